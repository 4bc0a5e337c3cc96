"""Classification metrics on top of scikit-learn, with classes that cannot be scored made explicit.

The paper's definitions (docs/evaluation.md): single-label ACC is per-sample argmax accuracy;
multi-label ACC is per-label accuracy at the 0.5 threshold, micro over all (sample, label)
decisions; F1 is macro one-vs-rest F1 at the fixed 0.5 threshold (`probs >= 0.5` is positive);
AUROC is macro one-vs-rest AUROC.

Left-out classes. A class with no positive (or no negative) in the evaluated set has no AUROC; a
class with no positive has no recall, so no F1 that measures the class (with no predicted
positive either, F1 is 0/0). Such classes are listed and left out of the macro means, never
averaged in as 0 or 0.5. ACC keeps every class (its negatives are real decisions).

Rare classes (`min_positive_patients`, report.min_positive_patients): a class with fewer positive
test patients than that is left out of the macro AUROC and F1 as well, and listed
(classes_left_out["rare"]): with one or two positive patients its AUROC is one or two rank
positions, and a patient bootstrap's interval for it is far too narrow (docs/evaluation.md,
"Rare classes"), yet it would weigh as much as a class of hundreds in the macro mean.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

# Lazy imports: scikit-learn (the `ray` extra), where a metric is scored: inference (aggregate_by_record)
# runs on the light install without it (tests/test_light_install.py).

THRESHOLD = 0.5
BOOTSTRAP_CHUNK = 250   # resamples scored together: bounds the (chunk, n) weight matrix


def per_class_auroc(y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """One-vs-rest AUROC per class. y: (n, K) {0, 1}; scores: (n, K). -> (K,), NaN where undefined."""
    from sklearn.metrics import roc_auc_score

    y = np.asarray(y)
    out = np.full(y.shape[1], np.nan)
    for k in range(y.shape[1]):
        if 0 < y[:, k].sum() < len(y):
            out[k] = roc_auc_score(y[:, k], scores[:, k])
    return out


def macro_auroc(y: np.ndarray, scores: np.ndarray) -> tuple[float, list[int]]:
    """Macro one-vs-rest AUROC over the classes that can be scored, and the indices left out."""
    per = per_class_auroc(y, scores)
    skipped = [int(k) for k in np.flatnonzero(np.isnan(per))]
    return (float(np.nanmean(per)) if len(skipped) < len(per) else float("nan")), skipped


def aggregate_by_record(record_ids: Sequence[str], scores: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Mean over each record's windows, so a record with several windows counts once.

    record_ids: (n,) one per window; scores: (n,) or (n, K). -> (record ids (m,) in first-seen
    order, mean scores (m,) or (m, K)). Multi-hot labels aggregate the same way (they are equal
    over a record's windows, so the mean is the record's label row).
    """
    scores = np.asarray(scores, dtype=float)
    if len(record_ids) != len(scores):
        raise ValueError(f"{len(record_ids)} record ids for {len(scores)} score rows")
    table = pd.DataFrame(scores.reshape(len(scores), -1))
    means = table.groupby(np.asarray(record_ids), sort=False).mean()
    return list(means.index), means.to_numpy().reshape((len(means),) + scores.shape[1:])


