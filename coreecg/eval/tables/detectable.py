"""What a table can detect, from its own data: per testable difference, the smallest true
difference the report's rule would mark with `report.power` at its family's level alpha / k, from
the noncentral t of that comparison's own standard error and degrees of freedom
(`coreecg.eval.significance.detectable_difference`, set by `Table.set_significance`); and the
table's run-to-run SD beside it (docs/evaluation.md, "What a comparison can detect").

The per-cell figure holds each cell's own spread, whatever its source (why not a simulated
calibration: docs/decisions.md).
"""
from __future__ import annotations

import numpy as np

from coreecg.eval.runs import METRICS
from coreecg.eval.significance import Difference
from coreecg.eval.tables.table import Table


def run_sd(table: Table, metric: str = "auroc") -> float | None:
    """The mean sample SD over runs of the table's `metric` cells with two or more runs, in points."""
    sds = [100 * np.std(v[j], ddof=1) for v in table.cells.values() for j, c in enumerate(table.columns)
           if c.metric == metric and len(v[j]) > 1]
    return float(np.mean(sds)) if sds else None


def detectable_summary(table: Table, metric: str | None = None) -> dict | None:
    """{"metric", "family", "n", "median", "low", "high" (points), "untested"} of the smallest
    detectable differences of `metric`'s family (default: the primary metric); "untested": its
    differences that could not be tested (too few runs, patients, no variance). None without any."""
    sig = table.significance
    if sig is None or not sig.n_resamples:
        return None
    metric = metric or sig.primary_metric
    family = table.families.get(metric, [])
    untested = sum(1 for m in table.cells for j, c in enumerate(table.columns)
                   if c.metric == metric and isinstance(d := table.difference(m, j), Difference) and not d.testable)
    if not family:
        return {"metric": metric, "family": 0, "n": 0, "untested": untested} if untested else None
    sizes = np.array([100 * table.detectable[k] for k in family])
    return {"metric": metric, "family": len(family), "n": len(sizes), "median": float(np.median(sizes)),
            "low": float(sizes.min()), "high": float(sizes.max()), "untested": untested}


def detectable_note(table: Table) -> str:
    """The paragraph under a table: the primary metric's smallest detectable differences (median and
    range over its comparisons), how many could not be tested, and the table's run-to-run SD."""
    summary = detectable_summary(table)
    if summary is None:
        return "Smallest detectable difference: the table has no difference, so none is stated."
    sig, label = table.significance, METRICS.get(summary["metric"], summary["metric"])
    text = "Smallest detectable difference. "
    if summary["n"]:
        text += (f"{label}, per comparison from the noncentral t of its own standard error and degrees of freedom "
                 f"(with power {sig.power:g} at {1 - sig.level:g} after {sig.adjust} over its family of "
                 f"{summary['family']}): "
                 f"median {summary['median']:.1f} points, range {summary['low']:.1f}-{summary['high']:.1f} over "
                 f"{summary['n']} comparison(s); each one's in the CSV ('detectable'). A difference not marked "
                 f"is equivalent within ±{sig.equivalence_margin:g} points only where two one-sided tests show it; "
                 "otherwise it is inconclusive at that size.")
    else:
        text += f"no {label} comparison could be tested."
    if summary["untested"]:
        text += (f" {summary['untested']} {label} difference(s) could not be tested (fewer than {sig.min_runs} "
                 f"replicates per method, fewer than {sig.min_test_patients} test patients, or no variance): no "
                 "difference can be marked there, however large.")
    sd = run_sd(table, summary["metric"])
    return text + (f" This table's run-to-run {label} SD: {sd:.1f} points (mean over its cells)." if sd is not None
                   else "")
