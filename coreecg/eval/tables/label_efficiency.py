"""The label-efficiency table: does pretraining help when labels are scarce? One row per (method,
mode), columns dataset x train fraction (largest first) x metric on 12 leads, and each row's
difference to the baseline of its mode (docs/evaluation.md, "Label-efficiency table"):

- a linear (or frozen) row against the Random-init row of the same mode: does the pretrained
  encoder beat a random one under the same probe?
- a fine-tune row against the Supervised (scratch) row: does pretraining beat training from
  scratch?

Random-init runs are recognised by metrics.json "encoder": "random" (finetune.encoder=random),
never by their name; a scratch run is its method's row without a mode suffix. The baselines have
no difference. The differences are `cell_differences` (coreecg/eval/significance.py) marked by the
report's run-level rule (report.min_runs, min_test_patients, min_positive_patients, report.adjust
within each metric's family of this table, report.level), through the same Table / renderers as
the other tables (a reference per row: `Table.references`).

    table = label_efficiency_table(runs, report)         # coreecg.eval.runs.load_run runs
    write_label_efficiency(table, out_dir)               # label_efficiency.{md,csv,tex},
                                                         #   label_efficiency_verdicts.md

Registered as `label_efficiency` (coreecg.eval.tables.registry): a study asks for it by name; the
report job writes it when a run has a random encoder (`extra_tables`). The encoder x objective table
(coreecg/eval/tables/encoder_objective.py) is this table with its rows found within each encoder
(`label_efficiency_table(..., group=)`), written by the same writer under its own name.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from math import isclose
from pathlib import Path
from typing import Callable, Sequence

from coreecg.data.declared import MARK as DECLARED
from coreecg.config import ReportConfig
from coreecg.eval.runs import DATASETS, Run, RunError, label_runs, regression_runs
from coreecg.eval.significance import PREDICTIONS, Difference, _encoder_of
from coreecg.eval.tables.detectable import detectable_note
from coreecg.eval.tables.protocol import protocol_footnotes
from coreecg.eval.tables.registry import TableInputs, index_line, register_table
from coreecg.eval.tables.render import table_latex, table_markdown, write_table_csv
from coreecg.eval.tables.table import (LEAK, NO_PREDICTIONS, Cell, Significance, Table, TableSpec, build_table,
                                       column_differences, variant_of)

LABEL_EFFICIENCY_TABLE = "label_efficiency"
MODES = ("linear", "frozen", "finetune", "scratch")      # the run modes the table holds, rows in this order
SUFFIX = {"linear": "linear", "frozen": "frozen", "finetune": "fine-tune"}
UNDER = {"linear": "under the linear probe", "frozen": "with the encoder frozen", "finetune": "under fine-tuning"}
LEADS = "12"
VERDICT_METRIC = "auroc"
VERDICTS_SUFFIX = "_verdicts.md"
VERDICTS_FILE = f"{LABEL_EFFICIENCY_TABLE}{VERDICTS_SUFFIX}"
# coreecg/eval/tables/regression.py's tables (registered after this module)
REGRESSION_TABLE, REGRESSION_EFFICIENCY_TABLE = "regression", "regression_label_efficiency"


def is_random_init(run: Run) -> bool:
    """A run whose encoder was drawn at random (metrics.json "encoder": "random")."""
    return run.record.get("encoder") == "random"


def row_name(run: Run) -> str:
    """'CoRe-ECG (linear)', 'CoRe-ECG (fine-tune)'; a scratch run's method alone ('Supervised')."""
    return run.method if run.mode == "scratch" else f"{run.method} ({SUFFIX[run.mode]})"


@dataclass(frozen=True)
class Row:
    name: str
    method: str
    mode: str                 # linear | frozen | finetune | scratch
    role: str                 # "random" | "supervised" | "pretrained"
    baseline: str | None      # the row its difference is to (None: a baseline, or none ran)


