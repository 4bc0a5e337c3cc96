"""Regression metrics (coreecg.data.tasks, kind "regression") on top of scikit-learn and SciPy, with
patient-bootstrap intervals.

Definitions (docs/tasks.md), one value per record (the mean over its windows' predictions):
MAE in the target's unit and in SD units (MAE / the train split's target SD, the scaler's: the
ecg-fm-benchmarking convention, so tasks of other units sit in one table), RMSE, R² (1 - SSE/SST
about the evaluated set's own mean, scikit-learn's r2_score) and Pearson's r. Lower MAE and RMSE
are better; higher R² and r.

Intervals: the percentile bootstrap over patients (every record of a drawn patient moves with it),
as for the label metrics (coreecg.eval.metrics.patient_resample_weights), vectorised over weighted
copies: copy b repeats record i weights[b, i] times, and its metrics are what the point estimates
give on that materialised copy (tests check this).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from coreecg.eval.metrics import BOOTSTRAP_CHUNK, patient_resample_weights

# Lazy imports: scikit-learn and SciPy (the `ray` extra), where a metric is scored.

METRICS = ("mae", "mae_sd", "rmse", "r2", "pearson_r")
LOWER_IS_BETTER = ("mae", "mae_sd", "rmse")


def _checked(y, pred) -> tuple[np.ndarray, np.ndarray]:
    y, pred = np.asarray(y, dtype=float).reshape(-1), np.asarray(pred, dtype=float).reshape(-1)
    if y.shape != pred.shape or not len(y):
        raise ValueError(f"need targets and predictions of one shape (n > 0); got {y.shape} and {pred.shape}")
    if not (np.isfinite(y).all() and np.isfinite(pred).all()):
        raise ValueError("targets and predictions must be finite (a missing target is left out, never scored)")
    return y, pred


def regression_metrics(y: np.ndarray, pred: np.ndarray, sd: float, unit: str = "",
                       patient_ids: Sequence | None = None) -> dict:
    """y, pred: (n,) targets and predictions in the target's unit, one per record; sd: the train
    split's target SD (MAE in SD units). -> {n, patients, mae, mae_sd, rmse, r2, pearson_r, unit,
    target_mean, target_sd (of the evaluated set), sd_units_of}; r2 and pearson_r None where the
    evaluated targets are constant."""
    from scipy.stats import pearsonr
    from sklearn.metrics import mean_absolute_error, mean_squared_error, r2_score

    y, pred = _checked(y, pred)
    constant = bool(np.all(y == y[0]))
    out = {"n": int(len(y)), "mae": float(mean_absolute_error(y, pred)),
           "rmse": float(np.sqrt(mean_squared_error(y, pred))),
           "r2": None if constant or len(y) < 2 else float(r2_score(y, pred)),
           "pearson_r": (None if constant or len(y) < 2 or np.all(pred == pred[0])
                         else float(pearsonr(y, pred).statistic))}
    out["mae_sd"] = out["mae"] / sd
    out.update(unit=unit, target_mean=float(y.mean()), target_sd=float(y.std(ddof=1)) if len(y) > 1 else 0.0,
               sd_units_of=float(sd))
    if patient_ids is not None:
        out["patients"] = int(len(np.unique(np.asarray(patient_ids))))
    return out


def resample_regression(y: np.ndarray, pred: np.ndarray, sd: float, weights: np.ndarray) -> dict[str, np.ndarray]:
    """The metrics of B weighted copies: y, pred (n,); weights (B, n) -> {metric: (B,)} (NaN for
    R² and r in a copy whose targets or predictions are constant)."""
    w = np.asarray(weights, dtype=float)
    total = w.sum(1)
    err = pred - y
    mae = w @ np.abs(err) / total
    mse = w @ err ** 2 / total
    my, mp = w @ y / total, w @ pred / total
    dy, dp = y[None, :] - my[:, None], pred[None, :] - mp[:, None]
    sst, vp = (w * dy ** 2).sum(1), (w * dp ** 2).sum(1)
    cov = (w * dy * dp).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r2 = np.where(sst > 0, 1 - mse * total / sst, np.nan)
        r = np.where((sst > 0) & (vp > 0), cov / np.sqrt(sst * vp), np.nan)
    return {"mae": mae, "mae_sd": mae / sd, "rmse": np.sqrt(mse), "r2": r2, "pearson_r": r}


def regression_bootstrap_ci(y: np.ndarray, pred: np.ndarray, patient_ids: Sequence, sd: float,
                            n_resamples: int = 1000, seed: int = 0, level: float = 0.95) -> dict[str, dict]:
    """Percentile intervals of every metric, resampling patients -> {metric: {low, high,
    undefined_resamples}} (the label metrics' form, coreecg.eval.metrics.bootstrap_ci).
    Deterministic for a seed."""
    y, pred = _checked(y, pred)
    if len(patient_ids) != len(y):
        raise ValueError(f"{len(patient_ids)} patient ids for {len(y)} rows")
    if n_resamples < 1 or not 0 < level < 1:
        raise ValueError(f"need n_resamples >= 1 and 0 < level < 1, got {n_resamples} and {level}")
    rng = np.random.default_rng(seed)
    chunks = []
    for start in range(0, n_resamples, BOOTSTRAP_CHUNK):
        w = patient_resample_weights(patient_ids, min(BOOTSTRAP_CHUNK, n_resamples - start), rng)
        chunks.append(resample_regression(y, pred, sd, w))
    out = {}
    for metric in METRICS:
        values = np.concatenate([c[metric] for c in chunks])
        ok = values[~np.isnan(values)]
        low = high = None
        if len(ok):
            low, high = (float(q) for q in np.quantile(ok, [(1 - level) / 2, (1 + level) / 2]))
        out[metric] = {"low": low, "high": high, "undefined_resamples": int(len(values) - len(ok))}
    return out
