"""What the readers of hospital and device exports share: DICOM, HL7 aECG, GE MUSE XML, EDF and
arrays (`dicom.py`, `aecg.py`, `muse.py`, `edf.py`, `arrays.py`, and `auto.py`, which picks one
of them per file by its content).

A clinic's folder is not a database release: no index file, no labels, files named by whatever the
archive chose (DICOM files often without a suffix). So an export reader:

- lists files by their content (`sniff`: the first bytes), not their extension; a file of this
  reader's suffixes whose content is something else (an `.xml` that is neither MUSE nor aECG) is
  listed and quarantined with what it is; a file of another known format is left to its reader
  (`--source auto` reads a mixed folder);
- names each record by its path relative to the root, suffix kept (`ecg/0001.xml`);
- takes labels from a table (`ExportOptions.labels`: a CSV of record id -> codes, and a class map);
  with a table, a record that has no row is unlabelled and is refused from the labelled corpus
  ("unlabelled"); without one, every record is unlabelled (pretraining);
- reads only the waveform, its sampling rate, lead names, units and the patient id: never a name,
  a birth date or free text. The patient id is a hospital identifier (`identifying_patient_ids`):
  the corpus builder stores only its salted hash (coreecg.data.patient_ids).

The contract a reader adds to `Source`: `formats` (the `sniff` results it reads), `suffixes` (the
names it claims whatever their content), and `read_export(path) -> Export`.
"""
from __future__ import annotations

import csv
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
import zipfile

import numpy as np

from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources.base import _LISTING_ERROR, no_records, raise_listing_error, require_task_label, walk

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------- content sniffing

_HEAD_BYTES = 4096
_XML_ROOT = re.compile(rb"<\s*(?:[A-Za-z_][\w.-]*:)?([A-Za-z_][\w.-]*)[\s>/]")
_XML_SKIP = re.compile(rb"\s*(?:<\?.*?\?>|<!--.*?-->|<!DOCTYPE[^>]*>|\s)*", re.S)
# XML root element -> format
XML_ROOTS = {b"RestingECG": "muse", b"AnnotatedECG": "aecg"}
FORMAT_NAMES = {"dicom": "DICOM", "muse": "GE MUSE XML", "aecg": "HL7 aECG", "edf": "EDF/EDF+",
                "npy": "NumPy .npy", "npz": "NumPy .npz", "hdf5": "HDF5", "wfdb": "WFDB header",
                "xml": "XML of another kind", "unreadable": "a file that cannot be opened"}


def sniff(path: Path | str) -> str | None:
    """The format of a file by its first bytes: 'dicom' | 'muse' | 'aecg' | 'xml' (any other XML) |
    'edf' | 'npy' | 'npz' | 'hdf5' | 'wfdb' (a `.hea` header, by name) | 'unreadable' (cannot be
    opened) | None (none of these).

    DICOM: 'DICM' at byte 128 (Part 10). EDF/EDF+: the header's version field, '0' and 7 spaces.
    XML: the root element after the prolog, comments and DOCTYPE (RestingECG: MUSE; AnnotatedECG:
    aECG). NumPy: the .npy magic, or a zip holding .npy members. HDF5: its signature.
    """
    path = Path(path)
    if path.suffix.lower() == ".hea":
        return "wfdb"
    try:
        with open(path, "rb") as f:
            head = f.read(_HEAD_BYTES)
    except OSError:
        return "unreadable"          # listed (quarantined or counted) with that reason, never skipped
    if len(head) >= 132 and head[128:132] == b"DICM":
        return "dicom"
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"\x89HDF\r\n\x1a\n"):
        return "hdf5"
    if head.startswith(b"PK\x03\x04"):
        return "npz" if _is_npz(path) else None
    if head.startswith(b"0       ") and len(head) >= 256 and head[184:192].strip().isdigit():
        return "edf"
    text = head.lstrip(b"\xef\xbb\xbf")
    if text.lstrip().startswith(b"<"):
        start = _XML_SKIP.match(text).end()
        root = _XML_ROOT.match(text, start)
        if root is not None:
            return XML_ROOTS.get(root.group(1), "xml")
    return None


