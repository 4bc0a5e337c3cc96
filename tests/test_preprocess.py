"""The paper's preprocessing: band-pass response, exact resampling, windows, z-score, leads."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import wfdb
from scipy import signal as sps

from coreecg.config import PreprocessConfig
from coreecg.data.leads import canonical_lead_name
from coreecg.data.preprocess import bandpass, bandpass_sos, preprocess_record, resample, resample_factors, zscore
from coreecg.data.record import STANDARD_LEADS, Record, RecordError
from coreecg.data.sources.synthetic import synthesize_record

CFG = PreprocessConfig()


def _gain_db(freq: float, fs: float = 500.0, seconds: float = 60.0) -> float:
    t = np.arange(int(fs * seconds)) / fs
    x = np.sin(2 * np.pi * freq * t)[None, :]
    y = bandpass(x, fs, CFG)
    mid = slice(len(t) // 4, 3 * len(t) // 4)  # away from filtfilt's edge transients
    return 20 * np.log10(np.sqrt(np.mean(y[0, mid] ** 2)) / np.sqrt(np.mean(x[0, mid] ** 2)))


def _analytic_db(freq: float, fs: float = 500.0) -> float:
    """Twice (forward + backward pass) the dB response of the cascaded digital Butterworth SOS."""
    _, h = sps.sosfreqz(bandpass_sos(fs, CFG.highpass_hz, CFG.lowpass_hz, CFG.filter_order), worN=[freq], fs=fs)
    return 2 * 20 * np.log10(abs(h[0]))


@pytest.mark.parametrize("freq", [0.2, 10.0, 60.0, 100.0])
def test_bandpass_matches_butterworth_response(freq):
    assert _gain_db(freq) == pytest.approx(_analytic_db(freq), abs=1.0)


def test_bandpass_rejects_baseline_wander_and_mains_keeps_qrs_band():
    assert _gain_db(0.2) < -30          # baseline wander
    assert _gain_db(60.0) < -30         # mains (order 4 at 500 Hz: -30.4 dB)
    assert _gain_db(100.0) < -60
    assert abs(_gain_db(10.0)) < 0.5    # QRS band untouched
    assert abs(_gain_db(2.0)) < 0.5


def _gaussian_peak(fs: float, t0: float, seconds: float = 12.0, sigma: float = 0.03) -> np.ndarray:
    t = np.arange(int(round(fs * seconds))) / fs
    return np.exp(-0.5 * ((t - t0) / sigma) ** 2)[None, :]


@pytest.mark.parametrize("fs, up, down", [(500, 1, 2), (1000, 1, 4), (100, 5, 2), (250, 1, 1), (360, 25, 36)])
def test_resample_exact_factors_length_and_peak_alignment(fs, up, down):
    assert resample_factors(fs, 250, CFG.resample_max_denominator) == (up, down)
    x = _gaussian_peak(fs, t0=3.2)
    y = resample(x, up, down)
    assert y.shape[-1] == int(np.ceil(x.shape[-1] * up / down))
    assert y.shape[-1] == 12 * 250
    assert abs(np.argmax(y[0]) / 250 - 3.2) <= 1 / 250  # the peak stays at t (zero phase)
    assert y[0].max() == pytest.approx(1.0, abs=0.02)


def test_non_rational_rate_is_refused():
    with pytest.raises(RecordError, match="cannot resample 257.3 Hz to 250 Hz with an exact rational factor"):
        resample_factors(257.3, 250, CFG.resample_max_denominator)
    rec = synthesize_record(0, 0)
    rec = dataclasses.replace(rec, fs=257.3)
    with pytest.raises(RecordError, match="cannot resample 257.3 Hz"):
        preprocess_record(rec, CFG)


@pytest.mark.parametrize("seconds, n_windows, padded", [(4.99, 0, 0), (6, 1, 1000), (9.99, 1, 2), (10, 1, 0),
                                                        (25, 2, 0), (60, 6, 0)])
def test_window_counts(seconds, n_windows, padded):
    """Under min_duration_s=5: shorter is quarantined, 5-10 s is one window padded with NaN."""
    rec = synthesize_record(1, 5, fs=500, duration_s=seconds)
    if n_windows == 0:
        with pytest.raises(RecordError, match="shorter than 5 s"):
            preprocess_record(rec, CFG)
        return
    w = preprocess_record(rec, CFG)
    assert w.shape == (n_windows, 12, 2500) and w.dtype == np.float32
    assert int(np.isnan(w[..., -padded:] if padded else w[..., :0]).sum()) == 12 * padded
    assert int(np.isnan(w).sum()) == 12 * padded


def test_windows_are_consecutive_not_overlapping():
    rec = synthesize_record(2, 7, fs=500, duration_s=30)
    w = preprocess_record(rec, CFG)
    # Window k is the z-scored k-th 10 s slice of the whole filtered, resampled record.
    full = resample(bandpass(rec.signal, 500, CFG), 1, 2)
    for k in range(3):
        np.testing.assert_allclose(w[k], zscore(full[:, k * 2500:(k + 1) * 2500], CFG.zscore_eps), atol=1e-5)


def test_zscore_mean_std_and_flat_lead_is_zero_not_nan():
    w = preprocess_record(synthesize_record(0, 3, duration_s=20), CFG)
    np.testing.assert_allclose(w.mean(axis=-1), 0, atol=1e-4)
    np.testing.assert_allclose(w.std(axis=-1), 1, atol=1e-3)
    x = np.random.default_rng(0).normal(size=(2, 12, 2500)) * 3 + 5
    x[1, 4] = 0.3                        # a flat lead in one window (e.g. an electrode off)
    x[0, 2] = 7.0 + 1e-9 * np.arange(2500)  # std far below eps: treated as flat too
    z = zscore(x, CFG.zscore_eps)
    assert np.isfinite(z).all()
    assert (z[1, 4] == 0).all() and (z[0, 2] == 0).all()
    np.testing.assert_allclose(z[0, 0].std(), 1, atol=1e-9)


@pytest.mark.parametrize("corrupt, reason", [
    (lambda s: s.__setitem__((7, slice(100, 200)), np.nan), "NaN or infinite samples in lead V2"),
    (lambda s: s.__setitem__(9, 0.0), "lead V4 is flat"),
])
def test_bad_signals_name_the_lead(corrupt, reason):
    rec = synthesize_record(0, 0)
    corrupt(rec.signal)
    with pytest.raises(RecordError, match=reason):
        preprocess_record(rec, CFG)


def test_lead_spellings_normalise():
    assert [canonical_lead_name(n) for n in ("AVR", "avl", " aVF ", "V1 ", "i", "III", "vx")] == \
        ["aVR", "aVL", "aVF", "V1", "I", "III", "VX"]


def _shuffled(rec: Record, order: list[str], spell=lambda n: n) -> Record:
    idx = [STANDARD_LEADS.index(n) for n in order]
    return dataclasses.replace(rec, signal=rec.signal[idx], lead_names=tuple(spell(n) for n in order))


def test_reorder_by_name_not_position():
    rec = synthesize_record(0, 4)
    mimic = ["I", "II", "III", "aVR", "aVF", "aVL", "V1", "V2", "V3", "V4", "V5", "V6"]
    shuffled = _shuffled(rec, mimic, spell=str.upper)
    np.testing.assert_array_equal(preprocess_record(shuffled, CFG), preprocess_record(rec, CFG))


def test_real_mimic_order_record_matches_its_ptbxl_original(ecg_data):
    """mimic-iv-ecg-layout re-writes PTB-XL 00003 in MIMIC's order (aVF before aVL)."""
    def load(path):
        r = wfdb.rdrecord(str(path))
        return Record("t", "x", r.p_signal.T.astype(np.float32), float(r.fs), tuple(r.sig_name), None, (), str(path))
    mimic = load(ecg_data / "mimic-iv-ecg-layout/files/p1002/p10020372/s40000003/40000003")
    ptbxl = load(ecg_data / "ptbxl/records500/00000/00003_hr")
    assert mimic.lead_names[4:6] == ("aVF", "aVL") and ptbxl.lead_names[3:6] == ("AVR", "AVL", "AVF")
    np.testing.assert_allclose(preprocess_record(mimic, CFG), preprocess_record(ptbxl, CFG), atol=1e-5)


