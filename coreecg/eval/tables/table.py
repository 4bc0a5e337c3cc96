"""A results table as data: rows (methods) x columns (dataset x variant x metric) of test
metrics over seeds, with each cell's difference to a reference row (coreecg/eval/significance.py)
and the p-values adjusted within each metric's family (the primary metric's and each secondary
metric's own), each difference's detectable size and, for the primary metric, its equivalence
test. `build_table` makes one from runs
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
from scipy import stats

from coreecg.config import ReportConfig
from coreecg.eval.runs import (DATASETS, F1_KEYS, METRICS, Run, RunError, is_regression, leakage_note, metric_key,
                               require, run_task)
from coreecg.eval.significance import (Difference, PairingError, adjust_p, cell_differences, detectable_difference,
                                      equivalence_p)

TABLE_MODES = ("finetune", "scratch")     # the run modes the method tables hold
MISSING = "–"
UNAVAILABLE = "n/a"
NO_PREDICTIONS = "no predictions.csv"
LEAK = "‡"      # a method with a run that the leakage guard let through (--allow-overlap)
BELOW = "↓"     # a cell whose AUROC interval over runs lies under 0.5: worse than constant outputs, on this test set
CHANCE = 0.5


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
    if run.mode not in spec.modes or is_regression(run):      # a regression run: the regression table's
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
    primary_metric: str = "auroc"
    equivalence_margin: float = 2.0       # percentage points of the primary metric
    power: float = 0.8                    # the power of the stated detectable difference

    @classmethod
    def of(cls, reference: str, report: ReportConfig) -> "Significance":
        """The report's rule, differences to `reference` ("" where each row has its own)."""
        return cls(reference, report.bootstrap_resamples, report.level, report.adjust, report.min_runs,
                   report.min_test_patients, primary_metric=report.primary_metric,
                   equivalence_margin=report.equivalence_margin, power=report.power)


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
    # metric -> its family: the testable differences of its columns, corrected together
    families: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    detectable: dict[tuple[str, int], float] = field(default_factory=dict)   # smallest detectable difference
    equivalence: dict[tuple[str, int], float] = field(default_factory=dict)  # adjusted TOST p (primary metric)
    footnotes: list[str] = field(default_factory=list)   # protocol differences of its rows (eval/fairness)
    leaks: dict[str, list[str]] = field(default_factory=dict)   # method -> its runs' leakage notes
    # row -> the row its differences are to (a reference per row, coreecg/eval/tables/label_efficiency.py); None: every
    # row's is significance.reference. A row missing from the dict has no difference (a baseline).
    references: dict[str, str] | None = None
    row_of: dict[Path, str] = field(default_factory=dict)      # run folder -> its row, where not its method
    behind: set[Path] = field(default_factory=set)   # the runs behind its cells, set for a report (runs_behind)
    below_chance: dict[tuple[str, int], float] = field(default_factory=dict)   # (row, AUROC column) -> upper bound
    # dataset -> {class left out of the macro means as rare: its positive test patients}; and the
    # datasets with runs written before the rule (their macro means hold every class)
    rare: dict[str, dict[str, int]] = field(default_factory=dict)
    rare_unknown: set[str] = field(default_factory=set)
    # datasets whose printed argmax F1 is a run's stored macro with its rare classes (written before
    # per-class argmax F1), where its difference leaves them out
    rare_argmax_stored: set[str] = field(default_factory=set)
    # columns printed between a row's name and its metrics: header -> row -> text (e.g. an encoder's
    # parameters and FLOPs, coreecg/eval/tables/encoder_objective.py)
    lead_columns: dict[str, dict[str, str]] = field(default_factory=dict)
    # rows placed under the measured ones for context (published numbers), never compared, bold or
    # marked: (label, {column index: text})
    context: list[tuple[str, dict[int, str]]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)       # further lines under the table (the context's)

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
        """Attach the differences and correct them family by family: one family per metric, the
        testable differences of its columns (each method with min_runs runs, min_test_patients
        patients, a variance to test with); the primary metric's family is what the table's claims
        rest on, each secondary metric's is its own. Per testable difference also the smallest
        difference it could detect (at sig.power, with its family's size) and, in the primary
        metric, the equivalence test's adjusted p. The same cell in another table is corrected
        within that table's families."""
        self.significance = sig
        alpha = 1 - sig.level
        self.families, self.adjusted, self.detectable, self.equivalence = {}, {}, {}, {}
        for metric in dict.fromkeys(c.metric for c in self.columns):
            family = [(m, j) for m in self.cells for j, c in enumerate(self.columns)
                      if c.metric == metric and isinstance(d := self.difference(m, j), Difference) and d.testable]
            if not family:
                continue
            self.families[metric] = family
            found = [self.difference(m, j) for m, j in family]
            self.adjusted.update(zip(family, map(float, adjust_p([d.p_value for d in found], sig.adjust))))
            k = 1 if sig.adjust == "none" else len(family)
            self.detectable.update({key: detectable_difference(d.se, d.df, alpha, k, sig.power, d.parts)
                                    for key, d in zip(family, found)})
            if metric == sig.primary_metric:
                margin = sig.equivalence_margin / 100
                tost = adjust_p([equivalence_p(d.diff, d.se, d.df, margin) for d in found], sig.adjust)
                self.equivalence.update(zip(family, map(float, tost)))

    def family_of(self, method: str, j: int) -> str | None:
        """The metric whose family holds this difference (None: not testable, in no family)."""
        metric = self.columns[j].metric
        return metric if (method, j) in self.families.get(metric, ()) else None

    def verdict(self, method: str, j: int) -> str:
        """What a difference shows: "different" (marked), "equivalent within +-m points" (the
        primary metric, shown by TOST), else "inconclusive" with the smallest difference this cell
        could detect; or why it is not tested."""
        if (method, j) not in self.adjusted:
            return self.unmarked_because(method, j)
        sig, alpha = self.significance, 1 - self.significance.level
        adjusted = self.adjusted[(method, j)]
        if adjusted < alpha:
            return f"different (adjusted p {adjusted:.3g} < {alpha:g})"
        tost = self.equivalence.get((method, j))
        if tost is not None and tost < alpha:
            return (f"equivalent within ±{sig.equivalence_margin:g} points (two one-sided tests, adjusted p "
                    f"{tost:.3g} < {alpha:g})")
        return (f"inconclusive: the smallest detectable difference here is {100 * self.detectable[(method, j)]:.1f} "
                f"points (power {sig.power:g})")

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


