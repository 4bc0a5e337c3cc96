"""The on-disk corpus: Parquet shards per split, `manifest.json`, `quarantine.csv`, and readers.

Layout of a corpus folder:

    manifest.json                 source, class names, counts, full PreprocessConfig,
                                  code version, every shard file with rows and sha256
    quarantine.csv                record_id, path, reason for every record not written
    fingerprints.parquet          one signal fingerprint per window, for the leakage guard
                                  (coreecg.data.fingerprints; stamped with the manifest's sha256)
    train/shard-00000.parquet     one row per 10 s window (see ROW SCHEMA)
    val/...  test/...             a split is a folder, so reading one split opens only its files
    _state/shard-00000.json       resume markers (one per shard, written after its files)

ROW SCHEMA (Parquet):
    dataset       string         source name ("ptbxl", "synthetic", ...)
    record_id     string
    patient_id    string         patient id, or "record:<record_id>" when the source has none
    window_index  int16          0-based position of the window in its record
    split         string         "train" | "val" | "test" (also the folder name)
    labels        list<int16>    indices into manifest["class_names"] (empty: unlabelled)
    target        float32        a regression task's value (manifest["task"], coreecg.data.tasks); only in
                                 corpora of such a task (its one class, index 0, in `labels` too)
    signal        fixed_size_binary[12 * 2500 * 2]   z-scored float16, little-endian, C order
                  (leads in STANDARD_LEADS order, then time); dtype and shape are in the
                  manifest ("signal") and in the field's Parquet metadata

Arrays from `coreecg.data.reading.read_split` instead carry
    signal   (12, 2500) float32,  label  int64 (first class, -1 if none),
    multihot (n_classes,) float32 (all classes of the window's record),
    plus the other columns asked for; training reads the float16 signal through
    `coreecg.train.ingest.training_dataset` (`read_windows` below).

One run opens its corpus once (`open_corpus`): an `OpenCorpus` holds the manifest, its sha256
(of the very bytes parsed) and, computed on first use and kept, the shard lists per split and the
digests of its other files. The plan, the fingerprint checks, the run record and the ingest are
handed that object, not the path; it is os.PathLike and `load_manifest` of it reads nothing, so
every reader that takes a corpus path takes it too. A manifest file is parsed once per process
(`_MANIFESTS`, checked against the file's modification time and size, so a rebuilt corpus is read
anew); a Ray worker adopts what the driver read (`adopt_corpus`, from `RunPlan.to_dict`) and reads
none. With COREECG_TRACE_MANIFEST_READS=<file> every read appends a JSON line (pid, host, path)
there: the count per process is a figure of docs/performance.md and a test.

Layout choices (their figures: docs/data_pipeline.md): float16 (windows are z-scored, so the
11-bit mantissa costs little and halves the size), one fixed-size binary blob per window (a
float16 fixed_size_list column pays per-value Parquet levels), no compression (z-scored
mantissas are noise-like), 128-row groups.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coreecg.files import sha256_file, write_atomic
from coreecg.log import TRACE_MANIFEST_ENV

# Lazy imports: torch, for one float16 cast: reading ECG files must not pull in torch (tests/test_data_layering.py).

FORMAT_VERSION = 1
SIGNAL_DTYPE = np.float16
COMPRESSION = "none"           # zstd saves little on z-scored float16 and costs read time
ROW_GROUP_ROWS = 128           # ~7.7 MB row groups: large sequential reads, bounded memory
MANIFEST = "manifest.json"
QUARANTINE = "quarantine.csv"


class CorpusError(ValueError):
    """A corpus folder that is missing, incomplete or fails its checksums."""


def schema(shape: tuple[int, ...], dtype: Any = SIGNAL_DTYPE, target: bool = False) -> pa.Schema:
    """The row schema; `target`: with the float32 column of a regression task's values."""
    dtype = np.dtype(dtype).newbyteorder("<")
    signal = pa.field("signal", pa.binary(int(np.prod(shape)) * dtype.itemsize),
                      metadata={"dtype": dtype.name, "shape": ",".join(map(str, shape))})
    return pa.schema([
        ("dataset", pa.string()), ("record_id", pa.string()), ("patient_id", pa.string()),
        ("window_index", pa.int16()), ("split", pa.string()),
        ("labels", pa.list_(pa.int16())), *([("target", pa.float32())] if target else []), signal,
    ])