def label_efficiency_runs(runs: Sequence[Run], regression: bool = False) -> list[Run]:
    """The runs the table holds: 12 leads, or every lead a published model takes (its contract's:
    ECG-JEPA's 8, counted in the 12-lead columns and said under the table, `contract_leads_note`),
    modes linear, frozen, finetune and scratch; label tasks only, or with `regression` regression
    tasks only (their MAE curve: coreecg/eval/tables/regression.py, regression_label_efficiency)."""
    kind = regression_runs if regression else label_runs
    return [replace(r, leads=LEADS) if r.leads != LEADS else r for r in kind(runs)
            if r.mode in MODES and (r.leads == LEADS or r.record.get("contract_leads"))]


def contract_leads_note(runs: Sequence[Run]) -> list[str]:
    """The footnote naming the rows whose runs took a published model's own lead set."""
    fewer = {r.method: r.leads for r in runs if r.mode in MODES and r.leads != LEADS and r.record.get("contract_leads")}
    return ["Leads: every lead the model takes, by its own input contract: "
            + "; ".join(f"{m}: {leads}" for m, leads in fewer.items()) + "."] if fewer else []


def label_efficiency_rows(runs: Sequence[Run], regression: bool = False) -> list[Row]:
    """The table's rows in order: Random-init rows (linear, frozen, fine-tune), the Supervised
    (scratch) rows, then each pretrained method's rows (linear, frozen, fine-tune), methods in
    first-seen order. A pretrained linear/frozen row's baseline is the first Random-init row of its
    mode, a fine-tune row's the first scratch row. `regression`: of the regression runs."""
    kept = label_efficiency_runs(runs, regression)
    methods = list(dict.fromkeys(r.method for r in kept))
    found: dict[tuple[str, str], str] = {}      # (method, mode) -> role
    for r in kept:
        role = "random" if is_random_init(r) else "supervised" if r.mode == "scratch" else "pretrained"
        if found.setdefault((r.method, r.mode), role) != role:
            raise RunError(f"{r.path}: {r.method} ({r.mode}) holds both random-init and pretrained runs; give a "
                           "random encoder its own method name")
    order = {m: i for i, m in enumerate(MODES)}
    random_rows = sorted(((m, mode) for (m, mode), role in found.items() if role == "random"),
                         key=lambda k: (order[k[1]], methods.index(k[0])))
    supervised = [(m, mode) for m in methods for mode in MODES if found.get((m, mode)) == "supervised"]
    pretrained = [(m, mode) for m in methods for mode in MODES if found.get((m, mode)) == "pretrained"]
    name = {k: k[0] if k[1] == "scratch" else f"{k[0]} ({SUFFIX[k[1]]})" for k in found}
    random_of = {}
    for m, mode in random_rows:
        random_of.setdefault(mode, name[(m, mode)])
    scratch = name[supervised[0]] if supervised else None
    rows = [Row(name[k], *k, "random", None) for k in random_rows]
    rows += [Row(name[k], *k, "supervised", None) for k in supervised]
    rows += [Row(name[k], *k, "pretrained", scratch if k[1] == "finetune" else random_of.get(k[1]))
             for k in pretrained]
    return rows


def grouped_rows(runs: Sequence[Run], group: Callable[[Run], str]) -> list[Row]:
    """`label_efficiency_rows` within each group of `runs` (group(run) -> key, first-seen order),
    one group after the other: each group's rows have its own baselines. RunError for a row whose
    runs fall in two groups."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(group(r), []).append(r)
    rows, seen = [], {}
    for key, members in groups.items():
        for row in label_efficiency_rows(members):
            if row.name in seen:
                raise RunError(f"{row.name}: its runs fall in two groups ({seen[row.name]}; {key}): give each its "
                               "own method name")
            seen[row.name] = key
            rows.append(row)
    return rows


@dataclass
class LabelEfficiencyTable(Table):
    """A report Table (every renderer of coreecg.eval.report takes it) with its rows' roles."""

    rows: list[Row] = field(default_factory=list)
    encoders: dict[tuple[str, Cell], set[str]] = field(default_factory=dict)   # (row, cell) -> its encoders
    heading: str = "Label efficiency"       # the verdicts file's heading

    @property
    def run_paths(self) -> set:
        """The runs behind the table (write_report's fairness check reads them)."""
        return set(self.row_of)

    def write(self, out_dir: str | Path) -> list[Path]:
        return write_label_efficiency(self, out_dir)
    replicates: dict[tuple[str, Cell], int] = field(default_factory=dict)      # (row, cell) -> replicates


