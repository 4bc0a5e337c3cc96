"""A report: the tables asked for, built from saved fine-tuning runs and written as their modules
say (coreecg/eval/tables/: the paper's comparison, lead reduction and training fraction as
Markdown, CSV and LaTeX, the ablation, label-efficiency and benchmark tables, and any registered
table), plus every run in all_runs.csv. In the method tables every method's cell is compared
with a reference method's (default CoRe-ECG) over training runs, test patients resampled within
(coreecg/eval/significance.py); a difference is marked when both methods have report.min_runs
runs, the test set report.min_test_patients patients, and its p-value, adjusted over the table's
comparisons (report.adjust), is below 1 - report.level.

Contract: the fine-tuning job writes RUN_DIR/metrics.json as

    {"method": "CoRe-ECG",          # table row; "Supervised" for scratch runs; ablations by name
     "dataset": "ptbxl",            # ptbxl | icbeb2018 | ningbo (cpsc2018 is read as icbeb2018)
     "mode": "finetune",            # finetune | scratch enter the tables; linear and frozen only
                                    #   all_runs.csv and the label-efficiency table
                                    #   (coreecg/eval/tables/label_efficiency.py)
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
metrics.json, or one missing any of these or with a wrong type, is a RunError naming the folder
(coreecg/eval/runs.py).
A regression run (metrics.json "task": {"kind": "regression", ...}, "target_scaler": {mean, sd,
records, unit}) has test.{mae, mae_sd, rmse, r2, pearson_r, ...} in place of acc/f1/auroc (test.mae
required); the label tables leave it out and the regression tables hold it
(coreecg/eval/tables/regression.py).
Differences between methods read RUN_DIR/predictions.csv (one row per test record) and multilabel and
class_names; a run without predictions.csv leaves its cells without a difference.
A run whose "leakage" says the guard was overruled (--allow-overlap: overlap, or unchecked) puts
‡ after its method's name and a note under every table it is in, and a note in all_runs.csv.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from coreecg.config import ReportConfig
from coreecg.eval.fairness import Allowance
from coreecg.eval.runs import (DATASET_ALIASES, DATASETS, F1_KEYS, METRICS, REGRESSION_METRICS,  # noqa: F401
                               Run, RunError, is_multilabel as _multilabel, is_regression, leakage_note, load_run,
                               metric_key, regression_runs, require as _require, run_task as _task)
from coreecg.eval.tables import RegisteredTable, TableInputs, default_tables, table_for
from coreecg.eval.tables.methods import (FRACTIONS, LEADS, TABLES, method_differences,  # noqa: F401 - re-exported
                                         method_table, table_runs, table_specs)
from coreecg.eval.tables.render import (ADJUST_NAMES, DIFF_FIELDS, MARK, SAMPLING_ONLY,  # noqa: F401 - re-exported
                                        latex_escape, table_latex, table_markdown, write_table_csv)
from coreecg.eval.tables.table import (LEAK, MISSING, NO_PREDICTIONS, TABLE_MODES, Cell,  # noqa: F401 - re-exported
                                       Column, Significance, Table, TableSpec, build_table, format_cell, variant_of)
from coreecg.eval.tables.table import column_differences as _cell_differences  # noqa: F401 - re-exported

ALL_RUNS = "all_runs.csv"
RUN_FIELDS = ("method", "dataset", "mode", "leads", "train_fraction", "seed")


@dataclass
class Written:
    """A table as a report wrote it: its name as asked, its registration, its files, its runs."""

    name: str
    table: RegisteredTable
    files: list[Path]
    runs: set[Path]

    @property
    def file_name(self) -> str:
        """The name its files carry (ablation_<name> for a variants file's table)."""
        return self.files[0].stem if self.files else self.name


def write_tables(names: Sequence[str], inputs: TableInputs, output: str | Path) -> list[Written]:
    """Each named table (registered, or one of inputs.rows' variants-file tables) built from
    inputs, then written into `output`, and all_runs.csv (every run, the tables it is in). Every
    table is built before any is written: a RunError or UnfairTableError leaves no partial set."""
    asked = [(name, table_for(name, list(inputs.rows))) for name in dict.fromkeys(names)]
    built = [(name, kind, kind.build(name, inputs)) for name, kind in asked]
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = [Written(name, kind, [], set()) if table is None else
               Written(name, kind, list(kind.write(table, output)), set(kind.runs(table)))
               for name, kind, table in built]
    write_all_runs_csv(inputs.runs, written, output / ALL_RUNS)
    return written


def write_all_runs_csv(runs: Sequence[Run], written: Sequence[Written], path: Path) -> None:
    """Every run: its keys, the tables it is in, test and val metrics (fractions) and test CIs; with
    a regression run among them, its metrics (in the target's unit) and task in columns after these."""
    split_keys = ("n", "acc", "f1", "f1_argmax", "auroc")
    ci_keys = [f"test_{m}_{end}" for m in ("acc", "f1", "f1_argmax", "auroc") for end in ("low", "high")]
    # only with a regression run: a label report's all_runs.csv stays as it was
    regression = [f"{s}_{k}" for s in ("test", "val") for k in REGRESSION_METRICS] \
        + ["test_mae_low", "test_mae_high", "task", "unit"] if regression_runs(runs) else []
    header = (["run_dir", *RUN_FIELDS, "multilabel", "tables"]
              + [f"{s}_{k}" for s in ("test", "val") for k in split_keys]
              + ci_keys + ["encoder", "encoder_config_hash", "crop_rule", "split_rule", "leakage"] + regression)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        for run in runs:
            rec = run.record
            row = {"run_dir": str(run.path), **{k: getattr(run, k) for k in RUN_FIELDS},
                   "multilabel": rec.get("multilabel"),
                   "tables": ";".join(t.file_name for t in written if run.path in t.runs),
                   **{k: rec.get(k) for k in ("encoder", "encoder_config_hash", "crop_rule", "split_rule")},
                   "leakage": leakage_note(rec)}
            for split in ("test", "val"):
                metrics = rec.get(split) or {}
                row.update({f"{split}_{k}": metrics.get(k) for k in split_keys})
            ci = rec["test"].get("ci") or {}
            row.update({f"test_{m}_{end}": (ci.get(m) or {}).get(end)
                        for m in ("acc", "f1", "f1_argmax", "auroc") for end in ("low", "high")})
            if regression and is_regression(run):
                row.update({f"{s}_{k}": (rec.get(s) or {}).get(k) for s in ("test", "val") for k in REGRESSION_METRICS})
                row.update({"test_mae_low": (ci.get("mae") or {}).get("low"),
                            "test_mae_high": (ci.get("mae") or {}).get("high"),
                            "task": rec["task"].get("name"), "unit": (rec.get("target_scaler") or {}).get("unit")})
            w.writerow(row)


def write_report(run_dirs: Sequence[str | Path], output: str | Path,
                 method_tables: dict[str, Sequence[str]] | None = None,
                 unavailable: dict[str, str] | None = None, *, report: ReportConfig | None = None,
                 allow: Sequence[Allowance] = (),
                 extra: Callable[[list[Run], ReportConfig], Sequence[str]] | None = None,
                 tables: Sequence[str] | None = None) -> list[Path]:
    """Read every run folder, write the default tables (comparison / lead_reduction /
    train_fraction: .md, .csv, .tex) and all_runs.csv into `output`, plus one table per
    `method_tables` entry (name -> methods in row order; `ablation_<name>`, except that an entry
    named `comparison` puts the comparison's rows in that order); `unavailable`: method -> why it
    has no run (an n/a row). `report` (the config's `report` section, defaults if None): which F1
    the tables print, the reference method of the differences, their resamples, level, seed and
    the marking rule (adjust, min_runs, min_test_patients). Each table's rows are checked to have
    been trained under one protocol (coreecg/eval/fairness.py; `allow`: the variants file's
    declared differences, printed as footnotes): UnfairTableError names an undeclared difference.
    `extra`: (runs, report) -> the names of more registered tables to write, e.g. the
    label-efficiency table's (coreecg.eval.label_efficiency.extra_tables). `tables`: the
    registered tables to write instead of all those (jobs/report.py --tables; a plugin's too), in
    that order; TableError for a name not registered.
    -> the files written. RunError on an unreadable folder."""
    if not run_dirs:
        raise RunError("no run folders given")
    runs = [load_run(d) for d in run_dirs]
    inputs = TableInputs(runs, report or ReportConfig(), dict(method_tables or {}), dict(unavailable or {}),
                         tuple(allow))
    names = (list(tables) if tables is not None else
             [*default_tables(), *inputs.rows, *(extra(runs, inputs.report) if extra else ())])
    written = write_tables(names, inputs, output)
    return [f for w in written for f in w.files] + [Path(output) / ALL_RUNS]
