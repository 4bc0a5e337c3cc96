"""The paper's result tables from saved fine-tuning runs (comparison, lead reduction, training
fraction), as Markdown and CSV, plus every run in all_runs.csv.

Contract: the fine-tuning job writes RUN_DIR/metrics.json as

    {"method": "CoRe-ECG",          # table row; "Supervised" for scratch runs; ablations by name
     "dataset": "ptbxl",            # ptbxl | icbeb2018 | ningbo (cpsc2018 is read as icbeb2018)
     "mode": "finetune",            # finetune | scratch enter the tables; anything else (linear)
                                    #   only all_runs.csv
     "leads": "12",                 # "12" | "6" | "1" (an integer is read as its string)
     "train_fraction": 1.0,         # 1.0 | 0.5 | 0.05 in the tables
     "seed": 0,                     # one run per (method, dataset, mode, leads, fraction, seed)
     "multilabel": false, "class_names": [...],
     "test": {"acc": 0.9, "f1": 0.7, "f1_argmax": 0.71, "auroc": 0.93, "n": 123,
              "ci": {"acc": {"low": .., "high": .., "undefined_resamples": 0}, ...},
              "per_class": {...}, "classes_left_out": {...}, ...},   # classification_metrics
     "val": {...same keys...},                                        #   + bootstrap_ci as "ci"
     "crop_rule": "...", "encoder": "path or null", "encoder_config_hash": "..."}

`jobs/finetune.py` (coreecg.train.finetuning) also writes lead_names, corpus, config_hash,
selection {metric, best_epoch (0-based), best_step, val_auroc, epochs, steps}, counts, train_subset,
classes_absent_from_train, aggregation, bootstrap_resamples and unlabelled_windows_skipped.
Metrics are fractions in [0, 1] (null where undefined; NaN is read as null); the tables print
test metrics in percent.
The report reads method, dataset, mode, leads, train_fraction, seed and test.{acc, f1, auroc};
a folder without metrics.json, or one missing any of these or with a wrong type, is a RunError
naming the folder.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from math import isclose
from pathlib import Path
from typing import Sequence

import numpy as np

METRICS = {"acc": "ACC", "f1": "F1", "auroc": "AUROC"}
DATASETS = {"ptbxl": "PTB-XL", "icbeb2018": "ICBEB2018", "ningbo": "Ningbo"}   # the paper's order
DATASET_ALIASES = {"cpsc2018": "icbeb2018"}
TABLE_MODES = ("finetune", "scratch")
LEADS = ("12", "6", "1")
FRACTIONS = (1.0, 0.5, 0.05)
MISSING = "–"
UNAVAILABLE = "n/a"


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


TABLES = (
    TableSpec("comparison", "Comparison (12 leads, all training data)", (("12", 1.0, ""),)),
    TableSpec("lead_reduction", "Lead reduction (all training data)",
              tuple((lead, 1.0, f"{lead}-lead") for lead in LEADS)),
    TableSpec("train_fraction", "Reduced fine-tuning data (12 leads)",
              tuple(("12", f, f"{f:.0%}") for f in FRACTIONS)),
)


def _variant(spec: TableSpec, run: Run) -> tuple[str, float, str] | None:
    """The table variant (column block) a run belongs to, or None if it is not in the table."""
    if run.mode not in TABLE_MODES:
        return None
    return next((v for v in spec.variants if v[0] == run.leads and isclose(v[1], run.train_fraction)), None)


def _dataset_order(runs: Sequence[Run]) -> list[str]:
    seen = list(dict.fromkeys(r.dataset for r in runs))
    return [d for d in DATASETS if d in seen] + [d for d in seen if d not in DATASETS]


def format_cell(values: Sequence[float]) -> str:
    """'93.6 ± 0.4' (mean ± sample std over seeds, in percent), '93.6' for one run, '' for none."""
    if not values:
        return ""
    mean = 100 * np.mean(values)
    return f"{mean:.1f}" if len(values) == 1 else f"{mean:.1f} ± {100 * np.std(values, ddof=1):.1f}"


@dataclass
class Table:
    spec: TableSpec
    columns: list[Column]
    cells: dict[str, list[list[float]]]     # method -> per column, the test values over seeds
    unavailable: dict[str, str] = field(default_factory=dict)   # method -> why it has no run

    def best(self, j: int) -> float | None:
        """The column's best mean as printed (rounded), so equal printed values are both bold."""
        means = [round(100 * np.mean(v[j]), 1) for v in self.cells.values() if v[j]]
        return max(means) if means else None


