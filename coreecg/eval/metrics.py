"""Classification metrics on top of scikit-learn, with classes that cannot be scored made explicit.

A class with no positive (or no negative) in the evaluated set has no AUROC: it is listed
and left out of the macro mean, never averaged in as 0 or 0.5.
"""
from __future__ import annotations

import numpy as np
from sklearn.metrics import roc_auc_score


def per_class_auroc(y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """One-vs-rest AUROC per class. y: (n, K) {0, 1}; scores: (n, K). -> (K,), NaN where undefined."""
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
