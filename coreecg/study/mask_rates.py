"""The paper's mask-rate figure: every P_time x P_lead cell's encoder fine-tuned on each named
corpus, F1 and AUROC heatmaps per dataset, and how well the cheap probe ranks the cells the way
fine-tuning does (Spearman's rho with a Fisher-z interval).

Its runs are a study's (`mask_rates` section; `jobs/sweep_mask_rates.py` writes such a study):
every cell pretrained (judged by its probe every epoch: the cheap mode), then fine-tuned on each
downstream corpus; the study report calls the writers here.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any, Sequence
import json

import numpy as np

from coreecg.study.plan import slug
from coreecg.tune.plots import heatmap

# Lazy imports: scipy.stats (1.7 s; python -X importtime), tune.plots (matplotlib: the `ray` extra).

METRICS = ("f1", "auroc")


def probe_row(folder: Path, cell: dict[str, Any]) -> dict[str, Any]:
    """One pretrained cell's row of the cheap mode: `cell` (grid values, seed), its final and
    initial probe_auroc and its epochs from done.json (NaN and status failed when it did not
    finish), its run folder."""
    done = (folder / "done.json").is_file()
    last = json.loads((folder / "done.json").read_text()) if done else {}
    return {**cell, "status": "done" if done else "failed",
            **{k: last.get(k, math.nan) for k in ("probe_auroc", "probe_auroc_init", "loss")},
            "epochs": int(last.get("epoch", 0)), "run_dir": str(folder)}


def write_probe_results(rows: Sequence[dict], x: str, y: str, output: Path) -> list[Path]:
    """probe_results.csv (one row per pretrained cell) and heatmap.png: the cheap mode, the mean
    final few-label probe_auroc over seeds per cell."""
    with open(output / "probe_results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, [x, y, "seed", "status", "probe_auroc", "probe_auroc_init", "loss", "epochs", "run_dir"])
        w.writeheader()
        w.writerows(rows)
    shown = [{**r, "status": "completed" if r["status"] == "done" else "error"} for r in rows]
    return [output / "probe_results.csv",
            heatmap(shown, x, y, output / "heatmap.png",
                    title="cheap mode: few-label probe_auroc (mean over seeds), not the paper's fine-tuned metrics")]


def cell_result(folder: Path, cell: dict[str, Any], error: str = "") -> dict[str, Any]:
    """One fine-tuned cell's row: `cell` (grid values, seed, dataset, trial_id) and its test
    acc/f1/auroc from metrics.json (NaN and status failed when the run did not finish)."""
    done = (folder / "metrics.json").is_file()
    test = json.loads((folder / "metrics.json").read_text())["test"] if done else {}
    return {**cell, **{k: (math.nan if test.get(k) is None else test[k]) for k in ("acc", *METRICS)},
            "status": "done" if done else "failed", "error": error, "run_dir": str(folder)}


def rank_correlation(probe: Sequence[float], finetuned: Sequence[float], level: float = 0.95) -> dict[str, Any]:
    """Spearman's rho between the cells' probe scores and their fine-tuned scores (scipy), its
    test of rho = 0, and an interval from Fisher's z with Bonett and Wright's (2000) variance for
    Spearman, (1 + rho^2 / 2) / (n - 3): closed form, so it holds for a few cells, where a
    bootstrap over cells resamples mostly ties (undefined). -> {rho, low, high, p, cells, note};
    NaN, with the reason in `note`, with fewer than 3 cells (4 for the interval) or when one side
    takes a single value (no ranks)."""
    from scipy.stats import norm, spearmanr

    a, b = np.asarray(probe, dtype=float), np.asarray(finetuned, dtype=float)
    ok = np.isfinite(a) & np.isfinite(b)
    a, b = a[ok], b[ok]
    n = len(a)
    out = {"rho": math.nan, "low": math.nan, "high": math.nan, "p": math.nan, "cells": int(n), "note": ""}
    if n < 3:
        return {**out, "note": f"undefined: {n} cell(s) with both scores, 3 needed"}
    for side, v in (("probe", a), ("fine-tuned", b)):
        if np.ptp(v) == 0:
            return {**out, "note": f"undefined: every cell has the same {side} score ({v[0]:.4g})"}
    test = spearmanr(a, b)
    rho = float(test.statistic)
    out.update(rho=rho, p=float(test.pvalue))
    if n < 4:
        return {**out, "note": "no interval: 4 cells needed"}
    z = math.atanh(min(max(rho, -0.999999), 0.999999))
    half = norm.ppf(0.5 + level / 2) * math.sqrt((1 + rho * rho / 2) / (n - 3))
    out.update(low=math.tanh(z - half), high=math.tanh(z + half))
    return out


def cell_means(rows: Sequence[dict], x: str, y: str, key: str) -> dict[tuple[float, float], float]:
    """Mean of `key` over seeds per (x, y) cell (finite values only)."""
    groups: dict[tuple[float, float], list[float]] = {}
    for r in rows:
        v = r.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            groups.setdefault((r[x], r[y]), []).append(float(v))
    return {k: float(np.mean(v)) for k, v in groups.items()}


def write_finetune_figures(probe_rows: Sequence[dict], ft_rows: Sequence[dict], x: str, y: str,
                           output: Path) -> list[Path]:
    """Per dataset: heatmap_<dataset>_f1.png and heatmap_<dataset>_auroc.png (the paper's figure),
    finetune_results.csv, and rank_correlation.csv (probe_auroc vs fine-tuned AUROC over cells)."""
    written = []
    fields = [x, y, "seed", "dataset", "trial_id", "acc", *METRICS, "status", "error", "run_dir"]
    with open(output / "finetune_results.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(ft_rows)
    written.append(output / "finetune_results.csv")
    probe = cell_means(probe_rows, x, y, "probe_auroc")
    corr_rows = []
    for dataset in dict.fromkeys(r["dataset"] for r in ft_rows):
        rows = [{**r, "status": "completed" if r["status"] == "done" else "error"}
                for r in ft_rows if r["dataset"] == dataset]
        for metric in METRICS:
            written.append(heatmap(rows, x, y, output / f"heatmap_{slug(dataset)}_{metric}.png", key=metric,
                                   title=f"fine-tuned {metric.upper()} on {dataset} (mean over seeds)"))
        ft = cell_means(rows, x, y, "auroc")
        cells = sorted(set(probe) & set(ft))
        corr_rows.append({"dataset": dataset, **rank_correlation([probe[c] for c in cells], [ft[c] for c in cells])})
    with open(output / "rank_correlation.csv", "w", newline="") as f:
        w = csv.DictWriter(f, ["dataset", "rho", "low", "high", "p", "cells", "note"])
        w.writeheader()
        w.writerows(corr_rows)
    written.append(output / "rank_correlation.csv")
    return written