def build_table(spec: TableSpec, runs: Sequence[Run]) -> Table:
    """Rows: methods in first-seen order; columns: dataset x variant x metric. RunError if a cell
    holds two runs with one seed (the same run passed twice, or two runs that collide)."""
    members = [(r, v) for r in runs if (v := _variant(spec, r))]
    columns = [Column(d, v[0], v[1], m, " ".join(filter(None, (DATASETS.get(d, d), v[2], label))),
                      " ".join(filter(None, (DATASETS.get(d, d), v[2]))))
               for d in _dataset_order([r for r, _ in members]) for v in spec.variants
               for m, label in METRICS.items()]
    index = {(c.dataset, c.leads, c.fraction, c.metric): j for j, c in enumerate(columns)}
    cells: dict[str, list[list[float]]] = {}
    seeds: dict[tuple, Run] = {}
    for run, (leads, fraction, _) in members:
        key = (run.method, run.dataset, leads, fraction, run.seed)
        if key in seeds:
            raise RunError(f"{run.path} and {seeds[key].path}: two runs of {run.method} on {run.dataset} "
                           f"({leads} leads, fraction {fraction}) with seed {run.seed}")
        seeds[key] = run
        row = cells.setdefault(run.method, [[] for _ in columns])
        for metric in METRICS:
            value = run.record["test"][metric]
            if value is not None and value == value:     # null (or NaN): undefined in this run
                row[index[(run.dataset, leads, fraction, metric)]].append(float(value))
    return Table(spec, columns, cells)


def _markdown_row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


def table_markdown(table: Table) -> str:
    """The table as the paper prints it, then a runs-per-cell table (n per dataset block; shown
    as 'ACC/F1/AUROC' counts when a metric was undefined in some run)."""
    cols = table.columns
    lines = [f"# {table.spec.title}", "",
             "Test-set metrics in percent: mean ± sample standard deviation over seeds (the mean alone "
             f"for one run). Best per column in **bold**; {MISSING}: no run.", "",
             _markdown_row(["Method"] + [c.label for c in cols]), _markdown_row(["---"] * (len(cols) + 1))]
    for method, row in table.cells.items():
        if method in table.unavailable:
            lines.append(_markdown_row([f"{method}†"] + [UNAVAILABLE] * len(cols)))
            continue
        out = []
        for j, values in enumerate(row):
            text = format_cell(values) or MISSING
            bold = values and round(100 * np.mean(values), 1) == table.best(j)
            out.append(f"**{text}**" if bold else text)
        lines.append(_markdown_row([method] + out))
    if table.unavailable:
        lines += [""] + [f"† {UNAVAILABLE}: {m}: {why}" for m, why in table.unavailable.items()]
    groups = list(dict.fromkeys(c.group for c in cols))
    lines += ["", "Runs per cell:", "",
              _markdown_row(["Method"] + groups), _markdown_row(["---"] * (len(groups) + 1))]
    for method, row in table.cells.items():
        counts = []
        for g in groups:
            n = [len(row[j]) for j, c in enumerate(cols) if c.group == g]
            counts.append(MISSING if not any(n) else str(n[0]) if len(set(n)) == 1 else "/".join(map(str, n)))
        lines.append(_markdown_row([method] + counts))
    return "\n".join(lines) + "\n"