def label_efficiency_table(runs: Sequence[Run], report: ReportConfig | None = None, *,
                           group: Callable[[Run], str] | None = None, name: str = LABEL_EFFICIENCY_TABLE,
                           title: str = "Label efficiency (12 leads)") -> LabelEfficiencyTable:
    """The table of `runs` (12-lead runs of modes linear, frozen, finetune and scratch; the others
    are left out) with its differences attached (report.bootstrap_resamples = 0: none). RunError
    for two runs of one row, cell and seed, or runs of a cell that cannot be compared.
    `group` (run -> key): rows and their baselines are found within each group, groups in
    first-seen order (the encoder x objective table: each encoder's rows against its own Random
    init and Supervised); a row with runs in two groups is a RunError."""
    report = report or ReportConfig()
    kept = label_efficiency_runs(runs)
    rows = grouped_rows(kept, group) if group else label_efficiency_rows(kept)
    relabelled = [replace(r, method=row_name(r)) for r in kept]
    fractions = sorted({r.train_fraction for r in kept}, reverse=True)
    distinct = [f for i, f in enumerate(fractions) if not any(isclose(f, g) for g in fractions[:i])]
    spec = TableSpec(name, title, tuple((LEADS, f, f"{f:.0%}") for f in distinct), "Data ratio", modes=MODES)
    built = build_table(spec, relabelled, report.f1, report.min_positive_patients)
    table = LabelEfficiencyTable(**{f.name: getattr(built, f.name) for f in fields(Table)}, rows=rows)
    empty = [[] for _ in table.columns]
    table.cells = {row.name: table.cells.get(row.name, empty) for row in rows}
    table.references = {row.name: row.baseline for row in rows if row.baseline}
    table.row_of = {r.path: row_name(r) for r in kept}
    for r in relabelled:      # replicates as the rule counts them: runs of one pretrained encoder are one
        if v := variant_of(spec, r):
            table.encoders.setdefault((r.method, (r.dataset, v[0], v[1])), set()).add(_encoder_of(r.path))
    table.replicates = {k: len(v) for k, v in table.encoders.items()}
    table.set_significance(label_efficiency_differences(spec, relabelled, table.references, report))
    return table


def label_efficiency_differences(spec: TableSpec, runs: Sequence[Run], references: dict[str, str],
                                 report: ReportConfig) -> Significance:
    """Each row's differences to its baseline (`references`: row -> baseline row) in every cell
    both have runs in, one `cell_differences` per (cell, baseline) with the report's resamples,
    seed, level, min_runs and min_test_patients; `runs` carry their row as method. A cell where a
    run of the row or of its baseline lacks predictions.csv gets NO_PREDICTIONS instead."""
    sig = Significance.of("", report)
    cells: dict[Cell, dict[str, list[Run]]] = {}
    for run in runs:
        if v := variant_of(spec, run):
            cells.setdefault((run.dataset, v[0], v[1]), {}).setdefault(run.method, []).append(run)
    if not report.bootstrap_resamples:
        return sig
    for cell, by_row in cells.items():
        for baseline in dict.fromkeys(references.values()):
            ref = by_row.get(baseline)
            others = {row: rs for row, rs in by_row.items() if references.get(row) == baseline}
            if not ref or not others:
                continue
            ready = {}
            for row, row_runs in others.items():
                if any(not (r.path / PREDICTIONS).is_file() for r in (*ref, *row_runs)):
                    sig.cells[(row, cell)] = NO_PREDICTIONS
                else:
                    ready[row] = row_runs
            if ready:
                sig.cells.update(column_differences(cell, ref, ready, report, reference=baseline))
    return sig


def _points(x: float) -> str:
    return f"{100 * x:.1f}"


