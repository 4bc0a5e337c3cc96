"""Evaluation metrics: hand-computed values, left-out classes, the 0.5 threshold, record
aggregation, and the patient bootstrap (rows of a patient move together; seeded)."""
import numpy as np
import pytest

from coreecg.eval.metrics import (aggregate_by_record, bootstrap_ci, classification_metrics,
                                  macro_auroc, patient_resample_weights, resample_metrics)

ABC = ["A", "B", "C"]
# Single-label: truth A, A, B, C. Argmax: A, A, A, C. Decisions at >= 0.5: {A}, {}, {A}, {C}.
Y1 = np.eye(3, dtype=int)[[0, 0, 1, 2]]
P1 = np.array([[0.6, 0.3, 0.1],
               [0.4, 0.35, 0.25],
               [0.5, 0.45, 0.05],     # exactly 0.5: A counts as predicted (>=)
               [0.2, 0.3, 0.5]])


def test_single_label_by_hand():
    m = classification_metrics(Y1, P1, multilabel=False, class_names=ABC)
    assert m["acc"] == pytest.approx(3 / 4)
    # at 0.5: A tp1 fp1 fn1 -> 0.5; B tp0 fn1 -> 0; C -> 1
    assert m["f1"] == pytest.approx((0.5 + 0 + 1) / 3)
    # argmax: A tp2 fp1 -> 0.8; B -> 0; C -> 1
    assert m["f1_argmax"] == pytest.approx((0.8 + 0 + 1) / 3)
    # A: positives {.6, .4} vs negatives {.5, .2}: 3 of 4 pairs; B and C rank perfectly
    assert m["auroc"] == pytest.approx((0.75 + 1 + 1) / 3)
    assert m["per_class"]["A"] == {"auroc": pytest.approx(0.75), "f1": pytest.approx(0.5),
                                     "f1_argmax": pytest.approx(0.8), "positives": 2, "positive_patients": 2}
    # per-class argmax F1 (B 0, C 1): the report's rare-class rule averages them over the classes kept
    assert [m["per_class"][c]["f1_argmax"] for c in "BC"] == [0.0, 1.0]
    assert m["classes_left_out"] == {"auroc": [], "f1": [], "rare": []}
    assert (m["n"], m["auroc_kind"], m["threshold"]) == (4, "one-vs-rest", 0.5)


def test_single_label_just_below_threshold_is_negative():
    p = P1.copy()
    p[2] = [0.49, 0.46, 0.05]            # argmax unchanged, but A is no longer predicted at 0.5
    m = classification_metrics(Y1, p, multilabel=False, class_names=ABC)
    assert m["per_class"]["A"]["f1"] == pytest.approx(2 / 3)   # tp1 fp0 fn1
    assert m["f1_argmax"] == pytest.approx((0.8 + 0 + 1) / 3)


# Multi-label: Z has no positive (and a false alarm in row 0).
XYZ = ["X", "Y", "Z"]
Y2 = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 0]])
P2 = np.array([[0.9, 0.5, 0.6],
               [0.49, 0.7, 0.1],
               [0.6, 0.65, 0.0]])      # decisions: [1 1 1], [0 1 0], [1 1 0]


def test_multi_label_by_hand_with_a_class_left_out():
    m = classification_metrics(Y2, P2, multilabel=True, class_names=XYZ)
    assert m["acc"] == pytest.approx(4 / 9)            # micro over the 9 (sample, label) decisions
    assert m["per_class"]["X"]["f1"] == pytest.approx(0.5)   # tp1 fp1 fn1
    assert m["per_class"]["Y"]["f1"] == pytest.approx(0.5)   # tp1 fp2 fn0
    assert m["f1"] == pytest.approx(0.5)                # Z not averaged in as 0
    assert m["per_class"]["X"]["auroc"] == pytest.approx(0.5)  # .9 > .6, .49 < .6
    assert m["per_class"]["Y"]["auroc"] == pytest.approx(1.0)  # .7 > .5, .7 > .65
    assert m["auroc"] == pytest.approx(0.75)            # Z not averaged in as 0.5
    assert m["per_class"]["Z"] == {"auroc": None, "f1": None, "positives": 0, "positive_patients": 0}
    assert m["classes_left_out"] == {"auroc": ["Z"], "f1": ["Z"], "rare": []}
    assert "f1_argmax" not in m


