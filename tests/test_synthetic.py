"""The synthetic source: limb-lead laws, determinism, class balance, class physiology."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from scipy.signal import find_peaks

from coreecg.config import PreprocessConfig
from coreecg.data import SYNTHETIC_CLASS_NAMES, synthetic_windows
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import STANDARD_LEADS
from coreecg.data.sources.synthetic import RECORDS_PER_PATIENT, SyntheticSource, synthesize, synthesize_record

L = {name: i for i, name in enumerate(STANDARD_LEADS)}


@pytest.mark.parametrize("index", range(0, 18, 3))  # one record of each class
def test_einthoven_and_goldberger_hold(index):
    s = synthesize_record(7, index).signal.astype(np.float64)
    lead = {n: s[i] for n, i in L.items()}
    tol = 1e-5 * np.abs(s).max()
    assert np.abs(lead["II"] - (lead["I"] + lead["III"])).max() < tol
    assert np.abs(lead["aVR"] + (lead["I"] + lead["II"]) / 2).max() < tol
    assert np.abs(lead["aVL"] - (lead["I"] - lead["II"] / 2)).max() < tol
    assert np.abs(lead["aVF"] - (lead["II"] - lead["I"] / 2)).max() < tol
    assert 0.3 < np.ptp(lead["II"]) < 6.0  # millivolt-scale, not noise and not volts


def test_deterministic_per_seed_and_per_record():
    a, b = synthesize(8, seed=3), synthesize(8, seed=3)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.signal, y.signal)
    assert not np.array_equal(a[0].signal, synthesize(1, seed=4)[0].signal)
    # Record i does not depend on how many records were asked for.
    np.testing.assert_array_equal(synthesize(20, seed=3)[5].signal, a[5].signal)


def test_class_balance_and_patients():
    recs = synthesize(6 * RECORDS_PER_PATIENT * 4, seed=0)
    counts = Counter(r.labels[0] for r in recs)
    assert set(counts) == set(SYNTHETIC_CLASS_NAMES)
    assert len(set(counts.values())) == 1
    by_patient: dict[str, set] = {}
    for r in recs:
        by_patient.setdefault(r.patient_id, set()).add(r.labels)
    assert len(by_patient) == len(recs) // RECORDS_PER_PATIENT
    assert all(len(v) == 1 for v in by_patient.values())


def _rr(index: int, seed: int = 11) -> np.ndarray:
    """R-R intervals (s) from lead II after preprocessing (R waves are the tallest peaks)."""
    w = preprocess_record(synthesize_record(seed, index, duration_s=30), PreprocessConfig())
    ii = np.concatenate(list(w[:, L["II"]]))
    peaks, _ = find_peaks(ii, height=np.percentile(ii, 99) * 0.5, distance=int(0.3 * 250))
    return np.diff(peaks) / 250


def test_rhythm_classes_have_their_rates_and_regularity():
    per_class = RECORDS_PER_PATIENT  # record index of the first record of class k is k * 3
    hr = {SYNTHETIC_CLASS_NAMES[k]: 60 / np.median(_rr(k * per_class)) for k in range(4)}
    assert 55 <= hr["normal_sinus"] <= 105
    assert hr["sinus_bradycardia"] < 60
    assert hr["sinus_tachycardia"] > 100
    cv = {k: np.std(_rr(k * per_class)) / np.mean(_rr(k * per_class)) for k in (0, 3)}
    assert cv[3] > 2 * cv[0] and cv[3] > 0.1  # AF is irregularly irregular


def test_wide_qrs_class_is_wider():
    def qrs_width(index: int) -> float:
        rec = synthesize_record(5, index, fs=500)
        slope = np.abs(np.gradient(rec.signal[L["V5"]]))
        return float((slope > 0.3 * slope.max()).mean())  # share of time with steep slopes ~ QRS share
    normal = np.mean([qrs_width(i) for i in range(0, 3)])
    bbb = np.mean([qrs_width(4 * RECORDS_PER_PATIENT + i) for i in range(3)])
    assert bbb > normal


def test_source_interface_is_deterministic_and_reads_back():
    src = SyntheticSource(n_records=10, seed=2)
    refs = src.list_records(None)
    assert refs == SyntheticSource(n_records=10, seed=2).list_records("/anything")
    assert [r.record_id for r in refs] == [f"syn2-{i:06d}" for i in range(10)]
    np.testing.assert_array_equal(src.read(refs[4]).signal, synthesize_record(2, 4).signal)
    assert src.class_names == SYNTHETIC_CLASS_NAMES and not src.multilabel


def test_synthetic_windows_are_preprocessed_corpus_windows():
    cfg = PreprocessConfig()
    x, y = synthetic_windows(12, seed=1, cfg=cfg)
    assert x.shape == (12, 12, 2500) and x.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(x[7], preprocess_record(synthesize_record(1, 7), cfg)[0])
    assert list(y) == [SYNTHETIC_CLASS_NAMES.index(synthesize_record(1, i).labels[0]) for i in range(12)]
    np.testing.assert_allclose(x.std(axis=-1), 1, atol=1e-3)