def windows_table(rows: list[dict[str, Any]], signals: np.ndarray, dtype: Any = SIGNAL_DTYPE) -> pa.Table:
    """Rows (metadata dicts, one per window; with "target" in a regression task's corpus) + signals
    (n, leads, samples) -> an Arrow table."""
    sch = schema(signals.shape[1:], dtype, target=bool(rows) and "target" in rows[0])
    blob = np.ascontiguousarray(signals, dtype=np.dtype(dtype).newbyteorder("<"))
    cols = {name: pa.array([r[name] for r in rows], type=sch.field(name).type)
            for name in sch.names if name != "signal"}
    cols["signal"] = pa.FixedSizeBinaryArray.from_buffers(
        sch.field("signal").type, len(blob), [None, pa.py_buffer(blob)])
    return pa.table(cols, schema=sch)


def write_parquet(table: pa.Table, path: Path, compression: str = COMPRESSION,
                  row_group_rows: int = ROW_GROUP_ROWS) -> str:
    """Atomically write `table`; returns the file's sha256."""
    write_atomic(path, lambda tmp: pq.write_table(
        table, tmp, compression=compression, row_group_size=row_group_rows,
        use_dictionary=["dataset", "patient_id", "split"]))
    return sha256_file(path)


# ---------------------------------------------------------------------------- reading


# The manifests this process parsed, by corpus folder: (stamp, manifest, sha256 of its bytes)
_MANIFESTS: dict[str, tuple[tuple[int, int], dict[str, Any], str]] = {}


def _stamp(f: Path) -> tuple[int, int]:
    """What says a manifest file changed: its modification time (ns) and size."""
    st = f.stat()
    return st.st_mtime_ns, st.st_size


def _read_manifest(path: str | Path) -> tuple[dict[str, Any], str, tuple[int, int]]:
    """(the manifest, the sha256 of the bytes it was parsed from, the file's stamp), parsed once
    per process while the file is unchanged; CorpusError if the folder is not a finished corpus."""
    f = Path(path) / MANIFEST
    if not f.is_file():
        raise CorpusError(f"not a coreecg corpus (no {MANIFEST}): {path}")
    key, stamp = str(Path(path).resolve()), _stamp(f)
    known = _MANIFESTS.get(key)
    if known is None or known[0] != stamp:
        raw = f.read_bytes()
        _trace(f)
        manifest = json.loads(raw)
        if manifest.get("format_version") != FORMAT_VERSION:
            raise CorpusError(f"{f}: format_version {manifest.get('format_version')} != {FORMAT_VERSION}")
        known = _MANIFESTS[key] = (stamp, manifest, hashlib.sha256(raw).hexdigest())
    return copy.deepcopy(known[1]), known[2], known[0]      # a copy: callers may edit theirs


