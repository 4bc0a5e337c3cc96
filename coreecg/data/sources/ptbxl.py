"""PTB-XL: 10 s 12-lead WFDB records with SCP-ECG statements, 5 diagnostic superclasses.

Index files in the root: `ptbxl_database.csv` (ecg_id, patient_id, scp_codes as a
python-dict string {code: likelihood}, strat_fold, filename_lr, filename_hr) and
`scp_statements.csv` (code index; rows with diagnostic == 1 carry diagnostic_class).

Labels follow the PTB-XL benchmark (Strodthoff et al. 2021): every scp code with
diagnostic == 1 maps to its diagnostic_class, whatever its likelihood (likelihood 0
means "not stated", not "absent"); `min_likelihood` can raise that threshold.
Views (`label_view`):
- "single" (default, the paper's single-label task): records with exactly one
  superclass; others raise RecordError("not single-label: superclasses [MI, STTC]")
  or RecordError("no diagnostic superclass ...").
- "multi": records with at least one superclass (the benchmark's "superdiagnostic").
- "none": every record, labels empty (pretraining).
The check happens in `read` before any file is touched (`labels_for` exposes it), so
excluded records reach the quarantine with a reason rather than vanishing at listing.
"""
from __future__ import annotations

import ast
from pathlib import Path

from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources.base import as_age, no_records, require_root
from coreecg.data.sources.wfdb_io import read_wfdb

SUPERCLASSES: tuple[str, ...] = ("NORM", "MI", "STTC", "CD", "HYP")
LABEL_VIEWS = ("single", "multi", "none")
_FILE_COLUMN = {500: "filename_hr", 100: "filename_lr"}


class PTBXLSource:
    """PTB-XL reader. Options: label_view ("single"|"multi"|"none"), rate (500|100),
    min_likelihood (0.0 = the benchmark: all codes)."""

    name = "ptbxl"
    class_names = SUPERCLASSES

    def __init__(self, label_view: str = "single", rate: int = 500, min_likelihood: float = 0.0):
        if label_view not in LABEL_VIEWS:
            raise ValueError(f"label_view must be one of {LABEL_VIEWS}, got {label_view!r}")
        if rate not in _FILE_COLUMN:
            raise ValueError(f"rate must be 500 or 100, got {rate!r}")
        self.label_view = label_view
        self.rate = int(rate)
        self.min_likelihood = float(min_likelihood)
        self.multilabel = label_view == "multi"
        if label_view == "none":
            self.class_names = ()

    def list_records(self, root: Path) -> list[RecordRef]:
        import pandas as pd

        root = require_root(root)
        db_csv, scp_csv = root / "ptbxl_database.csv", root / "scp_statements.csv"
        for f in (db_csv, scp_csv):
            if not f.is_file():
                raise no_records(self.name, root, f"no {f.name}")
        diag = _diagnostic_classes(scp_csv)
        table = pd.read_csv(db_csv)
        refs = []
        for row in table.sort_values("ecg_id").itertuples(index=False):
            scp = {str(k): float(v) for k, v in ast.literal_eval(row.scp_codes).items()}
            supers = sorted({diag[c] for c, lik in scp.items()
                             if c in diag and lik >= self.min_likelihood},
                            key=SUPERCLASSES.index)
            extra = {
                "ecg_id": int(row.ecg_id),
                "patient_id": _patient(row.patient_id),
                "strat_fold": int(row.strat_fold),
                "scp_codes": scp,
                "superclasses": supers,
                "age": as_age(row.age),
                "sex": None if pd.isna(row.sex) else int(row.sex),
            }
            path = root / getattr(row, _FILE_COLUMN[self.rate])
            refs.append(RecordRef(self.name, str(int(row.ecg_id)), str(path), extra))
        if not refs:
            raise no_records(self.name, root, f"{db_csv.name} has no rows")
        return refs

    def labels_for(self, ref: RecordRef) -> tuple[str, ...]:
        """The record's labels in this view, or RecordError if the view excludes it."""
        supers = tuple(ref.extra["superclasses"])
        if self.label_view == "none":
            return ()
        if not supers:
            raise RecordError(ref.path, f"no diagnostic superclass (scp_codes {ref.extra['scp_codes']})")
        if self.label_view == "single" and len(supers) != 1:
            raise RecordError(ref.path, f"not single-label: superclasses [{', '.join(supers)}]")
        return supers

    def read(self, ref: RecordRef) -> Record:
        labels = self.labels_for(ref)
        sig = read_wfdb(ref.path)
        if sig.fs != self.rate:
            raise RecordError(ref.path, f"wrong sampling rate: {sig.fs:g} Hz, expected {self.rate} Hz")
        meta = {k: ref.extra[k] for k in ("ecg_id", "strat_fold", "scp_codes", "superclasses", "age", "sex")}
        return Record(self.name, ref.record_id, sig.signal, sig.fs, sig.lead_names,
                      ref.extra["patient_id"], labels, ref.path, meta)


def _diagnostic_classes(scp_csv: Path) -> dict[str, str]:
    """scp code -> diagnostic superclass, for the rows with diagnostic == 1."""
    import pandas as pd

    scp = pd.read_csv(scp_csv, index_col=0)
    rows = scp[scp["diagnostic"] == 1]
    return {str(code): str(cls) for code, cls in rows["diagnostic_class"].items()}


def _patient(value) -> str | None:
    """patient_id is a float column in the csv (20372.0) -> '20372'."""
    try:
        return str(int(float(value)))
    except (TypeError, ValueError):
        return None