def _is_npz(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return False
    return bool(names) and all(n.endswith(".npy") for n in names)


def xml_root_name(path: Path | str) -> str:
    """The root element's name of an XML file (for the reason of a quarantined one), or '?'."""
    try:
        with open(path, "rb") as f:
            text = f.read(_HEAD_BYTES).lstrip(b"\xef\xbb\xbf")
    except OSError:
        return "?"
    root = _XML_ROOT.match(text, _XML_SKIP.match(text).end())
    return root.group(1).decode(errors="replace") if root else "?"


def other_format_reason(path: Path, fmt: str | None, reader: str) -> str:
    """Why a file this reader claims by its name is not one it reads."""
    if fmt == "unreadable":
        return "unreadable: the file cannot be opened (permissions, or it vanished)"
    if fmt == "xml":
        return (f"an XML that is neither GE MUSE (root RestingECG) nor HL7 aECG (root AnnotatedECG): "
                f"root <{xml_root_name(path)}>")
    if fmt is None:
        article = "an" if reader[:1] in "AEIOU" or reader.startswith("HL7") else "a"    # an EDF, an HL7 aECG
        others = ", ".join(v for k, v in FORMAT_NAMES.items() if k not in ("xml", "unreadable"))
        return f"not {article} {reader} file (its content is none of {others})"
    return f"a {FORMAT_NAMES[fmt]} file, not {reader}: read it with --source auto"


# ---------------------------------------------------------------------------- units

# Unit spellings -> millivolts per unit (UCUM codes, DICOM's and EDF's usual spellings).
_MV_PER_UNIT = {"v": 1000.0, "volt": 1000.0, "volts": 1000.0, "mv": 1.0, "millivolt": 1.0, "millivolts": 1.0,
                "uv": 1e-3, "µv": 1e-3, "μv": 1e-3, "microvolt": 1e-3, "microvolts": 1e-3, "nv": 1e-6}


def millivolts_per(unit: str | None, path: str, what: str = "signal") -> float:
    """Millivolts per `unit` ('uV', 'mV', 'V', 'µV', ...); RecordError naming the file for a unit
    that is missing or not a voltage (the amplitude would be a guess)."""
    if unit is None or not str(unit).strip():
        raise RecordError(path, f"units missing: the {what} states no physical unit")
    key = str(unit).strip().lower()
    if key not in _MV_PER_UNIT:
        raise RecordError(path, f"unknown units {str(unit).strip()!r} of the {what}: expected a voltage "
                                "(V, mV, uV)")
    return _MV_PER_UNIT[key]


def parse_number(text: str | None, path: str, what: str) -> float:
    """A number written in an export's text (an XML value); RecordError naming `what` when the
    text is not a number, or not a finite one."""
    try:
        value = float(str(text).strip())
    except ValueError:
        raise RecordError(path, f"{what} {text!r} is not a number") from None
    if not np.isfinite(value):
        raise RecordError(path, f"{what} {text!r} is not a finite number")
    return value


# ---------------------------------------------------------------------------- labels


# Suffixes a labels table may leave out of a record id.
LABEL_SUFFIXES = (".dcm", ".dicom", ".xml", ".edf", ".hea", ".dat", ".mat")


@dataclass(frozen=True)
class LabelTable:
    """Labels of a folder of exports, from a CSV: `record_id` and `labels` (codes, separated by
    ';' or ','), optionally through a class map (a CSV of `code` and `class`; several codes may map
    to one class; codes not in it are counted as unrecognised). Without a map, each code is a class.

    class_names: the map's classes in first-seen order (sorted codes without a map);
    multilabel: whether any record has more than one class (or as set).
    """

    path: str
    rows: dict[str, tuple[str, ...]]
    code_to_class: dict[str, str]
    class_names: tuple[str, ...]
    multilabel: bool

    @classmethod
    def load(cls, labels: str, class_map: str | None = None, multilabel: bool | None = None) -> "LabelTable":
        rows = {}
        for i, row in enumerate(_read_csv(labels, ("record_id", "labels")), start=2):
            rid = row["record_id"].strip()
            if not rid:
                raise ValueError(f"{labels}: line {i}: empty record_id")
            if rid in rows:
                raise ValueError(f"{labels}: line {i}: record_id {rid!r} given twice")
            rows[rid] = tuple(t.strip() for t in re.split(r"[;,]", row["labels"] or "") if t.strip())
        if class_map:
            mapping = {}
            for i, row in enumerate(_read_csv(class_map, ("code", "class")), start=2):
                code, name = row["code"].strip(), row["class"].strip()
                if not code or not name:
                    raise ValueError(f"{class_map}: line {i}: empty code or class")
                if mapping.get(code, name) != name:
                    raise ValueError(f"{class_map}: line {i}: code {code!r} maps to {mapping[code]!r} and {name!r}")
                mapping[code] = name
            names = tuple(dict.fromkeys(mapping.values()))
        else:
            names = tuple(sorted({c for codes in rows.values() for c in codes}))
            mapping = {c: c for c in names}
        if not names:
            raise ValueError(f"{class_map or labels}: no classes (every labels cell is empty)")
        if multilabel is None:
            multilabel = any(len({mapping[c] for c in codes if c in mapping}) > 1 for codes in rows.values())
        return cls(str(labels), rows, mapping, names, bool(multilabel))

    def lookup(self, record_id: str) -> tuple[str, ...] | None:
        """The codes of a record (its id, or its id without an ECG file suffix: `a/0001.xml` is
        also `a/0001`; a DICOM UID named file keeps its dots), or None: no row."""
        keys = [record_id]
        if Path(record_id).suffix.lower() in LABEL_SUFFIXES:
            keys.append(record_id[: -len(Path(record_id).suffix)])
        return next((self.rows[k] for k in keys if k in self.rows), None)

    def labels(self, record_id: str, path: str) -> tuple[tuple[str, ...], list[str]]:
        """(classes in class order, unrecognised codes); RecordError when the record has no row or
        none of its codes is a class."""
        codes = self.lookup(record_id)
        if codes is None:
            raise RecordError(path, f"unlabelled: no row for {record_id!r} in {Path(self.path).name} "
                                    "(an unlabelled record goes into pretraining corpora only: "
                                    "build them without labels)")
        hit = {self.code_to_class[c] for c in codes if c in self.code_to_class}
        unmapped = [c for c in codes if c not in self.code_to_class]
        labels = tuple(c for c in self.class_names if c in hit)
        require_task_label(path, labels, self.class_names, list(codes), unmapped, "label codes",
                           f"{Path(self.path).name}")
        return labels, unmapped


def _read_csv(path: str, required: tuple[str, ...]) -> list[dict[str, str]]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"labels table not found: {p}")
    with open(p, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or ())]
        if missing:
            raise ValueError(f"{p}: missing column(s) {missing}; has {reader.fieldnames}")
        return list(reader)


