"""The paper's result tables from saved fine-tuning runs (comparison, lead reduction, training
fraction), as Markdown, CSV and LaTeX, plus every run in all_runs.csv. Every method's cell is
compared with a reference method's (default CoRe-ECG) over training runs, test patients resampled
within (coreecg/eval/significance.py); a difference is marked when both methods have
report.min_runs runs, the test set report.min_test_patients patients, and its p-value, adjusted
over the table's comparisons (report.adjust), is below 1 - report.level.

Contract: the fine-tuning job writes RUN_DIR/metrics.json as

    {"method": "CoRe-ECG",          # table row; "Supervised" for scratch runs; ablations by name
     "dataset": "ptbxl",            # ptbxl | icbeb2018 | ningbo (cpsc2018 is read as icbeb2018)
     "mode": "finetune",            # finetune | scratch enter the tables; linear and frozen only
                                    #   all_runs.csv and the label-efficiency table
                                    #   (coreecg/eval/label_efficiency.py)
     "leads": "12",                 # "12" | "6" | "1" (an integer is read as its string)
     "train_fraction": 1.0,         # 1.0 | 0.5 | 0.05 in the tables
     "seed": 0,                     # one run per (method, dataset, mode, leads, fraction, seed)
     "multilabel": false, "class_names": [...],
     "test": {"acc": 0.9, "f1": 0.7, "f1_argmax": 0.71, "auroc": 0.93, "n": 123,
              "ci": {"acc": {"low": .., "high": .., "undefined_resamples": 0}, ...},
              "per_class": {...}, "classes_left_out": {...}, ...},   # classification_metrics
     "val": {...same keys...},                                        #   + bootstrap_ci as "ci"
     "crop_rule": "...", "encoder": "path, \"random\" or null", "encoder_config_hash": "...",
     "split_rule": "patients",      # or "folds" (PTB-XL strat_fold); optional, all_runs.csv only
     "leakage": {"overlap": bool, "allowed": bool, "checked": bool, "b_records": n, ...}}  # optional

`jobs/finetune.py` (coreecg.train.finetuning) also writes lead_names, corpus, config_hash,
selection {metric, best_epoch (from 1), best_step, val_auroc, epochs, steps}, counts, train_subset,
classes_absent_from_train, aggregation, bootstrap_resamples and unlabelled_windows_skipped.
Metrics are fractions in [0, 1] (null where undefined; NaN is read as null); the tables print
test metrics in percent.
The report reads method, dataset, mode, leads, train_fraction, seed and test.{acc, f1, auroc}
(and with report.f1=argmax multilabel and, single-label, test.f1_argmax); a folder without
metrics.json, or one missing any of these or with a wrong type, is a RunError naming the folder.
Differences between methods read RUN_DIR/predictions.csv (one row per test record) and multilabel and
class_names; a run without predictions.csv leaves its cells without a difference.
A run whose "leakage" says the guard was overruled (--allow-overlap: overlap, or unchecked) puts
‡ after its method's name and a note under every table it is in, and a note in all_runs.csv.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field, replace
from math import isclose
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from coreecg.config import ReportConfig
from coreecg.eval.fairness import Allowance, check_table, run_entries
from coreecg.eval.significance import PREDICTIONS, Difference, PairingError, adjust_p, cell_differences

METRICS = {"acc": "ACC", "f1": "F1", "auroc": "AUROC"}
DATASETS = {"ptbxl": "PTB-XL", "icbeb2018": "ICBEB2018", "ningbo": "Ningbo"}   # the paper's order
DATASET_ALIASES = {"cpsc2018": "icbeb2018"}
TABLE_MODES = ("finetune", "scratch")
LEADS = ("12", "6", "1")
FRACTIONS = (1.0, 0.5, 0.05)
MISSING = "–"
UNAVAILABLE = "n/a"
F1_KEYS = {"threshold": "f1", "argmax": "f1_argmax"}
NO_PREDICTIONS = "no predictions.csv"
ADJUST_NAMES = {"holm": "Holm's correction", "bh": "the Benjamini-Hochberg correction (false discovery rate)",
                "none": "no correction for multiple comparisons"}
SAMPLING_ONLY = "test-set sampling only, not a claim about the methods"
LEAK = "‡"      # a method with a run that the leakage guard let through (--allow-overlap)


class RunError(ValueError):
    """A run folder the report cannot read; the message names the folder."""


@dataclass(frozen=True)
class Run:
    path: Path
    method: str
    dataset: str
    mode: str
    leads: str
    train_fraction: float
    seed: int
    record: dict          # the whole metrics.json


def _require(record: dict, key: str, types: type | tuple, where: Path, parent: str = "") -> object:
    name = f"{parent}{key}"
    if key not in record:
        raise RunError(f"{where}: metrics.json has no '{name}'")
    value = record[key]
    if not isinstance(value, types) or isinstance(value, bool):   # JSON true is a Python int
        raise RunError(f"{where}: metrics.json '{name}' is {value!r}, not of type {types}")
    return value


def load_run(run_dir: str | Path) -> Run:
    """Read and check RUN_DIR/metrics.json against the contract above (RunError otherwise)."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.json"
    if not path.is_file():
        raise RunError(f"{run_dir}: no metrics.json (not a fine-tuning run folder?)")
    try:
        record = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RunError(f"{run_dir}: metrics.json is not valid JSON: {e}") from None
    if not isinstance(record, dict):
        raise RunError(f"{run_dir}: metrics.json is not a JSON object")
    for key in ("method", "dataset", "mode"):
        if not _require(record, key, str, run_dir):
            raise RunError(f"{run_dir}: metrics.json '{key}' is empty")
    leads = str(_require(record, "leads", (str, int), run_dir))
    fraction = float(_require(record, "train_fraction", (int, float), run_dir))
    if not 0 < fraction <= 1:
        raise RunError(f"{run_dir}: metrics.json 'train_fraction' {fraction} is not in (0, 1]")
    seed = _require(record, "seed", int, run_dir)
    test = _require(record, "test", dict, run_dir)
    for metric in METRICS:
        _require(test, metric, (int, float, type(None)), run_dir, parent="test.")
    dataset = DATASET_ALIASES.get(record["dataset"], record["dataset"])
    return Run(run_dir, record["method"], dataset, record["mode"], leads, fraction, seed, record)


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