def build_table(spec: TableSpec, runs: Sequence[Run], f1: str = "threshold", min_positive_patients: int = 1) -> Table:
    """Rows: methods in first-seen order; columns: dataset x variant x metric. RunError if a cell
    holds two runs with one seed (the same run passed twice, or two runs that collide). A class with
    fewer than `min_positive_patients` positive test patients is left out of each run's macro F1 and
    AUROC (`rule_value`; report.min_positive_patients)."""
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
    fallback, argmax_stored = [], []
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
            if rule_unapplied(run.record["test"], name, min_positive_patients):
                argmax_stored.append(run.dataset)
            value = rule_value(run.record["test"], name, value, min_positive_patients)
            if value is not None and value == value:     # null (or NaN): undefined in this run
                row[index[(run.dataset, leads, fraction, metric)]].append(float(value))
    table_below = below_chance_cells(cells, columns, members, index)
    rare, rare_unknown = rare_classes(members, min_positive_patients)
    leaks: dict[str, list[str]] = {}
    for run, _ in members:
        if note := leakage_note(run.record):
            dataset = DATASETS.get(run.dataset, run.dataset)
            leaks.setdefault(run.method, []).append(f"{dataset}, seed {run.seed}: {note}")
    return Table(spec, columns, cells, f1=f1, f1_fallback=tuple(dict.fromkeys(fallback)), members=cell_members,
                 leaks=leaks, below_chance=table_below, rare=rare, rare_unknown=rare_unknown,
                 rare_argmax_stored=set(argmax_stored))


def rare_classes(members: list, min_positive_patients: int) -> tuple[dict[str, dict[str, int]], set[str]]:
    """Per dataset, the classes its test set holds fewer than `min_positive_patients` positive
    patients of (metrics.json test.per_class.<class>.positive_patients), with their counts; and
    the datasets with a run written before per-class patient counts (its macros hold every class)."""
    rare: dict[str, dict[str, int]] = {}
    unknown: set[str] = set()
    if min_positive_patients <= 1:
        return rare, unknown
    for run, _ in members:
        counts = patient_counts(run.record.get("test") or {})
        if counts is None:
            unknown.add(run.dataset)
            continue
        for name, n in counts.items():
            if 0 < n < min_positive_patients:
                rare.setdefault(run.dataset, {})[name] = n
    return rare, unknown


