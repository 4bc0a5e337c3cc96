"""A results table as data: rows (methods) x columns (dataset x variant x metric) of test
metrics over seeds, with each cell's difference to a reference row (coreecg/eval/significance.py)
and the p-values adjusted over the table's family. `build_table` makes one from runs
(coreecg.eval.runs); coreecg.eval.tables.render writes it (Markdown, CSV, booktabs LaTeX).

A variant is one (leads, train_fraction) block of columns; a cell (dataset, leads, fraction) holds
one run per method and seed.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from math import isclose
from pathlib import Path
from typing import Sequence

import numpy as np

from coreecg.config import ReportConfig
from coreecg.eval.runs import (DATASETS, F1_KEYS, METRICS, Run, RunError, leakage_note, metric_key, require,
                                 run_task)
from coreecg.eval.significance import Difference, PairingError, adjust_p, cell_differences

TABLE_MODES = ("finetune", "scratch")     # the run modes the method tables hold
MISSING = "–"
UNAVAILABLE = "n/a"
NO_PREDICTIONS = "no predictions.csv"
LEAK = "‡"      # a method with a run that the leakage guard let through (--allow-overlap)


@dataclass(frozen=True)
class Column:
    dataset: str
    leads: str
    fraction: float
    metric: str
    label: str            # e.g. "PTB-XL 6-lead ACC"
    group: str            # the label without the metric: runs-per-cell column


@dataclass(frozen=True)
class TableSpec:
    name: str
    title: str
    variants: tuple[tuple[str, float, str], ...]   # (leads, train_fraction, column label part)
    block: str = ""       # LaTeX: heading of the first column when rows come in one block per variant
    modes: tuple[str, ...] = TABLE_MODES   # the run modes the table holds


def variant_of(spec: TableSpec, run: Run) -> tuple[str, float, str] | None:
    """The table variant (column block) a run belongs to, or None if it is not in the table."""
    if run.mode not in spec.modes:
        return None
    return next((v for v in spec.variants if v[0] == run.leads and isclose(v[1], run.train_fraction)), None)


def dataset_order(runs: Sequence[Run]) -> list[str]:
    seen = list(dict.fromkeys(r.dataset for r in runs))
    return [d for d in DATASETS if d in seen] + [d for d in seen if d not in DATASETS]


def format_cell(values: Sequence[float]) -> str:
    """'93.6 ± 0.4' (mean ± sample std over seeds, in percent), '93.6' for one run, '' for none."""
    if not values:
        return ""
    mean = 100 * np.mean(values)
    return f"{mean:.1f}" if len(values) == 1 else f"{mean:.1f} ± {100 * np.std(values, ddof=1):.1f}"


Cell = tuple[str, str, float]   # (dataset, leads, train_fraction): one run per method and seed


@dataclass
class Significance:
    """Differences to `reference` (coreecg/eval/significance.py) for every (method, cell) of the
    tables: {metric column: Difference}, or why there is none (NO_PREDICTIONS), with the rule that
    marks them (report.level, adjust, min_runs, min_test_patients). Empty when n_resamples is 0."""

    reference: str
    n_resamples: int
    level: float
    adjust: str = "holm"
    min_runs: int = 3
    min_test_patients: int = 30
    cells: dict[tuple[str, Cell], dict[str, Difference] | str] = field(default_factory=dict)


@dataclass
class Table:
    spec: TableSpec
    columns: list[Column]
    cells: dict[str, list[list[float]]]     # method -> per column, the test values over seeds
    unavailable: dict[str, str] = field(default_factory=dict)   # method -> why it has no run
    f1: str = "threshold"                   # report.f1: which F1 the F1 columns print
    f1_fallback: tuple[str, ...] = ()       # datasets printing the 0.5-threshold F1 under f1="argmax"
    members: dict[str, set[Cell]] = field(default_factory=dict)  # method -> cells it has runs in
    significance: Significance | None = None
    adjusted: dict[tuple[str, int], float] = field(default_factory=dict)   # (method, column) -> adjusted p
    footnotes: list[str] = field(default_factory=list)   # protocol differences of its rows (eval/fairness)
    leaks: dict[str, list[str]] = field(default_factory=dict)   # method -> its runs' leakage notes
    # row -> the row its differences are to (a reference per row, coreecg/eval/tables/label_efficiency.py); None: every
    # row's is significance.reference. A row missing from the dict has no difference (a baseline).
    references: dict[str, str] | None = None
    row_of: dict[Path, str] = field(default_factory=dict)      # run folder -> its row, where not its method
    behind: set[Path] = field(default_factory=set)   # the runs behind its cells, set for a report (runs_behind)

    def runs_behind(self, runs: Sequence[Run]) -> set[Path]:
        """The folders of `runs` that fill the table's cells (its protocol check, its line in a
        study's index, its name in all_runs.csv)."""
        return {r.path for r in runs if variant_of(self.spec, r) and self.row_of.get(r.path, r.method) in self.cells}

    def reference_of(self, method: str) -> str | None:
        """The row whose runs `method`'s differences are to (None: it has none)."""
        if self.references is not None:
            return self.references.get(method)
        return self.significance.reference if self.significance is not None else None

    def _means(self, j: int) -> list[float]:
        return sorted({round(100 * np.mean(v[j]), 1) for v in self.cells.values() if v[j]}, reverse=True)

    def best(self, j: int) -> float | None:
        """The column's best mean as printed (rounded), so equal printed values are both bold."""
        means = self._means(j)
        return means[0] if means else None

    def second(self, j: int) -> float | None:
        """The column's second-best printed mean (LaTeX underlines it, as the paper does)."""
        means = self._means(j)
        return means[1] if len(means) > 1 else None

    def difference(self, method: str, j: int) -> Difference | str | None:
        """Column j's difference of `method` to the reference; a str says why there is none; None
        where none is asked for (the reference's own row, an n/a row, no runs of the method or of
        the reference in that cell, differences off)."""
        sig, c = self.significance, self.columns[j]
        cell = (c.dataset, c.leads, c.fraction)
        reference = self.reference_of(method)
        if sig is None or not sig.n_resamples or reference is None or method == reference \
                or method in self.unavailable \
                or cell not in self.members.get(method, ()) or cell not in self.members.get(reference, ()):
            return None
        found = sig.cells.get((method, cell))
        return found if found is None or isinstance(found, str) else found[c.metric]

    def set_significance(self, sig: Significance) -> None:
        """Attach the differences and adjust the p-values of this table's family: every testable
        difference it shows (each method with min_runs runs, min_test_patients patients); the
        same cell in another table is adjusted within that table's family."""
        self.significance = sig
        family = [(m, j) for m in self.cells for j in range(len(self.columns))
                  if isinstance(d := self.difference(m, j), Difference) and d.testable]
        adjusted = adjust_p([self.difference(m, j).p_value for m, j in family], sig.adjust)
        self.adjusted = dict(zip(family, map(float, adjusted)))

    def marked(self, method: str, j: int) -> bool:
        p = self.adjusted.get((method, j))
        return p is not None and p < 1 - self.significance.level

    def unmarked_because(self, method: str, j: int) -> str:
        """Why a cell with a difference (or a reason for none) has no mark; '' otherwise."""
        d = self.difference(method, j)
        if isinstance(d, str):
            return d
        if not isinstance(d, Difference) or self.marked(method, j):
            return ""
        if not d.testable:
            return d.unmarkable
        alpha = 1 - self.significance.level
        return f"adjusted p ({self.significance.adjust}) {self.adjusted[(method, j)]:.3g} >= {alpha:g}"


