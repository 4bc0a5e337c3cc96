"""The benchmark table: test macro AUROC of every encoder per corpus x evaluation mode, with each
run's patient-bootstrap interval, beside published numbers that are kept visibly apart
(studies/benchmark.yaml, docs/benchmark.md).

    table = benchmark_table(runs, published=[load_published("studies/published/ecg_fm_benchmark.yaml")])
    write_benchmark(table, out_dir)          # benchmark.md, benchmark.csv

Rows: methods (encoders) in first-seen order. Columns: corpora (the run's `dataset`, a study's
corpus name such as ptbxl-super) x modes in the order finetune, frozen, linear; a `scratch` run
(the supervised baseline) sits in the finetune column, since it trains every weight as the
benchmark's supervised rows do. Only 12-lead runs on all training data enter (the benchmark's
protocol); the others are counted under the table. A cell prints the AUROC in percent and the
95 % interval of the patient bootstrap (`finetune.bootstrap_resamples`) for one run, or mean ±
SD over runs with their count. Nothing is bold and nothing is marked: which differences hold is
the method tables' job (`report.min_runs` runs per method); this table places numbers.

A published-numbers file (YAML):

    source: AI4HealthUOL/ecg-fm-benchmarking (Al-Masud et al., ICLR 2026)
    protocol: strat_fold 1-8/9/10, 2.5 s crops, 4-crop test averaging, one run per model
    mode: finetune                          # the column its numbers go under
    rows: {ECG-CPC: {ptbxl-super: 0.934, ptbxl-all: 0.949, cpsc2018: 0.969}, ...}

    shares:                                 # per dataset: what its numbers share with coreecg's runs
      ptbxl-super: {test_split: folds, classes: same}
      chapman: {test_split: own, classes: other}

Its dataset keys are the study's corpus names; its rows are printed under the measured ones,
their protocol in a footnote, never compared with them in code. Under each column the table says
whether that file's numbers share the test records (its `test_split` is the split rule of every
measured run in the column: `folds`, PTB-XL's strat_fold 10; `own`, the benchmark's own folds,
which no coreecg split reproduces) and the classes (`same`) with the measured rows; numbers that
share neither, or whose dataset the file does not declare, print in a context block apart from
the columns.

Registered as `benchmark` (coreecg.eval.tables.registry): a study asks for it by name and gives
the published files as report.published (read before Ray starts). It compares encoders, so its
rows' pretraining is not checked for one protocol, and their architecture may differ.
"""
from __future__ import annotations

import csv
import re
from dataclasses import dataclass, field
from math import isclose
from pathlib import Path
from typing import Sequence

import numpy as np
import yaml

from coreecg.data.declared import declared_note
from coreecg.eval.fairness import FINETUNING, Allowance, check_table, run_entries
from coreecg.eval.runs import DATASET_ALIASES, DATASETS, Run, RunError, label_runs
from coreecg.eval.tables.registry import TableError, TableInputs, register_table
from coreecg.eval.tables.table import LEAK, MISSING, UNAVAILABLE

BENCHMARK_TABLE = "benchmark"
MODES = ("finetune", "frozen", "linear")
MODE_OF = {"scratch": "finetune"}
MODE_NAMES = {"finetune": "fine-tuned", "frozen": "frozen", "linear": "linear"}