TABLES = (
    TableSpec("comparison", "Comparison (12 leads, all training data)", (("12", 1.0, ""),)),
    TableSpec("lead_reduction", "Lead reduction (all training data)",
              tuple((lead, 1.0, f"{lead}-lead") for lead in LEADS), "Leads"),
    TableSpec("train_fraction", "Reduced fine-tuning data (12 leads)",
              tuple(("12", f, f"{f:.0%}") for f in FRACTIONS), "Data ratio"),
)


def _lead_label(leads: str) -> str:
    return f"{leads}-lead" if leads.isdigit() else leads


def table_specs(runs: Sequence[Run]) -> tuple[TableSpec, ...]:
    """TABLES with the columns of the settings the runs hold: lead sets (all training data) and
    fractions (12 leads), the paper's (12/6/1, 100/50/5 %) in its order, then others (a study's
    own: leads as first seen, fractions from the largest). A paper column that no run fills is
    left out when the runs fill others (a study with 20 % in place of 5 % shows no empty 5 %)."""
    table = [r for r in runs if r.mode in TABLE_MODES]
    lead_sets = {r.leads for r in table if isclose(r.train_fraction, 1.0)}
    leads = [*(x for x in LEADS if x in lead_sets), *dict.fromkeys(r.leads for r in table if r.leads not in LEADS
                                                                    and isclose(r.train_fraction, 1.0))]
    ran = [r.train_fraction for r in table if r.leads == "12"]
    fractions = [*(f for f in FRACTIONS if any(isclose(f, g) for g in ran)),
                 *sorted({f for f in ran if not any(isclose(f, g) for g in FRACTIONS)}, reverse=True)]
    comparison, lead_table, fraction_table = TABLES
    return (comparison,
            replace(lead_table, variants=tuple((lead, 1.0, _lead_label(lead)) for lead in leads)
                    or lead_table.variants),
            replace(fraction_table, variants=tuple(("12", f, f"{f:.0%}") for f in fractions)
                    or fraction_table.variants))


def variant_of(spec: TableSpec, run: Run) -> tuple[str, float, str] | None:
    """The table variant (column block) a run belongs to, or None if it is not in the table."""
    if run.mode not in spec.modes:
        return None
    return next((v for v in spec.variants if v[0] == run.leads and isclose(v[1], run.train_fraction)), None)