@dataclass
class ExportOptions:
    """The options every export reader shares (its section `data.sources.<name>`)."""

    # CSV of record_id, labels (codes separated by ';' or ','); empty: unlabelled (pretraining)
    labels: str = ""
    # CSV of code, class (several codes may map to one class); empty: each code is a class
    class_map: str = ""
    # whether a record may carry several classes; null: from the table (any row with two classes)
    multilabel: bool | None = None
    # "": the labels column's codes; column:<name>: that numeric column of the labels CSV as a regression
    # task; or a registered task (coreecg.data.tasks). Keyword-only: the readers' own options keep their positions.
    task: str = field(default="", kw_only=True)

    def __post_init__(self) -> None:
        if self.class_map and not self.labels:
            raise ValueError("class_map without labels: the class map maps the labels table's codes")
        if self.task.startswith("column:") and not self.labels:
            raise ValueError(f"task={self.task}: a column task reads the labels CSV (set labels=<csv>)")


def check_no_task(task: str) -> None:
    """A reader built without get_source has no task applied: say so rather than ignore it."""
    if task:
        raise ValueError(f"task={task}: a task is applied by coreecg.data.sources.get_source (it wraps the reader); "
                         "build the reader through it")


# The label-free view of every export reader (inference, embedding, pretraining corpora).
LABEL_FREE = {"labels": "", "class_map": ""}


# ---------------------------------------------------------------------------- one recording


@dataclass
class Export:
    """One recording as an export reader decoded it.

    signal: (leads, samples) in millivolts, file order; fs: Hz; leads: names as the file spells
    them (the readers map format codes to standard names: MDC_ECG_LEAD_AVR -> aVR); patient_id:
    the identifier as stored (hashed by the corpus builder), or None; meta: JSON-able facts about
    the reading (never a name, birth date or free text).
    """

    signal: np.ndarray
    fs: float
    leads: tuple[str, ...]
    patient_id: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)