class PublishedError(ValueError):
    """A published-numbers file that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Published:
    """One published-numbers file: method -> dataset -> macro AUROC (a fraction)."""

    path: Path
    source: str
    protocol: str
    mode: str
    rows: dict[str, dict[str, float]]
    shares: dict[str, dict[str, str]] = field(default_factory=dict)   # dataset -> {test_split, classes}

    def shared(self, dataset: str, split_rules: set[str]) -> tuple[bool, bool] | None:
        """(same test records, same classes) as the measured runs of a column whose runs have
        `split_rules`; None when the file does not declare the dataset."""
        declared = self.shares.get(dataset)
        if declared is None:
            return None
        split = declared.get("test_split", "own")
        return split != "own" and split_rules == {split}, declared.get("classes") == "same"


@dataclass
class BenchmarkTable:
    columns: list[tuple[str, str]]                      # (dataset, mode)
    cells: dict[str, dict[tuple[str, str], list[Run]]]  # method -> column -> its runs
    published: list[Published] = field(default_factory=list)
    left_out: int = 0                                   # runs not on 12 leads and all training data
    footnotes: list[str] = field(default_factory=list)  # the protocol check's (check_benchmark)


def load_published(path: str | Path) -> Published:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PublishedError(f"{path}: cannot read published numbers: {e}") from None
    if not isinstance(data, dict) or set(data) - {"source", "protocol", "mode", "rows", "shares"}:
        raise PublishedError(f"{path}: needs a mapping of source, protocol, mode, rows and shares; got "
                             f"{sorted(data) if isinstance(data, dict) else type(data).__name__}")
    mode = data.get("mode", "finetune")
    if mode not in MODES:
        raise PublishedError(f"{path}: mode {mode!r} is not one of {MODES}")
    rows = data.get("rows")
    if not isinstance(rows, dict) or not rows:
        raise PublishedError(f"{path}: rows must map methods to {{dataset: AUROC}}")
    out: dict[str, dict[str, float]] = {}
    for method, values in rows.items():
        if not isinstance(values, dict):
            raise PublishedError(f"{path}: rows.{method} must map datasets to AUROC values")
        for dataset, value in values.items():
            if not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise PublishedError(f"{path}: rows.{method}.{dataset}: {value!r} is not an AUROC in [0, 1]")
        out[str(method)] = {DATASET_ALIASES.get(str(d), str(d)): float(v) for d, v in values.items()}
    shares = {}
    for dataset, declared in (data.get("shares") or {}).items():
        if not isinstance(declared, dict) or set(declared) - {"test_split", "classes"} \
                or declared.get("classes", "same") not in ("same", "other") \
                or not isinstance(declared.get("test_split", "own"), str):
            raise PublishedError(f"{path}: shares.{dataset}: needs {{test_split: <a split rule, e.g. folds, or own>, "
                                 f"classes: same | other}}; got {declared!r}")
        shares[DATASET_ALIASES.get(str(dataset), str(dataset))] = {k: str(v) for k, v in declared.items()}
    return Published(path, str(data.get("source", "")), str(data.get("protocol", "")), mode, out, shares)


def benchmark_table(runs: Sequence[Run], published: Sequence[Published] = ()) -> BenchmarkTable:
    """The table of `runs` (coreecg.eval.runs.load_run); RunError for two runs of one method,
    column and seed."""
    # 12 leads, or every lead a published model takes (its contract's: ECG-JEPA's 8, ECGFounder's lead I)
    kept = [r for r in label_runs(runs) if (r.leads == "12" or r.record.get("contract_leads"))
            and isclose(r.train_fraction, 1.0) and MODE_OF.get(r.mode, r.mode) in MODES]
    datasets = list(dict.fromkeys(r.dataset for r in kept))
    modes = [m for m in MODES if any(MODE_OF.get(r.mode, r.mode) == m for r in kept)]
    columns = [(d, m) for d in datasets for m in modes if any(r.dataset == d and MODE_OF.get(r.mode, r.mode) == m
                                                             for r in kept)]
    cells: dict[str, dict[tuple[str, str], list[Run]]] = {}
    seen: dict[tuple, Run] = {}
    for r in kept:
        column = (r.dataset, MODE_OF.get(r.mode, r.mode))
        key = (r.method, column, r.seed)
        if key in seen:
            raise RunError(f"{r.path} and {seen[key].path}: two runs of {r.method} on {r.dataset} ({column[1]}) "
                           f"with seed {r.seed}")
        seen[key] = r
        cells.setdefault(r.method, {}).setdefault(column, []).append(r)
    return BenchmarkTable(columns, cells, list(published), len(runs) - len(kept))


# A benchmark compares encoders: their architecture and input contract are each one's own.
ENCODER_KEYS = ("model.*", "encoders.*", "data.preprocess.*", "data.crop_samples")
ENCODER_REASON = "the rows are different encoders: architecture and input contract are each encoder's own"


def benchmark_allowance(methods: Sequence[str]) -> Allowance:
    return Allowance(tuple(methods), ENCODER_KEYS, ENCODER_REASON)


def check_benchmark(table: BenchmarkTable, allow: Sequence[Allowance] = ()) -> list[str]:
    """Within each column every row's fine-tuning protocol agrees (coreecg/eval/fairness.py) but
    for the encoder itself (ENCODER_KEYS): UnfairTableError otherwise. How each encoder was
    pretrained is what the table compares, so pretraining configs are not. -> footnotes."""
    runs = [r for row in table.cells.values() for col in row.values() for r in col]
    entries = [e for es, _ in run_entries(runs).values() for e in es if e.phase == FINETUNING]
    mine = benchmark_allowance(list(table.cells))
    notes = check_table("benchmark", entries, [mine, *allow], seeds="note")
    # differences in the encoder itself are the table's subject: one line says so, not one per key
    keyed = [(n, re.match(r".+? differs in (\S+) ", n)) for n in notes]
    kept = [n for n, m in keyed if not (m and any(mine.covers(method, m.group(1)) for method in mine.variants))]
    return kept + ([f"Protocol: {ENCODER_REASON}."] if len(table.cells) > 1 else [])


def _auroc(run: Run) -> float | None:
    value = run.record["test"].get("auroc")
    return None if value is None or value != value else float(value)


def _interval(run: Run) -> tuple[float | None, float | None]:
    ci = ((run.record["test"].get("ci") or {}).get("auroc")) or {}
    return ci.get("low"), ci.get("high")


def cell_text(runs: list[Run]) -> str:
    """'93.2 [91.0, 95.1]' (one run: its bootstrap interval), '93.2 ± 0.4 (3 runs)', or – ."""
    values = [v for r in runs if (v := _auroc(r)) is not None]
    if not values:
        return MISSING if not runs else "undefined"
    if len(runs) == 1:
        low, high = _interval(runs[0])
        ci = f" [{100 * low:.1f}, {100 * high:.1f}]" if low is not None and high is not None else ""
        return f"{100 * values[0]:.1f}{ci}"
    return f"{100 * np.mean(values):.1f} ± {100 * np.std(values, ddof=1):.1f} ({len(values)} runs)"


def _declared(run: Run) -> str:
    """The run's declared overlap in words ("" when none: coreecg.data.declared)."""
    leak = run.record.get("leakage") if isinstance(run.record.get("leakage"), dict) else {}
    return declared_note(leak.get("declared"))


