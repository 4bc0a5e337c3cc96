"""The regression table: how well each method predicts a regression task's target (age, height,
weight, a labels-CSV column: coreecg.data.tasks), and whether it does better than the reference method.

Rows are methods (a run's method; a linear or frozen run's mode in brackets, "CoRe-ECG (linear)"),
columns one per regression corpus x leads x train fraction (e.g. ptbxl-age, 12 leads, 100 %), each
with three metrics of the test set (metrics.json test, coreecg.eval.regression):

- MAE in the target's unit, lower is better (the primary metric: the table's claims are about it);
- MAE in SD units (MAE over the train split's target SD), lower is better;
- R², higher is better.

A cell is the mean ± sample SD over the row's runs (one run: its value and its patient-bootstrap
interval, metrics.json test.ci). Each row's difference to report.reference in that column is the
run-level test of coreecg/eval/significance.py (`regression_cell_differences`: Welch's t over
training runs, test patients resampled within, runs of one pretrained encoder counted once),
corrected within its metric's family of this table (report.adjust), with the smallest difference
it could detect (report.power) and, for MAE, two one-sided tests of equivalence within
±MARGIN_SD of the target's SD. The sign of a difference is read by its metric's direction: a
marked MAE difference below 0 is better (BETTER), above 0 worse (WORSE); an R² one the other way.

    table = regression_table(runs, report)        # coreecg.eval.runs.load_run runs; None: no regression run
    write_regression(table, out_dir)              # regression.md, regression.csv, regression.tex

Registered as `regression` (coreecg.eval.tables.registry); the report job writes it when a run is
of a regression task (coreecg.eval.tables.label_efficiency.extra_tables). The label tables leave
regression runs out, and this table leaves label runs out (coreecg.eval.runs.label_runs).
"""
from __future__ import annotations

import csv
from dataclasses import dataclass, field
from math import isclose
from pathlib import Path
from typing import Sequence

import numpy as np

from coreecg.config import ReportConfig
from coreecg.eval.runs import DATASETS, REGRESSION_METRICS, Run, RunError, leakage_note, regression_runs
from coreecg.eval.significance import (PREDICTIONS, Difference, PairingError, adjust_p, detectable_difference,
                                      direction, equivalence_p, lower_is_better, regression_cell_differences)
from coreecg.eval.tables.label_efficiency import label_efficiency_rows, label_efficiency_runs
from coreecg.eval.tables.label_efficiency import row_name as efficiency_row_name
from coreecg.eval.tables.protocol import protocol_footnotes
from coreecg.eval.tables.registry import TableInputs, register_table
from coreecg.eval.tables.render import ADJUST_NAMES, latex_escape
from coreecg.eval.tables.table import LEAK, MISSING, NO_PREDICTIONS, TABLE_MODES, Significance, dataset_order

REGRESSION_TABLE = "regression"
EFFICIENCY_TABLE = "regression_label_efficiency"    # the label-efficiency study's MAE-vs-fraction table
MODES = (*TABLE_MODES, "linear", "frozen")     # every fine-tuning mode: a row per (method, mode)
SHOWN = ("mae", "mae_sd", "r2")                # the metrics of each column, the first primary
PRIMARY = "mae"
MARGIN_SD = 0.1       # the MAE equivalence margin: a tenth of the target's train SD, in its unit
MARK = "\\*"          # a difference whose adjusted p is below 1 - level
BETTER, WORSE = "▲", "▼"     # ... and its direction: better or worse than the reference
DIGITS = {"mae": 2, "mae_sd": 3, "r2": 3}


def row_name(run: Run) -> str:
    """A finetune or scratch run's method; a linear or frozen run's with its mode in brackets."""
    return run.method if run.mode in TABLE_MODES else f"{run.method} ({run.mode})"


@dataclass(frozen=True)
class RegressionColumn:
    """One regression corpus x leads x fraction: its three metrics' cells.

    unit: the target's unit (metrics.json target_scaler.unit); sd: the target's train SD (the
    first run's scaler: the MAE equivalence margin is MARGIN_SD of it)."""

    dataset: str
    leads: str
    fraction: float
    label: str
    unit: str
    sd: float

    def metric_label(self, metric: str) -> str:
        name = REGRESSION_METRICS[metric]
        return f"{name} ({self.unit})" if metric == "mae" and self.unit else name