def _dataset_order(runs: Sequence[Run]) -> list[str]:
    seen = list(dict.fromkeys(r.dataset for r in runs))
    return [d for d in DATASETS if d in seen] + [d for d in seen if d not in DATASETS]


def _multilabel(run: Run) -> bool:
    value = run.record.get("multilabel")
    if not isinstance(value, bool):
        raise RunError(f"{run.path}: metrics.json 'multilabel' is {value!r}, not true or false")
    return value


def metric_key(run: Run, metric: str, f1: str = "threshold") -> str:
    """The metrics.json test key a column prints: F1 is test.f1 (the paper's 0.5 threshold) or,
    with f1="argmax", test.f1_argmax on a single-label run (a multi-label run has no argmax F1)."""
    if metric == "f1" and not _multilabel(run):
        return F1_KEYS[f1]
    return metric


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
    # row -> the row its differences are to (a reference per row, coreecg/eval/label_efficiency.py); None: every
    # row's is significance.reference. A row missing from the dict has no difference (a baseline).
    references: dict[str, str] | None = None
    row_of: dict[Path, str] = field(default_factory=dict)      # run folder -> its row, where not its method

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
               for d in _dataset_order([r for r, _ in members]) for v in spec.variants
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
            value = _require(run.record["test"], name, (int, float, type(None)), run.path, parent="test.")
            if value is not None and value == value:     # null (or NaN): undefined in this run
                row[index[(run.dataset, leads, fraction, metric)]].append(float(value))
    leaks: dict[str, list[str]] = {}
    for run, _ in members:
        if note := leakage_note(run.record):
            leaks.setdefault(run.method, []).append(f"{DATASETS.get(run.dataset, run.dataset)}, seed {run.seed}: {note}")
    return Table(spec, columns, cells, f1=f1, f1_fallback=tuple(dict.fromkeys(fallback)), members=cell_members,
                 leaks=leaks)


def leakage_note(record: dict) -> str:
    """What a run's metrics.json "leakage" says when the guard was overruled (--allow-overlap):
    the val/test records shared with the encoder's pretraining corpus, or that it went unchecked."""
    leak = record.get("leakage") if isinstance(record.get("leakage"), dict) else {}
    if leak.get("overlap"):
        return (f"{leak.get('b_records')} val/test record(s) share a patient ({leak.get('patient_records')}) or a "
                f"recording ({leak.get('signal_records')}) with the encoder's pretraining corpus (overlap.csv)")
    if leak.get("allowed") and leak.get("checked") is False and leak.get("pretraining_corpus"):
        return "leakage not checked (the pretraining corpus was not found)"
    return ""


def _leak_notes(table: Table) -> list[str]:
    return [f"{LEAK} {m}: trained with --allow-overlap; {n}" for m, notes in table.leaks.items() if m in table.cells
            for n in notes]


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def _f1_note(table: Table) -> str:
    """Which F1 the table prints (report.f1)."""
    if table.f1 == "threshold":
        return "F1: macro F1 at the paper's fixed 0.5 threshold (metrics.json test.f1)."
    text = ("F1: macro F1 of argmax decisions, as ST-MEM's code computes it (metrics.json test.f1_argmax), "
            "not the paper's 0.5 threshold")
    if table.f1_fallback:
        names = ", ".join(DATASETS.get(d, d) for d in table.f1_fallback)
        text += f"; {names}: multi-label, no argmax decision, so F1 at the 0.5 threshold (test.f1)"
    return text + "."


def _unmarkable_counts(table: Table) -> dict[str, int]:
    """How many of the table's cells have no mark for a reason other than their p-value, by kind."""
    sig, counts = table.significance, {}
    for method in table.cells:
        for j in range(len(table.columns)):
            d = table.difference(method, j)
            why = d if isinstance(d, str) else d.unmarkable if isinstance(d, Difference) else None
            for part in why.split("; ") if why else ():      # a cell may lack both runs and patients
                kind = ("runs" if part.startswith("fewer than") else "patients" if part.endswith(
                    f"fewer than {sig.min_test_patients}") else part)
                counts[kind] = counts.get(kind, 0) + 1
    return counts


