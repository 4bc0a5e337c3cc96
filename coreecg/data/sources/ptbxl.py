"""PTB-XL: 10 s 12-lead WFDB records with SCP-ECG statements, six benchmark tasks.

Index files in the root: `ptbxl_database.csv` (ecg_id, patient_id, scp_codes as a
python-dict string {code: likelihood}, strat_fold, filename_lr, filename_hr) and
`scp_statements.csv` (one row per statement: diagnostic/form/rhythm flags, and for
diagnostic statements diagnostic_class and diagnostic_subclass).

Tasks (`task`) follow the PTB-XL benchmark (Strodthoff et al. 2021, code
helme/ecg_ptbxl_benchmarking, utils.compute_label_aggregations), which counts every
statement listed in scp_codes whatever its likelihood (0 means "not stated", not "absent");
`min_likelihood` can raise that threshold for every task:
- "superdiagnostic" (default): diagnostic statements -> diagnostic_class (5 classes, in
  today's order NORM, MI, STTC, CD, HYP).
- "subdiagnostic": diagnostic statements -> diagnostic_subclass (23).
- "diagnostic": the statements with diagnostic == 1 (44); "form": form == 1 (19);
  "rhythm": rhythm == 1 (12); "all": every statement (71).
The class names are fixed below (sorted, the benchmark's MultiLabelBinarizer order), so that
every corpus of a task has the same label space; `list_records` checks them against
scp_statements.csv and names the file when they differ.
Views (`label_view`):
- "single" (default; with superdiagnostic the paper's 5-class task): records with exactly one
  label of the task; others raise RecordError("not single-label: superclasses [MI, STTC]")
  or RecordError("no diagnostic superclass ...").
- "multi": records with at least one label (the benchmark's tasks, whose select_data also
  drops records without a label).
- "none": every record, labels empty (pretraining).
The check happens in `read` before any file is touched (`labels_for` exposes it), so
excluded records reach the quarantine with a reason rather than vanishing at listing.
Splits (`split`): "patients" (the patient hash of coreecg.data.splits) or "folds" (the
benchmark's strat_fold: 1-8 train, 9 val, 10 test; `read` puts it in the record's meta).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources.base import as_age, no_records, require_root
from coreecg.data.sources.registry import IndexFile, register_source
from coreecg.data.sources.wfdb_io import read_wfdb
from coreecg.data.splits import fold_split
from coreecg.data.tasks import LABELS, TASKS

SUPERCLASSES: tuple[str, ...] = ("NORM", "MI", "STTC", "CD", "HYP")
DIAGNOSTIC: tuple[str, ...] = (
    "1AVB", "2AVB", "3AVB", "ALMI", "AMI", "ANEUR", "ASMI", "CLBBB", "CRBBB", "DIG", "EL", "ILBBB",
    "ILMI", "IMI", "INJAL", "INJAS", "INJIL", "INJIN", "INJLA", "IPLMI", "IPMI", "IRBBB", "ISCAL",
    "ISCAN", "ISCAS", "ISCIL", "ISCIN", "ISCLA", "ISC_", "IVCD", "LAFB", "LAO/LAE", "LMI", "LNGQT",
    "LPFB", "LVH", "NDT", "NORM", "NST_", "PMI", "RAO/RAE", "RVH", "SEHYP", "WPW")
SUBCLASSES: tuple[str, ...] = (
    "AMI", "CLBBB", "CRBBB", "ILBBB", "IMI", "IRBBB", "ISCA", "ISCI", "ISC_", "IVCD", "LAFB/LPFB",
    "LAO/LAE", "LMI", "LVH", "NORM", "NST_", "PMI", "RAO/RAE", "RVH", "SEHYP", "STTC", "WPW", "_AVB")
FORM: tuple[str, ...] = (
    "ABQRS", "DIG", "HVOLT", "INVT", "LNGQT", "LOWT", "LPR", "LVOLT", "NDT", "NST_", "NT_", "PAC",
    "PRC(S)", "PVC", "QWAVE", "STD_", "STE_", "TAB_", "VCLVH")
RHYTHM: tuple[str, ...] = (
    "AFIB", "AFLT", "BIGU", "PACE", "PSVT", "SARRH", "SBRAD", "SR", "STACH", "SVARR", "SVTAC", "TRIGU")
# Every statement is diagnostic, form or rhythm (4 are both diagnostic and form): 71 in all.
TASK_CLASSES: dict[str, tuple[str, ...]] = {
    "superdiagnostic": SUPERCLASSES, "subdiagnostic": SUBCLASSES, "diagnostic": DIAGNOSTIC,
    "form": FORM, "rhythm": RHYTHM, "all": tuple(sorted({*DIAGNOSTIC, *FORM, *RHYTHM}))}
# What a label of the task is called in quarantine reasons (superdiagnostic keeps today's).
_NOUN = {"superdiagnostic": ("diagnostic superclass", "superclasses")}
LABEL_VIEWS = ("single", "multi", "none")
SPLIT_RULES = ("patients", "folds")
_FILE_COLUMN = {500: "filename_hr", 100: "filename_lr"}


@dataclass
class PTBXLOptions:
    """The config section data.sources.ptbxl."""

    label_view: Literal["single", "multi", "none"] = "single"   # single: the paper's 5-class task
    rate: Literal[500, 100] = 500                                # records500/ or records100/
    min_likelihood: float = 0.0                                  # SCP-code likelihood threshold
    # the benchmark's statement tasks (docs/data_sources.md; superdiagnostic + single = the paper's 5
    # classes), or a registered task of the records' metadata (coreecg.data.tasks: age, sex, height, weight)
    task: str = "superdiagnostic"
    # patients: the patient hash at data.split_ratios; folds: strat_fold 1-8 / 9 / 10 = train / val / test
    split: Literal["patients", "folds"] = "patients"

    def __post_init__(self) -> None:
        targets = [n for n, t in TASKS.items() if t.kind != LABELS]
        if self.task not in TASK_CLASSES and self.task not in targets:
            raise ValueError(f"data.sources.ptbxl.task must be one of {', '.join([*TASK_CLASSES, *targets])}, "
                             f"got {self.task!r}")


def dataset_key(manifest: dict[str, Any]) -> str:
    """PTB-XL with another task or the fold split is a benchmark of its own, so that its runs never
    share a table cell with the paper's task: ptbxl, ptbxl-rhythm, ptbxl-folds, ptbxl-form-folds."""
    options = manifest.get("source_options") or {}
    task, split = options.get("task", "superdiagnostic"), manifest.get("split_rule", "patients")
    return "-".join(["ptbxl"] + [task] * (task != "superdiagnostic") + [split] * (split == "folds"))