@dataclass
class RegressionTable:
    """The table as data: rows x columns of runs, the differences to the reference, their families.

    runs: row -> per column its runs; differences: (row, j) -> {metric: Difference} or why there
    is none (NO_PREDICTIONS); adjusted, detectable: (row, j, metric) -> the adjusted p and the
    smallest detectable difference (in the metric's unit) of a testable difference; equivalence:
    (row, j) -> MAE's adjusted TOST p; families: metric -> its testable (row, j)."""

    name: str
    title: str
    columns: list[RegressionColumn]
    runs: dict[str, list[list[Run]]]
    significance: Significance
    differences: dict[tuple[str, int], dict[str, Difference] | str] = field(default_factory=dict)
    families: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    adjusted: dict[tuple[str, int, str], float] = field(default_factory=dict)
    detectable: dict[tuple[str, int, str], float] = field(default_factory=dict)
    equivalence: dict[tuple[str, int], float] = field(default_factory=dict)
    footnotes: list[str] = field(default_factory=list)
    leaks: dict[str, list[str]] = field(default_factory=dict)
    # row -> the row its differences are to (the label-efficiency rows' baselines); None: every
    # row's is significance.reference. A row missing from the dict has no difference (a baseline).
    references: dict[str, str] | None = None

    def reference_of(self, row: str) -> str | None:
        if self.references is not None:
            return self.references.get(row)
        return self.significance.reference

    @property
    def behind(self) -> set[Path]:
        return {r.path for row in self.runs.values() for runs in row for r in runs}

    def values(self, row: str, j: int, metric: str) -> list[float]:
        """The test values of `metric` over the row's runs in column j (None / NaN: undefined, left out)."""
        out = [r.record["test"].get(metric) for r in self.runs[row][j]]
        return [float(v) for v in out if isinstance(v, (int, float)) and v == v]

    def difference(self, row: str, j: int, metric: str) -> Difference | str | None:
        found = self.differences.get((row, j))
        return found if found is None or isinstance(found, str) else found.get(metric)

    def marked(self, row: str, j: int, metric: str) -> bool:
        p = self.adjusted.get((row, j, metric))
        return p is not None and p < 1 - self.significance.level

    def mark(self, row: str, j: int, metric: str) -> str:
        """MARK and BETTER / WORSE for a marked difference (the metric's direction), '' otherwise."""
        if not self.marked(row, j, metric):
            return ""
        return MARK + (BETTER if self.difference(row, j, metric).better else WORSE)

    def verdict(self, row: str, j: int, metric: str = PRIMARY) -> str:
        """"better" / "worse" (marked, by the metric's direction), "equivalent within ±m <unit>" (MAE,
        TOST), "inconclusive" with the smallest detectable difference; or why it is not tested."""
        d = self.difference(row, j, metric)
        if d is None:
            return ""
        if isinstance(d, str):
            return d
        if (row, j, metric) not in self.adjusted:
            return d.unmarkable or ""
        sig, alpha, c = self.significance, 1 - self.significance.level, self.columns[j]
        adjusted = self.adjusted[(row, j, metric)]
        if adjusted < alpha:
            return f"{'better' if d.better else 'worse'} (adjusted p {adjusted:.3g} < {alpha:g}; {direction(metric)})"
        tost = self.equivalence.get((row, j)) if metric == PRIMARY else None
        if tost is not None and tost < alpha:
            margin = f"{MARGIN_SD * c.sd:.3g}" + (f" {c.unit}" if c.unit else "")
            return f"equivalent within ±{margin} (two one-sided tests, adjusted p {tost:.3g} < {alpha:g})"
        size = f"{self.detectable[(row, j, metric)]:.3g}" + (f" {c.unit}" if metric == "mae" and c.unit else "")
        return f"inconclusive: the smallest detectable difference here is {size} (power {sig.power:g})"