def _trace(f: Path) -> None:
    """One line per manifest read, where COREECG_TRACE_MANIFEST_READS names a file."""
    out = os.environ.get(TRACE_MANIFEST_ENV)
    if out:
        with open(out, "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "path": str(f)}) + "\n")


def load_manifest(path: str | Path | OpenCorpus) -> dict[str, Any]:
    """The corpus manifest; CorpusError if the folder is not a finished corpus. Of an OpenCorpus:
    the manifest it holds (nothing is read again)."""
    if isinstance(path, OpenCorpus):
        return path.manifest
    return _read_manifest(path)[0]


@dataclass(frozen=True, eq=False)
class OpenCorpus:
    """A corpus folder opened once (`open_corpus`): its manifest and that file's sha256, and,
    computed on first use and kept in `memo`, the shard lists per split and other files' sha256
    (`coreecg.data.fingerprints` keeps its fingerprint file there too). A snapshot: what one run
    reads, from planning to ingest. os.PathLike (its folder), so path-taking readers take it."""

    path: Path
    manifest: dict[str, Any]
    manifest_sha256: str                        # of the bytes `manifest` was parsed from
    memo: dict[Any, Any] = field(default_factory=dict, repr=False)
    stamp: tuple[int, int] = (0, 0)             # the manifest file's (mtime ns, size) when read

    def to_dict(self) -> dict[str, Any]:
        """Plain data for a worker (`adopt_corpus`): the manifest, its sha256 and stamp."""
        return {"path": str(self.path), "manifest": self.manifest, "manifest_sha256": self.manifest_sha256,
                "stamp": list(self.stamp)}

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:                   # error messages and records name the folder
        return str(self.path)

    @property
    def signal_shape(self) -> tuple[int, ...]:
        return tuple(self.manifest["signal"]["shape"])

    @property
    def signal_dtype(self) -> str:
        return self.manifest["signal"]["dtype"]

    def split_files(self, split: str) -> list[Path]:
        """`split_files` of this corpus, checked once and kept."""
        if ("files", split) not in self.memo:
            self.memo["files", split] = split_files(self.path, split, self.manifest)
        return list(self.memo["files", split])

    def shard_rows(self, split: str) -> list[int]:
        """Rows of each shard file of `split`, in `split_files` order (from the manifest)."""
        return [s["rows"] for s in self.manifest["shards"] if s["split"] == split]

    def sha256(self, name: str) -> str:
        """The sha256 of the corpus's file `name` (relative to its folder), hashed once and kept."""
        if name == MANIFEST:
            return self.manifest_sha256
        if ("sha256", name) not in self.memo:
            self.memo["sha256", name] = sha256_file(self.path / name)
        return self.memo["sha256", name]

    def forget(self, name: str) -> None:
        """Drop what is kept of file `name` (it was just rewritten)."""
        self.memo.pop(("sha256", name), None)

    def verify(self) -> list[str]:
        """Shard files whose sha256 differs from the manifest, or that are missing (empty: intact)."""
        return [s["path"] for s in self.manifest["shards"]
                if not (self.path / s["path"]).is_file() or self.sha256(s["path"]) != s["sha256"]]


def open_corpus(corpus: str | Path | OpenCorpus) -> OpenCorpus:
    """The corpus at `corpus` opened: its manifest read once (CorpusError as `load_manifest`).
    An OpenCorpus is returned as it is."""
    if isinstance(corpus, OpenCorpus):
        return corpus
    manifest, sha, stamp = _read_manifest(corpus)
    return OpenCorpus(Path(corpus), manifest, sha, stamp=stamp)


def adopt_corpus(d: dict[str, Any]) -> OpenCorpus:
    """An OpenCorpus from another process's `OpenCorpus.to_dict` (a worker's, from the driver's
    plan), kept as this process's read of that manifest when the file here has the same stamp
    (shared storage); where it differs (another copy, or rebuilt since) it is read here."""
    path, stamp = Path(d["path"]), tuple(d["stamp"])
    f = path / MANIFEST
    if not f.is_file() or _stamp(f) != stamp:
        return open_corpus(path)
    key = str(path.resolve())
    if _MANIFESTS.get(key, ((),))[0] != stamp:
        _MANIFESTS[key] = (stamp, copy.deepcopy(d["manifest"]), d["manifest_sha256"])
    return OpenCorpus(path, d["manifest"], d["manifest_sha256"], stamp=stamp)


def open_corpora(corpora: Iterable[str | Path | OpenCorpus]) -> list[OpenCorpus]:
    """Each of `corpora` opened, a folder listed twice opened once (the same object twice)."""
    opened: dict[str, OpenCorpus] = {}
    out = []
    for c in corpora:
        if str(c) not in opened:
            opened[str(c)] = open_corpus(c)
        out.append(opened[str(c)])
    return out


def unpadded_split(path: str | Path | OpenCorpus, split: str = "train", manifest: dict[str, Any] | None = None) -> bool:
    """True when the manifest counts no short-record (NaN-padded) window in `split`; False when it
    counts some, or when the corpus predates the count (then nothing is assumed)."""
    manifest = manifest or load_manifest(path)
    return manifest.get("counts", {}).get("padded_windows", {}).get(split) == 0


def split_files(path: str | Path | OpenCorpus, split: str, manifest: dict[str, Any] | None = None) -> list[Path]:
    """The shard files of one split, as listed in the manifest (CorpusError if one is missing)."""
    manifest = manifest or load_manifest(path)
    files = [Path(path) / s["path"] for s in manifest["shards"] if s["split"] == split]
    if not files:
        raise CorpusError(f"corpus {path} has no {split!r} windows "
                          f"(splits: {sorted({s['split'] for s in manifest['shards']})})")
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise CorpusError(f"corpus {path} lacks shard files listed in its manifest: {missing[:3]}")
    return files


def verify_corpus(path: str | Path | OpenCorpus) -> list[str]:
    """Files whose sha256 differs from the manifest (empty list: the corpus is intact)."""
    return open_corpus(path).verify()


def signal_view(col: pa.Array | pa.ChunkedArray, shape: Iterable[int], dtype: Any = SIGNAL_DTYPE) -> np.ndarray:
    """fixed_size_binary signal column -> (n, *shape) array in the stored dtype, a read-only view
    of the Arrow buffer (no copy for a single chunk; it keeps the buffer alive)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    width = col.type.byte_width
    raw = np.frombuffer(col.buffers()[1], dtype=np.uint8)[col.offset * width:(col.offset + len(col)) * width]
    return raw.view(np.dtype(dtype).newbyteorder("<")).reshape(-1, *shape)


def decode_signals(col: pa.Array | pa.ChunkedArray, shape: Iterable[int], dtype: Any = SIGNAL_DTYPE,
                   as_stored: bool = False) -> np.ndarray:
    """fixed_size_binary signal column -> (n, *shape) float32 (one copy: the dtype cast), or
    in the stored dtype with `as_stored` (training ingest keeps float16 on the wire)."""
    if len(col) == 0:
        return np.zeros((0, *shape), dtype=np.dtype(dtype) if as_stored else np.float32)
    stored = signal_view(col, shape, dtype)
    if as_stored:
        return stored.astype(stored.dtype.newbyteorder("="), copy=True)
    if stored.dtype == np.float16:  # torch's float16 -> float32 cast is faster than numpy's
        import torch  # here, not at module level: reading ECG files must not pull in torch

        return torch.from_numpy(stored.copy()).float().numpy()
    return stored.astype(np.float32)


def decode_labels(col: pa.Array | pa.ChunkedArray, n_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """list<int16> label column -> (label (n,) int64 first class or -1, multihot (n, C) float32)."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    n = len(col)
    rows = pc.list_parent_indices(col).to_numpy()
    values = pc.list_flatten(col).to_numpy().astype(np.int64)
    multihot = np.zeros((n, n_classes), dtype=np.float32)
    multihot[rows, values] = 1.0
    label = np.full(n, -1, dtype=np.int64)
    first = np.unique(rows, return_index=True)[1]   # rows are non-decreasing: first value per row
    label[rows[first]] = values[first]
    return label, multihot


ALL_COLUMNS = ("dataset", "record_id", "patient_id", "window_index", "split", "labels", "signal")


def read_shard(path: str | Path, columns: Iterable[str]) -> pa.Table:
    """One shard file's columns as an Arrow table (signals still encoded). Memory-mapped: the
    uncompressed pages are decoded straight from the page cache (measured 60k -> 75k windows/s)."""
    return pq.read_table(str(path), columns=list(columns), memory_map=True)


def read_windows(batch: dict[str, np.ndarray], shape: tuple[int, ...], dtype: str,
                 keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Ray Data map_batches fn of training ingest (`coreecg.train.ingest`): one shard file
    {"path", "first_uid"} -> {"signal": (n, C, T) stored dtype, "uid": (n,) int64}, only the rows
    whose uid is True in `keep` (the split's (N,) bool mask) when given. It lives here, away
    from torch, so that a fresh Ray Data worker imports 0.4 s of modules, not 3.8 s."""
    path, first_uid = str(batch["path"][0]), int(batch["first_uid"][0])
    table = read_shard(path, ["signal"])
    uid = np.arange(first_uid, first_uid + table.num_rows, dtype=np.int64)
    if keep is not None:
        rows = np.flatnonzero(keep[uid])
        table, uid = table.take(rows), uid[rows]
    return {"signal": decode_signals(table.column("signal"), shape, dtype, as_stored=True), "uid": uid}