@register_source(
    "ptbxl", options=PTBXLOptions, dataset_key=dataset_key, dataset_label="PTB-XL",
    index_file=IndexFile("ptbxl_database.csv", lost="records100/ and records500/ would be two records of each "
                                                    "ECG, and labels and patient ids would be lost"),
    label_free=lambda options: {"label_view": "none", "rate": options.rate})
class PTBXLSource:
    """PTB-XL reader. Options: label_view ("single"|"multi"|"none"), rate (500|100),
    min_likelihood (0.0 = the benchmark: all codes), task (see TASK_CLASSES),
    split ("patients"|"folds")."""

    name = "ptbxl"
    class_names = SUPERCLASSES

    def __init__(self, label_view: str = "single", rate: int = 500, min_likelihood: float = 0.0,
                 task: str = "superdiagnostic", split: str = "patients"):
        for key, value, known in (("label_view", label_view, LABEL_VIEWS), ("task", task, tuple(TASK_CLASSES)),
                                  ("split", split, SPLIT_RULES)):
            if value not in known:
                raise ValueError(f"{key} must be one of {known}, got {value!r}")
        if rate not in _FILE_COLUMN:
            raise ValueError(f"rate must be 500 or 100, got {rate!r}")
        self.label_view, self.task, self.split_rule = label_view, task, split
        self.rate = int(rate)
        self.min_likelihood = float(min_likelihood)
        self.multilabel = label_view == "multi"
        self.class_names = () if label_view == "none" else TASK_CLASSES[task]

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        db_csv, scp_csv = root / "ptbxl_database.csv", root / "scp_statements.csv"
        for f in (db_csv, scp_csv):
            if not f.is_file():
                raise no_records(self.name, root, f"no {f.name}")
        diag, to_class = _statement_maps(scp_csv, self.task)
        table = pd.read_csv(db_csv)
        refs = []
        for row in table.sort_values("ecg_id").itertuples(index=False):
            scp = {str(k): float(v) for k, v in ast.literal_eval(row.scp_codes).items()}
            stated = [c for c, lik in scp.items() if lik >= self.min_likelihood]
            extra = {
                "ecg_id": int(row.ecg_id),
                "patient_id": _patient(row.patient_id),
                "strat_fold": int(row.strat_fold),
                "scp_codes": scp,
                "superclasses": _ordered({diag[c] for c in stated if c in diag}, SUPERCLASSES),
                "task_labels": _ordered({to_class[c] for c in stated if c in to_class}, TASK_CLASSES[self.task]),
                "age": as_age(row.age),
                "sex": None if pd.isna(row.sex) else int(row.sex),
                "height": _number(getattr(row, "height", None)),
                "weight": _number(getattr(row, "weight", None)),
            }
            path = root / getattr(row, _FILE_COLUMN[self.rate])
            refs.append(RecordRef(self.name, str(int(row.ecg_id)), str(path), extra))
        if not refs:
            raise no_records(self.name, root, f"{db_csv.name} has no rows")
        return refs

    def labels_for(self, ref: RecordRef) -> tuple[str, ...]:
        """The record's labels in this view, or RecordError if the view excludes it."""
        labels = tuple(ref.extra["task_labels"])
        if self.label_view == "none":
            return ()
        one, many = _NOUN.get(self.task, (f"{self.task} label", f"{self.task} labels"))
        if not labels:
            raise RecordError(ref.path, f"no {one} (scp_codes {ref.extra['scp_codes']})")
        if self.label_view == "single" and len(labels) != 1:
            raise RecordError(ref.path, f"not single-label: {many} [{', '.join(labels)}]")
        return labels

    def read(self, ref: RecordRef) -> Record:
        labels = self.labels_for(ref)
        split = fold_split(ref.extra["strat_fold"], ref.path) if self.split_rule == "folds" else None
        sig = read_wfdb(ref.path)
        if sig.fs != self.rate:
            raise RecordError(ref.path, f"wrong sampling rate: {sig.fs:g} Hz, expected {self.rate} Hz")
        meta = {k: ref.extra.get(k) for k in ("ecg_id", "strat_fold", "scp_codes", "superclasses", "age", "sex",
                                              "height", "weight")}
        if split is not None:
            meta["split"] = split   # the pipeline stores the record under this split, not the hash's
        return Record(self.name, ref.record_id, sig.signal, sig.fs, sig.lead_names,
                      ref.extra["patient_id"], labels, ref.path, meta)