def _column_label(dataset: str, leads: str, fraction: float, many_leads: bool, many_fractions: bool) -> str:
    parts = [DATASETS.get(dataset, dataset)]
    if many_leads or leads != "12":
        parts.append(f"{leads}-lead" if leads.isdigit() else leads)
    if many_fractions or not isclose(fraction, 1.0):
        parts.append(f"{fraction:.0%}")
    return " ".join(parts)


def regression_table(runs: Sequence[Run], report: ReportConfig | None = None,
                     title: str = "Regression tasks") -> RegressionTable | None:
    """The table of the regression runs among `runs` (label runs are left out), with its
    differences attached (report.bootstrap_resamples = 0: none); None without a regression run.
    RunError for two runs of one row, column and seed, or runs of a column that cannot be compared."""
    report = report or ReportConfig()
    kept = [r for r in regression_runs(runs) if r.mode in MODES]
    return _table(REGRESSION_TABLE, title, kept, row_name, None, report) if kept else None


def regression_label_efficiency(runs: Sequence[Run], report: ReportConfig | None = None,
                                title: str = "Label efficiency: regression tasks (12 leads)") -> RegressionTable | None:
    """The label-efficiency study's regression curve: the rows and baselines of the label-efficiency
    table (coreecg/eval/tables/label_efficiency.py: a linear/frozen row against Random init under
    the same probe, a fine-tune row against Supervised) on the regression runs (12 leads, modes
    linear, frozen, finetune, scratch), columns corpus x train fraction (largest first): MAE against
    the fraction of labelled training patients. None without such a run."""
    report = report or ReportConfig()
    kept = label_efficiency_runs(runs, regression=True)
    if not kept:
        return None
    rows = label_efficiency_rows(kept, regression=True)
    table = _table(EFFICIENCY_TABLE, title, kept, efficiency_row_name, {r.name: r.baseline for r in rows
                                                                         if r.baseline}, report,
                   order=[r.name for r in rows])
    return table


def _table(name: str, title: str, kept: list[Run], row_of, references: dict[str, str] | None,
           report: ReportConfig, order: Sequence[str] = ()) -> RegressionTable:
    """The table of `kept` (regression runs), rows named by row_of(run) (in `order`, then first
    seen), its differences to `references` (row -> baseline row; None: report.reference)."""
    settings: list[tuple[str, str, float]] = []
    for d in dataset_order(kept):
        for r in kept:
            if r.dataset == d and not any(s[0] == d and s[1] == r.leads and isclose(s[2], r.train_fraction)
                                          for s in settings):
                settings.append((d, r.leads, r.train_fraction))
    settings.sort(key=lambda s: (dataset_order(kept).index(s[0]), s[1] != "12", s[1], -s[2]))
    many_leads = len({s[1] for s in settings}) > 1
    many_fractions = len({round(s[2], 9) for s in settings}) > 1
    first = {s: next(r for r in kept if (r.dataset, r.leads) == s[:2] and isclose(r.train_fraction, s[2]))
             for s in settings}
    columns = [RegressionColumn(d, leads, f, _column_label(d, leads, f, many_leads, many_fractions),
                                str(first[(d, leads, f)].record.get("target_scaler", {}).get("unit", "")),
                                float(first[(d, leads, f)].record.get("target_scaler", {}).get("sd", float("nan"))))
               for d, leads, f in settings]
    cells: dict[str, list[list[Run]]] = {}
    seen: dict[tuple, Run] = {}
    for r in kept:
        j = next(j for j, c in enumerate(columns)
                 if (c.dataset, c.leads) == (r.dataset, r.leads) and isclose(c.fraction, r.train_fraction))
        row = row_of(r)
        if (key := (row, j, r.seed)) in seen:
            raise RunError(f"{r.path} and {seen[key].path}: two runs of {row} on {r.dataset} ({r.leads} leads, "
                           f"fraction {r.train_fraction}) with seed {r.seed}")
        seen[key] = r
        cells.setdefault(row, [[] for _ in columns])[j].append(r)
    cells = {**{row: cells[row] for row in order if row in cells}, **cells}
    leaks: dict[str, list[str]] = {}
    for r in kept:
        if note := leakage_note(r.record):
            leaks.setdefault(row_of(r), []).append(f"{r.dataset}, seed {r.seed}: {note}")
    table = RegressionTable(name, title, columns, cells,
                            Significance.of(report.reference if references is None else "", report),
                            leaks=leaks, references=references)
    set_differences(table, report)
    return table


