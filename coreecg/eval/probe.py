"""The in-loop representation probe: frozen mean-pooled embeddings of a labelled corpus, a
logistic regression fitted on labelled windows of its train split, macro AUROC on its val split.

`probe_auroc` is a few-label probe: the mean over `subsets` disjoint, class-stratified subsets
of `per_class` train windows per class, each scored on the whole val split. With every label a
logistic regression on a randomly initialised encoder's features is already near the ceiling
on easy tasks (0.987 macro AUROC on the synthetic corpus), so the full-label score cannot tell a
pretrained encoder from a random one; with 10 labels per class it can (docs/decisions.md), which
is what a sweep objective needs. `probe_auroc_full` (every probe train window) is reported too.

Deterministic for a fixed encoder: a fixed, evenly spaced subset of windows (at most
`max_windows` per split), fixed subsets, the centre crop, eval mode, and lbfgs logistic
regression (no random state involved). Sweeps optimise `probe_auroc`, so it must not wobble.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.multiclass import OneVsRestClassifier
from sklearn.preprocessing import StandardScaler

from coreecg.config import STANDARD_LEADS
from coreecg.data.corpus import load_manifest
from coreecg.data.reading import read_split
from coreecg.eval.metrics import macro_auroc


@dataclass
class ProbeSplit:
    windows: np.ndarray      # (n, C, T_stored) float32
    multihot: np.ndarray     # (n, K) float32
    label: np.ndarray        # (n,) int64 first class


@dataclass
class ProbeData:
    train: ProbeSplit
    val: ProbeSplit
    class_names: list[str]
    multilabel: bool
    corpus: str
    leads: tuple[str, ...] = ()   # the corpus's lead names: each row's lead embedding (empty: the first C)


def load_probe_data(path: str | Path, max_windows: int) -> ProbeData:
    """The probe's windows from a labelled corpus (ValueError if it has no labels or splits)."""
    manifest = load_manifest(path)
    if not manifest["class_names"]:
        raise ValueError(f"probe corpus {path} has no labels (class_names is empty)")
    splits = {}
    for split in ("train", "val"):
        d = read_split(path, split, ["labels", "signal"], max_windows=max_windows, labelled_only=True,
                       manifest=manifest)
        if len(d["signal"]) < 2:
            raise ValueError(f"probe corpus {path}: fewer than 2 labelled {split} windows")
        splits[split] = ProbeSplit(d["signal"], d["multihot"], d["label"])
    return ProbeData(splits["train"], splits["val"], list(manifest["class_names"]),
                     bool(manifest["multilabel"]), str(path), tuple(manifest["signal"]["leads"]))


