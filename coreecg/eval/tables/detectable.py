"""What a label-efficiency table can detect: the smallest AUROC difference the report's rule marks
with >= 80 % power for the table's replicates, test patients and Holm family, read from a
calibration measured on synthetic runs (experiments/minimal_detectable_effect.py), and the table's
own run-to-run SD to scale it by (docs/evaluation.md, "Label-efficiency table").
"""
from __future__ import annotations

import numpy as np

from coreecg.eval.significance import Difference
from coreecg.eval.tables.table import Table

# The smallest AUROC difference the rule marks in >= 80 % of simulated tables (Holm at 5 %), measured
# by experiments/minimal_detectable_effect.py on coreecg/eval/calibration.py's synthetic runs (run-to-
# run AUROC SD about 3.5 points; 200 tables per effect, skill steps of 0.2 or 0.4):
# (replicates per method, test patients, tests in the Holm family) -> the first scanned effect with
# >= 80 % power: its mean AUROC difference in points, its power, the calibration skill effect, and
# the step below it (points, power), between which the true 80 % point lies. A family of 3 is one
# comparison's three metrics; a bigger one (a whole table's: comparisons x 3) asks for family x p <
# 0.05, Holm's bar for the family's smallest p, so it is never easier than the table.
DETECTABLE: dict[tuple[int, int, int], dict | None] = {
    (3, 88, 36): {"points": 20.7, "power": 0.8, "effect": 1.6, "below": (18.6, 0.71)},   # the tiny study's table
    (3, 88, 3): {"points": 14.4, "power": 0.9, "effect": 0.8, "below": (12.0, 0.635)},
    (3, 100, 3): {"points": 14.5, "power": 0.87, "effect": 0.8, "below": (11.9, 0.61)},
    (3, 300, 3): {"points": 14.8, "power": 0.84, "effect": 0.8, "below": (11.9, 0.72)},
    (5, 100, 3): {"points": 12.0, "power": 0.98, "effect": 0.6, "below": (8.4, 0.77)},
    (5, 300, 3): {"points": 8.5, "power": 0.835, "effect": 0.4, "below": (4.4, 0.23)},
}
CALIBRATED_RULE = ("holm", 0.95)     # (report.adjust, report.level) the figures were measured with
CALIBRATION_RUN_SD = 3.5    # points: the calibration's run-to-run AUROC standard deviation


def table_settings(table: Table) -> dict[tuple[int, int], int]:
    """(replicates per method, test patients) of each compared cell -> how many differences have
    it: the fewer replicates of the row and its baseline (runs fine-tuned from one pretrained
    encoder are one replicate, as the rule counts them: coreecg/eval/significance.py), the cell's
    test patients; most replicates first."""
    out: dict[tuple[int, int], int] = {}
    for row in table.cells:
        for j, c in enumerate(table.columns):
            d = table.difference(row, j)
            if not isinstance(d, Difference):
                continue
            cell = (c.dataset, c.leads, c.fraction)
            reps = [getattr(table, "replicates", {}).get((name, cell)) for name in (row, table.references[row])]
            n = min(reps) if None not in reps else min(len(d.seeds), len(d.reference_seeds))
            out[(n, d.n_patients)] = out.get((n, d.n_patients), 0) + 1
    return dict(sorted(out.items(), reverse=True))


def run_sd(table: Table, metric: str = "auroc") -> float | None:
    """The mean sample SD over runs of the table's `metric` cells with two or more runs, in points."""
    sds = [100 * np.std(v[j], ddof=1) for v in table.cells.values() for j, c in enumerate(table.columns)
           if c.metric == metric and len(v[j]) > 1]
    return float(np.mean(sds)) if sds else None


def detectable_effect(runs: int, n_patients: int, min_runs: int = 3, family: int = 3,
                      rule: tuple[str, float] = CALIBRATED_RULE) -> str:
    """What the calibration (DETECTABLE) says about the smallest AUROC difference a table of `runs`
    replicates per method, `n_patients` test patients and a Holm family of `family` tests marks
    with >= 80 % power: the documented scenario with the most replicates and patients not above
    the table's and a family not smaller (so never optimistic); `rule`: the report's (adjust, level)."""
    if runs < min_runs:
        return (f"with {runs} replicate(s) per method (fewer than report.min_runs = {min_runs}) no difference can be "
                "marked, however large: the intervals are test-set sampling only.")
    if tuple(rule) != CALIBRATED_RULE:
        return (f"the calibration was measured for adjust={CALIBRATED_RULE[0]} at level {CALIBRATED_RULE[1]:g}; "
                f"this report uses adjust={rule[0]} at level {rule[1]:g}, so no documented minimal detectable "
                "effect applies.")
    fits = [k for k in DETECTABLE if k[0] <= runs and k[1] <= n_patients and k[2] >= family]
    if not fits:
        smaller = [k for k in DETECTABLE if k[0] <= runs and k[1] <= n_patients]
        floor = (f" With one comparison's 3 tests it would be {DETECTABLE[max(smaller)]['points']:.1f} points "
                 f"({max(smaller)[0]} replicates, {max(smaller)[1]} patients): a lower bound here."
                 if smaller and DETECTABLE[max(smaller)] else "")
        return (f"the calibration has no scenario with at most {runs} replicates and {n_patients} test patients "
                f"for a Holm family of {family} tests: no documented minimal detectable effect for this table "
                f"(python -m experiments.minimal_detectable_effect --runs {runs} --patients {n_patients} "
                f"--family {family} measures it).{floor}")
    k = max(fits, key=lambda k: (k[0], k[1], -k[2]))
    found = DETECTABLE[k]
    where = (f"in the calibration's simulation (synthetic runs, run-to-run AUROC SD about {CALIBRATION_RUN_SD:g} "
             f"points; experiments/minimal_detectable_effect.py) with {k[0]} replicates per method, {k[1]} test "
             f"patients and a Holm family of {k[2]} tests (this table: {runs} replicates, {n_patients} patients, "
             f"{family} tests)")
    if found is None:
        return where + ", no difference scanned reached 80 % power: only very large effects would be marked."
    below, below_power = found["below"]
    return (where + f", the smallest difference marked with >= 80 % power is about {found['points']:.1f} AUROC "
            f"points (power {found['power']:.2f}; {below:.1f} points had {below_power:.2f}). A simulation-based "
            "figure, not a property of these methods: where this table's run-to-run SD differs, the detectable "
            "difference scales with it.")


def detectable_note(table: Table) -> str:
    """The minimal-detectable-effect paragraph for each setting of the table's compared cells
    (table_settings), its Holm family (the differences that can be marked) and the table's own
    run-to-run SD, to scale the simulated figure by."""
    settings = table_settings(table)
    if not settings:
        return "Minimal detectable effect: the table has no difference, so none is stated."
    sig = table.significance
    family = max(len(table.adjusted), 3)
    parts = [f"{n} difference(s) with {runs} replicates and {patients} test patients: "
             + detectable_effect(runs, patients, sig.min_runs, family, (sig.adjust, sig.level))
             for (runs, patients), n in settings.items()]
    sd = run_sd(table)
    observed = f" This table's run-to-run AUROC SD: {sd:.1f} points (mean over its cells)." if sd is not None else ""
    return "Minimal detectable effect. " + " ".join(parts) + observed