def _status(table: Table, row: str, j: int, d: Difference) -> str:
    """'marked (adjusted p ...)'; 'not marked (adjusted p ...): equivalent within ...' or
    '...: inconclusive: the smallest detectable difference here is D points'; or why it is not
    tested ('not marked: fewer than 3 runs ...')."""
    alpha = 1 - table.significance.level
    adjusted = table.adjusted.get((row, j))
    if table.marked(row, j):
        return f"marked (adjusted p {adjusted:.3g} < {alpha:g})"
    if not d.testable:
        return f"not marked: {d.unmarkable}"
    return f"not marked (adjusted p {adjusted:.3g} >= {alpha:g}): {table.verdict(row, j)}"


def difference_text(d: Difference, metric: str) -> str:
    """'+3.2 [-1.0, 7.4] AUROC points' from the Difference (fractions -> percentage points)."""
    label = {"acc": "ACC", "f1": "F1", "auroc": "AUROC"}[metric]
    return f"{100 * d.diff:+.1f} [{_points(d.low)}, {_points(d.high)}] {label} points"


def verdicts(table: LabelEfficiencyTable, metric: str = VERDICT_METRIC) -> list[str]:
    """One sentence per dataset, fraction (largest first) and pretrained row with a baseline: e.g.
    'PTB-XL, 10 %: CoRe-ECG vs Random init under the linear probe: +3.2 [-1.0, 7.4] AUROC points,
    not marked (adjusted p 0.21 >= 0.05)'. The numbers are the row's Difference in `metric`'s
    column and its adjusted p (Table.adjusted); a cell without one says why."""
    rows = table.rows
    by_name = {r.name: r for r in rows}
    out = []
    for j, c in enumerate(table.columns):
        if c.metric != metric:
            continue
        where = f"{DATASETS.get(c.dataset, c.dataset)}, {100 * c.fraction:g} %"
        cell = (c.dataset, c.leads, c.fraction)
        for row in rows:
            if row.role != "pretrained" or row.mode not in UNDER or cell not in table.members.get(row.name, ()):
                continue
            head = f"{where}: {row.method} vs "
            if row.baseline is None:
                kind = "Random init" if row.mode != "finetune" else "Supervised"
                out.append(f"{head}{kind} {UNDER[row.mode]}: no {kind} run {UNDER[row.mode]}, no difference")
                continue
            base = by_name[row.baseline].method
            head += f"{base} {UNDER[row.mode]}: "
            if any(DECLARED in n for n in table.leaks.get(row.method, [])):   # the row's own declaration
                head = head[:-2] + f" ({LEAK} {DECLARED}: its weights declare data that contains this dataset): "
            d = table.difference(row.name, j)
            if isinstance(d, Difference) and d.diff is not None:
                out.append(head + f"{difference_text(d, metric)}, {_status(table, row.name, j, d)}")
            elif isinstance(d, Difference):
                out.append(head + f"no difference: {d.unmarkable}")
            elif isinstance(d, str):
                out.append(head + f"no difference: {d}")
            elif cell not in table.members.get(row.baseline, ()):
                out.append(head + f"no difference: no {row.baseline} runs at this fraction")
            else:
                out.append(head + "no difference (report.bootstrap_resamples = 0)")
    return out


def difference_list(table: Table) -> list[str]:
    """Every difference of the table, one line each: row vs baseline, column, points, interval, raw
    and adjusted p, and whether it is marked (or why not)."""
    out = []
    for row in table.cells:
        for j, c in enumerate(table.columns):
            d = table.difference(row, j)
            if d is None:
                continue
            head = f"- {row} vs {table.reference_of(row)}, {c.label}: "
            if isinstance(d, str) or d.diff is None:
                out.append(head + f"no difference: {d if isinstance(d, str) else d.unmarkable}")
                continue
            p = "p –" if d.p_value is None else f"p {d.p_value:.3g}"
            adjusted = table.adjusted.get((row, j))
            p += "" if adjusted is None else f", adjusted p {adjusted:.3g}"
            status = ("marked" if table.marked(row, j) else
                      f"not marked: {table.unmarked_because(row, j)}")
            out.append(head + f"{difference_text(d, c.metric)} ({p}; {d.n_patients} test patients); {status}")
    return out