def center_crop(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, C, T) -> (B, C, length), the middle `length` samples."""
    start = (x.shape[-1] - length) // 2
    return x[..., start:start + length]


@torch.no_grad()
def embed(encoder: torch.nn.Module, windows: np.ndarray, crop: int, device: torch.device,
          batch_size: int = 128, leads: tuple[str, ...] = ()) -> np.ndarray:
    """Mean-pooled encoder features of every window (centre crop): (n, C, T) -> (n, D) float64.
    leads: the rows' lead names (a reduced-lead corpus feeds each row its own lead's embedding);
    empty: the first C standard leads."""
    was_training = encoder.training
    encoder.eval()
    feats = []
    lead_idx = (torch.tensor([STANDARD_LEADS.index(x) for x in leads], device=device)
                if leads and all(x in STANDARD_LEADS for x in leads) else None)
    for i in range(0, len(windows), batch_size):
        x = center_crop(torch.from_numpy(windows[i:i + batch_size]), crop).to(device, torch.float32)
        feats.append(encoder.pooled(x, lead_idx).float().cpu())
    encoder.train(was_training)
    return torch.cat(feats).double().numpy()


def probe_probabilities(train_x: np.ndarray, train: ProbeSplit, eval_x: np.ndarray,
                        multilabel: bool) -> np.ndarray:
    """The probe itself: logistic regression on standardised features (one-vs-rest for
    multi-label, over the classes train holds both ways) fitted on (n_train, D) -> class
    probabilities of eval_x (n_eval, D) -> (n_eval, K); a class train cannot fit scores 0."""
    scaler = StandardScaler().fit(train_x)
    tx, vx = scaler.transform(train_x), scaler.transform(eval_x)
    K = train.multihot.shape[1]
    scores = np.zeros((len(vx), K))
    if multilabel:
        present = train.multihot.sum(0) > 0
        present &= train.multihot.sum(0) < len(train.multihot)
        if present.any():
            clf = OneVsRestClassifier(LogisticRegression(max_iter=1000)).fit(tx, train.multihot[:, present])
            scores[:, present] = clf.predict_proba(vx)
    elif len(np.unique(train.label)) > 1:
        clf = LogisticRegression(max_iter=1000).fit(tx, train.label)
        scores[:, clf.classes_] = clf.predict_proba(vx)
    return scores


def fit_probe(train_x: np.ndarray, train: ProbeSplit, val_x: np.ndarray, val: ProbeSplit,
              multilabel: bool) -> dict[str, float]:
    """`probe_probabilities` scored on val -> probe_auroc (macro, one-vs-rest, over the val
    classes that can be scored) and probe_acc (argmax accuracy; per-label at 0.5 for
    multi-label)."""
    scores = probe_probabilities(train_x, train, val_x, multilabel)
    if multilabel:
        acc = float(((scores >= 0.5) == (val.multihot > 0.5)).mean())
    else:
        acc = float((scores.argmax(1) == val.label).mean())
    auroc, skipped = macro_auroc(val.multihot, scores)
    return {"probe_auroc": auroc, "probe_acc": acc, "probe_classes_scored": float(scores.shape[1] - len(skipped))}


def label_subsets(label: np.ndarray, per_class: int, n_subsets: int) -> list[np.ndarray]:
    """Disjoint index sets: subset s holds, for every class, that class's windows number
    s * per_class .. (s + 1) * per_class - 1 in split order (multi-label: by first label).
    A class with fewer windows contributes fewer (or none) to the later subsets."""
    by_class = [np.flatnonzero(label == c) for c in np.unique(label[label >= 0])]
    return [np.sort(np.concatenate([idx[s * per_class:(s + 1) * per_class] for idx in by_class]))
            for s in range(n_subsets)]


def _subset(split: ProbeSplit, idx: np.ndarray) -> ProbeSplit:
    return ProbeSplit(split.windows[idx], split.multihot[idx], split.label[idx])


def run_probe(encoder: torch.nn.Module, data: ProbeData, crop: int, device: torch.device,
              per_class: int = 10, n_subsets: int = 5) -> dict[str, float]:
    """Embed both probe splits with `encoder` (frozen, eval mode) and score the probes:
    probe_auroc / probe_acc (few-label mean; with per_class = 0 the whole train split) and
    probe_auroc_full (the whole probe train split)."""
    train_x = embed(encoder, data.train.windows, crop, device, leads=data.leads)
    val_x = embed(encoder, data.val.windows, crop, device, leads=data.leads)
    return probe_scores(train_x, val_x, data, per_class, n_subsets)


def probe_scores(train_x: np.ndarray, val_x: np.ndarray, data: ProbeData, per_class: int = 10,
                 n_subsets: int = 5) -> dict[str, float]:
    """`run_probe`'s scores on embeddings already made: (n_train, D), (n_val, D)."""
    full = fit_probe(train_x, data.train, val_x, data.val, data.multilabel)
    out = {"probe_auroc_full": full["probe_auroc"]}
    if per_class == 0:
        return {**full, **out}
    scores = [fit_probe(train_x[idx], _subset(data.train, idx), val_x, data.val, data.multilabel)
              for idx in label_subsets(data.train.label, per_class, n_subsets) if len(idx)]
    for key in ("probe_auroc", "probe_acc", "probe_classes_scored"):
        out[key] = float(np.nanmean([s[key] for s in scores]))
    return out
