"""Fine-tuning run folders as the report reads them: RUN_DIR/metrics.json checked against its
contract (docs/evaluation.md; the contract itself: coreecg/eval/report.py's docstring).

    run = load_run("runs/finetune/core-ecg-ptbxl-finetune-l12-f100-s0")   # Run, or RunError
    run.method, run.dataset, run.leads, run.train_fraction, run.record["test"]["auroc"]

A folder without metrics.json, or one missing a key the tables read (method, dataset, mode,
leads, train_fraction, seed, test.{acc, f1, auroc}) or with a wrong type, is a RunError naming
the folder. A regression run (metrics.json task.kind "regression", coreecg.data.tasks) has no label
metrics: it needs test.mae instead (its REGRESSION_METRICS: mae, mae_sd, rmse, r2, pearson_r);
the label tables leave it out (`label_runs`), the regression table holds it
(coreecg/eval/tables/regression.py).
"""
from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from coreecg.data.declared import declared_note
from coreecg.data.sources import dataset_aliases, dataset_labels

METRICS = {"acc": "ACC", "f1": "F1", "auroc": "AUROC"}     # metrics.json test key -> column label
# a regression run's test keys -> label (coreecg.eval.regression.METRICS)
REGRESSION_METRICS = {"mae": "MAE", "mae_sd": "MAE (SD units)", "rmse": "RMSE", "r2": "R²", "pearson_r": "r"}


class _Registered(Mapping):
    """A read-only view of the data-source registry, read at each lookup: a source registered
    after this module was imported (a plugin) is seen too."""

    def __init__(self, read):
        self._read = read

    def __getitem__(self, key: str) -> str:
        return self._read()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


DATASETS: Mapping[str, str] = _Registered(dataset_labels)          # key -> name in tables, the paper's order first
DATASET_ALIASES: Mapping[str, str] = _Registered(dataset_aliases)  # e.g. cpsc2018 -> icbeb2018
F1_KEYS = {"threshold": "f1", "argmax": "f1_argmax"}     # report.f1 -> the metrics.json test key


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


def require(record: dict, key: str, types: type | tuple, where: Path, parent: str = "") -> object:
    """record[key], checked to be of `types` (a JSON true is not an int here): RunError otherwise."""
    name = f"{parent}{key}"
    if key not in record:
        raise RunError(f"{where}: metrics.json has no '{name}'")
    value = record[key]
    if not isinstance(value, types) or isinstance(value, bool):   # JSON true is a Python int
        raise RunError(f"{where}: metrics.json '{name}' is {value!r}, not of type {types}")
    return value


def load_run(run_dir: str | Path) -> Run:
    """Read and check RUN_DIR/metrics.json against the contract (RunError otherwise)."""
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
        if not require(record, key, str, run_dir):
            raise RunError(f"{run_dir}: metrics.json '{key}' is empty")
    leads = str(require(record, "leads", (str, int), run_dir))
    fraction = float(require(record, "train_fraction", (int, float), run_dir))
    if not 0 < fraction <= 1:
        raise RunError(f"{run_dir}: metrics.json 'train_fraction' {fraction} is not in (0, 1]")
    seed = require(record, "seed", int, run_dir)
    test = require(record, "test", dict, run_dir)
    if record_is_regression(record):
        require(test, "mae", (int, float), run_dir, parent="test.")
        for metric in REGRESSION_METRICS:
            if metric in test:
                require(test, metric, (int, float, type(None)), run_dir, parent="test.")
    else:
        for metric in METRICS:
            require(test, metric, (int, float, type(None)), run_dir, parent="test.")
    dataset = DATASET_ALIASES.get(record["dataset"], record["dataset"])
    return Run(run_dir, record["method"], dataset, record["mode"], leads, fraction, seed, record)


def record_is_regression(record: dict) -> bool:
    """Whether a metrics.json is a regression run's (its task's kind, coreecg.data.tasks)."""
    task = record.get("task")
    return isinstance(task, dict) and task.get("kind") == "regression"


def is_regression(run: Run) -> bool:
    return record_is_regression(run.record)


def label_runs(runs) -> list[Run]:
    """The runs of label (and binary) tasks: what the label tables hold."""
    return [r for r in runs if not is_regression(r)]


def regression_runs(runs) -> list[Run]:
    """The runs of regression tasks: what the regression table holds."""
    return [r for r in runs if is_regression(r)]


def is_multilabel(run: Run) -> bool:
    value = run.record.get("multilabel")
    if not isinstance(value, bool):
        raise RunError(f"{run.path}: metrics.json 'multilabel' is {value!r}, not true or false")
    return value


def run_task(run: Run) -> tuple[bool, list[str]]:
    """(multi-label, class names) of a run: what two runs compared in one cell must share."""
    names = run.record.get("class_names")
    if not isinstance(names, list) or not names or not all(isinstance(c, str) for c in names):
        raise RunError(f"{run.path}: metrics.json 'class_names' is {names!r}, not a list of class names")
    return is_multilabel(run), names


def metric_key(run: Run, metric: str, f1: str = "threshold") -> str:
    """The metrics.json test key a column prints: F1 is test.f1 (the paper's 0.5 threshold) or,
    with f1="argmax", test.f1_argmax on a single-label run (a multi-label run has no argmax F1)."""
    if metric == "f1" and not is_multilabel(run):
        return F1_KEYS[f1]
    return metric


def leakage_note(record: dict) -> str:
    """What a run's metrics.json "leakage" says when the guard was overruled (--allow-overlap):
    the val/test records shared with the encoder's pretraining corpus, or that it went unchecked."""
    leak = record.get("leakage") if isinstance(record.get("leakage"), dict) else {}
    if declared := declared_note(leak.get("declared")):   # a published family's own declaration
        return declared
    if leak.get("overlap"):
        return (f"{leak.get('b_records')} val/test record(s) share a patient ({leak.get('patient_records')}) or a "
                f"recording ({leak.get('signal_records')}) with the encoder's pretraining corpus (overlap.csv)")
    if leak.get("allowed") and leak.get("checked") is False and leak.get("pretraining_corpus"):
        return "leakage not checked (the pretraining corpus was not found)"
    return ""
