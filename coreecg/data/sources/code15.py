"""CODE-15% (Ribeiro et al., Zenodo 4916206) in its release format: `exams.csv` + `exams_part*.hdf5`.

`exams.csv`: exam_id, age, is_male, nn_predicted_age, 1dAVb, RBBB, LBBB, SB, ST, AF, patient_id,
death, timey, normal_ecg, trace_file (the hdf5 file holding the exam, e.g. exams_part0.hdf5).
Each `exams_partK.hdf5` holds `tracings` (N, 4096, 12) float32 and `exam_id` (N,): 400 Hz,
leads DI, DII, DIII, AVR, AVL, AVF, V1-V6 (= I, II, III, aVR, aVL, aVF, V1-V6). Exams of 7 s
(2,800 samples) or 10 s (4,000) are zero-padded on both sides to 4,096; some files end with a
padding row of exam_id 0, which no csv row names and which is never listed.

Trimming: the leading and trailing samples that are zero on all 12 leads are dropped. A record
genuinely flat on every lead at its edges loses those samples too (harmless: nothing is there).

Units: the release states none; the authors' model README says both "scale 1e-4 V" and
"multiply V by 1000" (i.e. mV). Values are passed on as millivolts (the second reading, and the
amplitude range of the tracings); preprocessing z-scores each lead, so only the stored raw
scale depends on it. `meta["amplitude_unit"]` records the assumption.

Labels (`label_view="multi"`, default): the six abnormality columns plus `normal_ecg`, as 7
classes in CLASS_NAMES order, multi-label; an exam with none of them ("other" findings) raises
"no label of the task". `label_view="none"`: every exam, no labels (pretraining).
patient_id comes from exams.csv.

Listing reads exams.csv and each present hdf5's `exam_id` (one small dataset per file) so that
a ref carries its row; only exams whose `trace_file` is in the root are listed (a partial
download is a subset, like CinC's `subsets`). An exam missing from its hdf5 is listed and read as
a RecordError naming the file. Reading keeps each hdf5 open per process and reads one row.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import h5py

from coreecg.data.record import STANDARD_LEADS, Record, RecordError, RecordRef
from coreecg.data.sources.base import (
    _LISTING_ERROR, as_age, no_records, raise_listing_error, require_root, require_task_label,
)
from coreecg.data.sources.registry import register_source

CLASS_NAMES: tuple[str, ...] = ("1dAVb", "RBBB", "LBBB", "SB", "ST", "AF", "normal_ecg")
LABEL_VIEWS = ("multi", "none")
FS = 400.0
N_LEADS = 12
_REQUIRED = {"exam_id", "patient_id", "trace_file", *CLASS_NAMES}

log = logging.getLogger(__name__)


@dataclass
class Code15Options:
    """The config section data.sources.code15."""

    # multi: the six abnormalities + normal_ecg, 7 classes; none: unlabelled (pretraining)
    label_view: Literal["multi", "none"] = "multi"
    # "": the six abnormalities; a registered task of exams.csv's metadata (coreecg.data.tasks: age, sex)
    task: str = ""

    def reader_options(self, data: Any) -> dict[str, Any]:
        return {"label_view": self.label_view, **({"task": self.task} if self.task else {})}


@register_source("code15", options=Code15Options)
class Code15Source:
    """CODE-15% reader. Option: label_view ("multi" | "none")."""

    name = "code15"
    unlabelled_view = {"label_view": "none"}    # a task's records need no statement (coreecg.data.tasks)

    def __init__(self, label_view: str = "multi"):
        if label_view not in LABEL_VIEWS:
            raise ValueError(f"label_view must be one of {LABEL_VIEWS}, got {label_view!r}")
        self.label_view = label_view
        self.multilabel = label_view == "multi"
        self.class_names: tuple[str, ...] = CLASS_NAMES if label_view == "multi" else ()

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        table = _exams_table(root)
        refs, absent = [], {}
        for trace_file, rows in table.groupby("trace_file", sort=True):
            h5 = root / trace_file
            if not h5.is_file():
                absent[trace_file] = len(rows)    # a part not downloaded: its exams are outside this subset
                continue
            index = _exam_index(h5)
            refs += [self._ref(h5, row, index.get(int(row["exam_id"]))) for row in rows.to_dict("records")]
        if not refs:
            raise no_records(self.name, root, "none of the trace_file hdf5 files of exams.csv is present")
        if absent:     # said once, not quarantined exam by exam (a one-part download would list 300k)
            log.warning("%s: %d exam(s) of exams.csv are not listed: their trace_file is not in the folder (%s)",
                        root, sum(absent.values()), ", ".join(sorted(absent)))
        # file, then row: reads stream through each hdf5 in order; exams missing from it go last
        return sorted(refs, key=lambda r: (r.path, r.extra["row"] is None, r.extra["row"] or 0, r.record_id))

    def _ref(self, h5: Path, row: dict, position: int | None) -> RecordRef:
        labels = [c for c in CLASS_NAMES if _truthy(row[c])]
        extra = {"row": position, "patient_id": str(row["patient_id"]).strip() or None, "labels": labels,
                 "age": as_age(row.get("age")),
                 "is_male": _truthy(row["is_male"]) if str(row.get("is_male", "")).strip() else None,
                 "death": _truthy(row["death"]) if str(row.get("death", "")).strip() else None,
                 "timey": as_age(row.get("timey"))}
        if position is None:
            extra[_LISTING_ERROR] = f"exam_id {row['exam_id']} not in {h5.name} (its trace_file in exams.csv)"
        return RecordRef(self.name, str(row["exam_id"]).strip(), str(h5), extra)

    def read(self, ref: RecordRef) -> Record:
        raise_listing_error(ref)
        labels: tuple[str, ...] = ()
        if self.label_view == "multi":
            labels = tuple(ref.extra["labels"])
            require_task_label(ref.path, labels, CLASS_NAMES, [], [], "exams.csv columns",
                               f"exam_id {ref.record_id}: all of {', '.join(CLASS_NAMES)} false")
        padded = _read_row(ref.path, ref.extra["row"])
        signal, lead, trail = trim_padding(padded, ref.path, ref.record_id)
        meta = {"exam_id": int(ref.record_id), "row": ref.extra["row"], "labels_all": ref.extra["labels"],
                "age": ref.extra["age"], "is_male": ref.extra["is_male"], "death": ref.extra["death"],
                "timey": ref.extra["timey"], "padding_samples": [lead, trail], "amplitude_unit": "mV (assumed)"}
        return Record(self.name, ref.record_id, signal, FS, STANDARD_LEADS, ref.extra["patient_id"],
                      labels, ref.path, meta)


def trim_padding(padded: np.ndarray, path: str, exam_id: str) -> tuple[np.ndarray, int, int]:
    """(samples, 12) zero-padded tracing -> ((12, kept) float32, leading, trailing samples dropped).

    A sample is padding when all 12 leads are exactly 0 (the release pads with 0.0); an exam
    that is all zero has no signal and raises RecordError.
    """
    live = np.flatnonzero(np.any(padded != 0, axis=1))
    if live.size == 0:
        raise RecordError(path, f"exam_id {exam_id}: tracing is all zero")
    first, last = int(live[0]), int(live[-1])
    signal = np.ascontiguousarray(padded[first:last + 1].T, dtype=np.float32)
    return signal, first, padded.shape[0] - 1 - last


def _exams_table(root: Path):
    """exams.csv as strings (no NaN coercion), or ValueError naming the file and what is wrong."""
    csv = root / "exams.csv"
    if not csv.is_file():
        raise no_records("code15", root, "no exams.csv")
    table = pd.read_csv(csv, dtype=str, keep_default_na=False)
    missing = _REQUIRED - set(table.columns)
    if missing:
        raise ValueError(f"{csv}: missing columns {sorted(missing)}")
    bad = table.loc[~table["exam_id"].str.strip().str.fullmatch(r"\d+"), "exam_id"]
    if len(bad):
        raise ValueError(f"{csv}: exam_id not a whole number in {len(bad)} row(s), e.g. {bad.iloc[0]!r}")
    return table


def _exam_index(h5: Path) -> dict[int, int]:
    """exam_id -> row of `h5`, skipping exam_id 0 (the release's padding row)."""
    try:
        with h5py.File(h5, "r") as f:
            ids = np.asarray(f["exam_id"][()], dtype=np.int64)
    except Exception as exc:  # h5py raises OSError/KeyError variants for damaged files
        raise ValueError(f"{h5}: unreadable CODE-15 hdf5 (need dataset exam_id): {exc}") from exc
    return {int(e): i for i, e in enumerate(ids) if e != 0}


def _open(path: str):
    """A read-only handle of `path`, kept per process: opening per record would re-read its metadata.

    Keyed by modification time too, so a file rewritten while a (long-lived Ray) worker holds a
    handle is opened afresh rather than read through a stale one.
    """
    return _open_cached(path, os.stat(path).st_mtime_ns)


@lru_cache(maxsize=32)
def _open_cached(path: str, mtime_ns: int):
    """The handle behind `_open` (mtime_ns only keys the cache)."""
    return h5py.File(path, "r")


def _read_row(path: str, row: int) -> np.ndarray:
    """Row `row` of `tracings` as (samples, 12) float32, or RecordError naming the file."""
    try:
        tracings = _open(path)["tracings"]
    except Exception as exc:
        raise RecordError(path, f"unreadable CODE-15 hdf5 (need dataset tracings): {exc}") from exc
    if tracings.ndim != 3 or tracings.shape[2] != N_LEADS or row >= tracings.shape[0]:
        raise RecordError(path, f"tracings has shape {tracings.shape}, expected (exams, samples, 12) "
                                f"with row {row}")
    return np.asarray(tracings[row], dtype=np.float32)


def _truthy(cell) -> bool:
    """exams.csv booleans: 'True'/'False' (also 1/0); empty cells are false."""
    return str(cell).strip().lower() in ("true", "1", "1.0")
