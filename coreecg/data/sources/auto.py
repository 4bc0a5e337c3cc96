"""`--source auto`: a folder of mixed exports, each file read by its own reader, chosen by content.

A clinic's export folder holds what its devices wrote: DICOM (often without a suffix), GE MUSE
XML, HL7 aECG, EDF from a Holter, arrays with their index CSV, WFDB records. `exports.sniff` names
each file's format from its first bytes, and the registered reader that lists that format
(`formats`, on every `ExportSource`: dicom, muse, aecg, edf, arrays, and plugins alike) reads it;
a `.hea` is a WFDB record (the generic reader), its data files part of it.

- Record ids: the path relative to the root, suffix kept (arrays: the ids of their index CSV; two
  arrays with the same ids: the later records are quarantined as duplicates, naming the first).
- A WFDB record is its `.hea`; every file of the header's stem (`.dat`, `.mat`, `.atr`, even an
  `.edf` a header names) is read with it, and RECORDS / ANNOTATORS are its database's index.
- Every record is this source's ("auto"): the patient-level split hashes one dataset name, so a
  patient's DICOM and MUSE files land in the same split.
- Labels: one table for the whole folder (`data.sources.auto.labels`), by record id.
- A file whose content is none of these is quarantined with that reason (an XML that is neither
  MUSE nor aECG names its root), except documents (.csv, .txt, .md, .json, .pdf, .yaml): tables
  and notes beside the records, never records themselves.
- Each reader's own options (`data.sources.dicom.*`, `data.sources.edf.unnamed_lead`, ...) apply
  to its files; their labels do not (the folder's table does).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coreecg.data.record import Record, RecordRef
from coreecg.data.sources.base import _LISTING_ERROR, no_records, raise_listing_error
from coreecg.data.sources.exports import (
    LABEL_FREE, ExportOptions, ExportSource, iter_files, other_format_reason, sniff,
)
from coreecg.data.sources.registry import SOURCES, reader_options, register_source

# A WFDB database's index files (a record's own files share its header's stem).
WFDB_INDEXES = ("RECORDS", "ANNOTATORS", "SHA256SUMS.txt")
# Files beside the records that are never records: not quarantined.
DOCUMENT_SUFFIXES = (".csv", ".tsv", ".txt", ".md", ".json", ".pdf", ".yaml", ".yml", ".html")


@dataclass
class AutoOptions(ExportOptions):
    """The config section data.sources.auto: the folder's labels table (ExportOptions)."""

    def reader_options(self, data: Any) -> dict[str, Any]:
        """Constructor options: the labels table, and each format reader's own section (label-free)."""
        readers = {name: {**reader_options(name, data), **LABEL_FREE}
                   for name in dict.fromkeys(format_readers().values())}
        return {**dataclasses.asdict(self), "readers": readers}


def format_readers() -> dict[str, str]:
    """{sniffed format: the registered source that reads it}: every ExportSource's `formats`, in
    registration order (the first reader of a format wins)."""
    out: dict[str, str] = {}
    for name, spec in SOURCES.items():
        if name != "auto" and isinstance(spec.cls, type) and issubclass(spec.cls, ExportSource):
            for fmt in spec.cls.formats:
                out.setdefault(fmt, name)
    return out


@register_source("auto", options=AutoOptions, label_free=LABEL_FREE, dataset_label="Own files")
class AutoSource(ExportSource):
    """Every file of a folder by the reader its content asks for."""

    name = "auto"
    format_label = "ECG export"

    def __init__(self, labels: str = "", class_map: str = "", multilabel: bool | None = None,
                 readers: dict[str, dict[str, Any]] | None = None, task: str = ""):
        super().__init__(labels, class_map, multilabel, task)
        self.reader_options = dict(readers or {})
        self._readers: dict[str, Any] = {}

    def reader(self, name: str) -> Any:
        """The reader `name` (label-free, its own options), built once."""
        if name not in self._readers:
            options = dict(self.reader_options.get(name, {}))
            if issubclass(SOURCES[name].cls, ExportSource):
                options.update(LABEL_FREE)
            self._readers[name] = SOURCES[name].cls(**options)
        return self._readers[name]

    def file_refs(self, path: Path, record_id: str, fmt: str | None) -> list[RecordRef]:
        """The refs of one file by its sniffed format `fmt`: its reader's (a WFDB header: the
        record it names), or one that `read` quarantines with what the file is."""
        if fmt == "wfdb":
            stem = path.with_suffix("")
            return [RecordRef(self.name, record_id[: -len(path.suffix)], str(stem), {"reader": "wfdb"})]
        reader = format_readers().get(fmt)
        if reader is not None:
            try:
                refs = self.reader(reader).file_refs(path, record_id, fmt)
            except ValueError as e:           # e.g. an array whose index CSV does not describe it
                return [RecordRef(self.name, record_id, str(path), {_LISTING_ERROR: str(e)})]
            return [dataclasses.replace(r, source=self.name, extra={**r.extra, "reader": reader}) for r in refs]
        return [RecordRef(self.name, record_id, str(path),
                          {_LISTING_ERROR: other_format_reason(path, fmt, "ECG export")})]

    def list_records(self, root: Path) -> list[RecordRef]:
        if root is None:
            raise FileNotFoundError("auto: --input is required")
        root = Path(root).expanduser()
        if not root.exists():
            raise FileNotFoundError(f"data root not found: {root}")
        base = root.parent if root.is_file() else root
        files = list(iter_files(root))
        headers = {f.with_suffix("") for f in files if f.suffix.lower() == ".hea"}
        refs: list[RecordRef] = []
        for path in files:
            if path.suffix.lower() != ".hea" and (path.with_suffix("") in headers or path.name in WFDB_INDEXES):
                continue                          # a WFDB record's samples or annotations: with its header
            fmt = sniff(path)
            if fmt is None and path.suffix.lower() in DOCUMENT_SUFFIXES:
                continue
            refs += self.file_refs(path, path.relative_to(base).as_posix(), fmt)
        if not refs:
            raise no_records(self.name, root, "no file of a format coreecg reads")
        return sorted(refs, key=lambda r: (r.path, r.record_id))

    def read(self, ref: RecordRef) -> Record:
        raise_listing_error(ref)
        name = ref.extra["reader"]
        record = self.reader(name).read(dataclasses.replace(ref, source=name))
        labels, meta = (), {**record.meta, "reader": name}
        if self.table is not None:
            labels, meta["unrecognised_codes"] = self.table.labels(ref.record_id, ref.path)
        return dataclasses.replace(record, source=self.name, labels=labels, meta=meta)