def _label(column: tuple[str, str]) -> str:
    dataset, mode = column
    return f"{DATASETS.get(dataset, dataset)} {MODE_NAMES[mode]}"


def table_markdown(table: BenchmarkTable) -> str:
    cols = table.columns
    lines = ["# Benchmark: test macro AUROC (%)", "",
             "| method | " + " | ".join(_label(c) for c in cols) + " |",
             "|---|" + "---|" * len(cols)]
    scratch = [m for m, row in table.cells.items() if all(r.mode == "scratch" for runs in row.values() for r in runs)]
    for method, row in table.cells.items():
        lines.append(f"| {method} | " + " | ".join(
            UNAVAILABLE if method in scratch and c[1] != "finetune"
            else cell_text(row.get(c, [])) + (f" {LEAK}" if any(map(_declared, row.get(c, []))) else "")
            for c in cols) + " |")
    notes = ["", *table.footnotes,
             "One run: its test AUROC and the 95 % interval of its patient bootstrap; several: mean ± SD over "
             "runs. 12 leads, all training data. Not a significance test (docs/evaluation.md); protocol "
             "differences to published numbers: docs/benchmark.md."]
    mismatched = {m: sorted({d for (d, _), runs in row.items() for r in runs if r.record.get("preprocess_mismatch")})
                  for m, row in table.cells.items()}
    for method, datasets in mismatched.items():
        if datasets:
            example = next(r.record["preprocess_mismatch"] for (d, _), runs in table.cells[method].items()
                           for r in runs if r.record.get("preprocess_mismatch"))
            notes.append(f"{method}: fine-tuned on {', '.join(datasets)} preprocessed otherwise than its input "
                         f"contract ({'; '.join(example)}); rebuild those corpora to its contract for its own numbers.")
    fewer = {m: next(r.leads for runs in row.values() for r in runs) for m, row in table.cells.items()
             if any(r.leads != "12" for runs in row.values() for r in runs)}
    if fewer:
        notes.append("Leads: every lead the model takes, by its own input contract: "
                     + "; ".join(f"{m}: {leads}" for m, leads in fewer.items()) + ".")
    for method, row in table.cells.items():       # a published family's declared pretraining data
        said = sorted({_declared(r) for runs in row.values() for r in runs} - {""})
        notes += [f"{LEAK} {method}: {n}." for n in said]
    if scratch and any(c[1] != "finetune" for c in cols):
        notes.append(f"{UNAVAILABLE}: {', '.join(scratch)} trained from scratch, so it has no frozen or linear run.")
    if table.left_out:
        notes.append(f"{table.left_out} run(s) on fewer leads or part of the training data are not in this table "
                     "(all_runs.csv has them).")
    context: list[str] = []
    for k, pub in enumerate(table.published, 1):
        mark = "*" * k
        shares = {c: _column_shares(table, pub, c) for c in cols if c[1] == pub.mode}
        shown = [c for c, (text, apart) in shares.items() if not apart]
        lines.append(f"| *published{mark}: shares with the measured rows* | " + " | ".join(
            shares[c][0] if c in shown else "" for c in cols) + " |")
        for method, values in pub.rows.items():
            lines.append(f"| {method}{mark} | " + " | ".join(
                (f"{100 * values[c[0]]:.1f}" if c in shown and c[0] in values else "") for c in cols) + " |")
        notes.append(f"{mark} Published, not run here: {pub.source}. Protocol: {pub.protocol} ({pub.path.name}).")
        context += _context_lines(table, pub, mark, [c for c, (_, apart) in shares.items() if apart])
    if context:
        notes += ["", "Context: published numbers that share neither the test records nor the classes with the "
                      "measured rows (or whose file does not say), so no column holds them:", *context]
    return "\n".join(lines + notes) + "\n"


