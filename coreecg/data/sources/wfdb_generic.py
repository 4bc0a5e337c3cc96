"""Any folder of WFDB records (e.g. the PTB Diagnostic ECG Database): unlabelled.

Every `.hea` below the root is one record; all its signals are returned (the PTB
Diagnostic records have 15: the 12 standard leads as i, ii, ..., v6 plus Frank vx, vy, vz),
with names as the header spells them. Header comment lines go to meta["comments"]
verbatim (PTB Diagnostic keeps its free-text diagnosis there). patient_id is None.
"""
from __future__ import annotations

from pathlib import Path

from coreecg.data.record import Record, RecordRef
from coreecg.data.sources.base import no_records, require_root
from coreecg.data.sources.wfdb_io import read_wfdb


class WfdbFolderSource:
    """Generic WFDB reader: refs for every header below the root, no labels."""

    name = "wfdb"
    class_names: tuple[str, ...] = ()
    multilabel = False

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        refs = [RecordRef(self.name, str(h.relative_to(root).with_suffix("")),
                          str(h.with_suffix("")), {})
                for h in sorted(root.rglob("*.hea"))]
        if not refs:
            raise no_records(self.name, root, "no .hea files")
        return refs

    def read(self, ref: RecordRef) -> Record:
        sig = read_wfdb(ref.path)
        meta = {"comments": sig.comments, "units": list(sig.units)}
        return Record(self.name, ref.record_id, sig.signal, sig.fs, sig.lead_names, None, (),
                      ref.path, meta)