def test_threshold_is_inclusive():
    y = np.array([[1], [0]])
    at = classification_metrics(y, np.array([[0.5], [0.2]]), multilabel=True, class_names=["K"])
    below = classification_metrics(y, np.array([[0.49], [0.2]]), multilabel=True, class_names=["K"])
    assert (at["acc"], at["f1"]) == (1.0, 1.0)
    assert (below["acc"], below["f1"]) == (0.5, 0.0)


def test_all_positive_class_has_f1_but_no_auroc():
    y = np.array([[1, 1], [1, 0]])
    m = classification_metrics(y, np.array([[0.8, 0.7], [0.3, 0.4]]), multilabel=True, class_names=["P", "Q"])
    assert m["classes_left_out"] == {"auroc": ["P"], "f1": [], "rare": []}
    assert m["per_class"]["P"]["f1"] == pytest.approx(2 / 3)
    assert m["auroc"] == pytest.approx(1.0)


def test_old_helpers_unchanged():
    auroc, skipped = macro_auroc(Y2, P2)
    assert auroc == pytest.approx(0.75) and skipped == [2]


@pytest.mark.parametrize("y, multilabel, match", [
    (np.array([[1, 1, 0]] * 4), False, "exactly one positive"),
    (np.full((4, 3), 2), True, "multi-hot"),
    (np.eye(3, dtype=int)[[0, 1]], False, "one shape"),
])
def test_bad_labels_are_refused(y, multilabel, match):
    with pytest.raises(ValueError, match=match):
        classification_metrics(y, P1, multilabel=multilabel, class_names=ABC)


def test_record_aggregation_counts_a_record_once():
    windows = np.array([[0.2, 1], [0.4, 0], [0.9, 1], [0.1, 0]])
    ids, scores = aggregate_by_record(["r1", "r1", "r2", "r0"], windows)
    assert ids == ["r1", "r2", "r0"]
    np.testing.assert_allclose(scores, [[0.3, 0.5], [0.9, 1], [0.1, 0]])
    ids, scores = aggregate_by_record(["b", "a", "b"], np.array([1.0, 2.0, 3.0]))
    assert ids == ["b", "a"] and scores.tolist() == [2.0, 2.0]


def random_set(rng, n, k, multilabel):
    y = (rng.random((n, k)) < 0.4).astype(int) if multilabel else np.eye(k, dtype=int)[rng.integers(0, k, n)]
    probs = np.round(np.clip(0.4 * y + rng.random((n, k)) * 0.7, 0, 1), 1)   # rounded: ties in scores
    return y, probs


@pytest.mark.parametrize("multilabel", [False, True])
def test_resample_metrics_equal_sklearn_on_materialised_copies(multilabel):
    rng = np.random.default_rng(1)
    y, probs = random_set(rng, 40, 4, multilabel)
    names = list("abcd")
    weights = rng.integers(0, 4, (6, 40))
    fast = resample_metrics(y, probs, multilabel, weights)
    for b, w in enumerate(weights):
        copy = classification_metrics(np.repeat(y, w, 0), np.repeat(probs, w, 0), multilabel, names)
        assert not any(copy["classes_left_out"].values())
        for metric, values in fast.items():
            assert values[b] == pytest.approx(copy[metric], abs=1e-12), metric


def test_resample_missing_a_scored_class_is_undefined():
    w = np.ones((2, 4))
    w[1, 2] = 0                                  # drops the only B row
    out = resample_metrics(Y1, P1, False, w)
    for metric in ("f1", "f1_argmax", "auroc"):
        assert not np.isnan(out[metric][0]) and np.isnan(out[metric][1]), metric
    assert not np.isnan(out["acc"]).any()


