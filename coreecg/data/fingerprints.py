"""Signal fingerprints of a corpus's windows: the same recording found under another name,
format, gain or lead order (docs/leakage.md).

A stored window is already resampled, band-passed and z-scored per lead (coreecg.data.preprocess),
so two copies of one recording differ only by float rounding. Per window and lead:

    shape    the mean of each of BLOCKS consecutive blocks of the stored samples (78 samples,
             0.31 s at 250 Hz), z-scored again over the blocks: (n, leads, BLOCKS)
    feature  shape * FEATURE_SCALE rounded to int8: what a candidate pair is verified on
    key      the sign bits of the shape, one uint32 per lead: two copies share their keys unless
             a block mean lies within rounding of the lead's mean (then that lead's key differs;
             a window is found through any one of its leads' keys). 0 marks a flat lead.

`fingerprints.parquet` beside the manifest holds one row per window (FINGERPRINT_COLUMNS); its
schema metadata names the manifest's sha256 it was computed from, so a corpus built before
fingerprints existed, or rebuilt since, gets them computed on first use (`corpus_fingerprints`).
Every function here takes a corpus path or an opened corpus (coreecg.data.corpus.OpenCorpus): a
run hands the one it opened, so the manifest is not read, nor a file hashed, again; the file's
check is made once per OpenCorpus and kept on it.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from coreecg.data.corpus import MANIFEST, OpenCorpus, load_manifest, open_corpus, read_shard, signal_view
from coreecg.files import sha256_file, write_atomic
from coreecg.data.patient_ids import comparable_warning

FINGERPRINT_FILE = "fingerprints.parquet"
FINGERPRINT_VERSION = 1
BLOCKS = 32                    # block means per lead: 32 bits fill one uint32 key
FEATURE_SCALE = 24.0           # int8 steps per standard deviation of the block means (|z| < 5.3)
FLAT_STD = 1e-3                # block means this flat carry no shape: the lead gets no key
META_COLUMNS = ("dataset", "record_id", "patient_id", "window_index", "split")
FINGERPRINT_COLUMNS = (*META_COLUMNS, "keys", "features")
_BITS = (np.uint64(1) << np.arange(BLOCKS, dtype=np.uint64)).astype(np.uint64)

log = logging.getLogger(__name__)


def window_fingerprints(signals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, leads, samples) windows -> (keys (n, leads) uint32, features (n, leads, BLOCKS) int8)."""
    n, leads, samples = signals.shape
    if np.isnan(signals[..., -1]).any():   # a short record's padding (NaN, always at the end) counts as 0
        signals = np.nan_to_num(signals, nan=0.0)
    width = samples // BLOCKS
    blocks = signals[..., : width * BLOCKS].reshape(n, leads, BLOCKS, width).mean(axis=-1, dtype=np.float32)
    blocks -= blocks.mean(axis=-1, keepdims=True)
    std = blocks.std(axis=-1, keepdims=True)
    flat = std[..., 0] < FLAT_STD
    shape = blocks / np.where(std < FLAT_STD, 1.0, std)
    keys = ((shape > 0).astype(np.uint64) @ _BITS).astype(np.uint32)
    keys[flat] = 0
    features = np.clip(np.rint(shape * FEATURE_SCALE), -127, 127).astype(np.int8)
    features[flat] = 0
    return keys, features


def fingerprint_table(meta: pa.Table, keys: np.ndarray, features: np.ndarray) -> pa.Table:
    """Metadata columns + keys and features as fixed-size binary columns (one row per window)."""
    cols = {name: meta.column(name) for name in META_COLUMNS}
    for name, arr in (("keys", np.ascontiguousarray(keys, dtype="<u4")), ("features", np.ascontiguousarray(features))):
        width = arr[0].nbytes if len(arr) else int(np.prod(arr.shape[1:])) * arr.itemsize
        cols[name] = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(arr), [None, pa.py_buffer(arr)])
    return pa.table(cols)


