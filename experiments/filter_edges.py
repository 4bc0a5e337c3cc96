"""Filter edges: how far a 10 s record's preprocessed window is from the same 10 s preprocessed
inside a longer recording, before and after the edge handling of `coreecg.data.preprocess`.

    python -m experiments.filter_edges      # real records from ../shared/ecg-data

A record of 10 s has no context at its ends: the zero-phase band-pass and the resampler must
invent it (padding), and whatever they invent shows up as an edge error. Real records of 30 s
or more (CPSC2018 in CinC form, the PTB records of CinC 2021, PTB Diagnostic s0010_re) give
a reference: every window with >= 10 s of recording on both sides is preprocessed twice, as
part of the whole record (reference: its edges are far away) and cut out as a 10 s record of
its own, and the two z-scored windows are compared per lead. Reported: the largest absolute
difference in the first and last second (z-units), its median over windows, the rms over the
edge seconds, the largest difference in the middle 8 s (z-scoring spreads an edge error over
the window), and the smallest per-lead correlation. PTB-XL records (10 s) give a second
figure at the native rate: the inner 6 s filtered alone vs. inside the whole 10 s.

"before" is the earlier preprocessing: one `sosfiltfilt` with scipy's default padding (odd
extension of 3 x (2 x sections + 1) = 27 samples) and `resample_poly` with zero padding.
"after" is `coreecg.data.preprocess` as it is.
"""
from __future__ import annotations

import json

import numpy as np
from scipy import signal as sps

from bench.common import SHARED
from coreecg.config import PreprocessConfig
from coreecg.data.leads import select_leads
from coreecg.data.preprocess import bandpass, bandpass_sos, resample, resample_factors, windows, zscore
from coreecg.data.sources import get_source

CFG = PreprocessConfig()


def before_filter(x: np.ndarray, fs: float) -> np.ndarray:
    return sps.sosfiltfilt(bandpass_sos(fs, CFG.highpass_hz, CFG.lowpass_hz, CFG.filter_order), x, axis=-1)


def before_resample(x: np.ndarray, up: int, down: int) -> np.ndarray:
    return x if up == down else sps.resample_poly(x, up, down, axis=-1)


METHODS = {
    "before": (before_filter, before_resample),
    "after": (lambda x, fs: bandpass(x, fs, CFG), resample),
}


def windows_of(sig: np.ndarray, fs: float, method: str) -> np.ndarray:
    """(leads, n) -> (k, leads, 2500) z-scored windows, as preprocess_record makes them."""
    filt, res = METHODS[method]
    up, down = resample_factors(fs, CFG.sampling_rate, CFG.resample_max_denominator)
    return zscore(windows(res(filt(sig, fs), up, down), CFG.window_samples), CFG.zscore_eps)


def long_records():
    """Real records of >= 30 s: (record id, (12, n) float64 mV, fs)."""
    readers = [("cpsc2018", {"label_view": "none"}, "cpsc2018-cinc2020"),
               ("cinc2021", {"class_map": "none", "subsets": ["PTB"]}, "cinc2021-smoke"),
               ("wfdb", {}, "ptb-diagnostic")]
    for name, opts, folder in readers:
        src = get_source(name, **opts)
        for ref in src.list_records(SHARED / folder):
            rec = src.read(ref)
            if rec.duration_s >= 3 * CFG.window_s:
                sig, _ = select_leads(rec.signal, rec.lead_names, CFG.leads, CFG.extra_leads, rec.path)
                yield f"{name}:{rec.record_id}", sig.astype(np.float64), rec.fs


def context_errors(method: str) -> dict:
    edge, edge_sq, mid, corr, worst = [], [], [], [], ("", -1.0)
    second = CFG.sampling_rate
    for rid, sig, fs in long_records():
        w = int(round(CFG.window_s * fs))
        whole = windows_of(sig, fs, method)
        for k in range(1, sig.shape[1] // w - 1):
            alone = windows_of(sig[:, k * w:(k + 1) * w], fs, method)[0]
            err = np.abs(alone - whole[k])
            ends = np.concatenate([err[:, :second], err[:, -second:]], axis=1)
            edge.append(float(ends.max()))
            edge_sq.append(float(np.mean(ends ** 2)))
            mid.append(float(err[:, second:-second].max()))
            corr.append(min(float(np.corrcoef(alone[i], whole[k][i])[0, 1]) for i in range(len(alone))))
            if edge[-1] > worst[1]:
                worst = (f"{rid} window {k}", edge[-1])
    return {"windows": len(edge), "edge_max": round(max(edge), 3), "edge_median": round(float(np.median(edge)), 3),
            "edge_rms": round(float(np.sqrt(np.mean(edge_sq))), 3), "middle_max": round(max(mid), 3),
            "min_corr": round(min(corr), 4), "median_min_corr": round(float(np.median(corr)), 4),
            "worst": worst[0]}


def ptbxl_native(method: str, rate: int, n: int = 100) -> dict:
    """PTB-XL at its native rate: inner 6 s filtered alone vs. inside the 10 s record."""
    filt = METHODS[method][0]
    src = get_source("ptbxl", label_view="none", rate=rate)
    edge, corr = [], []
    for ref in src.list_records(SHARED / "ptbxl"):
        if len(edge) == n:
            break
        try:
            rec = src.read(ref)
        except Exception:  # the csv lists records the shared subset does not hold
            continue
        sig, fs = rec.signal.astype(np.float64), rec.fs
        c, s = int(2 * fs), int(fs)
        ref_part, alone = filt(sig, fs)[:, c:-c], filt(sig[:, c:-c], fs)
        err = np.abs(alone - ref_part) / ref_part.std(axis=1, keepdims=True)
        edge.append(float(max(err[:, :s].max(), err[:, -s:].max())))
        corr.append(min(float(np.corrcoef(alone[i], ref_part[i])[0, 1]) for i in range(12)))
    return {"records": len(edge), "edge_max": round(max(edge), 3), "edge_median": round(float(np.median(edge)), 3),
            "min_corr": round(min(corr), 4)}


def main() -> None:
    out = {m: {"long_records_250hz_z": context_errors(m),
               "ptbxl_100hz_native": ptbxl_native(m, 100), "ptbxl_500hz_native": ptbxl_native(m, 500)}
           for m in METHODS}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