def _split_rules(table: BenchmarkTable, column: tuple[str, str]) -> set[str]:
    return {r.record.get("split_rule", "patients") for row in table.cells.values() for r in row.get(column, [])}


def _column_shares(table: BenchmarkTable, pub: Published, column: tuple[str, str]) -> tuple[str, bool]:
    """(what the published numbers of `column` share with its measured rows, whether they go apart
    into the context block: sharing neither, or undeclared)."""
    return shares_text(pub, column[0], _split_rules(table, column))


def shares_text(pub: Published, dataset: str, split_rules: set[str]) -> tuple[str, bool]:
    """(what `pub`'s numbers on `dataset` share with measured runs of `split_rules`, in words;
    whether they go apart into a context block: sharing neither, or not declared in its file)."""
    shared = pub.shared(dataset, split_rules)
    if shared is None:
        return "not declared", True
    records, classes = shared
    if records and classes:
        return "test records and classes", False
    if classes:
        return "classes, not test records", False
    if records:
        return "test records, not classes", False
    return "neither", True


def _context_lines(table: BenchmarkTable, pub: Published, mark: str, columns: list[tuple[str, str]]) -> list[str]:
    out = []
    for c in columns:
        values = [(m, v[c[0]]) for m, v in pub.rows.items() if c[0] in v]
        if values:
            why = _column_shares(table, pub, c)[0]
            reason = "not declared in its file" if why == "not declared" else "shares neither"
            out.append(f"- {_label(c)}{mark} ({reason}"
                       "): " + ", ".join(f"{m} {100 * v:.1f}" for m, v in values))
    return out


def write_benchmark(table: BenchmarkTable, out_dir: str | Path) -> list[Path]:
    """benchmark.md and benchmark.csv (one row per run and per published number) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    md = out / "benchmark.md"
    md.write_text(table_markdown(table))
    path = out / "benchmark.csv"
    fields = ["method", "dataset", "mode", "seed", "auroc", "auroc_low", "auroc_high", "test_n", "split_rule",
              "source", "declared_overlap", "run_dir"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        for method, row in table.cells.items():
            for (dataset, mode), runs in row.items():
                for r in sorted(runs, key=lambda r: r.seed):
                    low, high = _interval(r)
                    w.writerow({"method": method, "dataset": dataset, "mode": r.mode, "seed": r.seed,
                                "auroc": _auroc(r), "auroc_low": low, "auroc_high": high,
                                "test_n": r.record["test"].get("n"), "split_rule": r.record.get("split_rule", ""),
                                "source": "measured", "declared_overlap": _declared(r), "run_dir": str(r.path)})
        for pub in table.published:
            for method, values in pub.rows.items():
                for dataset, value in values.items():
                    w.writerow({"method": method, "dataset": dataset, "mode": pub.mode, "auroc": value,
                                "source": f"published: {pub.source}"})
    return [md, path]


def build_for_report(name: str, inputs: TableInputs) -> BenchmarkTable:
    """The table of the report's runs beside inputs.published, its protocol checked."""
    table = benchmark_table(inputs.runs, [load_published(p) for p in inputs.published])
    table.footnotes = check_benchmark(table, inputs.allow)
    return table


def runs_behind(table: BenchmarkTable) -> set[Path]:
    return {r.path for row in table.cells.values() for column in row.values() for r in column}


def check_published(inputs: TableInputs) -> None:
    """A study's published-numbers files, each read now (before Ray): TableError naming it."""
    for path in inputs.published:
        try:
            load_published(path)
        except PublishedError as e:
            raise TableError("report.published", str(e)) from None


register_table(BENCHMARK_TABLE, build=build_for_report, write=write_benchmark, runs=runs_behind, differences=None,
               study_keys=("published",), check=check_published, compares_pretraining=False,
               allowances=lambda rows: [benchmark_allowance(rows)])
