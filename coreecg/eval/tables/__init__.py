"""Report tables, one module each, registered by name (registry: `register_table`):

    methods            comparison, lead_reduction, train_fraction (the paper's Tables 1-3) and a
                       variants file's own tables (ablation_<name>)
    label_efficiency   does pretraining help when labels are scarce (rows per method and mode)
    benchmark          macro AUROC per corpus x mode beside published numbers
    encoder_objective  encoders x objectives: each encoder's rows against its own baselines, beside
                       its parameters and train GFLOP per sample (torch: imported when built)
    regression         regression tasks (age, ...): MAE (lower is better), MAE in SD units and R²
                       per method x task corpus, differences to the reference by each metric's direction

and what they share: table (a results table as data), render (Markdown, CSV, LaTeX), protocol
(one protocol per table), detectable (the label-efficiency table's minimal detectable effect).
A table of your own is one module calling `register_table`, imported through the config's
plugins (docs/evaluation.md, "Adding a table").
"""
from __future__ import annotations

# the registry first: the built-in tables below register themselves into it
from coreecg.eval.tables.registry import (REFERENCE, RegisteredTable, TableError, TableInputs, default_tables,
                                          index_line, known_tables, register_table, table_for)
import coreecg.eval.tables.methods  # noqa: E402,F401 - the built-ins register themselves
import coreecg.eval.tables.label_efficiency  # noqa: E402,F401
import coreecg.eval.tables.benchmark  # noqa: E402,F401
import coreecg.eval.tables.encoder_objective  # noqa: E402,F401
import coreecg.eval.tables.regression  # noqa: E402,F401

__all__ = ["REFERENCE", "RegisteredTable", "TableError", "TableInputs", "default_tables", "index_line",
           "known_tables", "register_table", "table_for"]
