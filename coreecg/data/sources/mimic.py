"""MIMIC-IV-ECG: unlabelled 10 s, 500 Hz 12-lead WFDB records (the pretraining corpus).

Index: `record_list.csv` in the root (subject_id, study_id, file_name, ecg_time, path),
`path` relative to the root without extension: files/pNNNN/pNNNNNNNN/sNNNNNNNN/NNNNNNNN.
The lead order differs from the conventional one (I, II, III, aVR, aVF, aVL, V1-V6);
names are returned as the header spells them, reordering happens downstream.
patient_id = subject_id. No labels.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from coreecg.data.record import Record, RecordRef
from coreecg.data.sources.base import no_records, require_root
from coreecg.data.sources.registry import IndexFile, register_source
from coreecg.data.sources.wfdb_io import read_wfdb


@register_source("mimic-iv-ecg", label_free={}, index_file=IndexFile(
    "record_list.csv", ("subject_id", "study_id"), "subject ids (patients) would be lost"))
class MimicIVECGSource:
    """Reader for a MIMIC-IV-ECG root holding record_list.csv and files/."""

    name = "mimic-iv-ecg"
    class_names: tuple[str, ...] = ()
    multilabel = False

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        index = root / "record_list.csv"
        if not index.is_file():
            raise no_records(self.name, root, "no record_list.csv")
        table = pd.read_csv(index, dtype=str, keep_default_na=False)
        missing = {"subject_id", "study_id", "path"} - set(table.columns)
        if missing:
            raise ValueError(f"{index}: missing columns {sorted(missing)}")
        refs = [
            RecordRef(self.name, str(row["study_id"]), str(root / row["path"]),
                      {"subject_id": str(row["subject_id"]), "study_id": str(row["study_id"]),
                       "ecg_time": row.get("ecg_time") or None})
            for row in table.to_dict("records")
        ]
        if not refs:
            raise no_records(self.name, root, f"{index.name} has no rows")
        return sorted(refs, key=lambda r: r.path)

    def read(self, ref: RecordRef) -> Record:
        sig = read_wfdb(ref.path)
        meta = {"study_id": ref.extra["study_id"], "ecg_time": ref.extra.get("ecg_time")}
        return Record(self.name, ref.record_id, sig.signal, sig.fs, sig.lead_names,
                      ref.extra["subject_id"], (), ref.path, meta)