def test_lead_errors_and_reduced_lead_sets():
    rec = synthesize_record(0, 2)
    with pytest.raises(RecordError, match="missing lead"):
        preprocess_record(_shuffled(rec, [n for n in STANDARD_LEADS if n != "V3"]), CFG)
    dup = dataclasses.replace(rec, lead_names=STANDARD_LEADS[:11] + ("V5",))
    with pytest.raises(RecordError, match="duplicated lead 'V5'"):
        preprocess_record(dup, CFG)
    odd = dataclasses.replace(rec, lead_names=STANDARD_LEADS[:11] + ("MLII",))
    with pytest.raises(RecordError, match="unexpected lead"):
        preprocess_record(odd, dataclasses.replace(CFG, leads=STANDARD_LEADS[:11]))
    # Declared reduced-lead set: the missing V3 is fine, and the output has 11 rows in order.
    reduced = tuple(n for n in STANDARD_LEADS if n != "V3")
    w = preprocess_record(_shuffled(rec, list(reversed(reduced))), dataclasses.replace(CFG, leads=reduced))
    np.testing.assert_array_equal(w, np.delete(preprocess_record(rec, CFG), 8, axis=1))


def test_ptb_diagnostic_frank_leads_are_dropped_and_noted(ecg_data):
    r = wfdb.rdrecord(str(ecg_data / "ptb-diagnostic/s0010_re"))
    rec = Record("ptb", "s0010_re", r.p_signal.T.astype(np.float32), float(r.fs), tuple(r.sig_name), None, (),
                 "s0010_re")
    w = preprocess_record(rec, CFG)              # 1000 Hz, 38.4 s, 15 leads
    assert w.shape == (3, 12, 2500)
    assert rec.meta["dropped_leads"] == ["VX", "VY", "VZ"]