def decode_fingerprints(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """A fingerprint table -> (keys (n, leads) uint32, features (n, leads, BLOCKS) int8)."""
    n, leads = table.num_rows, table.schema.field("keys").type.byte_width // 4   # from the type: n may be 0
    keys = _binary_column(table.column("keys"), "<u4").reshape(n, leads)
    return keys, _binary_column(table.column("features"), np.int8).reshape(n, leads, BLOCKS)


def _binary_column(col: pa.ChunkedArray, dtype: Any) -> np.ndarray:
    col = col.combine_chunks()
    width = col.type.byte_width
    raw = np.frombuffer(col.buffers()[1], dtype=np.uint8)[col.offset * width:(col.offset + len(col)) * width]
    return raw.view(dtype).astype(np.dtype(dtype).newbyteorder("="))


def compute_fingerprints(corpus: str | Path | OpenCorpus, manifest: dict[str, Any] | None = None) -> pa.Table:
    """Every window of every split, shard by shard (one shard's signals in memory at a time)."""
    manifest = manifest or load_manifest(corpus)
    shape, dtype = tuple(manifest["signal"]["shape"]), manifest["signal"]["dtype"]
    parts = []
    for shard in manifest["shards"]:
        table = read_shard(Path(corpus) / shard["path"], [*META_COLUMNS, "signal"])
        keys, features = window_fingerprints(signal_view(table.column("signal"), shape, dtype))
        parts.append(fingerprint_table(table, keys, features))
    if not parts:
        return fingerprint_table(pa.table({c: pa.array([], pa.string()) for c in META_COLUMNS}),
                                 np.zeros((0, shape[0]), np.uint32), np.zeros((0, shape[0], BLOCKS), np.int8))
    return pa.concat_tables(parts)


def _stamp(table: pa.Table, corpus: OpenCorpus) -> pa.Table:
    """The table with its provenance: version, the manifest's sha256 and its preprocessing (two
    corpora preprocessed differently store other numbers for one recording: `preprocess_warning`)."""
    return table.replace_schema_metadata({"fingerprint_version": str(FINGERPRINT_VERSION),
                                          "manifest_sha256": corpus.manifest_sha256,
                                          "preprocess": json.dumps(corpus.manifest.get("preprocess"), sort_keys=True),
                                          "patient_ids": json.dumps(corpus.manifest.get("patient_ids"),
                                                                    sort_keys=True)})


def preprocess_warning(a: pa.Table, b: pa.Table) -> str | None:
    """Why two fingerprint tables may not be comparable (other preprocessing), None when alike or unknown."""
    pa_, pb = ((t.schema.metadata or {}).get(b"preprocess") for t in (a, b))
    if pa_ is None or pb is None or pa_ == pb or b"null" in (pa_, pb):
        return None
    da, db = json.loads(pa_), json.loads(pb)
    diff = ", ".join(f"{k}: {da.get(k)} vs {db.get(k)}" for k in sorted(set(da) | set(db)) if da.get(k) != db.get(k))
    return (f"the two corpora were preprocessed differently ({diff}): a recording in both is stored as other "
            "numbers, so fingerprints may miss it (patient ids still compare)")


def patient_ids_warning(a: pa.Table, b: pa.Table) -> str | None:
    """Why two fingerprint tables' patient keys cannot match (other salts, coreecg.data.patient_ids),
    None when alike or unknown (a table stamped before patient ids were recorded)."""
    pa_, pb = ((t.schema.metadata or {}).get(b"patient_ids") for t in (a, b))
    if pa_ is None or pb is None or not _datasets(a) & _datasets(b):
        return None          # patients match within one dataset only: nothing to miss
    return comparable_warning(json.loads(pa_), json.loads(pb))


def _datasets(table: pa.Table) -> set[str]:
    return set(table.column("dataset").unique().to_pylist()) if "dataset" in table.column_names else set()


def fingerprint_stamp(path: str | Path) -> dict[str, str]:
    """A fingerprint file's metadata (version, the manifest sha256 it was computed from)."""
    meta = pq.read_schema(str(path)).metadata or {}
    return {k.decode(): v.decode() for k, v in meta.items()}


def write_fingerprints(corpus: str | Path | OpenCorpus) -> Path:
    """Compute the corpus's fingerprints and write them beside its manifest (atomically)."""
    corpus = open_corpus(corpus)
    table = _stamp(compute_fingerprints(corpus), corpus)
    path = write_atomic(corpus.path / FINGERPRINT_FILE, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    corpus.forget(FINGERPRINT_FILE)                        # a digest kept of the file it replaced
    return path


def is_current(corpus: str | Path | OpenCorpus) -> bool:
    """Whether the corpus's fingerprint file was computed from its present manifest by this version."""
    f = Path(corpus) / FINGERPRINT_FILE
    if not f.is_file():
        return False
    stamp = fingerprint_stamp(f)
    opened = isinstance(corpus, OpenCorpus)          # its manifest's sha256 is known: no second read
    manifest_sha256 = corpus.manifest_sha256 if opened else sha256_file(f.parent / MANIFEST)
    return (stamp.get("fingerprint_version") == str(FINGERPRINT_VERSION)
            and stamp.get("manifest_sha256") == manifest_sha256)


_ENSURED = "fingerprints"      # OpenCorpus.memo key: the checked fingerprint file (None: read-only)


def ensure_fingerprints(corpus: str | Path | OpenCorpus) -> Path | None:
    """The corpus's current fingerprint file, computed and written now when it is missing or stale;
    None when the corpus folder is read-only (nothing cached). Checked once per OpenCorpus."""
    corpus = open_corpus(corpus)                           # CorpusError naming the folder if it is none
    if _ENSURED not in corpus.memo:
        corpus.memo[_ENSURED] = _ensure(corpus)
    return corpus.memo[_ENSURED]


def _ensure(corpus: OpenCorpus) -> Path | None:
    if not is_current(corpus):
        log.info("computing signal fingerprints of %s (once; cached in %s)", corpus, FINGERPRINT_FILE)
        try:
            write_fingerprints(corpus)
        except OSError as e:
            log.warning("%s: cannot cache fingerprints (%s); computed in memory", corpus, e)
            return None
    return corpus.path / FINGERPRINT_FILE


def corpus_fingerprints(corpus: str | Path | OpenCorpus) -> pa.Table:
    """The corpus's fingerprints: its file when current, else computed now and cached beside the
    manifest (kept in memory only when the corpus folder is read-only)."""
    corpus = open_corpus(corpus)
    path = ensure_fingerprints(corpus)
    if path is None:
        return _stamp(compute_fingerprints(corpus), corpus)
    return read_fingerprint_file(path)


def corpus_record(corpus: str | Path | OpenCorpus) -> dict[str, Any]:
    """What a pretraining run's record says of its corpus: where it is, its manifest's sha256, and
    its fingerprint file with that file's sha256 (None when it could not be written)."""
    corpus = open_corpus(corpus)
    path = ensure_fingerprints(corpus)
    root = corpus.path.resolve()
    return {"corpus": str(root), "manifest_sha256": corpus.manifest_sha256,
            "fingerprints": str(root / FINGERPRINT_FILE) if path else None,
            "fingerprints_sha256": corpus.sha256(FINGERPRINT_FILE) if path else None}


def read_fingerprint_file(path: str | Path) -> pa.Table:
    """A fingerprint file (a corpus's, or the copy an export carries); ValueError naming it if foreign."""
    table = pq.read_table(str(path))
    missing = [c for c in FINGERPRINT_COLUMNS if c not in table.column_names]
    if missing or fingerprint_stamp(path).get("fingerprint_version") != str(FINGERPRINT_VERSION):
        raise ValueError(f"{path}: not a coreecg fingerprint file of version {FINGERPRINT_VERSION} "
                         f"(missing columns {missing})")
    return table
