"""Sweep plots: the mask-rate heatmap and Optuna's parameter importances."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence
import warnings

import numpy as np

# Lazy imports: matplotlib and optuna (the `ray` extra): the sweep modules import without them.


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def heatmap_grid(rows: Sequence[dict], x: str, y: str, key: str = "probe_auroc"):
    """-> (x values, y values, mean (len(y), len(x)) with NaN where no trial finished, counts)."""
    xs = sorted({r[x] for r in rows if r[x] is not None})
    ys = sorted({r[y] for r in rows if r[y] is not None})
    total, count = np.zeros((len(ys), len(xs))), np.zeros((len(ys), len(xs)), dtype=int)
    for r in rows:
        if r["status"] != "error" and _finite(r[key]):
            i, j = ys.index(r[y]), xs.index(r[x])
            total[i, j] += r[key]
            count[i, j] += 1
    with np.errstate(invalid="ignore"):
        return xs, ys, np.where(count > 0, total / np.maximum(count, 1), np.nan), count


def heatmap(rows: Sequence[dict], x: str, y: str, path: Path, key: str = "probe_auroc", title: str = "") -> Path:
    """Mean `key` over seeds per (x, y) cell, annotated (value and run count), the best cell boxed;
    `title` says what the values are (default: "mean <key> over seeds")."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    xs, ys, mean, count = heatmap_grid(rows, x, y, key)
    fig, ax = plt.subplots(figsize=(1.2 * len(xs) + 2.5, 0.9 * len(ys) + 1.8), constrained_layout=True)
    im = ax.imshow(np.ma.masked_invalid(mean), origin="lower", cmap="viridis", aspect="auto")
    fig.colorbar(im, ax=ax, label=f"mean {key}")
    ax.set_xticks(range(len(xs)), [f"{v:g}" for v in xs])
    ax.set_yticks(range(len(ys)), [f"{v:g}" for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    finite = np.isfinite(mean)
    lo, hi = (np.nanmin(mean), np.nanmax(mean)) if finite.any() else (0, 1)
    for i in range(len(ys)):
        for j in range(len(xs)):
            text = "–" if not finite[i, j] else f"{mean[i, j]:.3f}\nn={count[i, j]}"
            light = finite[i, j] and mean[i, j] < lo + 0.5 * (hi - lo)
            ax.text(j, i, text, ha="center", va="center", fontsize=8, color="white" if light else "black")
    if finite.any():
        i, j = np.unravel_index(np.nanargmax(mean), mean.shape)
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", linewidth=2.5))
        ax.set_title(f"{title or f'mean {key} over seeds'}\nbest {mean[i, j]:.3f} at {x}={xs[j]:g}, "
                     f"{y}={ys[i]:g} (red box)", fontsize=9)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _stored_trials(study, rows: Sequence[dict], distributions: dict) -> list[tuple[dict, object]]:
    """(row, the stored trial with its parameters) for each row the stored study holds."""
    def key(params: dict) -> tuple:
        return tuple(round(float(params[k]), 9) if isinstance(params[k], (int, float)) else params[k]
                     for k in distributions)
    stored = {key(t.params): t for t in study.get_trials(deepcopy=False) if set(distributions) <= set(t.params)}
    return [(r, stored[key(r)]) for r in rows if key(r) in stored]


def importance_plot(rows: Sequence[dict], distributions: dict, path: Path, key: str = "probe_auroc",
                    study=None) -> Path:
    """Optuna's parameter importances (fANOVA) of `key` over `rows` (the trials compared at equal
    budget: coreecg.tune.sweep.rank_rows), as a bar chart; with fewer than 2 scored trials
    (importances undefined) a parallel-coordinates plot instead. `study`: the sweep's stored Optuna
    study: its trials (those of `rows`, matched by their parameters) are what the plot reads."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    kept = [r for r in rows if r["status"] != "error" and _finite(r[key]) and all(r.get(k) is not None
                                                                               for k in distributions)]
    if study is not None:
        kept = [{**r, key: t.value} for r, t in _stored_trials(study, kept, distributions) if t.value is not None]
    plotted = optuna.create_study(direction="maximize")
    for r in kept:
        plotted.add_trial(optuna.trial.create_trial(params={k: r[k] for k in distributions},
                                                    distributions=distributions, value=float(r[key])))
    study = plotted
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")    # Optuna marks its matplotlib plots experimental
        scored = len(study.trials)
        values = {t.value for t in study.trials}
        if scored >= 2 and len(values) > 1:
            ax = optuna.visualization.matplotlib.plot_param_importances(study)
        else:
            ax = optuna.visualization.matplotlib.plot_parallel_coordinate(study)
    fig = ax.figure
    fig.set_size_inches(8, 4.5)
    loc = "left" if ax.get_title(loc="left") else "center"    # Optuna titles its plots on the left
    ax.set_title(f"{ax.get_title(loc=loc)} ({scored} scored trials, objective: {key})", loc=loc)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
