"""Per-layer linear probes: the probe of coreecg.eval.probe (logistic regression on standardised
features) fitted on every block's pooled features (coreecg.model.layer_features) of a frozen
encoder, on a labelled corpus's train split; each layer scored on val and test as downstream
scores a model (coreecg.eval.downstream): the crop rule's evaluation crops (the mean over a
window's crops of its features), a record's probabilities the mean over its windows, macro AUROC
with patient-bootstrap intervals on test. The best layer is chosen by val macro AUROC only;
test chooses nothing. Intermediate layers often probe better than the last (ECG-Soup 2025).

A regression task's corpus (coreecg.data.tasks: age, ...) gets a ridge regression per layer instead
(RidgeCV over RIDGE_ALPHAS on standardised features; the target standardised by the train split's
record-level mean and SD, as fine-tuning's scaler, and predictions mapped back to its unit),
scored as downstream scores a regression (MAE, RMSE, R2, r; patient-bootstrap intervals on
test); the best layer is the lowest val MAE. Its record-level predictions of every layer are in
the result's "predictions" (layer_predictions.csv).

Deterministic for a fixed encoder: eval mode, fixed crops, lbfgs logistic regression (no random
state), RidgeCV's closed form and a seeded bootstrap.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from sklearn.linear_model import RidgeCV
from sklearn.preprocessing import StandardScaler

from coreecg.config import STANDARD_LEADS
from coreecg.data.corpus import load_manifest
from coreecg.eval.downstream import (EvalSplit, RecordScores, crop_rule, eval_offsets, load_split, score,
                                     score_regression, to_records)
from coreecg.eval.figures import layer_probe_figure, save_figure
from coreecg.eval.metrics import aggregate_by_record
from coreecg.eval.probe import ProbeSplit, probe_probabilities
from coreecg.model.layer_features import n_layers, pooled_layers
from coreecg.model.padding import padding_mask
from coreecg.data.tasks import corpus_task, is_regression

SPLITS = ("train", "val", "test")
COLUMNS = ("layer", "val_auroc", "test_auroc", "low", "high")
REGRESSION_COLUMNS = ("layer", "val_mae", "test_mae", "low", "high")
RIDGE_ALPHAS = (0.1, 1.0, 10.0, 100.0, 1000.0, 10000.0)


def lead_index(leads: Sequence[str], device: torch.device) -> torch.Tensor | None:
    """The standard-lead index of each stored row (None: a row not among the standard leads, so
    the encoder's default, the first C standard leads)."""
    if leads and all(x in STANDARD_LEADS for x in leads):
        return torch.tensor([STANDARD_LEADS.index(x) for x in leads], device=device)
    return None


@torch.no_grad()
def layer_embeddings(encoder: torch.nn.Module, signal: np.ndarray, crop: int, n_crops: int, device: torch.device,
                     lead_idx: torch.Tensor | None = None, batch_size: int = 128) -> list[np.ndarray]:
    """Every layer's features of every window under the crop rule: signal (n, C, T) any float dtype
    -> n_layers arrays (n, D_layer) float32 (half of float64's memory: a deep CNN has many wide
    layers), each the mean over the window's `n_crops` evaluation crops (a crop without a whole
    real patch weighs 0, as downstream's crop_features). The crops of a batch go through the
    encoder together, once for all layers; eval mode."""
    offsets = eval_offsets(signal.shape[-1], crop, n_crops)
    was_training = encoder.training
    encoder.eval()
    out: list[list[torch.Tensor]] = [[] for _ in range(n_layers(encoder))]
    for i in range(0, len(signal), batch_size):
        x = torch.from_numpy(signal[i:i + batch_size]).to(device, torch.float32)
        b = len(x)
        views = torch.cat([x[..., o:o + crop] for o in offsets])                    # (n_crops * b, C, crop)
        scored = (~padding_mask(views, encoder.patch_size)).any(dim=2).any(dim=1)
        w = scored.float().view(len(offsets), b, 1)
        w = w / w.sum(0, keepdim=True).clamp_min(1.0)
        for layer, f in zip(out, pooled_layers(encoder, views, lead_idx)):
            layer.append((f.float().view(len(offsets), b, -1) * w).sum(0).cpu())
    encoder.train(was_training)
    return [torch.cat(f).numpy() for f in out]


def _probe_split(split: EvalSplit) -> ProbeSplit:
    """The probe's view of an evaluation split: its first class per window (-1: none)."""
    multihot = split.multihot.astype(np.float32)
    label = np.where(multihot.any(1), multihot.argmax(1), -1).astype(np.int64)
    return ProbeSplit(split.signal, multihot, label)


def load_corpus(corpus: str | Path) -> tuple[dict, dict[str, EvalSplit]]:
    """(manifest, train/val/test splits' labelled windows); ValueError naming the corpus when it
    has no labels or a split has no labelled window."""
    manifest = load_manifest(corpus)
    if not manifest["class_names"]:
        raise ValueError(f"{corpus}: the corpus has no labels (class_names is empty); a probe needs labels")
    splits = {s: load_split(corpus, s) for s in SPLITS}
    empty = [s for s, d in splits.items() if not len(d.signal)]
    if empty:
        raise ValueError(f"{corpus}: no labelled windows in split(s) {', '.join(empty)}")
    return manifest, splits


def probe_layers(encoder: torch.nn.Module, corpus: str | Path, crop: int, n_crops: int, device: torch.device,
                 n_resamples: int = 1000, seed: int = 0, min_positive_patients: int = 1,
                 batch_size: int = 128) -> dict:
    """Fit a probe per layer on train, score it on val and test -> a JSON-ready dict: layers
    [{layer (1-based block), dim, val_auroc, test_auroc, low, high (test's 95 % patient-bootstrap
    interval)}], best_layer (highest val macro AUROC; the first of ties), its scores, and the
    settings (corpus, classes, crop_rule, bootstrap). A regression task's corpus: a ridge per
    layer, rows of val_mae, test_mae, low, high (test MAE's interval) and the other metrics,
    best_layer the lowest val MAE, and "predictions" (every layer's record-level val and test
    predictions, in the target's unit)."""
    manifest, splits = load_corpus(corpus)
    class_names, multilabel = list(manifest["class_names"]), bool(manifest["multilabel"])
    lead_idx = lead_index(tuple(manifest["signal"]["leads"]), device)
    feats = {s: layer_embeddings(encoder, d.signal, crop, n_crops, device, lead_idx, batch_size)
             for s, d in splits.items()}
    if is_regression(manifest):
        return _probe_layers_regression(manifest, corpus, splits, feats, crop, n_crops, n_resamples, seed)
    train = _probe_split(splits["train"])
    rows = []
    for i, train_x in enumerate(feats["train"]):
        scores = {}
        for s in ("val", "test"):
            probs = probe_probabilities(train_x, train, feats[s][i], multilabel)
            records = to_records(splits[s], probs, feats[s][i])
            scores[s] = score(records, multilabel, class_names, n_resamples if s == "test" else 0, seed,
                              min_positive_patients)
        ci = (scores["test"].get("ci") or {}).get("auroc") or {}
        rows.append({"layer": i + 1, "dim": int(train_x.shape[1]), "val_auroc": scores["val"]["auroc"],
                     "test_auroc": scores["test"]["auroc"], "low": ci.get("low"), "high": ci.get("high")})
    best = best_layer(rows)
    return {"corpus": str(corpus), "class_names": class_names, "multilabel": multilabel,
            "n_layers": len(rows), "layers": rows, "best_layer": best,
            "best": next(r for r in rows if r["layer"] == best), "best_by": "val macro AUROC",
            "last": rows[-1], "windows": {s: int(len(d.signal)) for s, d in splits.items()},
            "crop_rule": crop_rule(splits["train"].signal.shape[-1], crop, n_crops),
            "bootstrap_resamples": n_resamples, "seed": seed, "min_positive_patients": min_positive_patients}


def _records_target_scaler(split: EvalSplit) -> tuple[float, float]:
    """(mean, SD with ddof 1) of a regression split's targets, one value per record (fine-tuning's
    target scaler, coreecg.train.finetune_plan); ValueError when they are constant."""
    _, y = aggregate_by_record(split.record_id, split.target.astype(np.float64))
    sd = float(y.std(ddof=1)) if len(y) > 1 else 0.0
    if not sd > 0:
        raise ValueError(f"the train split's target is constant ({len(y)} record(s)): a regression needs targets "
                         "that vary")
    return float(y.mean()), sd


def ridge_predictions(train_x: np.ndarray, train_y: np.ndarray, eval_x: Sequence[np.ndarray],
                      mean: float, sd: float) -> tuple[list[np.ndarray], float]:
    """The regression probe: RidgeCV (RIDGE_ALPHAS, efficient leave-one-out) on standardised
    features fitted to the standardised target (train_y - mean) / sd -> (each eval_x's predictions
    (n,) in the target's unit, the chosen alpha)."""
    scaler = StandardScaler().fit(train_x)
    ridge = RidgeCV(alphas=RIDGE_ALPHAS).fit(scaler.transform(train_x), (train_y.astype(np.float64) - mean) / sd)
    return [ridge.predict(scaler.transform(x)) * sd + mean for x in eval_x], float(ridge.alpha_)


def _probe_layers_regression(manifest: dict, corpus: str | Path, splits: dict[str, EvalSplit],
                             feats: dict[str, list[np.ndarray]], crop: int, n_crops: int, n_resamples: int,
                             seed: int) -> dict:
    task = corpus_task(manifest)
    unit = str(task.get("unit", ""))
    mean, sd = _records_target_scaler(splits["train"])
    rows, predictions = [], {}
    for i, train_x in enumerate(feats["train"]):
        preds, alpha = ridge_predictions(train_x, splits["train"].target, [feats["val"][i], feats["test"][i]],
                                         mean, sd)
        scores = {}
        for s, pred in zip(("val", "test"), preds):
            records = to_records(splits[s], pred[:, None], feats[s][i])
            scores[s] = score_regression(records, sd, unit, n_resamples if s == "test" else 0, seed)
            _add_predictions(predictions, s, records)
        ci = (scores["test"].get("ci") or {}).get("mae") or {}
        rows.append({"layer": i + 1, "dim": int(train_x.shape[1]), "alpha": alpha,
                     "val_mae": scores["val"]["mae"], "test_mae": scores["test"]["mae"],
                     "low": ci.get("low"), "high": ci.get("high"),
                     **{f"{s}_{k}": scores[s][k] for s in ("val", "test") for k in ("rmse", "r2", "pearson_r")}})
    best = best_layer(rows, "val_mae", lower=True)
    return {"corpus": str(corpus), "class_names": list(manifest["class_names"]), "multilabel": False,
            "task": {"name": task.get("name"), "kind": "regression", "unit": unit},
            "target_scaler": {"mean": mean, "sd": sd}, "metric": "mae",
            "n_layers": len(rows), "layers": rows, "best_layer": best,
            "best": next(r for r in rows if r["layer"] == best), "best_by": "val MAE (lower is better)",
            "last": rows[-1], "windows": {s: int(len(d.signal)) for s, d in splits.items()},
            "crop_rule": crop_rule(splits["train"].signal.shape[-1], crop, n_crops),
            "ridge_alphas": list(RIDGE_ALPHAS), "bootstrap_resamples": n_resamples, "seed": seed,
            "predictions": predictions}


def _add_predictions(predictions: dict, split: str, records: RecordScores) -> None:
    """Collect a split's record-level predictions: record_id, patient_id, target once, then one
    list per layer."""
    p = predictions.setdefault(split, {"record_id": list(records.record_id),
                                       "patient_id": [str(x) for x in records.patient_id],
                                       "target": [float(v) for v in records.y[:, 0]], "layers": []})
    p["layers"].append([float(v) for v in records.probs[:, 0]])


def best_layer(rows: Sequence[dict], key: str = "val_auroc", lower: bool = False) -> int:
    """The layer with the highest `key` (the lowest with `lower`: an error such as val_mae; None
    and NaN never win; the first of ties); ValueError when no layer has a score."""
    scored = [r for r in rows if r[key] is not None and not np.isnan(r[key])]
    if not scored:
        raise ValueError(f"no layer has a {key} (a split lacks a class that can be scored)")
    pick = min if lower else max
    return pick(scored, key=lambda r: r[key])["layer"]


def write_results(result: dict, output: str | Path) -> dict[str, Path]:
    """`probe_layers`'s result into `output`: layer_probe.json (all of it but the predictions),
    layer_probe.csv (one row per layer: COLUMNS, or REGRESSION_COLUMNS for a regression task, empty
    where a score is undefined), figures/layer_probe.png and, for a regression task,
    layer_predictions.csv (split, record_id, patient_id, target, layer_1 ... layer_L: every layer's
    record-level prediction in the target's unit)."""
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "layer_probe.json", "csv": out / "layer_probe.csv",
             "figure": out / "figures" / "layer_probe.png"}
    predictions = result.get("predictions")
    summary = {k: v for k, v in result.items() if k != "predictions"}
    paths["json"].write_text(json.dumps(summary, indent=2) + "\n")
    columns = REGRESSION_COLUMNS if result.get("metric") == "mae" else COLUMNS
    with open(paths["csv"], "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in result["layers"]:
            w.writerow(["" if r[k] is None else (r[k] if k == "layer" else f"{r[k]:.6f}") for k in columns])
    if predictions:
        paths["predictions"] = out / "layer_predictions.csv"
        with open(paths["predictions"], "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["split", "record_id", "patient_id", "target",
                        *(f"layer_{r['layer']}" for r in result["layers"])])
            for s, p in predictions.items():
                for j, rid in enumerate(p["record_id"]):
                    w.writerow([s, rid, p["patient_id"][j], f"{p['target'][j]:.8g}",
                                *(f"{layer[j]:.8g}" for layer in p["layers"])])
    save_figure(layer_probe_figure(result), paths["figure"])
    return paths