def _significance_note(table: Table, mark: str) -> str:
    """The legend of the significance mark: the rule, its correction and family, and the cells that
    cannot be marked and why (they are not in the family)."""
    sig = table.significance
    if sig is None:
        return ""
    if not sig.n_resamples:
        return "No differences between methods (report.bootstrap_resamples = 0)."
    if table.references is not None:
        if not any(ref in table.members for ref in table.references.values()):
            return "No runs of a baseline row in this table: no differences between methods."
        rows_of = {b: [m for m, r in table.references.items() if r == b] for b in table.references.values()}
        target, reference_row = "its row's baseline", (
            "; ".join(f"{', '.join(rows)} against {b}" for b, rows in rows_of.items())
            + "; a baseline's own row has no difference")
    elif sig.reference not in table.members:
        return f"No {sig.reference} runs in this table: no differences between methods."
    else:
        target, reference_row = sig.reference, f"{sig.reference}'s row is the reference"
    alpha = 1 - sig.level
    text = (f"{mark} the difference to {target} has a p-value below {alpha:g} after "
            f"{ADJUST_NAMES[sig.adjust]} over the {len(table.adjusted)} comparison(s) of this table that can be "
            f"marked: Welch's t over training runs (each method >= {sig.min_runs} runs in the cell), test patients "
            f"resampled within ({sig.n_resamples:,} resamples; docs/evaluation.md, Differences between methods); "
            f"{reference_row}.")
    counts = _unmarkable_counts(table)
    excluded = " Cells that cannot be marked are not counted in the correction." if counts else ""
    if n := counts.pop("runs", 0):
        text += (f" {n} cell(s) have fewer than {sig.min_runs} runs of a method: their difference interval is "
                 f"{SAMPLING_ONLY}; never marked.")
    if n := counts.pop("patients", 0):
        text += f" {n} cell(s) have fewer than {sig.min_test_patients} test patients: not marked."
    if counts:
        text += (f" {sum(counts.values())} cell(s) have no difference: "
                 + ", ".join(f"{n} with {why}" for why, n in counts.items()) + ".")
    return text + excluded


def _pp(x: float | None) -> str:
    return MISSING if x is None else f"{100 * x:+.1f}"


def table_markdown(table: Table) -> str:
    """The table as the paper prints it (best per column in bold, second underlined, a difference to
    the reference marked \\* by `Table.marked`), then a runs-per-cell table (n per dataset block;
    shown as 'ACC/F1/AUROC' counts when a metric was undefined in some run) and the differences to
    the reference."""
    cols = table.columns
    lines = [f"# {table.spec.title}", "",
             "Test-set metrics in percent: mean ± sample standard deviation over seeds (the mean alone "
             f"for one run). Best per column in **bold**, second <u>underlined</u>; {MISSING}: no run. "
             f"{_f1_note(table)}", "",
             _markdown_row(["Method"] + [c.label for c in cols]), _markdown_row(["---"] * (len(cols) + 1))]
    for method, row in table.cells.items():
        if method in table.unavailable:
            lines.append(_markdown_row([f"{method}†"] + [UNAVAILABLE] * len(cols)))
            continue
        label = method + (LEAK if method in table.leaks else "")
        out = []
        for j, values in enumerate(row):
            text = format_cell(values) or MISSING
            mean = round(100 * np.mean(values), 1) if values else None
            if mean is not None and mean == table.best(j):
                text = f"**{text}**"
            elif mean is not None and mean == table.second(j):
                text = f"<u>{text}</u>"          # GitHub renders it, as the paper underlines
            out.append(text + ("\\*" if table.marked(method, j) else ""))
        lines.append(_markdown_row([label] + out))
    notes = [f"† {UNAVAILABLE}: {m}: {why}" for m, why in table.unavailable.items()] + _leak_notes(table)
    if note := _significance_note(table, "\\*"):
        notes.append(note)
    notes += [f"Protocol: {n}" for n in table.footnotes]
    if notes:
        lines += [""] + notes
    groups = list(dict.fromkeys(c.group for c in cols))
    lines += ["", "Runs per cell:", "",
              _markdown_row(["Method"] + groups), _markdown_row(["---"] * (len(groups) + 1))]
    for method, row in table.cells.items():
        counts = []
        for g in groups:
            n = [len(row[j]) for j, c in enumerate(cols) if c.group == g]
            counts.append(MISSING if not any(n) else str(n[0]) if len(set(n)) == 1 else "/".join(map(str, n)))
        lines.append(_markdown_row([method] + counts))
    lines += _differences_markdown(table)
    return "\n".join(lines) + "\n"


