"""The one reader of a corpus split into memory: every consumer (training ingest's metadata,
the probe, downstream evaluation, figures, tests and benchmarks) reads through `read_split`.

Row numbering: a split's `uid` is its row index over the split's shard files in manifest
order. Training ingest numbers rows the same way (`coreecg.train.ingest`), so a uid from a
training batch indexes any array this module returns for that split.

Without Ray: reading a split must not start a cluster (the streaming reader for training lives
in `coreecg.train.ingest`; both read shard files through `coreecg.data.corpus.read_shard`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from coreecg.data.corpus import ALL_COLUMNS, decode_labels, decode_signals, load_manifest, read_shard, split_files

META_COLUMNS = ("record_id", "patient_id", "labels")


def split_rows(corpus: str | Path, split: str = "train", manifest: dict[str, Any] | None = None) -> int:
    """Windows in one split (from the manifest; no file read)."""
    manifest = manifest or load_manifest(corpus)
    return sum(s["rows"] for s in manifest["shards"] if s["split"] == split)


def splits_of(corpus: str | Path, manifest: dict[str, Any] | None = None) -> list[str]:
    """The splits the corpus holds, in train/val/test order."""
    manifest = manifest or load_manifest(corpus)
    present = {s["split"] for s in manifest["shards"]}
    return [s for s in ("train", "val", "test") if s in present] + sorted(present - {"train", "val", "test"})


def _read_spaced(path: Path, columns: list[str], first_uid: int, stride: int) -> tuple[pa.Table, np.ndarray, int]:
    """The rows of one shard file whose split uid is a multiple of `stride` (all rows for 1),
    reading only the row groups that hold one: (table, uid (n,), rows in the file)."""
    if stride == 1:
        t = read_shard(path, columns)
        return t, np.arange(first_uid, first_uid + t.num_rows, dtype=np.int64), t.num_rows
    pf = pq.ParquetFile(str(path), memory_map=True)
    sizes = np.array([pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)], dtype=np.int64)
    starts = np.cumsum(sizes) - sizes
    rows = np.arange(-first_uid % stride, int(sizes.sum()), stride)        # file rows at spaced uids
    group_of = np.searchsorted(starts, rows, side="right") - 1
    groups = np.unique(group_of)
    t = pf.read_row_groups(groups.tolist(), columns=columns)
    # a file row's position in the table: its offset in its group + the selected groups before it
    before = (np.cumsum(sizes[groups]) - sizes[groups])[np.searchsorted(groups, group_of)]
    pos = rows - starts[group_of] + before
    return t.take(pa.array(pos)), first_uid + rows, int(sizes.sum())


def read_split(corpus: str | Path, split: str = "train", columns: Iterable[str] = ALL_COLUMNS, *,
               max_windows: int | None = None, labelled_only: bool = False, as_stored: bool = False,
               manifest: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """One split's rows as numpy arrays.

    columns: stored columns to read; "labels" decodes to label (n,) int64 (first class, -1 if
        none) and multihot (n, K) float32; "signal" to (n, C, T) float32 (or the stored dtype,
        float16, with `as_stored`); string columns to object arrays. "uid" (n,) int64 is always
        returned.
    max_windows: at most this many rows, evenly spaced over the split (every ceil(N / max)-th
        row in uid order): deterministic, spread over the whole split; only the row groups that
        hold those rows are read, and only those rows decoded.
    labelled_only: drop unlabelled rows (after the spacing, before the `max_windows` cut).
    """
    manifest = manifest or load_manifest(corpus)
    columns = list(dict.fromkeys(columns))
    read_cols = list(dict.fromkeys([*columns, *(["labels"] if labelled_only else [])]))
    total = split_rows(corpus, split, manifest)
    stride = max(1, -(-total // max_windows)) if max_windows else 1
    tables, uids, seen = [], [], 0
    for f in split_files(corpus, split, manifest):
        t, uid, rows = _read_spaced(f, read_cols, seen, stride)
        seen += rows
        if labelled_only:
            labelled = pc.greater(pc.list_value_length(t["labels"]), 0)
            uid = uid[labelled.to_numpy(zero_copy_only=False)]
            t = t.filter(labelled)
        tables.append(t)
        uids.append(uid)
    table = pa.concat_tables(tables)
    uid = np.concatenate(uids)
    if max_windows is not None:
        table, uid = table.slice(0, max_windows), uid[:max_windows]
    out: dict[str, np.ndarray] = {"uid": uid}
    for name in columns:
        col = table.column(name)
        if name == "signal":
            out["signal"] = decode_signals(col, tuple(manifest["signal"]["shape"]), manifest["signal"]["dtype"],
                                           as_stored=as_stored)
        elif name == "labels":
            out["label"], out["multihot"] = decode_labels(col, len(manifest["class_names"]))
        else:
            out[name] = col.to_numpy(zero_copy_only=False)
    return out


def patient_index(corpus: str | Path, split: str = "train") -> np.ndarray:
    """(N,) int64 over the split's uids: windows of one patient share an index. A patient is
    (dataset, patient_id), so equal ids of two sources stay apart; a recording without a patient
    id is its own patient (the corpus stores "record:<record_id>" for it)."""
    meta = read_split(corpus, split, ["dataset", "patient_id"])
    key = np.char.add(np.char.add(meta["dataset"].astype(str), "\x1f"), meta["patient_id"].astype(str))
    return np.unique(key, return_inverse=True)[1].astype(np.int64).reshape(-1)