def _checked(y, probs, multilabel: bool, class_names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """y as bool (n, K), probs as float (n, K); ValueError on shapes, non-binary or non-one-hot y."""
    y, probs = np.asarray(y), np.asarray(probs, dtype=float)
    if y.ndim != 2 or y.shape != probs.shape or y.shape[1] != len(class_names) or not len(y):
        raise ValueError(f"need y and probs of one shape (n > 0, {len(class_names)} classes); "
                         f"got {y.shape} and {probs.shape}")
    if not np.isin(y, (0, 1)).all():
        raise ValueError("y must be multi-hot {0, 1}")
    if not multilabel and not (y.sum(1) == 1).all():
        raise ValueError("single-label y must have exactly one positive per row")
    return y.astype(bool), probs


def positive_patients(y: np.ndarray, patient_ids: Sequence | None) -> np.ndarray:
    """(K,) distinct patients with a positive label per class (rows count as patients without ids)."""
    y = np.asarray(y, dtype=bool)
    if patient_ids is None:
        return y.sum(0)
    _, patient = np.unique(np.asarray(patient_ids), return_inverse=True)
    hits = np.zeros((patient.max() + 1, y.shape[1]), dtype=bool)
    np.logical_or.at(hits, patient.ravel(), y)
    return hits.sum(0)


def kept_classes(y: np.ndarray, patient_ids: Sequence | None, min_positive_patients: int = 1) -> np.ndarray:
    """(K,) bool: the classes the macro means may hold, those with >= min_positive_patients positive
    patients (1: every class with a positive)."""
    return positive_patients(y, patient_ids) >= max(1, min_positive_patients)


def _json_float(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def _accuracy(y: np.ndarray, probs: np.ndarray, pred: np.ndarray, multilabel: bool, f1_scored: np.ndarray,
              kept: np.ndarray) -> tuple[dict, np.ndarray]:
    """ACC (multi-label: over every record-class decision at the threshold; single-label: of the
    argmax) and, single-label, the F1 of argmax decisions -> ({acc[, f1_argmax]: its macro over the
    kept classes}, (K,) per-class F1 of argmax decisions, NaN where not scored or multi-label)."""
    from sklearn.metrics import accuracy_score, f1_score

    f1_argmax = np.full(y.shape[1], np.nan)
    if multilabel:
        return {"acc": float(accuracy_score(y.ravel(), pred.ravel()))}, f1_argmax
    true, argmax = y.argmax(1), probs.argmax(1)
    out = {"acc": float(accuracy_score(true, argmax))}
    scored = np.flatnonzero(f1_scored)
    if len(scored):
        f1_argmax[scored] = f1_score(true, argmax, labels=scored, average=None, zero_division=0.0)
    # the macro over the classes kept: the report prints it for another min_positive_patients too
    out["f1_argmax"] = float(np.mean(f1_argmax[f1_scored & kept])) if (f1_scored & kept).any() else None
    return out, f1_argmax


def classification_metrics(y: np.ndarray, probs: np.ndarray, multilabel: bool,
                           class_names: Sequence[str], patient_ids: Sequence | None = None,
                           min_positive_patients: int = 1) -> dict:
    """ACC, F1 and AUROC as the paper defines them, with scikit-learn.

    y: (n, K) multi-hot {0, 1} (one-hot when single-label); probs: (n, K) probabilities (softmax
    for single-label, sigmoid for multi-label); patient_ids (n,): whose records (None: each row its
    own patient). Returns a JSON-ready dict: acc, f1, auroc (and f1_argmax, macro F1 of argmax
    decisions, for single-label), each None when no class can be scored; per_class {name: {auroc,
    f1, f1_argmax (single-label), positives, positive_patients}}; classes_left_out {auroc: [...],
    f1: [...], rare: [...]} (rare: fewer than min_positive_patients positive patients, out of the
    macro means; their per-class values stay); min_positive_patients; n; auroc_kind; threshold.
    """
    from sklearn.metrics import f1_score

    y, probs = _checked(y, probs, multilabel, class_names)
    positives = y.sum(0)
    patients = positive_patients(y, patient_ids)
    kept = kept_classes(y, patient_ids, min_positive_patients)
    f1_scored = positives > 0
    pred = probs >= THRESHOLD
    auroc = per_class_auroc(y, probs)
    f1 = np.full(len(class_names), np.nan)
    for k in np.flatnonzero(f1_scored):
        f1[k] = f1_score(y[:, k], pred[:, k], zero_division=0.0)
    accuracy, f1_argmax = _accuracy(y, probs, pred, multilabel, f1_scored, kept)
    out = {"n": len(y), **accuracy}
    macro_f1, macro_auroc = np.where(kept, f1, np.nan), np.where(kept, auroc, np.nan)
    out["f1"] = _json_float(np.nanmean(macro_f1)) if (~np.isnan(macro_f1)).any() else None
    out["auroc"] = _json_float(np.nanmean(macro_auroc)) if (~np.isnan(macro_auroc)).any() else None
    out["per_class"] = {name: {"auroc": _json_float(auroc[k]), "f1": _json_float(f1[k]),
                               **({} if multilabel else {"f1_argmax": _json_float(f1_argmax[k])}),
                               "positives": int(positives[k]), "positive_patients": int(patients[k])}
                        for k, name in enumerate(class_names)}
    out["classes_left_out"] = {"auroc": [class_names[k] for k in np.flatnonzero(np.isnan(auroc))],
                               "f1": [class_names[k] for k in np.flatnonzero(~f1_scored)],
                               "rare": [class_names[k] for k in np.flatnonzero(f1_scored & ~kept)]}
    out["min_positive_patients"] = int(max(1, min_positive_patients))
    out["auroc_kind"] = "one-vs-rest"
    out["threshold"] = THRESHOLD
    return out


def patient_resample_weights(patient_ids: Sequence, n_resamples: int,
                             rng: np.random.Generator) -> np.ndarray:
    """Row multiplicities of `n_resamples` bootstrap resamples of PATIENTS: (n,) ids -> (B, n).

    Each resample draws as many patients as there are, with replacement; every row of a patient
    gets the number of times that patient was drawn (all its rows move together).
    """
    _, patient = np.unique(np.asarray(patient_ids), return_inverse=True)
    n_patients = patient.max() + 1
    # times each patient is drawn in n_patients draws with replacement: (B, n_patients)
    counts = rng.multinomial(n_patients, np.full(n_patients, 1 / n_patients), size=n_resamples)
    return counts[:, patient.ravel()].astype(float)


def _weighted_macro_f1(y: np.ndarray, pred: np.ndarray, w: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Macro F1 of weighted copies: y, pred (n, K) bool; w (B, n) -> (B,), over the classes with a
    positive in the unweighted set (and in `keep`); NaN where one of them has no positive in a copy."""
    cls = y.any(0) & (True if keep is None else keep)
    if not cls.any():
        return np.full(len(w), np.nan)
    y, pred = y[:, cls], pred[:, cls]
    tp, fp, fn = w @ (y & pred), w @ (~y & pred), w @ (y & ~pred)
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = np.where(tp + fn > 0, 2 * tp / (2 * tp + fp + fn), np.nan)
    return f1.mean(1)


def _weighted_auroc(y: np.ndarray, score: np.ndarray, w: np.ndarray) -> np.ndarray:
    """AUROC of one class in weighted copies: y (n,) bool, score (n,), w (B, n) -> (B,), NaN where a
    copy has no positive or no negative. The Mann-Whitney form: P(score_pos > score_neg) + half
    the ties, each pair weighted by its rows' multiplicities (what roc_auc_score gives on the
    materialised copy; scikit-learn per resample costs 3 ms per class, ~80 s for Ningbo)."""
    order = np.argsort(score, kind="stable")
    s, y = score[order], y[order]
    tie_starts = np.flatnonzero(np.r_[True, s[1:] != s[:-1]])
    w = w[:, order]
    pos = np.add.reduceat(w * y, tie_starts, axis=1)      # (B, groups of equal score)
    neg = np.add.reduceat(w * ~y, tie_starts, axis=1)
    below = np.cumsum(neg, axis=1) - neg                   # negative weight strictly below each group
    with np.errstate(invalid="ignore", divide="ignore"):
        return (pos * (below + 0.5 * neg)).sum(1) / (pos.sum(1) * neg.sum(1))


def resample_metrics(y: np.ndarray, probs: np.ndarray, multilabel: bool,
                     weights: np.ndarray, keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The headline metrics of B weighted copies of the evaluated set, vectorised.

    y: (n, K) bool; probs: (n, K); weights: (B, n) row multiplicities. Copy b is the set with row
    i repeated weights[b, i] times; its acc/f1/f1_argmax/auroc are what classification_metrics
    gives on it (tests check this), over the classes scored on the unweighted set: a copy in
    which one of those cannot be scored gets NaN for that metric (a different class set would
    be a different quantity); keep (K,) bool: the classes the macro means may hold (`kept_classes`;
    None: all). -> {metric: (B,)}.
    """
    y, w = np.asarray(y, dtype=bool), np.asarray(weights, dtype=float)
    pred = probs >= THRESHOLD
    out = {}
    if multilabel:
        out["acc"] = w @ (pred == y).mean(1) / w.sum(1)
    else:
        argmax = probs.argmax(1)
        out["acc"] = w @ (argmax == y.argmax(1)) / w.sum(1)
        out["f1_argmax"] = _weighted_macro_f1(y, np.eye(y.shape[1], dtype=bool)[argmax], w, keep)
    out["f1"] = _weighted_macro_f1(y, pred, w, keep)
    scored = [k for k in range(y.shape[1]) if 0 < y[:, k].sum() < len(y) and (keep is None or keep[k])]
    out["auroc"] = (np.mean([_weighted_auroc(y[:, k], probs[:, k], w) for k in scored], axis=0)
                    if scored else np.full(len(w), np.nan))
    return out


def bootstrap_ci(y: np.ndarray, probs: np.ndarray, patient_ids: Sequence, multilabel: bool,
                 class_names: Sequence[str], n_resamples: int = 1000, seed: int = 0,
                 level: float = 0.95, min_positive_patients: int = 1) -> dict[str, dict]:
    """Percentile bootstrap intervals of acc, f1, f1_argmax (single-label) and auroc, resampling
    patients (all rows of a drawn patient move together; one drawn twice counts twice).

    y, probs: (n, K) as for classification_metrics, one row per record; patient_ids: (n,).
    -> {metric: {"low", "high", "undefined_resamples"}}: resamples where the metric is undefined
    (a class scored on the full set has no positive, or for AUROC no negative) are skipped and
    counted; low/high are None when every resample is. Deterministic for a seed (numpy Generator).
    Time: 1,000 resamples of 3,000 records from 1,500 patients take about 1.1 s single-label
    (9 classes) and 2.6 s multi-label (25 classes) on one CPU thread (`OMP_NUM_THREADS=1 python
    bench/bootstrap_ci.py`); scikit-learn per resample would take ~80 s for the multi-label case.
    """
    y, probs = _checked(y, probs, multilabel, class_names)
    if len(patient_ids) != len(y):
        raise ValueError(f"{len(patient_ids)} patient ids for {len(y)} rows")
    if n_resamples < 1 or not 0 < level < 1:
        raise ValueError(f"need n_resamples >= 1 and 0 < level < 1, got {n_resamples} and {level}")
    rng = np.random.default_rng(seed)
    keep = kept_classes(y, patient_ids, min_positive_patients)
    chunks = []
    for start in range(0, n_resamples, BOOTSTRAP_CHUNK):
        w = patient_resample_weights(patient_ids, min(BOOTSTRAP_CHUNK, n_resamples - start), rng)
        chunks.append(resample_metrics(y, probs, multilabel, w, keep))
    out = {}
    for metric in chunks[0]:
        values = np.concatenate([c[metric] for c in chunks])
        ok = values[~np.isnan(values)]
        low, high = None, None
        if len(ok):
            low, high = (float(q) for q in np.quantile(ok, [(1 - level) / 2, (1 + level) / 2]))
        out[metric] = {"low": low, "high": high, "undefined_resamples": int(len(values) - len(ok))}
    return out
