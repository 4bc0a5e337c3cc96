"""Downstream evaluation of a `Classifier` on a corpus split: the crop rule, window -> record
aggregation, the paper's metrics with patient-bootstrap CIs, and predictions.csv.

The crop rule (one rule for every method and mode): a stored window has T samples and the model
takes `crop`; each window is scored by the mean of the logits of `n` evenly spaced crops (offsets
round(linspace(0, T - crop, n)); n = 1 is the centre crop), turned into probabilities (softmax
for single-label, sigmoid for multi-label). A record's probabilities are the mean over its
windows, so a record with several windows (ICBEB2018, Ningbo) counts once.
A short record's window (NaN padding after its real samples, docs/data_pipeline.md "Short
records"): each crop is scored on its real patches only (the encoder's padding mask), and a crop
without a single whole real patch is not scored (weight 0 in the mean over crops; with offsets
at most T - crop and records of at least one patch this cannot drop every crop of a window).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import pandas as pd

from coreecg.data.corpus import load_manifest
from coreecg.data.reading import read_split, split_rows
from coreecg.eval.metrics import aggregate_by_record, bootstrap_ci, classification_metrics
from coreecg.eval.regression import regression_bootstrap_ci, regression_metrics
from coreecg.data.tasks import is_regression
from coreecg.model.padding import padding_mask
from coreecg.devices import autocast, model_dtype


def eval_offsets(stored: int, crop: int, n: int) -> list[int]:
    """Start offsets of the evaluation crops of a `stored`-sample window."""
    if crop > stored:
        raise ValueError(f"cannot crop {crop} samples from windows of {stored}")
    if n == 1 or crop == stored:     # the whole window: n identical crops would cost n times one
        return [(stored - crop) // 2]
    return [int(v) for v in np.round(np.linspace(0, stored - crop, n))]


def crop_rule(stored: int, crop: int, n: int) -> str:
    """The rule in words, as metrics.json records it."""
    offsets = eval_offsets(stored, crop, n)
    return (f"mean of the logits of {len(offsets)} evenly spaced {crop}-sample crops of each {stored}-sample window "
            f"(offsets {offsets}); softmax (single-label) or sigmoid (multi-label) of "
            "that mean; a record's probabilities are the mean over its windows")


@dataclass
class EvalSplit:
    """One split's labelled windows: signal (n, C, T) stored dtype (float16), record_id, patient_id
    (n,), multihot (n, K) float32; `unlabelled` windows were skipped."""

    name: str
    signal: np.ndarray
    record_id: np.ndarray
    patient_id: np.ndarray
    multihot: np.ndarray
    unlabelled: int
    uid: np.ndarray | None = None       # (n,) int64: the windows' row ids in the split
    target: np.ndarray | None = None    # (n,) float32: a regression task's values (coreecg.data.tasks), else None


def load_split(corpus: str | Path, split: str) -> EvalSplit:
    """A split's labelled windows, kept in the stored dtype (half the memory of float32); a
    regression task's corpus adds its targets."""
    regression = is_regression(load_manifest(corpus))
    d = read_split(corpus, split, ["record_id", "patient_id", "labels", "signal", *(["target"] * regression)],
                   labelled_only=True, as_stored=True)
    return EvalSplit(split, d["signal"], d["record_id"], d["patient_id"], d["multihot"],
                     split_rows(corpus, split) - len(d["uid"]), d["uid"], d.get("target"))


