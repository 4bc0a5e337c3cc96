"""A complete report table outside coreecg: each method's best and mean test AUROC over its runs,
one row per method (docs/evaluation.md, "Adding a table", shows this file; tests run it in a
study's report). Named in a config's `plugins`, it is a table a study may ask for by name."""
from pathlib import Path

import numpy as np

from coreecg.eval.tables import register_table


def build(name, inputs):
    """The report's runs (inputs.runs: coreecg.eval.runs.Run) by method; None: nothing to show."""
    by_method = {}
    for run in inputs.runs:
        by_method.setdefault(run.method, []).append(run)
    return by_method or None


def write(table, folder):
    """best_auroc.md in `folder` -> the files written (the study's index links the first)."""
    lines = ["# Best test AUROC per method", "", "| Method | runs | best | mean |", "|---|---|---|---|"]
    for method, runs in table.items():
        values = [r.record["test"]["auroc"] for r in runs if r.record["test"]["auroc"] is not None]
        best, mean = (f"{100 * max(values):.1f}", f"{100 * np.mean(values):.1f}") if values else ("–", "–")
        lines.append(f"| {method} | {len(runs)} | {best} | {mean} |")
    path = Path(folder) / "best_auroc.md"
    path.write_text("\n".join(lines) + "\n")
    return [path]


register_table("best_auroc", build=build, write=write,
               runs=lambda table: {run.path for runs in table.values() for run in runs})