def test_patient_weights_move_a_patients_rows_together():
    patients = ["p3", "p1", "p3", "p2", "p1", "p3"]
    w = patient_resample_weights(patients, 50, np.random.default_rng(0))
    assert w.shape == (50, 6)
    np.testing.assert_array_equal(w[:, 0], w[:, 2])
    np.testing.assert_array_equal(w[:, 0], w[:, 5])
    np.testing.assert_array_equal(w[:, 1], w[:, 4])
    # each resample draws 3 patients: the per-patient counts sum to 3
    assert (w[:, 0] + w[:, 1] + w[:, 3] == 3).all()
    assert (w.max(1) > 1).any()                  # with replacement: some patient drawn twice


def test_bootstrap_keeps_a_patients_windows_together():
    # Every patient has one correct and one wrong row: any patient resample has acc exactly 0.5;
    # resampling rows independently would spread acc around 0.5.
    n_patients = 30
    truth = np.tile([0, 1], n_patients)
    y = np.eye(2, dtype=int)[truth]
    correct = np.tile([True, False], n_patients)
    pred = np.where(correct, truth, 1 - truth)
    probs = np.where(np.eye(2, dtype=bool)[pred], 0.8, 0.2)
    patients = np.repeat(np.arange(n_patients), 2)
    ci = bootstrap_ci(y, probs, patients, False, ["n", "p"], n_resamples=200)
    assert ci["acc"]["low"] == pytest.approx(0.5) and ci["acc"]["high"] == pytest.approx(0.5)


def test_bootstrap_of_duplicated_rows_equals_one_row_per_patient():
    rng = np.random.default_rng(2)
    y, probs = random_set(rng, 25, 3, multilabel=True)
    names = ["a", "b", "c"]
    once = bootstrap_ci(y, probs, np.arange(25), True, names, n_resamples=300, seed=5)
    twice = bootstrap_ci(np.repeat(y, 2, 0), np.repeat(probs, 2, 0), np.repeat(np.arange(25), 2), True, names,
                         n_resamples=300, seed=5)
    assert twice == once


def test_bootstrap_is_seeded_and_brackets_the_estimate():
    rng = np.random.default_rng(3)
    y, probs = random_set(rng, 300, 5, multilabel=False)
    patients = rng.integers(0, 150, 300)
    names = list("abcde")
    a = bootstrap_ci(y, probs, patients, False, names, n_resamples=300, seed=7)
    assert a == bootstrap_ci(y, probs, patients, False, names, n_resamples=300, seed=7)
    assert a != bootstrap_ci(y, probs, patients, False, names, n_resamples=300, seed=8)
    point = classification_metrics(y, probs, False, names)
    assert set(a) == {"acc", "f1", "f1_argmax", "auroc"}
    for metric, ci in a.items():
        assert ci["low"] < point[metric] < ci["high"], metric
        assert ci["undefined_resamples"] == 0


def test_bootstrap_counts_resamples_missing_a_rare_class():
    # 200 resamples fit in one chunk, so one patient_resample_weights call replays the draws
    n_patients = 20
    y = np.zeros((n_patients, 2), dtype=int)
    y[:, 0] = np.arange(n_patients) % 2
    y[0, 1] = 1                                   # class 1: one positive, patient 0
    probs = np.full(y.shape, 0.3) + 0.4 * y
    ci = bootstrap_ci(y, probs, np.arange(n_patients), True, ["common", "rare"], n_resamples=200, seed=0)
    missed = (patient_resample_weights(np.arange(n_patients), 200, np.random.default_rng(0))[:, 0] == 0).sum()
    assert 0 < missed < 200
    assert ci["auroc"]["undefined_resamples"] == ci["f1"]["undefined_resamples"] == missed
    assert ci["acc"]["undefined_resamples"] == 0


