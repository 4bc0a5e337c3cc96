"""Many recordings in one array: a NumPy `.npy` / `.npz` or an HDF5 dataset, with an index CSV.

Read: one 3-D array per file, (records, leads, samples) or (records, samples, leads), and the
index CSV beside it (same stem, `.csv`: signals.npy -> signals.csv; option `index` names another
for a single array). The CSV has one row per record, in the array's order unless a `row` column
gives each record's index: `record_id`, `patient_id` (empty: none), `sampling_rate` (Hz),
`leads` (names in the array's lead order, separated by ';' or ','), optionally `units` (else the
option `units`, "mV"). An `.npz` member / HDF5 root dataset is the option `key`, else the only
one, else "signals".

Assumed: every record of an array has the same lead count and length (the array's); the layout is
found from the lead count (option `layout` when both axes match). Values are multiplied by the
unit's millivolts; no gain or baseline is applied.

Never read: any other CSV column (names, birth dates, free text are ignored whatever they hold).

Listing reads the CSV and each array's header only; reading takes one record: `.npy` is
memory-mapped, HDF5 reads one row, an `.npz` member is read at the record's offset (a compressed
member is decompressed up to it, so `.npy` or an uncompressed `.npz` scale better). A file whose
array is unusable, or that has no index CSV, is one ref that `read` quarantines with the reason;
an index CSV that does not describe its array (row count, columns, ids) is a ValueError.
"""
from __future__ import annotations

import csv
import os
import re
import struct
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import h5py

from coreecg.data.leads import canonical_lead_name
from coreecg.data.record import Record, RecordError, RecordRef
from coreecg.data.sources.base import _LISTING_ERROR, raise_listing_error
from coreecg.data.sources.exports import (
    LABEL_FREE, Export, ExportOptions, ExportSource, check_export, iter_files, millivolts_per, sniff,
)
from coreecg.data.sources.registry import register_source

RLS, RSL = "records-leads-samples", "records-samples-leads"
LAYOUTS = ("auto", RLS, RSL)
DEFAULT_KEY = "signals"
INDEX_COLUMNS = ("record_id", "patient_id", "sampling_rate", "leads")   # the index CSV's required columns
_SKIP_CHUNK = 1 << 20  # bytes decompressed at a time while skipping to a record of a compressed .npz


@dataclass
class ArraysOptions(ExportOptions):
    """The config section data.sources.arrays."""

    # index CSV of a single array input; empty: the CSV beside each array, of its stem
    index: str = ""
    # the .npz member / HDF5 root dataset; empty: the only one, else "signals"
    key: str = ""
    # axis order: auto (from the CSV's lead count) | records-leads-samples | records-samples-leads
    layout: str = "auto"
    # units of the values where the CSV has no `units` column
    units: str = "mV"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layout not in LAYOUTS:
            raise ValueError(f"data.sources.arrays.layout must be one of {LAYOUTS}, got {self.layout!r}")
        try:
            millivolts_per(self.units, "data.sources.arrays.units", "option")
        except RecordError as exc:
            raise ValueError(f"data.sources.arrays.units: {exc.reason}") from None


