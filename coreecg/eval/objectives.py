"""What a pretraining epoch scores its encoder by, and what a sweep may optimise: registered
objectives, each computed from the probe corpus's embeddings made once per evaluation.

    @register_objective("my_score", "max", "what it measures")
    def my_score(e: Embeddings) -> dict[str, float]:
        return {"my_score": ...}

A plugin objective is one module of that shape, named in `plugins`; every pretraining evaluation
then reports it and `jobs/sweep.py --metric my_score` may optimise it. Built in:

- probe_auroc (max): the few-label logistic-regression probe (coreecg.eval.probe), with probe_acc and
  probe_auroc_full (every probe train window, max) beside it;
- knn_auroc (max): a k-nearest-neighbour probe on the same embeddings (cosine, `KNN_K` neighbours of
  the full train split: a window's class scores are its neighbours' label shares), with knn_acc;
- layer_probe_auroc (max): the few-label probe on every encoder block's pooled features
  (coreecg.model.layer_features), the best layer's val AUROC, with layer_probe_best_layer (1-based)
  beside it; computed only where the evaluation embedded every layer (data.probe_layers, which a
  sweep with --metric layer_probe_auroc sets): a `layers` objective is skipped otherwise;
- rankme (max): RankMe (Garrido et al., ICML 2023), the effective rank exp(H(p)) of the embeddings'
  singular values p = s / sum(s): near 1 when the encoder has collapsed, up to D when every
  direction is used.
The loss terms (`loss` and each method's `reported_losses`) are objectives too, minimised: the loop
reports them (coreecg.tune.sweep.objectives).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import numpy as np
from sklearn.neighbors import NearestNeighbors

from coreecg.eval.metrics import macro_auroc
from coreecg.eval.probe import ProbeData, probe_scores

KNN_K = 20
# RankMe's epsilon (its paper's): keeps log p finite for zero singular values
RANKME_EPS = 1e-7


@dataclass
class Embeddings:
    """The probe corpus's embeddings of one evaluation: train_x (n_train, D), val_x (n_val, D),
    their labels (data.train / data.val) and the probe's settings."""

    train_x: np.ndarray
    val_x: np.ndarray
    data: ProbeData
    per_class: int = 10
    n_subsets: int = 5
    # every layer's (train (n_train, D_layer), val (n_val, D_layer)) embeddings; None: not made
    layers: list[tuple[np.ndarray, np.ndarray]] | None = None


@dataclass(frozen=True)
class Objective:
    name: str
    direction: Literal["max", "min"]
    compute: Callable[[Embeddings], dict[str, float]]
    description: str = ""
    also: tuple[str, ...] = ()            # other keys its compute reports that a sweep may optimise (same direction)
    layers: bool = False                  # needs Embeddings.layers: skipped where an evaluation made none


OBJECTIVES: dict[str, Objective] = {}