def _differences_markdown(table: Table) -> list[str]:
    """The differences to the reference in percentage points with their intervals; an interval from
    test-set sampling alone (fewer than min_runs runs) is flagged §."""
    cols, sig = table.columns, table.significance
    diffs = {m: [table.difference(m, j) for j in range(len(cols))] for m in table.cells}
    diffs = {m: row for m, row in diffs.items() if any(isinstance(d, Difference) for d in row)}
    if not diffs:
        return []

    def text(d) -> str:
        if not isinstance(d, Difference) or d.diff is None:
            return MISSING
        return f"{_pp(d.diff)} [{_pp(d.low)}, {_pp(d.high)}]" + ("§" if d.p_value is None else "")

    if table.references is not None:
        head = ("Differences to each row's baseline in percentage points (the row's mean over its runs minus the "
                "baseline's)")
        names = {m: f"{m} − {table.references[m]}" for m in diffs}
    else:
        head = (f"Differences to {sig.reference} in percentage points (the method's mean over its runs minus "
                f"{sig.reference}'s)")
        names = {m: m for m in diffs}
    lines = ["", f"{head} [{100 * sig.level:g} % interval over training runs and test patients; § "
                 f"fewer than {sig.min_runs} runs of a method: {SAMPLING_ONLY}]; p-values, run counts and why a "
                 "cell is not marked in the CSV:", "",
             _markdown_row(["Method"] + [c.label for c in cols]), _markdown_row(["---"] * (len(cols) + 1))]
    return lines + [_markdown_row([names[method]] + [text(d) for d in row]) for method, row in diffs.items()]


DIFF_FIELDS = ("diff", "diff low", "diff high", "p", "p adjusted", "diff runs", "diff reference runs",
               "unmarked because")


def _diff_fields(table: Table, method: str, j: int) -> list:
    """The CSV's difference fields of one cell: percentage points, raw and adjusted p, the run
    counts of the method and the reference, why it has no mark ('' where none applies)."""
    d = table.difference(method, j)
    if not isinstance(d, Difference):
        return [""] * (len(DIFF_FIELDS) - 1) + [table.unmarked_because(method, j)]
    pp = ["" if x is None else f"{100 * x:.2f}" for x in (d.diff, d.low, d.high)]
    adjusted = table.adjusted.get((method, j))
    return pp + ["" if d.p_value is None else f"{d.p_value:.3g}", "" if adjusted is None else f"{adjusted:.3g}",
                 len(d.seeds), len(d.reference_seeds), table.unmarked_because(method, j)]


def write_table_csv(table: Table, path: Path) -> None:
    """One row per method; per column the printed cell ('' when missing) and its run count, then a
    note; after it, per column the difference to the reference in percentage points (diff, diff
    low, diff high), its raw and adjusted p-values, the run counts of the method and of the
    reference, and why the cell is not marked ('' where none applies: `_diff_fields`)."""
    diff_header = [f"{c.label} {name}" for c in table.columns for name in DIFF_FIELDS]
    per_row = table.references is not None      # a reference per row: its own column after the method
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method"] + (["baseline"] if per_row else [])
                   + [h for c in table.columns for h in (c.label, f"{c.label} n")] + ["note"] + diff_header)
        for method, row in table.cells.items():
            first = [method] + ([table.references.get(method, "")] if per_row else [])
            if method in table.unavailable:
                w.writerow(first + [UNAVAILABLE, 0] * len(table.columns) + [table.unavailable[method]]
                           + [""] * len(diff_header))
                continue
            w.writerow(first + [x for values in row for x in (format_cell(values), len(values))]
                       + ["; ".join(table.leaks.get(method, []))]
                       + [x for j in range(len(table.columns)) for x in _diff_fields(table, method, j)])


MARK = "\x00"      # stands for the significance mark until the caption is escaped
_LATEX_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
                  "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
                  "–": "--", "±": r"$\pm$", "†": r"\textsuperscript{\dag}", LEAK: r"\textsuperscript{\ddag}"}


def latex_escape(text: str) -> str:
    return "".join(_LATEX_SPECIAL.get(ch, ch) for ch in str(text))