def set_differences(table: RegressionTable, report: ReportConfig) -> None:
    """Every row's differences to its reference (table.reference_of) per column, then each metric's
    family: Holm (or report.adjust) over its testable differences, the detectable difference at
    report.power, and for MAE the TOST p at ±MARGIN_SD x the target's SD, corrected like the family."""
    sig = table.significance
    if not report.bootstrap_resamples:
        return
    baselines = dict.fromkeys(b for row in table.runs if (b := table.reference_of(row)) and b != row)
    for j, reference in ((j, b) for j in range(len(table.columns)) for b in baselines):
        ref = table.runs.get(reference, [[]] * len(table.columns))[j]
        others = {row: rs[j] for row, rs in table.runs.items()
                  if row != reference and table.reference_of(row) == reference and rs[j]}
        if not ref or not others:
            continue
        ready = {}
        for row, rs in others.items():
            if any(not (r.path / PREDICTIONS).is_file() for r in (*ref, *rs)):
                table.differences[(row, j)] = NO_PREDICTIONS
            else:
                ready[row] = rs
        if not ready:
            continue
        try:
            found = regression_cell_differences({reference: ref, **ready}, reference, list(SHOWN),
                                                report.bootstrap_resamples, report.seed, report.level,
                                                report.min_runs, report.min_test_patients)
        except PairingError as e:
            raise RunError(str(e)) from None
        table.differences.update({(row, j): by_metric for row, by_metric in found.items()})
    alpha = 1 - sig.level
    for metric in SHOWN:
        family = [(row, j) for row, j in table.differences
                  if isinstance(d := table.difference(row, j, metric), Difference) and d.testable]
        if not family:
            continue
        table.families[metric] = family
        found = [table.difference(row, j, metric) for row, j in family]
        adjusted = adjust_p([d.p_value for d in found], sig.adjust)
        table.adjusted.update({(row, j, metric): float(p) for (row, j), p in zip(family, adjusted)})
        k = 1 if sig.adjust == "none" else len(family)
        table.detectable.update({(row, j, metric): detectable_difference(d.se, d.df, alpha, k, sig.power, d.parts)
                                 for (row, j), d in zip(family, found)})
        if metric == PRIMARY:
            tost = [equivalence_p(d.diff, d.se, d.df, MARGIN_SD * table.columns[j].sd)
                    for (_, j), d in zip(family, found)]
            table.equivalence.update(zip(family, map(float, adjust_p(tost, sig.adjust))))


def cell_text(table: RegressionTable, row: str, j: int, metric: str) -> str:
    """'7.12 ± 0.30' (mean ± sample SD over runs); one run: '7.12 [6.90, 7.35]' (its bootstrap
    interval, when metrics.json has one); MISSING without a value."""
    values, digits = table.values(row, j, metric), DIGITS[metric]
    if not values:
        return MISSING
    if len(values) > 1:
        return f"{np.mean(values):.{digits}f} ± {np.std(values, ddof=1):.{digits}f}"
    ci = (table.runs[row][j][0].record["test"].get("ci") or {}).get(metric) or {}
    if isinstance(ci.get("low"), (int, float)) and isinstance(ci.get("high"), (int, float)):
        return f"{values[0]:.{digits}f} [{ci['low']:.{digits}f}, {ci['high']:.{digits}f}]"
    return f"{values[0]:.{digits}f}"


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _diff_text(d) -> str:
    if not isinstance(d, Difference) or d.diff is None:
        return MISSING
    interval = "" if d.low is None else f" [{d.low:+.2f}, {d.high:+.2f}]"
    return f"{d.diff:+.2f}{interval}" + ("" if d.p_value is not None else "§")