def register_objective(name: str, direction: Literal["max", "min"], description: str = "",
                       also: tuple[str, ...] = (), layers: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: `fn(Embeddings) -> {name: value, ...}` computed at every pretraining evaluation
    (with `layers`: at those that embedded every layer, `needs_layers`); ValueError for a
    direction other than max/min or a name another function holds."""
    if direction not in ("max", "min"):
        raise ValueError(f"objective {name!r}: direction must be 'max' or 'min', got {direction!r}")

    def register(fn: Callable[[Embeddings], dict[str, float]]) -> Callable:
        known = OBJECTIVES.get(name)
        if known is not None and known.compute is not fn and known.compute.__module__ != fn.__module__:
            raise ValueError(f"objective {name!r} is already registered by {known.compute.__module__}")
        OBJECTIVES[name] = Objective(name, direction, fn, description, tuple(also), layers)
        return fn
    return register


def objective_directions() -> dict[str, str]:
    """Every registered objective's name (and the keys it also reports) -> its direction."""
    out = {}
    for o in OBJECTIVES.values():
        out[o.name] = o.direction
        out.update({k: o.direction for k in o.also})
    return out


def needs_layers(metric: str) -> bool:
    """Whether the objective `metric` (a name or a key it also reports) needs every layer embedded."""
    return any(o.layers and metric in (o.name, *o.also) for o in OBJECTIVES.values())


def compute_objectives(e: Embeddings) -> dict[str, float]:
    """Every registered objective on one evaluation's embeddings (a failing plugin names itself);
    those needing every layer's embeddings only when the evaluation made them."""
    out: dict[str, float] = {}
    for o in OBJECTIVES.values():
        if o.layers and e.layers is None:
            continue
        try:
            got = o.compute(e)
        except Exception as exc:
            raise RuntimeError(f"objective {o.name!r} ({o.compute.__module__}) failed: {exc}") from exc
        missing = [k for k in (o.name, *o.also) if not isinstance(got, dict) or k not in got]
        if missing:          # a sweep on it would find no value to rank: said at the first evaluation
            wanted = ", ".join(repr(k) for k in (o.name, *o.also))
            raise ValueError(f"objective {o.name!r} ({o.compute.__module__}) must return a dict holding {wanted}; "
                             f"it lacks {', '.join(map(repr, missing))}")
        out.update(got)
    return out


@register_objective("probe_auroc", "max", "few-label logistic-regression probe, macro AUROC on the probe's val split",
                    also=("probe_auroc_full",))
def _probe(e: Embeddings) -> dict[str, float]:
    return probe_scores(e.train_x, e.val_x, e.data, e.per_class, e.n_subsets)


def knn_scores(train_x: np.ndarray, train_multihot: np.ndarray, val_x: np.ndarray, k: int = KNN_K) -> np.ndarray:
    """(n_val, K) class scores: each val window's share of each class among its k nearest train
    windows by cosine distance (sklearn's NearestNeighbors, brute force)."""
    k = min(k, len(train_x))
    nn = NearestNeighbors(n_neighbors=k, metric="cosine", algorithm="brute").fit(train_x)
    idx = nn.kneighbors(val_x, return_distance=False)                 # (n_val, k)
    return train_multihot[idx].mean(axis=1)


@register_objective("knn_auroc", "max", f"{KNN_K}-nearest-neighbour probe (cosine), macro AUROC",
                    also=("knn_acc",))
def _knn(e: Embeddings) -> dict[str, float]:
    scores = knn_scores(e.train_x, e.data.train.multihot, e.val_x)
    auroc, _ = macro_auroc(e.data.val.multihot, scores)
    if e.data.multilabel:
        acc = float(((scores >= 0.5) == (e.data.val.multihot > 0.5)).mean())
    else:
        acc = float((scores.argmax(1) == e.data.val.label).mean())
    return {"knn_auroc": auroc, "knn_acc": acc}


@register_objective("layer_probe_auroc", "max", "the few-label probe on every encoder layer: the best layer's "
                    "macro AUROC on the probe's val split", layers=True)
def _layer_probe(e: Embeddings) -> dict[str, float]:
    per_layer = np.array([probe_scores(train_x, val_x, e.data, e.per_class, e.n_subsets)["probe_auroc"]
                          for train_x, val_x in e.layers])
    if np.isnan(per_layer).all():
        return {"layer_probe_auroc": float("nan"), "layer_probe_best_layer": float("nan")}
    best = int(np.nanargmax(per_layer))                   # the first of ties
    return {"layer_probe_auroc": float(per_layer[best]), "layer_probe_best_layer": float(best + 1)}


def rankme(x: np.ndarray, eps: float = RANKME_EPS) -> float:
    """RankMe of embeddings x (n, D): exp(-sum p log p), p = s / ||s||_1 + eps, s the singular values."""
    s = np.linalg.svd(np.asarray(x, dtype=np.float64), compute_uv=False)
    if not s.any():
        return 1.0                                  # all zero: nothing spread, the degenerate rank
    p = s / s.sum() + eps
    return float(np.exp(-(p * np.log(p)).sum()))


# embedding_std: larger is further from collapse (docs/sweeps.md: not scale-free, so a weak objective)
@register_objective("rankme", "max", "RankMe: the effective rank of the probe windows' embeddings",
                    also=("embedding_std",))
def _rankme(e: Embeddings) -> dict[str, float]:
    x = np.concatenate([e.train_x, e.val_x])
    return {"rankme": rankme(x), "embedding_std": float(x.std(axis=0).mean())}


def collapse_reason(metrics: dict[str, float], rankme_floor: float, std_floor: float = 1e-6) -> str | None:
    """Why an evaluation's embeddings look collapsed (RankMe under `rankme_floor`, or a per-dimension
    standard deviation near 0), or None."""
    r, sd = metrics.get("rankme"), metrics.get("embedding_std")
    if sd is not None and sd < std_floor:
        return f"embeddings collapsed: their mean per-dimension std is {sd:.2e} (< {std_floor:g})"
    if r is not None and r < rankme_floor:
        return f"embeddings collapsed: RankMe {r:.2f} < train.collapse_rankme={rankme_floor:g}"
    return None


__all__ = ["Embeddings", "Objective", "OBJECTIVES", "register_objective", "objective_directions",
           "compute_objectives", "needs_layers", "knn_scores", "rankme", "collapse_reason", "KNN_K"]