def check_export(export: Export, path: str) -> Export:
    """RecordError for what no later stage can use: a sampling rate that is not > 0, no leads or
    samples, a lead count that differs from the names, samples that are not finite."""
    if not (np.isfinite(export.fs) and export.fs > 0):
        raise RecordError(path, f"sampling rate {export.fs:g} Hz: not a rate (must be > 0)")
    x = export.signal
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise RecordError(path, f"no samples: signal shape {x.shape}")
    if x.shape[0] != len(export.leads):
        raise RecordError(path, f"{x.shape[0]} signal rows for {len(export.leads)} lead names")
    if not np.all(np.isfinite(x)):
        raise RecordError(path, "samples that are not finite (NaN or infinity)")
    export.signal = np.ascontiguousarray(x, dtype=np.float32)
    return export


class ExportSource:
    """Base of the export readers: listing by content, record ids, labels, the checks on a read.

    Subclasses set `name` (their registered name: records and manifests carry it), `formats`,
    `suffixes` and `format_label`, and implement `read_export(path)`;
    a format whose file holds many records (arrays) overrides `file_refs` and `read`.
    """

    name = "export"
    formats: tuple[str, ...] = ()
    suffixes: tuple[str, ...] = ()
    format_label = "export"
    # Patient ids of these files are hospital identifiers: stored only as salted hashes.
    identifying_patient_ids = True

    def __init__(self, labels: str = "", class_map: str = "", multilabel: bool | None = None, task: str = ""):
        check_no_task(task)
        self.table = LabelTable.load(labels, class_map or None, multilabel) if labels else None
        self.class_names: tuple[str, ...] = self.table.class_names if self.table else ()
        self.multilabel = self.table.multilabel if self.table else False

    # -- listing

    def list_records(self, root: Path) -> list[RecordRef]:
        """Refs for the files below `root` (or `root` itself, a file) that this reader reads by
        content, and for files of its suffixes that are something else (read as their reason)."""
        if root is None:
            raise FileNotFoundError(f"{self.name}: --input is required")
        root = Path(root).expanduser()
        if not root.exists():
            raise FileNotFoundError(f"data root not found: {root}")
        refs: list[RecordRef] = []
        others = 0
        base = root.parent if root.is_file() else root
        for path in iter_files(root):
            fmt = sniff(path)
            rid = path.relative_to(base).as_posix()
            if fmt in self.formats:
                refs += self.file_refs(path, rid, fmt)
            elif path.suffix.lower() in self.suffixes:
                refs.append(RecordRef(self.name, rid, str(path),
                                      {_LISTING_ERROR: other_format_reason(path, fmt, self.format_label)}))
            elif fmt is not None:
                others += 1
        if others:
            log.warning("%s: %d file(s) of other formats under %s are not read by this reader "
                        "(--source auto reads each file by its own)", self.name, others, root)
        if not refs:
            raise no_records(self.name, root, f"no {self.format_label} files")
        return sorted(refs, key=lambda r: (r.path, r.record_id))

    def file_refs(self, path: Path, record_id: str, fmt: str) -> list[RecordRef]:
        """The refs of one file of this reader's format (one record per file by default)."""
        return [RecordRef(self.name, record_id, str(path), {"format": fmt})]

    # -- reading

    def read_export(self, path: str) -> Export:
        """Decode one file (subclasses); RecordError(path, reason) for what makes it unusable."""
        raise NotImplementedError

    def read(self, ref: RecordRef) -> Record:
        raise_listing_error(ref)
        export = check_export(self.read_export(ref.path), ref.path)
        return self.record(ref, export)

    def record(self, ref: RecordRef, export: Export) -> Record:
        """The Record of a decoded export, its labels from the table (if any)."""
        labels: tuple[str, ...] = ()
        meta = {"format": ref.extra.get("format"), **export.meta}
        if self.table is not None:
            labels, unmapped = self.table.labels(ref.record_id, ref.path)
            meta["unrecognised_codes"] = unmapped
        return Record(self.name, ref.record_id, export.signal, float(export.fs), tuple(export.leads),
                      export.patient_id, labels, ref.path, meta)


def iter_files(root: Path):
    """Every file below `root` (or `root`, a file), in sorted order; hidden files and folders are
    not records (.DS_Store, .git)."""
    if root.is_file():
        yield root
        return

    for folder, files in walk(root):
        if any(part.startswith(".") for part in folder.relative_to(root).parts):
            continue
        for f in files:
            if not f.startswith("."):
                yield folder / f


__all__ = ["sniff", "XML_ROOTS", "FORMAT_NAMES", "millivolts_per", "parse_number", "LabelTable", "ExportOptions",
           "LABEL_FREE", "Export", "check_export", "ExportSource", "iter_files", "other_format_reason", "xml_root_name"]