def build_table(spec: TableSpec, runs: Sequence[Run], f1: str = "threshold") -> Table:
    """Rows: methods in first-seen order; columns: dataset x variant x metric. RunError if a cell
    holds two runs with one seed (the same run passed twice, or two runs that collide)."""
    if f1 not in F1_KEYS:
        raise ValueError(f"f1={f1!r} is not one of {tuple(F1_KEYS)}")
    members = [(r, v) for r in runs if (v := variant_of(spec, r))]
    columns = [Column(d, v[0], v[1], m, " ".join(filter(None, (DATASETS.get(d, d), v[2], label))),
                      " ".join(filter(None, (DATASETS.get(d, d), v[2]))))
               for d in dataset_order([r for r, _ in members]) for v in spec.variants
               for m, label in METRICS.items()]
    index = {(c.dataset, c.leads, c.fraction, c.metric): j for j, c in enumerate(columns)}
    cells: dict[str, list[list[float]]] = {}
    seeds: dict[tuple, Run] = {}
    cell_members: dict[str, set[Cell]] = {}
    fallback = []
    for run, (leads, fraction, _) in members:
        key = (run.method, run.dataset, leads, fraction, run.seed)
        if key in seeds:
            raise RunError(f"{run.path} and {seeds[key].path}: two runs of {run.method} on {run.dataset} "
                           f"({leads} leads, fraction {fraction}) with seed {run.seed}")
        seeds[key] = run
        cell_members.setdefault(run.method, set()).add((run.dataset, leads, fraction))
        row = cells.setdefault(run.method, [[] for _ in columns])
        for metric in METRICS:
            name = metric_key(run, metric, f1)
            if f1 == "argmax" and metric == "f1" and name == "f1":
                fallback.append(run.dataset)
            value = require(run.record["test"], name, (int, float, type(None)), run.path, parent="test.")
            if value is not None and value == value:     # null (or NaN): undefined in this run
                row[index[(run.dataset, leads, fraction, metric)]].append(float(value))
    leaks: dict[str, list[str]] = {}
    for run, _ in members:
        if note := leakage_note(run.record):
            leaks.setdefault(run.method, []).append(f"{DATASETS.get(run.dataset, run.dataset)}, seed {run.seed}: {note}")
    return Table(spec, columns, cells, f1=f1, f1_fallback=tuple(dict.fromkeys(fallback)), members=cell_members,
                 leaks=leaks)


def column_differences(cell: Cell, ref: list[Run], others: dict[str, list[Run]], report: ReportConfig,
                       reference: str | None = None) -> dict[tuple[str, Cell], dict[str, Difference]]:
    """`cell_differences` of one cell by table column: {(method, cell): {metric column: Difference}};
    `ref` are the runs of `reference` (default report.reference)."""
    reference = report.reference if reference is None else reference
    multilabel, class_names = run_task(ref[0])
    for method_runs in others.values():
        if run_task(method_runs[0])[1] != class_names:
            raise RunError(f"{method_runs[0].path} and {ref[0].path}: one table cell, other class names")
    keys = {m: metric_key(ref[0], m, report.f1) for m in METRICS}    # column -> metrics.json key
    try:
        found = cell_differences({reference: ref, **others}, reference,
                                 list(dict.fromkeys(keys.values())), multilabel, class_names,
                                 report.bootstrap_resamples, report.seed, report.level, report.min_runs,
                                 report.min_test_patients)
    except PairingError as e:
        raise RunError(str(e)) from None
    return {(method, cell): {m: by_metric[key] for m, key in keys.items()} for method, by_metric in found.items()}