def test_duration_message_gives_samples_and_enough_precision():
    """4,999 samples at 500 Hz used to read 'record is 10.00 s, shorter than 10 s'."""
    rec = synthesize_record(0, 1, duration_s=10)
    short = dataclasses.replace(rec, signal=rec.signal[:, :4999])
    with pytest.raises(RecordError) as err:
        preprocess_record(short, dataclasses.replace(CFG, min_duration_s=10.0))
    assert err.value.reason == "record is 9.998 s, shorter than 10 s (4999 samples at 500 Hz, needs 5000)"
    assert preprocess_record(dataclasses.replace(rec, signal=rec.signal[:, :5000]), CFG).shape == (1, 12, 2500)


def test_filter_edges_of_a_10s_record_match_the_same_10s_inside_a_long_recording(ecg_data):
    """Every 10 s slice (with context both sides) of the 115 s PTB record S0009, preprocessed as a
    record of its own, against its window in the whole record: the edges are where they differ.
    scipy's default padding (27 samples, odd) gave 9.5 z-units at an edge and correlation 0.70
    here; mirror padding of one high-pass period gives 1.7 and 0.977 (experiments/filter_edges.py)."""
    from coreecg.data.sources import get_source

    src = get_source("cinc2021", class_map="none", subsets=["PTB"])
    (ref,) = [r for r in src.list_records(ecg_data / "cinc2021-smoke") if r.record_id == "S0009"]
    rec = src.read(ref)
    whole = preprocess_record(rec, CFG)
    n = int(rec.fs * CFG.window_s)
    assert len(whole) == 11
    worst_edge, worst_corr = 0.0, 1.0
    for k in range(1, len(whole) - 1):
        alone = preprocess_record(dataclasses.replace(rec, signal=rec.signal[:, k * n:(k + 1) * n]), CFG)[0]
        err = np.abs(alone - whole[k])
        worst_edge = max(worst_edge, err[:, :250].max(), err[:, -250:].max())
        worst_corr = min(worst_corr, *(np.corrcoef(alone[i], whole[k][i])[0, 1] for i in range(12)))
        assert err[:, 250:-250].max() < 0.5            # the middle 8 s agree
    assert worst_edge < 2.0 and worst_corr > 0.97