def test_rank_correlation_of_cells_matches_ranks_and_brackets_rho():
    from coreecg.study.mask_rates import rank_correlation

    rng = np.random.default_rng(1)
    probe = rng.normal(size=12)
    finetuned = probe + rng.normal(scale=0.5, size=12)
    out = rank_correlation(probe, finetuned)
    ranks = lambda v: np.argsort(np.argsort(v)).astype(float)      # noqa: E731  (no ties here)
    expected = np.corrcoef(ranks(probe), ranks(finetuned))[0, 1]   # Spearman = Pearson of ranks
    assert out["rho"] == pytest.approx(expected) and out["cells"] == 12
    assert out["low"] <= out["rho"] <= out["high"] and out["high"] - out["low"] > 0.01
    # Fisher's z with the Bonett-Wright variance, computed here independently
    se = np.sqrt((1 + expected**2 / 2) / (12 - 3))
    assert (out["low"], out["high"]) == pytest.approx(np.tanh(np.arctanh(expected) + np.array([-1.96, 1.96]) * se),
                                                      abs=1e-3)
    few = rank_correlation([0.1, 0.2, 0.3, 0.4], [0.2, 0.1, 0.4, 0.3])       # 4 cells: an interval, a wide one
    assert few["rho"] == pytest.approx(0.6) and few["low"] < 0 < few["high"]
    assert np.isnan(rank_correlation([1, 2], [2, 1])["rho"])                  # < 3 cells: undefined
    flat = rank_correlation([0.5, 0.5, 0.5], [0.1, 0.3, 0.2])                 # ties everywhere: no ranks
    assert np.isnan(flat["rho"]) and "same probe score" in flat["note"]


def test_a_class_with_too_few_positive_patients_is_left_out_of_the_macro_means_and_named():
    """min_positive_patients: a class whose positives come from fewer patients is out of the macro
    F1 and AUROC (not of ACC), named in classes_left_out["rare"], its per-class values kept; two
    records of one patient count once; the bootstrap's and the resampled metrics' class sets agree."""
    from coreecg.eval.metrics import bootstrap_ci, kept_classes, positive_patients, resample_metrics

    rng = np.random.default_rng(0)
    n = 40
    y = np.zeros((n, 3), dtype=int)
    y[:, 0] = np.arange(n) < 20                      # A: 20 positive records
    y[:, 1] = np.arange(n) >= 20
    y[[0, 1, 2], 2] = 1                              # R: 3 positive records of 2 patients (0 and 1 are one)
    patients = np.array([0, 0, *range(1, n - 1)])
    probs = np.clip(y * 0.3 + rng.random((n, 3)) * 0.7, 0, 1)
    assert list(positive_patients(y, patients)) == [19, 20, 2] and list(positive_patients(y, None)) == [20, 20, 3]
    every = classification_metrics(y, probs, True, ["A", "B", "R"], patients, 1)
    strict = classification_metrics(y, probs, True, ["A", "B", "R"], patients, 3)
    assert strict["classes_left_out"]["rare"] == ["R"] and every["classes_left_out"]["rare"] == []
    a, b = (strict["per_class"][c]["auroc"] for c in "AB")
    assert strict["auroc"] == pytest.approx((a + b) / 2) and every["auroc"] != pytest.approx(strict["auroc"])
    assert strict["acc"] == every["acc"] and strict["per_class"]["R"]["positive_patients"] == 2
    assert strict["per_class"]["R"]["auroc"] == every["per_class"]["R"]["auroc"]        # still reported
    keep = kept_classes(y, patients, 3)
    point = resample_metrics(y, probs, True, np.ones((1, n)), keep)
    assert point["auroc"][0] == pytest.approx(strict["auroc"]) and point["f1"][0] == pytest.approx(strict["f1"])
    ci = bootstrap_ci(y, probs, patients, True, ["A", "B", "R"], n_resamples=200, min_positive_patients=3)
    assert ci["auroc"]["undefined_resamples"] == 0          # R, often absent from a resample, is not needed