def verdicts_markdown(table: LabelEfficiencyTable) -> str:
    lines = [f"# {table.heading}: verdicts", "",
             "Pretrained encoder vs Random init under the same probe, and pretraining + fine-tuning vs Supervised "
             f"(from scratch); {VERDICT_METRIC.upper()} difference in percentage points "
             f"[{100 * table.significance.level:g} % "
             "interval], marked by the report's run-level rule (docs/evaluation.md, Label-efficiency table).", ""]
    lines += [f"- {v}" for v in verdicts(table)] or ["No pretrained row has a baseline in this table."]
    return "\n".join(lines + ["", detectable_note(table)]) + "\n"


def write_label_efficiency(table: LabelEfficiencyTable, out_dir: str | Path) -> list[Path]:
    """label_efficiency.md (the table, its differences, each difference with p, the verdicts and the
    minimal detectable effect), .csv, .tex and label_efficiency_verdicts.md in out_dir (named by
    the table's spec: <name>.md, ..., <name>_verdicts.md)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md, csv_path, tex = (out / f"{table.spec.name}.{e}" for e in ("md", "csv", "tex"))
    verdict_path = out / f"{table.spec.name}{VERDICTS_SUFFIX}"
    extra = []
    if table.significance is not None and table.significance.n_resamples:
        extra += ["", "Each difference with its p-values:", "", *(difference_list(table) or ["(none)"])]
        extra += ["", "## Verdicts", "", *(f"- {v}" for v in verdicts(table)), "", detectable_note(table)]
        verdict_path.write_text(verdicts_markdown(table))
    else:
        verdict_path.unlink(missing_ok=True)      # an earlier report's verdicts would not be this table's
    md.write_text(table_markdown(table) + ("\n".join(extra) + "\n" if extra else ""))
    write_table_csv(table, csv_path)
    tex.write_text(table_latex(table))
    return [md, csv_path, tex] + ([verdict_path] if verdict_path.exists() else [])


def has_label_efficiency_runs(runs: Sequence[Run]) -> bool:
    """Whether runs hold a label-efficiency study: a random-init (encoder "random") run."""
    return any(is_random_init(r) for r in runs)


def extra_tables(label_efficiency: bool | None = None):
    """write_report's `extra`: this table's name when asked (True), or, with None, when a label
    run has a random encoder (metrics.json "encoder": "random"); False: none. And the regression
    table's when a run is of a regression task, with the label-efficiency regression curve
    (coreecg/eval/tables/regression.py) when asked or a regression run has a random encoder."""
    def names(runs: Sequence[Run], report: ReportConfig) -> list[str]:
        label, regression = label_runs(runs), regression_runs(runs)
        wanted = label_efficiency or (label_efficiency is None and has_label_efficiency_runs(label))
        curve = bool(regression) and (label_efficiency or (label_efficiency is None
                                                             and has_label_efficiency_runs(regression)))
        return ([LABEL_EFFICIENCY_TABLE] * bool(wanted) + [REGRESSION_TABLE] * bool(regression)
                + [REGRESSION_EFFICIENCY_TABLE] * bool(curve))
    return names


OWN_BASELINE = "each row's baseline (Random init under the same probe, Supervised for fine-tuning)"


def build_for_report(name: str, inputs: TableInputs) -> LabelEfficiencyTable:
    """The table of the report's runs, its rows' protocols checked (coreecg/eval/fairness.py)."""
    table = label_efficiency_table(inputs.runs, inputs.report)
    table.footnotes = protocol_footnotes(table.spec.name, table.run_paths, inputs) + contract_leads_note(inputs.runs)
    return table


def index(name: str, files: Sequence[str], runs: Sequence[str]) -> str:
    """The study index's line: the table's files, then its verdicts (when written), then its runs."""
    verdicts = "".join(f", verdicts in [`{f}`]({f})" for f in files if f.endswith(VERDICTS_SUFFIX))
    head, _, tail = index_line(name, [f for f in files if not f.endswith(VERDICTS_SUFFIX)], runs).partition("; ")
    return f"{head}{verdicts}; {tail}"


register_table(LABEL_EFFICIENCY_TABLE, build=build_for_report, write=write_label_efficiency,
               runs=lambda table: table.run_paths, differences=OWN_BASELINE, index=index)
