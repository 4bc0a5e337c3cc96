"""How well a sweep's objectives predict fine-tuning (`jobs/sweep.py --validate K --finetune CORPUS`):
the K best and K worst trials at equal budget (coreecg.tune.sweep.rank_rows) have their encoders
fine-tuned through the study machinery (a study of external encoders, one run per trial and corpus:
no second runner), then Spearman's rho between each objective the trials recorded and the
fine-tuned test AUROC, with the mask-rate study's closed-form interval
(coreecg.study.mask_rates.rank_correlation), per corpus.

    validation.csv    one row per (corpus, objective): rho, low, high, p, trials, note
    validation/       the study folder (runs/finetune/*, runs.csv)
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Sequence

from coreecg.study.mask_rates import rank_correlation
from coreecg.study.presets import preset_study

# Lazy imports: the checkpoint store (torch), where a finished run is read: validating a study stays torch-free.

VALIDATION = "validation"
# What a trial records at its last epoch that could predict fine-tuning (results.csv's columns)
RECORDED = ("probe_auroc", "probe_auroc_full", "knn_auroc", "rankme", "loss")


def chosen_trials(compared: Sequence[dict], k: int) -> list[dict]:
    """The K best and K worst of the trials compared at equal budget (all of them when 2K or fewer),
    each with "encoder": its encoder.pt, else its newest checkpoint (a trial the scheduler ended at
    its last report wrote the checkpoint of that epoch, not encoder.pt)."""
    if k < 1:
        raise ValueError(f"--validate {k}: needs K >= 1 (the K best and K worst trials)")
    picked = list(compared) if len(compared) <= 2 * k else [*compared[:k], *compared[-k:]]
    out, missing = [], []
    for r in picked:
        source = trial_encoder(Path(r["run_dir"]))
        (missing.append(r["trial_id"]) if source is None else out.append({**r, "encoder": str(source)}))
    if missing:
        raise ValueError(f"--validate: trial(s) {', '.join(missing)} have no encoder.pt and no checkpoint")
    return out


def trial_encoder(run_dir: Path) -> Path | None:
    """A trial's encoder: encoder.pt, else its newest checkpoint file (the same weights at that step)."""
    from coreecg.checkpoints import latest_checkpoint

    if (run_dir / "encoder.pt").is_file():
        return run_dir / "encoder.pt"
    return latest_checkpoint(run_dir)


def trial_label(row: dict) -> str:
    return f"trial {row['trial_id']}"


def validation_study(output: Path, picked: Sequence[dict], *, config: str | None, overrides: list[str],
                     finetune: list[str], variants: str | Path, seeds: Sequence[int] = (0,)) -> dict[str, Any]:
    """The study (a study file's data, absolute paths) that fine-tunes each picked trial's encoder on
    every `finetune` corpus: 12 leads, all training data, mode finetune. `variants`: the variants
    file every study names (none of its variants runs here: the rows are the trials)."""
    head, corpora = preset_study(output / VALIDATION, config, overrides, finetune)
    encoders = {trial_label(r): r.get("encoder") or str(Path(r["run_dir"]) / "encoder.pt") for r in picked}
    return {**head, "variants": str(Path(variants).resolve()), "pretrain": {"methods": []},
            "downstream": {"corpora": corpora, "methods": list(encoders), "modes": ["finetune"],
                           "seeds": list(seeds), "encoders": encoders},
            "report": {"tables": []}}


def validation_rows(study, output: Path, picked: Sequence[dict], extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Spearman's rho per (corpus, recorded objective) between the picked trials' objective and the
    mean fine-tuned test AUROC of their runs (over seeds), from the finished study's runs."""
    tuned: dict[tuple[str, str], list[float]] = {}
    for run in study.finetune_runs():
        metrics = output / VALIDATION / "runs" / "finetune" / run.name / "metrics.json"
        if metrics.is_file():
            auroc = json.loads(metrics.read_text()).get("test", {}).get("auroc")
            if isinstance(auroc, (int, float)) and math.isfinite(auroc):
                tuned.setdefault((run.corpus, run.method), []).append(float(auroc))
    rows = []
    for corpus in sorted({c for c, _ in tuned}):
        finetuned = [_mean(tuned.get((corpus, trial_label(r)), [])) for r in picked]
        for name in (*RECORDED, *extra):
            values = [_float(r.get(name)) for r in picked]
            if all(math.isnan(v) for v in values):
                continue
            rows.append({"corpus": corpus, "objective": name, **rank_correlation(values, finetuned)})
    return rows


def write_validation(rows: Sequence[dict], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["corpus", "objective", "rho", "low", "high", "p", "cells", "note"])
        w.writeheader()
        w.writerows(rows)
    return path


def _mean(v: list[float]) -> float:
    return sum(v) / len(v) if v else math.nan


def _float(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


__all__ = ["VALIDATION", "RECORDED", "chosen_trials", "validation_study", "validation_rows", "write_validation"]