def _latex_cell(table: Table, method: str, j: int) -> str:
    values = table.cells[method][j]
    if method in table.unavailable:
        return UNAVAILABLE
    if not values:
        return "--"
    text = format_cell(values).replace(" ± ", r" $\pm$ ")
    mean = round(100 * np.mean(values), 1)
    if mean == table.best(j):
        text = rf"\textbf{{{text}}}"
    elif mean == table.second(j):
        text = rf"\underline{{{text}}}"
    return text + (r"\textsuperscript{*}" if table.marked(method, j) else "")


def table_latex(table: Table) -> str:
    """The table as a booktabs `table` in the paper's layout: methods x datasets x (ACC, F1, AUROC),
    best per column bold, second underlined, a marked difference to the reference (`Table.marked`)
    \\textsuperscript{*}; a table of several variants (leads, fractions) gets one row block per
    variant, as the paper's Tables 2 and 3. Needs \\usepackage{booktabs, multirow}."""
    cols, variants = table.columns, table.spec.variants
    datasets = list(dict.fromkeys(c.dataset for c in cols))
    index = {(c.dataset, c.leads, c.fraction, c.metric): j for j, c in enumerate(cols)}
    lead = 2 if len(variants) > 1 else 1
    k = len(METRICS)
    caption = [f"{table.spec.title}. Test-set metrics in percent, mean ± standard deviation over seeds; best per "
               "column in bold, second underlined.", _f1_note(table)]
    caption += [f"† {UNAVAILABLE}: {m}: {why}." for m, why in table.unavailable.items()]
    caption += [f"{note}." for note in _leak_notes(table)]
    caption += [note] if (note := _significance_note(table, MARK)) else []
    caption += [f"Protocol: {n}." for n in table.footnotes]
    lines = [f"% {table.spec.name}: written by coreecg/eval/report.py; needs \\usepackage{{booktabs,multirow}}",
             r"\begin{table}[t]", r"\centering",
             r"\caption{" + latex_escape(" ".join(caption)).replace(MARK, r"\textsuperscript{*}") + "}",
             rf"\label{{tab:{table.spec.name}}}",
             r"\begin{tabular}{" + "l" * lead + " " + " ".join("c" * k for _ in datasets) + "}", r"\toprule"]
    head = ([rf"\multirow{{2}}{{*}}{{\textbf{{{latex_escape(table.spec.block)}}}}}"] if lead == 2 else [])
    head += [r"\multirow{2}{*}{\textbf{Method}}"]
    head += [rf"\multicolumn{{{k}}}{{c}}{{\textbf{{{latex_escape(DATASETS.get(d, d))}}}}}" for d in datasets]
    lines += [" & ".join(head) + r" \\",
              " ".join(rf"\cmidrule(lr){{{lead + 1 + i * k}-{lead + (i + 1) * k}}}" for i in range(len(datasets))),
              " & ".join([""] * lead + [label for _ in datasets for label in METRICS.values()]) + r" \\", r"\midrule"]
    blocks = []
    for leads, fraction, label in variants:
        js = [index[(d, leads, fraction, m)] for d in datasets for m in METRICS]
        methods = [m for m, row in table.cells.items()
                   if lead == 1 or m in table.unavailable or any(row[j] for j in js)]
        rows = []
        for i, method in enumerate(methods):
            name = latex_escape(method + (LEAK if method in table.leaks else "")) + \
                (r"\textsuperscript{\dag}" if method in table.unavailable else "")
            first = ([rf"\multirow{{{len(methods)}}}{{*}}{{{latex_escape(label.replace('-lead', ''))}}}" if i == 0
                      else ""] if lead == 2 else [])
            rows.append(" & ".join(first + [name] + [_latex_cell(table, method, j) for j in js]) + r" \\")
        if rows:
            blocks.append(rows)
    for i, rows in enumerate(blocks):
        lines += ([r"\midrule"] if i else []) + rows
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


RUN_FIELDS = ("method", "dataset", "mode", "leads", "train_fraction", "seed")