@torch.no_grad()
def predict(model: torch.nn.Module, signal: np.ndarray, lead_rows: Sequence[int], crop: int, n_crops: int,
            device: torch.device, batch_size: int = 128, precision: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """Window probabilities and features of a `Classifier` under the crop rule.

    signal: (n, C_stored, T) -> (probs (n, K) float64, features (n, D) float32: the mean over
    crops of the pooled features, for t-SNE and the linear probe's cached features). The crops
    of a batch go through the model together.
    """
    offsets = eval_offsets(signal.shape[-1], crop, n_crops)
    rows = torch.as_tensor(list(lead_rows))
    was_training = model.training
    model.eval()
    probs, feats = [], []
    for i in range(0, len(signal), batch_size):
        x = torch.from_numpy(signal[i:i + batch_size]).to(device)[:, rows.to(device)]
        f, logits = crop_features(model, x, offsets, crop, precision)
        probs.append(model.probabilities(logits).double().cpu())
        feats.append(f.cpu())
    model.train(was_training)
    return torch.cat(probs).numpy(), torch.cat(feats).numpy()


def crop_features(model: torch.nn.Module, x: torch.Tensor, offsets: Sequence[int], crop: int,
                  precision: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The crop rule on one batch: x (b, len(leads), T) any float dtype, on the model's device ->
    (features (b, D) float32, logits (b, K) float32), each the weighted mean over the crops at
    `offsets` (a crop without a whole real patch weighs 0). No gradients reach the encoder when it
    is frozen; the caller chooses the model's mode (predict: eval)."""
    # float32, or the model's own dtype (a bf16 copy: coreecg.inference.precision)
    x, b = x.to(model_dtype(model)), len(x)
    views = torch.cat([x[..., o:o + crop] for o in offsets])             # (n_crops * b, C, crop)
    with autocast(precision, x.device):
        f = model.features(views)
        logits = model.head(f)
    # a crop holding no whole real patch of a short record is not scored
    scored = (~padding_mask(views, model.encoder.patch_size)).any(dim=2).any(dim=1)
    w = scored.float().view(len(offsets), b, 1)
    w = w / w.sum(0, keepdim=True).clamp_min(1.0)
    return (f.float().view(len(offsets), b, -1) * w).sum(0), (logits.float().view(len(offsets), b, -1) * w).sum(0)


@torch.no_grad()
def predict_features(model: torch.nn.Module, features: torch.Tensor, batch_size: int = 4096) -> np.ndarray:
    """Window probabilities of a mean-pooling `Classifier` from its cached window features
    (`predict`'s second output): its head is affine, so head(mean of the crops' features) is
    the mean of the crops' logits, i.e. `predict`'s probabilities up to float rounding."""
    out = [model.probabilities(model.head(features[i:i + batch_size].float())).double().cpu()
           for i in range(0, len(features), batch_size)]
    return torch.cat(out).numpy() if out else np.zeros((0, model.head.out_features))


@dataclass
class RecordScores:
    """Record-level view of a split: ids (m,), patient ids (m,), y (m, K) {0, 1}, probs (m, K),
    features (m, D) (mean over the record's windows)."""

    record_id: list[str]
    patient_id: np.ndarray
    y: np.ndarray
    probs: np.ndarray
    features: np.ndarray


def to_records(split: EvalSplit, probs: np.ndarray, features: np.ndarray) -> RecordScores:
    """Mean over each record's windows (labels, and a regression target, are equal over a record's
    windows). A regression split's y is (m, 1) float: the targets; probs its predictions."""
    ids, p = aggregate_by_record(split.record_id, probs)
    _, y = aggregate_by_record(split.record_id, split.multihot if split.target is None else split.target[:, None])
    _, f = aggregate_by_record(split.record_id, features)
    first = {r: i for i, r in reversed(list(enumerate(split.record_id)))}
    patients = np.asarray([split.patient_id[first[r]] for r in ids])
    y = (y > 0.5).astype(np.int64) if split.target is None else y.reshape(len(ids), -1)
    return RecordScores(ids, patients, y, p, f.astype(np.float32))


def score_regression(records: RecordScores, sd: float, unit: str = "", n_resamples: int = 0,
                     seed: int = 0) -> dict:
    """regression_metrics of a regression split's records (+ "ci": patient-bootstrap intervals)."""
    y, pred = records.y[:, 0], records.probs[:, 0]
    out = regression_metrics(y, pred, sd, unit, records.patient_id)
    if n_resamples:
        out["ci"] = regression_bootstrap_ci(y, pred, records.patient_id, sd, n_resamples=n_resamples, seed=seed)
    return out


def score(records: RecordScores, multilabel: bool, class_names: Sequence[str], n_resamples: int = 0,
          seed: int = 0, min_positive_patients: int = 1) -> dict:
    """classification_metrics (+ "ci": patient-bootstrap 95 % intervals when n_resamples > 0); a
    class with fewer than `min_positive_patients` positive patients is left out of the macro means
    (report.min_positive_patients; classes_left_out["rare"])."""
    out = classification_metrics(records.y, records.probs, multilabel, class_names, records.patient_id,
                                 min_positive_patients)
    out["patients"] = int(len(np.unique(records.patient_id)))
    if n_resamples:
        out["ci"] = bootstrap_ci(records.y, records.probs, records.patient_id, multilabel, class_names,
                                 n_resamples=n_resamples, seed=seed, min_positive_patients=min_positive_patients)
    return out


def write_predictions(path: str | Path, records: RecordScores, class_names: Sequence[str],
                      regression: bool = False) -> Path:
    """One row per record: record_id, patient_id, labels (true class names joined by "|"), then
    p_<class> per class: enough to recompute every metric. A regression task's: record_id,
    patient_id, target, prediction (both in the target's unit)."""
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if regression:
            w.writerow(["record_id", "patient_id", "target", "prediction"])
            for rid, pid, y, p in zip(records.record_id, records.patient_id, records.y, records.probs):
                w.writerow([rid, pid, f"{y[0]:.8g}", f"{p[0]:.8g}"])
            return path
        w.writerow(["record_id", "patient_id", "labels", *(f"p_{c}" for c in class_names)])
        for rid, pid, y, p in zip(records.record_id, records.patient_id, records.y, records.probs):
            w.writerow([rid, pid, "|".join(c for c, v in zip(class_names, y) if v),
                        *(f"{v:.8g}" for v in p)])
    return path


def read_predictions(path: str | Path, class_names: Sequence[str]) -> RecordScores:
    """predictions.csv -> RecordScores (features empty): to recompute metrics from the file."""
    table = pd.read_csv(path, dtype={"record_id": str, "patient_id": str, "labels": str}, keep_default_na=False)
    y = np.zeros((len(table), len(class_names)), dtype=np.int64)
    index = {c: k for k, c in enumerate(class_names)}
    for i, labels in enumerate(table["labels"]):
        for c in filter(None, labels.split("|")):
            y[i, index[c]] = 1
    probs = table[[f"p_{c}" for c in class_names]].to_numpy(dtype=float)
    return RecordScores(list(table["record_id"]), table["patient_id"].to_numpy(), y, probs,
                        np.zeros((len(table), 0), np.float32))
