"""The paper's preprocessing: one raw `Record` -> z-scored 10 s windows at 250 Hz.

Order (each step vectorised over leads):

1. leads       select and reorder by name (coreecg.data.leads)
2. check       NaN/inf samples or a constant lead among the kept ones -> RecordError naming it
3. duration    shorter than `min_duration_s` -> RecordError
4. filter      zero-phase Butterworth high-pass 0.65 Hz then low-pass 40 Hz (cascaded SOS,
               `sosfiltfilt`) at the NATIVE rate over the WHOLE record: one pair of filter edges
               per record instead of one per window, and the low-pass doubles as the
               anti-alias filter before down-sampling. The ends are mirror-padded by one
               period of the high-pass cut-off (1.54 s at 0.65 Hz): scipy's default (27 odd-
               extended samples) leaves the high-pass unsettled, up to 9.5 z-units of edge error
               on real records (docs/data_pipeline.md, `bench/filter_edges.py`)
5. resample    `resample_poly` to 250 Hz with exact rational factors up/down, the linear trend
               between the ends removed around it (`padtype="line"`: no step at the edges)
6. window      consecutive non-overlapping 10 s windows (2,500 samples), remainder dropped;
               a record shorter than one window (but at least `min_duration_s`) gives ONE window
               whose real samples come first, the rest being padding
7. z-score     per window and lead over time; a flat window-lead becomes zeros, never NaN
               (standardize=record: per window over leads and time together, ST-MEM's contract); a
               padded window is z-scored over its real samples only, then its padding is set
               to NaN: the padding marker (PAD), docs/data_pipeline.md "Short records"

The random 2,250-sample crop is a training-time augmentation and is not done here.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
from scipy import signal as sps

from coreecg.config import PreprocessConfig
from coreecg.data.leads import select_leads
from coreecg.data.contract import ContractError
from coreecg.data.record import Record, RecordError

# Lazy imports: the published families (coreecg.model.published, torch), inside resolve_contract and
# contract_windows only: a corpus built under a family's declared contract needs them; importing the data
# layer pulls in no model.

# Edge handling, measured in docs/data_pipeline.md ("Filter edges"): mirror padding ("even")
# settles the 0.65 Hz high-pass where odd (point-symmetric) padding extrapolates a slope into
# a large excursion; one cut-off period of padding is where the gain levels off.
FILTER_PADTYPE = "even"
FILTER_PAD_PERIODS = 1.0          # pad length in periods of the high-pass cut-off
RESAMPLE_PADTYPE = "line"


def filter_padlen(fs: float, highpass_hz: float, n_samples: int) -> int:
    """Samples of mirror padding at each end: one high-pass period, at most n_samples - 1."""
    return max(0, min(int(round(FILTER_PAD_PERIODS * fs / highpass_hz)), n_samples - 1))


@lru_cache(maxsize=32)
def bandpass_sos(fs: float, highpass_hz: float, lowpass_hz: float, order: int) -> np.ndarray:
    """Cascaded Butterworth high-pass + low-pass second-order sections, (2*ceil(order/2), 6)."""
    hp = sps.butter(order, highpass_hz, btype="highpass", fs=fs, output="sos")
    lp = sps.butter(order, lowpass_hz, btype="lowpass", fs=fs, output="sos")
    return np.concatenate([hp, lp])


def bandpass(x: np.ndarray, fs: float, cfg: PreprocessConfig, path: str = "<array>") -> np.ndarray:
    """Zero-phase band-pass along the last axis. x: (..., n) -> (..., n) float64."""
    if cfg.lowpass_hz >= fs / 2:
        raise RecordError(path, f"sampling rate {fs:g} Hz is too low for a {cfg.lowpass_hz:g} Hz low-pass")
    sos = bandpass_sos(float(fs), cfg.highpass_hz, cfg.lowpass_hz, cfg.filter_order)
    x = np.asarray(x, dtype=np.float64)
    return sps.sosfiltfilt(sos, x, axis=-1, padtype=FILTER_PADTYPE,
                           padlen=filter_padlen(fs, cfg.highpass_hz, x.shape[-1]))


def resample_factors(fs: float, target: int, max_denominator: int, path: str = "<array>") -> tuple[int, int]:
    """Exact integers (up, down) with target/fs == up/down, both <= max_denominator.

    500 -> 250: (1, 2); 1000 -> 250: (1, 4); 100 -> 250: (5, 2); 257.3 -> 250: RecordError.
    """
    ratio = Fraction(target) / Fraction(fs)   # Fraction(float) is exact, so 257.3 stays 257.3
    if ratio.numerator > max_denominator or ratio.denominator > max_denominator:
        raise RecordError(path, f"cannot resample {fs:g} Hz to {target} Hz with an exact rational "
                                f"factor (needs {ratio.numerator}/{ratio.denominator}, "
                                f"limit {max_denominator})")
    return ratio.numerator, ratio.denominator


def resample(x: np.ndarray, up: int, down: int) -> np.ndarray:
    """Zero-phase polyphase resampling along the last axis; (..., n) -> (..., ceil(n*up/down))."""
    if up == down:
        return x
    return sps.resample_poly(x, up, down, axis=-1, padtype=RESAMPLE_PADTYPE)


PAD = np.nan   # stored value of padded samples (a short record's tail); raw records never hold NaN


def windows(x: np.ndarray, n: int) -> np.ndarray:
    """(leads, samples) -> (samples // n, leads, n), consecutive and non-overlapping (a view)."""
    k = x.shape[-1] // n
    return x[:, : k * n].reshape(x.shape[0], k, n).transpose(1, 0, 2)


def zscore(w: np.ndarray, eps: float, over: str = "lead") -> np.ndarray:
    """z-score of (..., leads, samples): over="lead" per lead over the last axis (leads with
    std < eps become zeros); "record" over leads and time together (ST-MEM's contract; a window
    with std < eps becomes zeros). Same shape."""
    axes = (-2, -1) if over == "record" else -1
    mean = w.mean(axis=axes, keepdims=True)
    std = w.std(axis=axes, keepdims=True)
    flat = std < eps
    return np.where(flat, 0.0, (w - mean) / np.where(flat, 1.0, std))


def check_signal(signal: np.ndarray, lead_names: tuple[str, ...], path: str) -> None:
    """RecordError naming the first lead with NaN/inf samples or constant (e.g. all-zero) values."""
    finite = np.isfinite(signal).all(axis=-1)
    if not finite.all():
        lead = lead_names[int(np.argmin(finite))]
        raise RecordError(path, f"NaN or infinite samples in lead {lead.strip()}")
    flat = np.ptp(signal, axis=-1) == 0
    if flat.any():
        i = int(np.argmax(flat))
        raise RecordError(path, f"lead {lead_names[i].strip()} is flat (constant {float(signal[i, 0]):g} mV)")


def preprocess_record(record: Record, cfg: PreprocessConfig) -> np.ndarray:
    """One record -> (n_windows, len(cfg.leads), cfg.window_samples) float32, n_windows >= 1.

    Raises RecordError (with the record's path) for anything that makes the record unusable.
    Dropped extra leads are noted in `record.meta["dropped_leads"]`.
    cfg.contract: a published family's declared contract instead (`contract_windows`).
    """
    if cfg.contract:
        return contract_windows(record, cfg)
    path = record.path
    sig = np.asarray(record.signal)
    if sig.ndim != 2 or sig.shape[0] != len(record.lead_names):
        raise RecordError(path, f"signal shape {sig.shape} does not match {len(record.lead_names)} lead names")
    if not np.isfinite(record.fs) or record.fs <= 0:
        raise RecordError(path, f"invalid sampling rate {record.fs!r}")
    sig, dropped = select_leads(sig, record.lead_names, cfg.leads, cfg.extra_leads, path)
    check_signal(sig, cfg.leads, path)  # only leads that are kept can spoil a record
    if dropped:
        record.meta["dropped_leads"] = list(dropped)
    if record.duration_s < cfg.min_duration_s:
        n = sig.shape[1]  # seconds to 6 significant digits: 4,999 samples at 500 Hz are 9.998 s, not "10.00"
        raise RecordError(path, f"record is {record.duration_s:.6g} s, shorter than {cfg.min_duration_s:g} s "
                                f"({n} samples at {record.fs:g} Hz, needs {math.ceil(cfg.min_duration_s * record.fs)})")
    up, down = resample_factors(record.fs, cfg.sampling_rate, cfg.resample_max_denominator, path)
    x = resample(bandpass(sig, record.fs, cfg, path), up, down)
    w = windows(x, cfg.window_samples)
    if len(w) == 0:  # a short record: one window, its real samples first, NaN padding after
        return pad_window(x, cfg.window_samples, cfg.zscore_eps, cfg.standardize)[None]
    return zscore(w, cfg.zscore_eps, cfg.standardize).astype(np.float32)


def resolve_contract(cfg: PreprocessConfig) -> PreprocessConfig:
    """data.preprocess with `contract` set -> the contract's stored form (rate, window, leads: the
    variant whose leads cfg.leads names, e.g. ECGFounder's [I], else the family's main contract);
    unchanged without a contract. What a corpus build applies, so `--set data.preprocess.contract=X`
    is all a user gives."""
    if not cfg.contract:
        return cfg
    from coreecg.model.published import contract_of, contract_preprocess, family

    fam = family(cfg.contract)
    variants = [c for c in (fam.contract, *fam.variants) if c is not None and tuple(c.leads) == tuple(cfg.leads)]
    return contract_preprocess(fam, len(variants[0].leads) if variants else len(contract_of(fam).leads))


def contract_windows(record: Record, cfg: PreprocessConfig) -> np.ndarray:
    """One record under a published family's declared input contract (cfg.contract names it) ->
    (n_windows, leads, samples) float32 in the stored form (`InputContract.windows`); RecordError
    naming the record for what the contract cannot take."""
    from coreecg.model.published import contract_of, family   # the families (torch) only for a contract corpus

    contract = contract_of(family(cfg.contract), leads=tuple(cfg.leads))
    if contract is None:
        raise ValueError(f"data.preprocess.contract={cfg.contract!r}: that family declares no input contract")
    # no NaN / flat-lead quarantine here: each original pipeline handles those itself (NanTo, ConstantLeads)
    try:
        out = contract.windows(np.asarray(record.signal), record.fs, record.lead_names, record.path)
    except ContractError as e:           # a lead missing, too short: the record's fault, quarantined
        raise RecordError(record.path, str(e).removeprefix(f"{record.path}: ")) from e
    if not np.isfinite(out).all():
        raise RecordError(record.path, f"the {cfg.contract} contract gives non-finite model input")
    if out.shape[1:] != (len(cfg.leads), cfg.window_samples) or tuple(cfg.leads) != tuple(contract.leads):
        raise ValueError(f"data.preprocess does not match the {cfg.contract} contract's stored form "
                         f"({list(contract.leads)}, {contract.stored_samples()} samples at "
                         f"{contract.stored_rate():g} Hz): "
                         "build it with coreecg.model.published.contract_preprocess")
    return out


def pad_window(x: np.ndarray, n: int, eps: float, standardize: str = "lead") -> np.ndarray:
    """(leads, m) with m < n real samples -> (leads, n) float32: z-scored over the m real
    samples, then padded at the end with PAD (NaN), so the padding never enters the statistics."""
    out = np.full((x.shape[0], n), PAD, dtype=np.float32)
    out[:, : x.shape[-1]] = zscore(x, eps, standardize)
    return out