def write_all_runs_csv(runs: Sequence[Run], tables: Sequence[Table], path: Path) -> None:
    """Every run: its keys, the tables it is in, test and val metrics (fractions) and test CIs."""
    split_keys = ("n", "acc", "f1", "f1_argmax", "auroc")
    ci_keys = [f"test_{m}_{end}" for m in ("acc", "f1", "f1_argmax", "auroc") for end in ("low", "high")]
    header = (["run_dir", *RUN_FIELDS, "multilabel", "tables"]
              + [f"{s}_{k}" for s in ("test", "val") for k in split_keys]
              + ci_keys + ["encoder", "encoder_config_hash", "crop_rule", "split_rule", "leakage"])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        for run in runs:
            rec = run.record
            row = {"run_dir": str(run.path), **{k: getattr(run, k) for k in RUN_FIELDS},
                   "multilabel": rec.get("multilabel"),
                   "tables": ";".join(t.spec.name for t in tables
                                      if variant_of(t.spec, run) and t.row_of.get(run.path, run.method) in t.cells),
                   **{k: rec.get(k) for k in ("encoder", "encoder_config_hash", "crop_rule", "split_rule")},
                   "leakage": leakage_note(rec)}
            for split in ("test", "val"):
                metrics = rec.get(split) or {}
                row.update({f"{split}_{k}": metrics.get(k) for k in split_keys})
            ci = rec["test"].get("ci") or {}
            row.update({f"test_{m}_{end}": (ci.get(m) or {}).get(end)
                        for m in ("acc", "f1", "f1_argmax", "auroc") for end in ("low", "high")})
            w.writerow(row)



def method_table(name: str, title: str, methods: Sequence[str], runs: Sequence[Run],
                 unavailable: dict[str, str] | None = None, f1: str = "threshold") -> Table:
    """A comparison-style table (12 leads, all training data) of the named methods, in that order
    (the paper's Table 1 and ablation tables: one row per variant; a variant with no run is a row
    of –, one in `unavailable` a row of n/a with its reason under the table)."""
    spec = TableSpec(name, title, TABLES[0].variants)
    full = build_table(spec, [r for r in runs if r.method in methods], f1)
    empty = [[] for _ in full.columns]
    why = {m: r for m, r in (unavailable or {}).items() if m in methods}
    return Table(spec, full.columns, {m: full.cells.get(m, empty) for m in methods}, why, f1, full.f1_fallback,
                 full.members, leaks=full.leaks)


def table_runs(spec: TableSpec, runs: Sequence[Run]) -> list[Run]:
    """The runs of a lead or fraction table: the methods run beyond 12 leads and all data (the
    paper's Tables 2 and 3 compare those only), or every method when none was."""
    if spec is TABLES[0] or spec.name == TABLES[0].name:
        return list(runs)
    first = spec.variants[0]
    varied = {r.method for r in runs if (v := variant_of(spec, r)) and v != first}
    return [r for r in runs if r.method in varied] if varied else list(runs)


def _task(run: Run) -> tuple[bool, list[str]]:
    names = run.record.get("class_names")
    if not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names):
        raise RunError(f"{run.path}: metrics.json 'class_names' is {names!r}, not a list of class names")
    return _multilabel(run), names


def method_differences(runs: Sequence[Run], report: ReportConfig) -> Significance:
    """Differences to `report.reference` for every (method, cell) the tables hold (its F1,
    resamples, level, seed, min_runs, min_test_patients), from the runs' predictions.csv: one
    `cell_differences` per cell (so each run is resampled once however many tables show it). A
    method whose runs (or the reference's) lack predictions.csv gets the reason instead; runs that
    cannot be compared (other test records, labels or classes) are a RunError naming them."""
    settings = {(v[0], v[1]) for spec in table_specs(runs) for v in spec.variants}
    cells: dict[Cell, dict[str, list[Run]]] = {}
    for run in runs:
        setting = next((s for s in settings if s[0] == run.leads and isclose(s[1], run.train_fraction)), None)
        if run.mode in TABLE_MODES and setting:
            cells.setdefault((run.dataset, *setting), {}).setdefault(run.method, []).append(run)
    reference = report.reference
    sig = Significance(reference, report.bootstrap_resamples, report.level, report.adjust, report.min_runs,
                       report.min_test_patients)
    for cell, by_method in cells.items():
        ref = by_method.get(reference)
        if not ref or len(by_method) < 2 or not report.bootstrap_resamples:
            continue
        ready = {}
        for method, method_runs in by_method.items():
            if method == reference:
                continue
            if any(not (r.path / PREDICTIONS).is_file() for r in (*ref, *method_runs)):
                sig.cells[(method, cell)] = NO_PREDICTIONS
            else:
                ready[method] = method_runs
        if ready:
            sig.cells.update(_cell_differences(cell, ref, ready, report))
    return sig