def _number(value: Any) -> float | None:
    """A database cell as a float, or None where it is empty (height and weight are often)."""
    return None if value is None or pd.isna(value) else float(value)


def _statement_maps(scp_csv: Path, task: str) -> tuple[dict[str, str], dict[str, str]]:
    """(diagnostic code -> superclass, statement code -> class of `task`) from scp_statements.csv.

    ValueError naming the file when its statements of the task are not the fixed class names
    (another PTB-XL release would silently change a corpus's label space otherwise).
    """
    scp = pd.read_csv(scp_csv, index_col=0)
    scp.index = scp.index.astype(str)
    diag = scp[scp["diagnostic"] == 1]
    column = {"superdiagnostic": diag["diagnostic_class"], "subdiagnostic": diag["diagnostic_subclass"],
              "diagnostic": diag.index.to_series(),
              "form": scp.index[scp["form"] == 1].to_series(), "rhythm": scp.index[scp["rhythm"] == 1].to_series(),
              "all": scp.index.to_series()}[task].dropna().astype(str)
    found, fixed = set(column), set(TASK_CLASSES[task])
    if found != fixed:
        raise ValueError(f"{scp_csv}: the {task} statements are not PTB-XL's: unknown "
                         f"{sorted(found - fixed)}, missing {sorted(fixed - found)}")
    return diag["diagnostic_class"].dropna().astype(str).to_dict(), column.to_dict()


def _ordered(labels: set[str], order: tuple[str, ...]) -> list[str]:
    """`labels` in the task's class order (equal label sets compare equal)."""
    return [c for c in order if c in labels]


def _patient(value) -> str | None:
    """patient_id is a float column in the csv (20372.0) -> '20372'."""
    try:
        return str(int(float(value)))
    except (TypeError, ValueError):
        return None
