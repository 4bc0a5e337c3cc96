"""Any folder of WFDB records (e.g. the PTB Diagnostic ECG Database): unlabelled.

Every `.hea` below the root is one record; all its signals are returned (the PTB
Diagnostic records have 15: the 12 standard leads as i, ii, ..., v6 plus Frank vx, vy, vz),
with names as the header spells them. Header comment lines go to meta["comments"]
verbatim (PTB Diagnostic keeps its free-text diagnosis there). patient_id comes from the
header comments (`wfdb_io.PATIENT_FIELDS`: "# Patient ID: ...", "#Patient:", "#Subject:", ...),
else None (the pipeline then uses `record:<id>` and counts it).

A data file (`.dat`/`.mat`) that no header names is listed too, and `read` raises
"no header" for it. A folder of a database with its own reader (an index file registered with
`register_source(index_file=...)`: PTB-XL, MIMIC-IV-ECG, the CPSC2018 release, and plugins') is
refused at listing, naming that reader: read generically it would lose labels or patients, and
PTB-XL's records100/ and records500/ would become two records of each ECG.
"""
from __future__ import annotations

from pathlib import Path

from coreecg.data.record import Record, RecordRef
from coreecg.data.sources.base import (
    DATA_SUFFIXES, no_header_ref, no_records, orphan_data_files, raise_listing_error, require_root, walk,
)
from coreecg.data.sources.registry import layout_source, register_source, source_spec
from coreecg.data.sources.wfdb_io import patient_from_comments, read_wfdb


def known_layout(path: Path) -> str | None:
    """The source whose index file `path` is (registered with `register_source(index_file=...)`), or None."""
    return layout_source(path)


@register_source("wfdb")
class WfdbFolderSource:
    """Generic WFDB reader: refs for every header below the root, no labels."""

    name = "wfdb"
    class_names: tuple[str, ...] = ()
    multilabel = False

    def list_records(self, root: Path) -> list[RecordRef]:
        root = require_root(root)
        refs = []
        for folder, files in walk(root):
            for f in files:
                source = layout_source(folder / f)
                if source is not None:
                    raise ValueError(
                        f"wfdb: {folder / f} marks a {source} folder: read it with --source {source} "
                        f"(get_source({source!r})); with the generic reader {source_spec(source).index_file.lost}")
            refs += [RecordRef(self.name, str((folder / f[:-4]).relative_to(root)), str(folder / f[:-4]), {})
                     for f in files if f.endswith(".hea")]
            # A headerless data file's id keeps its suffix: no clash with a record of that stem.
            refs += [no_header_ref(self.name, str(d.relative_to(root)), d)
                     for d in orphan_data_files(folder, files)]
        if not refs:
            raise no_records(self.name, root, f"no .hea or {'/'.join(DATA_SUFFIXES)} files")
        return sorted(refs, key=lambda r: r.path)

    def read(self, ref: RecordRef) -> Record:
        raise_listing_error(ref)
        sig = read_wfdb(ref.path)
        meta = {"comments": sig.comments, "units": list(sig.units), "header_quirks": sig.quirks}
        return Record(self.name, ref.record_id, sig.signal, sig.fs, sig.lead_names,
                      patient_from_comments(sig.comments), (), ref.path, meta)