def _cell_differences(cell: Cell, ref: list[Run], others: dict[str, list[Run]], report: ReportConfig,
                      reference: str | None = None) -> dict[tuple[str, Cell], dict[str, Difference]]:
    """`cell_differences` of one cell by table column: {(method, cell): {metric column: Difference}};
    `ref` are the runs of `reference` (default report.reference)."""
    reference = report.reference if reference is None else reference
    multilabel, class_names = _task(ref[0])
    for method_runs in others.values():
        if _task(method_runs[0])[1] != class_names:
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


def write_report(run_dirs: Sequence[str | Path], output: str | Path,
                 method_tables: dict[str, Sequence[str]] | None = None,
                 unavailable: dict[str, str] | None = None, *, report: ReportConfig | None = None,
                 allow: Sequence[Allowance] = (),
                 extra: "Callable[[list[Run], ReportConfig], Sequence[Table]] | None" = None) -> list[Path]:
    """Read every run folder, write comparison / lead_reduction / train_fraction (.md, .csv, .tex)
    and all_runs.csv into `output`, plus one table per `method_tables` entry (name -> methods in row
    order; `ablation_<name>`, except that an entry named `comparison` replaces the comparison
    table with the paper's Table 1 rows in that order); `unavailable`: method -> why it has no
    run (an n/a row). `report` (the config's `report` section, defaults if None): which F1 the
    tables print, the reference method of the differences, their resamples, level, seed and the
    marking rule (adjust, min_runs, min_test_patients). Each table's rows are checked to have been
    trained under one protocol (coreecg/eval/fairness.py; `allow`: the variants file's declared
    differences, printed as footnotes): UnfairTableError names an undeclared difference.
    `extra`: (runs, report) -> more tables, each with `run_paths` (the runs behind it, for the
    fairness check) and `write(output)` -> its files, e.g. the label-efficiency table
    (coreecg.eval.label_efficiency.extra_tables; passed in, so this module does not import it).
    -> the files written. RunError on an unreadable folder."""
    if not run_dirs:
        raise RunError("no run folders given")
    report = report or ReportConfig()
    runs = [load_run(d) for d in run_dirs]
    method_tables = dict(method_tables or {})
    ordered = method_tables.pop(TABLES[0].name, None)
    tables = [method_table(spec.name, spec.title, ordered, runs, unavailable, report.f1)
              if spec is TABLES[0] and ordered is not None else build_table(spec, table_runs(spec, runs), report.f1)
              for spec in table_specs(runs)]
    tables += [method_table(f"ablation_{name}", f"Ablation: {name} (12 leads, all training data)", methods, runs,
                            unavailable, report.f1)
               for name, methods in method_tables.items()]
    protocols = run_entries(runs)
    significance = method_differences(runs, report)
    more = list(extra(runs, report)) if extra else []
    # one protocol per table (fairness): the runs behind each, an extra table's own run_paths
    for table, inside in [*((t, None) for t in tables), *((t, t.run_paths) for t in more)]:
        inside = inside if inside is not None else {
            r.path for r in runs
            if r.mode in TABLE_MODES and (r.dataset, r.leads, r.train_fraction) in table.members.get(r.method, ())}
        behind = [protocols[r.path] for r in runs if r.path in inside]
        notes = check_table(table.spec.name, [e for entries, _ in behind for e in entries], allow, seeds="note")
        table.footnotes = list(dict.fromkeys([*notes, *(n for _, ns in behind for n in ns)]))
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for table in tables:
        table.set_significance(significance)
        md, csv_path, tex = (output / f"{table.spec.name}.{ext}" for ext in ("md", "csv", "tex"))
        md.write_text(table_markdown(table))
        write_table_csv(table, csv_path)
        tex.write_text(table_latex(table))
        written += [md, csv_path, tex]
    for table in more:
        written += table.write(output)
        tables.append(table)
    write_all_runs_csv(runs, tables, output / "all_runs.csv")
    return written + [output / "all_runs.csv"]
