"""The method tables: the paper's comparison (Table 1: 12 leads, all training data),
lead_reduction (Table 2) and train_fraction (Table 3), and a variants file's own tables
(`ablation_<name>`: its rows in its order). Rows are methods, each cell's difference is to
report.reference; the differences are computed once for all of them (`method_differences`).
Each registers itself (coreecg.eval.tables.registry); comparison, lead_reduction and
train_fraction are a study's default tables.
"""
from __future__ import annotations

from dataclasses import replace
from math import isclose
from pathlib import Path
from typing import Sequence

from coreecg.config import ReportConfig
from coreecg.eval.runs import Run, label_runs
from coreecg.eval.significance import PREDICTIONS
from coreecg.eval.tables.protocol import protocol_footnotes
from coreecg.eval.tables.registry import TableInputs, register_table
from coreecg.eval.tables.render import write_table
from coreecg.eval.tables.table import (NO_PREDICTIONS, TABLE_MODES, Cell, Significance, Table, TableSpec, build_table,
                                       column_differences, variant_of)

LEADS = ("12", "6", "1")
FRACTIONS = (1.0, 0.5, 0.05)


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
    table = [r for r in label_runs(runs) if r.mode in TABLE_MODES]
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


def method_table(name: str, title: str, methods: Sequence[str], runs: Sequence[Run],
                 unavailable: dict[str, str] | None = None, f1: str = "threshold",
                 min_positive_patients: int = 1) -> Table:
    """A comparison-style table (12 leads, all training data) of the named methods, in that order
    (the paper's Table 1 and ablation tables: one row per variant; a variant with no run is a row
    of –, one in `unavailable` a row of n/a with its reason under the table)."""
    spec = TableSpec(name, title, TABLES[0].variants)
    full = build_table(spec, [r for r in runs if r.method in methods], f1, min_positive_patients)
    empty = [[] for _ in full.columns]
    why = {m: r for m, r in (unavailable or {}).items() if m in methods}
    return Table(spec, full.columns, {m: full.cells.get(m, empty) for m in methods}, why, f1, full.f1_fallback,
                 full.members, leaks=full.leaks, below_chance=full.below_chance, rare=full.rare,
                 rare_unknown=full.rare_unknown, rare_argmax_stored=full.rare_argmax_stored)


def table_runs(spec: TableSpec, runs: Sequence[Run]) -> list[Run]:
    """The runs of a lead or fraction table: the methods run beyond 12 leads and all data (the
    paper's Tables 2 and 3 compare those only), or every method when none was."""
    if spec is TABLES[0] or spec.name == TABLES[0].name:
        return list(runs)
    first = spec.variants[0]
    varied = {r.method for r in runs if (v := variant_of(spec, r)) and v != first}
    return [r for r in runs if r.method in varied] if varied else list(runs)



def method_differences(runs: Sequence[Run], report: ReportConfig) -> Significance:
    """Differences to `report.reference` for every (method, cell) the tables hold (its F1,
    resamples, level, seed, min_runs, min_test_patients), from the runs' predictions.csv: one
    `cell_differences` per cell (so each run is resampled once however many tables show it). A
    method whose runs (or the reference's) lack predictions.csv gets the reason instead; runs that
    cannot be compared (other test records, labels or classes) are a RunError naming them."""
    settings = {(v[0], v[1]) for spec in table_specs(runs) for v in spec.variants}
    cells: dict[Cell, dict[str, list[Run]]] = {}
    for run in label_runs(runs):
        setting = next((s for s in settings if s[0] == run.leads and isclose(s[1], run.train_fraction)), None)
        if run.mode in TABLE_MODES and setting:
            cells.setdefault((run.dataset, *setting), {}).setdefault(run.method, []).append(run)
    reference = report.reference
    sig = Significance.of(reference, report)
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
            sig.cells.update(column_differences(cell, ref, ready, report))
    return sig


BUILT_IN_TABLES = tuple(spec.name for spec in TABLES)
ABLATION_TITLE = "Ablation: {name} (12 leads, all training data)"


def _for_report(table: Table, inputs: TableInputs) -> Table:
    """The table with the runs behind it, its protocol footnotes (UnfairTableError for an
    undeclared difference) and the report's differences (computed once for every method table)."""
    table.behind = table.runs_behind(inputs.runs)
    table.footnotes = protocol_footnotes(table.spec.name, table.behind, inputs)
    table.set_significance(inputs.once("method_differences", lambda: method_differences(inputs.runs, inputs.report)))
    return table


def build_paper_table(name: str, inputs: TableInputs) -> Table:
    """lead_reduction or train_fraction (or comparison) of the report's runs, in the columns the
    runs fill (`table_specs`), rows in first-seen order."""
    spec = next(s for s in table_specs(inputs.runs) if s.name == name)
    return _for_report(build_table(spec, table_runs(spec, inputs.runs), inputs.report.f1,
                                   inputs.report.min_positive_patients), inputs)


def build_comparison(name: str, inputs: TableInputs) -> Table:
    """The comparison, in the variants file's row order when it lists one (the paper's Table 1
    rows, n/a rows included), else every method in first-seen order."""
    rows, spec = inputs.rows.get(name), TABLES[0]
    if not rows:
        return build_paper_table(name, inputs)
    return _for_report(method_table(spec.name, spec.title, rows, inputs.runs, dict(inputs.unavailable),
                                    inputs.report.f1, inputs.report.min_positive_patients), inputs)


def build_ablation(name: str, inputs: TableInputs) -> Table | None:
    """ablation_<name>: the variants file's table `name`, its rows in its order (None: no rows)."""
    rows = inputs.rows.get(name)
    if not rows:
        return None
    return _for_report(method_table(f"ablation_{name}", ABLATION_TITLE.format(name=name), rows, inputs.runs,
                                    dict(inputs.unavailable), inputs.report.f1, inputs.report.min_positive_patients),
                       inputs)


def _behind(table: Table) -> set[Path]:
    return table.behind


register_table("comparison", build=build_comparison, write=write_table, runs=_behind, default=True)
register_table("lead_reduction", build=build_paper_table, write=write_table, runs=_behind, default=True)
register_table("train_fraction", build=build_paper_table, write=write_table, runs=_behind, default=True)
register_table("ablation", build=build_ablation, write=write_table, runs=_behind, variant_tables=True)