def significance_note(table: RegressionTable) -> str:
    """The legend of the marks: the rule, each metric's direction, its family and correction."""
    sig = table.significance
    if not sig.n_resamples:
        return "No differences between methods (report.bootstrap_resamples = 0)."
    if table.references is not None:
        if not any(b in table.runs for b in table.references.values()):
            return "No runs of a baseline row in this table: no differences between methods."
        target = "its row's baseline"
        rows_of = {b: [m for m, r in table.references.items() if r == b] for b in table.references.values()}
        reference_row = ("; ".join(f"{', '.join(rows)} against {b}" for b, rows in rows_of.items())
                         + "; a baseline's own row has no difference")
    elif sig.reference not in table.runs:
        return f"No {sig.reference} runs in this table: no differences between methods."
    else:
        target, reference_row = sig.reference, f"{sig.reference}'s row is the reference"
    alpha = 1 - sig.level
    families = "; ".join(f"{REGRESSION_METRICS[m]}{' (primary)' if m == PRIMARY else ''}: {len(table.families[m])}"
                         for m in SHOWN if m in table.families) or "no testable comparison"
    return (f"{MARK} the difference to {target} has a p-value below {alpha:g} after {ADJUST_NAMES[sig.adjust]} "
            f"within its metric's family ({families} comparison(s)); {BETTER} better than {target}, {WORSE} "
            f"worse, by each metric's direction: MAE and MAE in SD units lower is better, R² higher is better. "
            f"Welch's t over training runs (each method >= {sig.min_runs} runs in the cell), test patients resampled "
            f"within ({sig.n_resamples:,} resamples; docs/evaluation.md, Differences between methods); "
            f"{reference_row}. An MAE difference not marked is equivalent within ±{MARGIN_SD:g} "
            "of the target's train SD only where two one-sided tests show it; otherwise inconclusive at the smallest "
            "difference its cell could detect (power "
            f"{sig.power:g}, the CSV's 'detectable').")


def table_markdown(table: RegressionTable) -> str:
    """The table (per column: MAE in the unit, MAE in SD units, R², each with its direction), its
    legend, the runs per cell, the MAE differences to the reference and each one's verdict."""
    heads = [f"{c.label} {c.metric_label(m)} {'↓' if lower_is_better(m) else '↑'}"
             for c in table.columns for m in SHOWN]
    lines = [f"# {table.title}", "",
             "Test-set metrics: mean ± sample standard deviation over seeds (one run: its value and its 95 % "
             "patient-bootstrap interval in brackets). MAE in the target's unit and in SD units (MAE over the train "
             "split's target SD): lower is better (↓); R²: higher is better (↑). "
             f"{MISSING}: no run.", "",
             _row(["Method", *heads]), _row(["---"] * (len(heads) + 1))]
    for row in table.runs:
        label = row + (LEAK if row in table.leaks else "")
        lines.append(_row([label] + [cell_text(table, row, j, m) + table.mark(row, j, m)
                                     for j in range(len(table.columns)) for m in SHOWN]))
    notes = [f"{LEAK} {m}: {n}" for m, ns in table.leaks.items() for n in ns]
    notes += [significance_note(table)] + [f"Protocol: {n}" for n in table.footnotes]
    lines += [""] + notes
    lines += ["", "Runs per cell:", "", _row(["Method"] + [c.label for c in table.columns]),
              _row(["---"] * (len(table.columns) + 1))]
    lines += [_row([row] + [str(len(rs)) if rs else MISSING for rs in runs]) for row, runs in table.runs.items()]
    diffs = {row: [table.difference(row, j, PRIMARY) for j in range(len(table.columns))] for row in table.runs}
    diffs = {row: ds for row, ds in diffs.items() if any(isinstance(d, Difference) for d in ds)}
    if diffs:
        sig = table.significance
        target = "each row's baseline" if table.references is not None else sig.reference
        names = {row: f"{row} − {table.references[row]}" if table.references is not None else row for row in diffs}
        lines += ["", f"MAE differences to {target} in the target's unit (the row's mean over its runs minus "
                      f"{target}'s; below 0: lower MAE, better) [{100 * sig.level:g} % interval over training "
                      f"runs and test patients; § fewer than {sig.min_runs} runs of a method: test-set sampling only]:",
                  "", _row(["Method"] + [c.label for c in table.columns]), _row(["---"] * (len(table.columns) + 1))]
        lines += [_row([names[row]] + [_diff_text(d) for d in ds]) for row, ds in diffs.items()]
        lines += ["", "Verdicts (MAE):", ""]
        lines += [f"- {names[row]}, {table.columns[j].label}: {table.verdict(row, j)}"
                  for row, ds in diffs.items() for j, d in enumerate(ds) if d is not None]
    return "\n".join(lines) + "\n"