def patient_counts(test: dict) -> dict[str, int] | None:
    """class -> positive test patients (metrics.json test.per_class), None for a run written before."""
    per_class = test.get("per_class") or {}
    if not per_class or any("positive_patients" not in v for v in per_class.values()):
        return None
    return {name: int(v["positive_patients"]) for name, v in per_class.items()}


RULE_KEYS = ("auroc", "f1", "f1_argmax")     # the macro means the rare-class rule recomputes from per_class


def _has_rare(test: dict, min_positive_patients: int) -> bool:
    """The run's test set holds a class with positives under `min_positive_patients` patients."""
    counts = patient_counts(test) if min_positive_patients > 1 else None
    return counts is not None and any(0 < n < min_positive_patients for n in counts.values())


def rule_value(test: dict, key: str, value: float | None, min_positive_patients: int) -> float | None:
    """The macro F1, argmax F1 or AUROC of a run without the classes under `min_positive_patients`
    positive test patients: the mean of test.per_class's values over the classes kept (None when
    none is), the classes its difference is tested on. ACC (every class) keeps its stored value; so
    do runs written before per-class patient counts or, for f1_argmax, before per-class argmax F1
    (`rule_unapplied`; the legend names them)."""
    if key not in RULE_KEYS or not _has_rare(test, min_positive_patients) \
            or rule_unapplied(test, key, min_positive_patients):
        return value
    counts = patient_counts(test)
    kept = [v[key] for name, v in test["per_class"].items()
            if counts[name] >= min_positive_patients and v.get(key) is not None]
    return float(np.mean(kept)) if kept else None


def rule_unapplied(test: dict, key: str, min_positive_patients: int) -> bool:
    """The run has rare classes but no per-class values of `key` to leave them out with (argmax F1
    of a run written before per-class argmax F1): its printed value holds them."""
    return (key in RULE_KEYS and _has_rare(test, min_positive_patients)
            and any(key not in v for v in test["per_class"].values()))


def chance_interval_high(values: Sequence[float], single_ci_high: float | None, level: float = 0.95) -> float | None:
    """The upper end of a cell's AUROC interval: over its runs, mean + t_{n-1} x SD / sqrt(n) (two or
    more runs: the training runs are the replicates, on one test set: its sampling, shared by every
    run, is not in it); one run: its own patient-bootstrap interval's (metrics.json
    test.ci.auroc.high); None where there is none."""
    if len(values) >= 2:
        return float(np.mean(values) + stats.t.ppf((1 + level) / 2, len(values) - 1)
                     * np.std(values, ddof=1) / np.sqrt(len(values)))
    return single_ci_high if values else None


def below_chance_cells(cells: dict[str, list[list[float]]], columns: list[Column], members: list,
                       index: dict) -> dict[tuple[str, int], float]:
    """(row, AUROC column) -> the upper end of its interval, where that lies under 0.5: the row ranks
    its classes worse than constant outputs would on this test set (flagged BELOW in the table; the
    interval over runs leaves out the test set's sampling, which its runs share)."""
    single: dict[tuple[str, int], float] = {}
    for run, (leads, fraction, _) in members:
        ci = (run.record.get("test", {}).get("ci") or {}).get("auroc") or {}
        if isinstance(ci, dict) and isinstance(ci.get("high"), (int, float)):
            single[(run.method, index[(run.dataset, leads, fraction, "auroc")])] = float(ci["high"])
    out = {}
    for method, row in cells.items():
        for j, c in enumerate(columns):
            if c.metric == "auroc":
                high = chance_interval_high(row[j], single.get((method, j)))
                if high is not None and high < CHANCE:
                    out[(method, j)] = high
    return out


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
                                 report.min_test_patients, report.min_positive_patients)
    except PairingError as e:
        raise RunError(str(e)) from None
    return {(method, cell): {m: by_metric[key] for m, key in keys.items()} for method, by_metric in found.items()}