@register_source("arrays", options=ArraysOptions, label_free=LABEL_FREE, dataset_label="Arrays")
class ArraysSource(ExportSource):
    """Reader of record arrays (.npy, .npz, HDF5) with index CSVs; options: see ArraysOptions."""

    name = "arrays"
    formats = ("npy", "npz", "hdf5")
    suffixes = (".npy", ".npz", ".h5", ".hdf5")
    format_label = "NumPy/HDF5 array"

    def __init__(self, labels: str = "", class_map: str = "", multilabel: bool | None = None,
                 index: str = "", key: str = "", layout: str = "auto", units: str = "mV", task: str = ""):
        self.options = ArraysOptions(labels, class_map, multilabel, index, key, layout, units)
        super().__init__(labels, class_map, multilabel, task)

    def list_records(self, root: Path) -> list[RecordRef]:
        if self.options.index and root is not None and Path(root).expanduser().is_dir():
            arrays = [p for p in iter_files(Path(root).expanduser()) if sniff(p) in self.formats]
            if len(arrays) > 1:
                raise ValueError(f"{self.name}: index {self.options.index} describes one array, but {root} "
                                 f"holds {len(arrays)} ({', '.join(p.name for p in arrays[:3])}, ...): give "
                                 "the array file as input, or put each array's CSV beside it")
        return super().list_records(root)

    def file_refs(self, path: Path, record_id: str, fmt: str) -> list[RecordRef]:
        """One ref per row of the array's index CSV; one quarantined ref for an unusable file."""
        try:
            key, shape = _describe(path, fmt, self.options.key)
        except RecordError as exc:
            return [RecordRef(self.name, record_id, str(path), {"format": fmt, _LISTING_ERROR: exc.reason})]
        if self.options.index:
            index = Path(self.options.index).expanduser()
            if not index.is_file():
                raise FileNotFoundError(f"{self.name}: index CSV not found: {index}")
        else:
            index = path.with_suffix(".csv")
            if not index.is_file():
                reason = f"no index CSV: {index.name} (record_id, patient_id, sampling_rate, leads) beside {path.name}"
                return [RecordRef(self.name, record_id, str(path), {"format": fmt, _LISTING_ERROR: reason})]
        rows = _index_rows(index, shape[0], path, self.options.units)
        return [RecordRef(self.name, rid, str(path), {"format": fmt, "key": key, "index": index.name, **extra})
                for rid, extra in rows]

    def read(self, ref: RecordRef) -> Record:
        raise_listing_error(ref)
        x = ref.extra
        where = f"record {ref.record_id!r} of {x['index']}"
        if not x["leads"]:
            raise RecordError(ref.path, f"no lead names for {where}")
        try:
            fs = float(x["fs"])
        except ValueError:
            raise RecordError(ref.path, f"sampling rate {x['fs']!r} of {where}: not a number") from None
        scale = millivolts_per(x["units"], ref.path, where)
        shape, values = _read_row(ref.path, x["format"], x["key"], x["row"])
        layout = self._layout(shape, len(x["leads"]), ref.path, x["index"])
        signal = np.asarray(values if layout == RLS else values.T, dtype=np.float64) * scale
        export = Export(signal, fs, tuple(x["leads"]), x["patient_id"],
                        {"layout": layout, "row": x["row"], "units": x["units"], "array": x["key"] or "",
                         "shape": list(shape)})
        return self.record(ref, check_export(export, ref.path))

    def _layout(self, shape: tuple[int, ...], n_leads: int, path: str, index: str) -> str:
        """The layout of an array of `shape` whose records have `n_leads` named leads."""
        on = {RLS: shape[1] == n_leads, RSL: shape[2] == n_leads}
        layout = self.options.layout
        if layout == "auto":
            if all(on.values()):
                raise RecordError(path, f"ambiguous layout: shape {shape} has {n_leads} (the lead count) on "
                                        "axes 1 and 2: set data.sources.arrays.layout")
            layout = next((k for k, hit in on.items() if hit), "")
        if not on.get(layout):
            axis = {RLS: "axis 1", RSL: "axis 2", "": "neither axis 1 nor 2"}[layout]
            raise RecordError(path, f"{n_leads} lead names in {index} for an array of shape {shape}: "
                                    f"{axis} does not have {n_leads} entries")
        return layout


# ---------------------------------------------------------------------------- the array of a file


def _describe(path: Path, fmt: str, key: str) -> tuple[str | None, tuple[int, ...]]:
    """(member/dataset name or None for .npy, shape) of a file's array, without reading its data;
    RecordError naming what makes it unusable (no such member, not 3-D, not numbers)."""
    try:
        if fmt == "npy":
            with open(path, "rb") as f:
                shape, fortran, dtype = _npy_header(f)
        elif fmt == "npz":
            with zipfile.ZipFile(path) as z:
                key = _choose(sorted(n[:-4] for n in z.namelist()), key, "member", path)
                with z.open(f"{key}.npy") as f:
                    shape, fortran, dtype = _npy_header(f)
            if fortran and len(shape) == 3:  # its records are not contiguous: a read would inflate it all
                raise RecordError(str(path), f"member {key!r} is Fortran-ordered: save it C-ordered "
                                             "(np.ascontiguousarray) or as .npy")
        else:
            with h5py.File(path, "r") as f:
                key = _choose(sorted(k for k in f if isinstance(f[k], h5py.Dataset)), key, "dataset", path)
                shape, dtype = f[key].shape, f[key].dtype
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise RecordError(str(path), f"unreadable {fmt} file: {exc}") from exc
    what = f"array {key!r}" if key else "array"
    if len(shape) != 3:
        raise RecordError(str(path), f"{what} has shape {tuple(shape)}: expected 3-D (records, leads, samples) "
                                     "or (records, samples, leads)")
    if not (np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)):
        raise RecordError(str(path), f"{what} holds {dtype}, not real numbers")
    return key, tuple(int(n) for n in shape)


def _choose(names: list[str], key: str, what: str, path: Path) -> str:
    """The member/dataset to read: `key`, else the only one, else 'signals'."""
    if key:
        if key not in names:
            raise RecordError(str(path), f"no {what} {key!r} (has {', '.join(names) or 'none'})")
        return key
    if len(names) == 1:
        return names[0]
    if DEFAULT_KEY in names:
        return DEFAULT_KEY
    raise RecordError(str(path), f"{len(names)} {what}s ({', '.join(names) or 'none'}) and none named "
                                 f"{DEFAULT_KEY!r}: set data.sources.arrays.key")