CSV_FIELDS = ("method", "reference", "dataset", "leads", "train_fraction", "unit", "runs")
DIFF_FIELDS = ("diff", "diff low", "diff high", "p", "p adjusted", "family", "detectable", "verdict")


def write_table_csv(table: RegressionTable, path: Path) -> None:
    """One row per (method, column): the runs' mean, SD over runs and, per metric, the difference to
    the reference (in the metric's unit), its raw and adjusted p, family, detectable size and
    verdict; MAE's equivalence p (adjusted) and the direction of each metric in its header."""
    header = list(CSV_FIELDS)
    for m in SHOWN:
        header += [f"{m} mean", f"{m} sd over runs", f"{m} direction"] + [f"{m} {f}" for f in DIFF_FIELDS]
    header += ["mae equivalence margin", "mae equivalence p adjusted", "unmarked because"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for row, runs in table.runs.items():
            for j, c in enumerate(table.columns):
                if not runs[j]:
                    continue
                out = [row, table.reference_of(row) or "", c.dataset, c.leads, c.fraction, c.unit, len(runs[j])]
                for m in SHOWN:
                    v = table.values(row, j, m)
                    out += ["" if not v else f"{np.mean(v):.6g}", "" if len(v) < 2 else f"{np.std(v, ddof=1):.6g}",
                            direction(m)]
                    d = table.difference(row, j, m)
                    if not isinstance(d, Difference):
                        out += [""] * (len(DIFF_FIELDS) - 1) + [table.verdict(row, j, m)]
                        continue
                    adj, det = table.adjusted.get((row, j, m)), table.detectable.get((row, j, m))
                    out += ["" if x is None else f"{x:.6g}" for x in (d.diff, d.low, d.high)]
                    out += ["" if d.p_value is None else f"{d.p_value:.3g}", "" if adj is None else f"{adj:.3g}",
                            f"{m} ({len(table.families[m])})" if (row, j) in table.families.get(m, ()) else "",
                            "" if det is None else f"{det:.4g}", table.verdict(row, j, m)]
                tost = table.equivalence.get((row, j))
                d = table.difference(row, j, PRIMARY)
                why = d if isinstance(d, str) else (d.unmarkable or "") if isinstance(d, Difference) else ""
                out += [f"{MARGIN_SD * c.sd:.4g}", "" if tost is None else f"{tost:.3g}", why]
                w.writerow(out)


def _best_two(table: RegressionTable, j: int, metric: str) -> tuple[float | None, float | None]:
    """The best and second-best row means (rounded as printed) of column j, by the metric's direction."""
    means = sorted({round(float(np.mean(v)), DIGITS[metric]) for row in table.runs
                    if (v := table.values(row, j, metric))}, reverse=not lower_is_better(metric))
    return (means[0] if means else None), (means[1] if len(means) > 1 else None)


_TEX = {"²": r"$^2$", "↓": r"$\downarrow$", "↑": r"$\uparrow$", BETTER: r"$\blacktriangle$",
        WORSE: r"$\blacktriangledown$", "≥": r"$\geq$", "−": r"$-$", "§": r"\S{}", "\x00": r"\textsuperscript{*}"}


def _tex(text: str) -> str:
    """latex_escape, then this table's symbols (R², arrows, its marks) as LaTeX."""
    out = latex_escape(text.replace(MARK, "\x00"))
    for ch, tex in _TEX.items():
        out = out.replace(ch, tex)
    return out


def _latex_cell(table: RegressionTable, row: str, j: int, metric: str, best: tuple) -> str:
    text = cell_text(table, row, j, metric)
    if text == MISSING:
        return "--"
    mean = round(float(np.mean(table.values(row, j, metric))), DIGITS[metric])
    text = _tex(text)
    if mean == best[0]:
        text = rf"\textbf{{{text}}}"
    elif mean == best[1]:
        text = rf"\underline{{{text}}}"
    return text + _tex(table.mark(row, j, metric))


def table_latex(table: RegressionTable) -> str:
    """The table as a booktabs `table`: methods x columns (corpus x leads x fraction) x (MAE, MAE in
    SD units, R²), best per column bold and second underlined by each metric's direction, a marked
    difference \\textsuperscript{*} with its direction ($\\blacktriangle$ better). Needs
    \\usepackage{booktabs, amssymb}."""
    k, cols = len(SHOWN), table.columns
    caption = [f"{table.title}. Test-set metrics, mean ± standard deviation over seeds (one run: its 95 % "
               "patient-bootstrap interval); MAE in the target's unit and in SD units, lower is better; R², higher "
               "is better; best per column in bold, second underlined.", significance_note(table)]
    caption += [f"{LEAK} {m}: {n}." for m, ns in table.leaks.items() for n in ns]
    caption += [f"Protocol: {n}" for n in table.footnotes]
    heads = [f"{c.metric_label(m)} {'↓' if lower_is_better(m) else '↑'}" for c in cols for m in SHOWN]
    lines = [f"% {table.name}: written by coreecg/eval/tables/regression.py; needs \\usepackage{{booktabs,amssymb}}",
             r"\begin{table}[t]", r"\centering", r"\caption{" + _tex(" ".join(caption)) + "}",
             rf"\label{{tab:{table.name}}}",
             r"\begin{tabular}{l " + " ".join("c" * k for _ in cols) + "}", r"\toprule",
             " & ".join([r"\textbf{Method}"] + [rf"\multicolumn{{{k}}}{{c}}{{\textbf{{{_tex(c.label)}}}}}"
                                                for c in cols]) + r" \\",
             " ".join(rf"\cmidrule(lr){{{2 + i * k}-{1 + (i + 1) * k}}}" for i in range(len(cols))),
             " & ".join([""] + [_tex(h) for h in heads]) + r" \\", r"\midrule"]
    best = {(j, m): _best_two(table, j, m) for j in range(len(cols)) for m in SHOWN}
    for row in table.runs:
        lines.append(" & ".join([_tex(row + (LEAK if row in table.leaks else ""))]
                                + [_latex_cell(table, row, j, m, best[(j, m)]) for j in range(len(cols))
                                   for m in SHOWN]) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def write_regression(table: RegressionTable, out_dir: str | Path) -> list[Path]:
    """<name>.md, <name>.csv and <name>.tex (regression.md, ...) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, csv_path, tex = out / f"{table.name}.md", out / f"{table.name}.csv", out / f"{table.name}.tex"
    md.write_text(table_markdown(table))
    write_table_csv(table, csv_path)
    tex.write_text(table_latex(table))
    return [md, csv_path, tex]


def build_for_report(name: str, inputs: TableInputs) -> RegressionTable | None:
    """The table of the report's regression runs, its rows' protocols checked (coreecg/eval/fairness.py)."""
    make = regression_label_efficiency if name == EFFICIENCY_TABLE else regression_table
    table = make(inputs.runs, inputs.report)
    if table is not None:
        table.footnotes = protocol_footnotes(name, table.behind, inputs)
    return table


def _behind(table: RegressionTable) -> set[Path]:
    return table.behind


register_table(REGRESSION_TABLE, build=build_for_report, write=write_regression, runs=_behind)
register_table(EFFICIENCY_TABLE, build=build_for_report, write=write_regression, runs=_behind,
               differences="each row's baseline (Random init under the same probe, Supervised for fine-tuning)")