def write_table_csv(table: Table, path: Path) -> None:
    """One row per method; per column the printed cell ('' when missing) and its run count."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method"] + [h for c in table.columns for h in (c.label, f"{c.label} n")] + ["note"])
        for method, row in table.cells.items():
            if method in table.unavailable:
                w.writerow([method] + [UNAVAILABLE, 0] * len(table.columns) + [table.unavailable[method]])
                continue
            w.writerow([method] + [x for values in row for x in (format_cell(values), len(values))] + [""])


RUN_FIELDS = ("method", "dataset", "mode", "leads", "train_fraction", "seed")


def write_all_runs_csv(runs: Sequence[Run], tables: Sequence[Table], path: Path) -> None:
    """Every run: its keys, the tables it is in, test and val metrics (fractions) and test CIs."""
    split_keys = ("n", "acc", "f1", "f1_argmax", "auroc")
    ci_keys = [f"test_{m}_{end}" for m in ("acc", "f1", "f1_argmax", "auroc") for end in ("low", "high")]
    header = (["run_dir", *RUN_FIELDS, "multilabel", "tables"]
              + [f"{s}_{k}" for s in ("test", "val") for k in split_keys]
              + ci_keys + ["encoder", "encoder_config_hash", "crop_rule"])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, header)
        w.writeheader()
        for run in runs:
            rec = run.record
            row = {"run_dir": str(run.path), **{k: getattr(run, k) for k in RUN_FIELDS},
                   "multilabel": rec.get("multilabel"),
                   "tables": ";".join(t.spec.name for t in tables if _variant(t.spec, run) and run.method in t.cells),
                   **{k: rec.get(k) for k in ("encoder", "encoder_config_hash", "crop_rule")}}
            for split in ("test", "val"):
                metrics = rec.get(split) or {}
                row.update({f"{split}_{k}": metrics.get(k) for k in split_keys})
            ci = rec["test"].get("ci") or {}
            row.update({f"test_{m}_{end}": (ci.get(m) or {}).get(end)
                        for m in ("acc", "f1", "f1_argmax", "auroc") for end in ("low", "high")})
            w.writerow(row)


def method_table(name: str, title: str, methods: Sequence[str], runs: Sequence[Run],
                 unavailable: dict[str, str] | None = None) -> Table:
    """A comparison-style table (12 leads, all training data) of the named methods, in that order
    (the paper's Table 1 and ablation tables: one row per variant; a variant with no run is a row
    of –, one in `unavailable` a row of n/a with its reason under the table)."""
    spec = TableSpec(name, title, TABLES[0].variants)
    full = build_table(spec, [r for r in runs if r.method in methods])
    empty = [[] for _ in full.columns]
    why = {m: r for m, r in (unavailable or {}).items() if m in methods}
    return Table(spec, full.columns, {m: full.cells.get(m, empty) for m in methods}, why)


def write_report(run_dirs: Sequence[str | Path], output: str | Path,
                 method_tables: dict[str, Sequence[str]] | None = None,
                 unavailable: dict[str, str] | None = None) -> list[Path]:
    """Read every run folder, write comparison / lead_reduction / train_fraction (.md, .csv) and
    all_runs.csv into `output`, plus one table per `method_tables` entry (name -> methods in row
    order; `ablation_<name>`, except that an entry named `comparison` replaces the comparison
    table with the paper's Table 1 rows in that order); `unavailable`: method -> why it has no
    run (an n/a row). -> the files written. RunError on an unreadable folder."""
    if not run_dirs:
        raise RunError("no run folders given")
    runs = [load_run(d) for d in run_dirs]
    method_tables = dict(method_tables or {})
    ordered = method_tables.pop(TABLES[0].name, None)
    tables = [method_table(spec.name, spec.title, ordered, runs, unavailable)
              if spec is TABLES[0] and ordered is not None else build_table(spec, runs) for spec in TABLES]
    tables += [method_table(f"ablation_{name}", f"Ablation: {name} (12 leads, all training data)", methods, runs,
                            unavailable)
               for name, methods in method_tables.items()]
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    written = []
    for table in tables:
        md, csv_path = output / f"{table.spec.name}.md", output / f"{table.spec.name}.csv"
        md.write_text(table_markdown(table))
        write_table_csv(table, csv_path)
        written += [md, csv_path]
    write_all_runs_csv(runs, tables, output / "all_runs.csv")
    return written + [output / "all_runs.csv"]