def _npy_header(f) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran_order, dtype) of the .npy stream `f`, left at the start of its data."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(f)


def _open(path: str, fmt: str):
    """A read-only handle of `path` kept per process (its metadata is read once), keyed by
    modification time so that a rewritten file is opened afresh by a long-lived worker."""
    return _open_cached(path, fmt, os.stat(path).st_mtime_ns)


@lru_cache(maxsize=32)
def _open_cached(path: str, fmt: str, mtime_ns: int):
    """The handle behind `_open` (mtime_ns only keys the cache): a memmap, ZipFile or h5py File."""
    if fmt == "npy":
        return np.load(path, mmap_mode="r")
    if fmt == "npz":
        return zipfile.ZipFile(path)

    return h5py.File(path, "r")


def _read_row(path: str, fmt: str, key: str | None, row: int) -> tuple[tuple[int, ...], np.ndarray]:
    """(array shape, record `row` as stored: 2-D), reading that record only; RecordError naming the
    file where it changed since listing or cannot be read."""
    try:
        handle = _open(path, fmt)
        if fmt == "npz":
            return _npz_row(path, handle, key, row)
        array = handle if fmt == "npy" else handle[key]
        shape = tuple(int(n) for n in array.shape)
        if len(shape) != 3 or row >= shape[0]:
            raise RecordError(path, f"array has shape {shape}, no record at row {row} (changed since listing?)")
        return shape, np.asarray(array[row])
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
        raise RecordError(path, f"unreadable {fmt} file: {exc}") from exc


def _npz_row(path: str, z: zipfile.ZipFile, key: str, row: int) -> tuple[tuple[int, ...], np.ndarray]:
    """Record `row` of member `key`: read in place when the member is stored, else decompressed
    chunk by chunk up to the record (never the whole member in memory)."""
    info = z.getinfo(f"{key}.npy")
    with z.open(info) as f:
        shape, fortran, dtype = _npy_header(f)
        if len(shape) != 3 or fortran or row >= shape[0]:
            raise RecordError(path, f"member {key!r} has shape {shape}, no C-ordered record at row {row} "
                                    "(changed since listing?)")
        size = int(np.prod(shape[1:])) * dtype.itemsize
        skip = row * size
        if info.compress_type == zipfile.ZIP_STORED:
            with open(path, "rb") as raw:   # local header: 30 bytes, then name and extra field
                raw.seek(info.header_offset + 26)
                name_len, extra_len = struct.unpack("<HH", raw.read(4))
                raw.seek(info.header_offset + 30 + name_len + extra_len + f.tell() + skip)
                data = raw.read(size)
        else:
            while skip:
                skip -= len(f.read(min(skip, _SKIP_CHUNK)))
            data = f.read(size)
    if len(data) != size:
        raise RecordError(path, f"member {key!r} is truncated at row {row}")
    return shape, np.frombuffer(data, dtype=dtype).reshape(shape[1:])


# ---------------------------------------------------------------------------- the index CSV


def _index_rows(index: Path, n_records: int, array: Path, units: str) -> list[tuple[str, dict[str, Any]]]:
    """(record_id, ref extra) per row of `index`, which describes the `n_records` records of
    `array`; ValueError naming both files for a CSV that does not describe it. The cells'
    values (rate, units, leads) are checked by `read`: a bad one quarantines its record only."""
    with open(index, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        columns = reader.fieldnames or []
        missing = [c for c in INDEX_COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"{index}: missing column(s) {missing} (has {columns}); it indexes {array}")
        rows = list(reader)
    if len(rows) != n_records:
        raise ValueError(f"{index}: {len(rows)} row(s) for the {n_records} record(s) of {array}: one row per record")
    out, seen, positions = [], set(), set()
    for i, row in enumerate(rows):
        line = f"{index}: line {i + 2}"
        rid = (row["record_id"] or "").strip()
        if not rid or rid in seen:
            raise ValueError(f"{line}: record_id {rid!r} is {'empty' if not rid else 'given twice'}")
        seen.add(rid)
        cell = (row.get("row") or "").strip() if "row" in columns else str(i)
        if not cell.isdigit() or int(cell) >= n_records:
            raise ValueError(f"{line}: row {cell!r} is not an index of the {n_records} records")
        if int(cell) in positions:
            raise ValueError(f"{line}: row {cell} given twice")
        positions.add(int(cell))
        leads = [canonical_lead_name(n) for n in re.split(r"[;,]", row["leads"] or "") if n.strip()]
        out.append((rid, {"row": int(cell), "fs": (row["sampling_rate"] or "").strip(), "leads": leads,
                          "units": (row["units"] or "").strip() if "units" in columns else units,
                          "patient_id": (row["patient_id"] or "").strip() or None}))
    return out


__all__ = ["ArraysOptions", "ArraysSource", "LAYOUTS", "INDEX_COLUMNS"]
