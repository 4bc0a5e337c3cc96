"""Training ingest: a corpus's train split as float16 windows for the workers, and the
per-epoch randomness (shuffle, crops) that is reproducible from `train.seed`.

Two paths (`training_dataset` picks by `data.cache_in_memory_gb`):
- a split that fits is a Ray Dataset materialised in the object store (one block per shard
  file, each window tagged with a stable `uid`); Ray Train splits it between workers, and each
  shuffles with Ray's local shuffle buffer seeded by (seed, epoch, rank);
- a larger split is `ShardFiles`: every worker streams its own equal share of the epoch's rows
  from the shard files with pyarrow (reader threads, seeded groups of `data.shuffle_buffer`
  rows). Ray Data's per-row streaming (read tasks, split coordinator, shuffling batcher) ran at
  0.11x of plain pyarrow here; this path is bound by pyarrow's read.
Why the randomness lives on the worker: Ray Data runs one execution per epoch and gives its
functions no epoch number, so a seeded operator inside the dataset would repeat itself every
epoch. The crop is a 2,250-sample window of each 2,500-sample row at an offset that is a hash of
(seed, epoch, uid): fresh every epoch, identical between runs, and independent of which worker
or batch the row lands in; it is one batched copy on the training device.
float16 stays float16 until the batch is on the training device (half the bytes through the
object store and the host-to-device copy); `to_model_input` casts there.
Reproducibility: with one worker either path's stream is reproducible; streamed, so is every
rank's with several. Materialised with several, Ray's streaming split hands blocks to whichever
worker asks first, so the global set per epoch is fixed but its assignment to ranks is not
(docs/training.md).
"""
from __future__ import annotations

import hashlib
import itertools
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from coreecg.data.corpus import CorpusError, OpenCorpus, open_corpus, read_shard, read_windows, signal_view
from coreecg.devices import to_device
from coreecg.model.padding import valid_samples

# Lazy imports: ray.data (the `ray` extra): the training modules import without it, so the preflight names the extra.


def seed_for(*parts: object) -> int:
    """A 62-bit seed from any tuple of ints/strings (stable across processes and Python runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic; masks emulate logical shifts)."""
    z = (z ^ ((z >> 30) & 0x3FFFFFFFF)) * -4658895280553007687
    z = (z ^ ((z >> 27) & 0x1FFFFFFFFF)) * -7723592293110705685
    return z ^ ((z >> 31) & 0x1FFFFFFFF)


def crop_offsets(uid: torch.Tensor, seed: int, epoch: int, n_offsets: int | torch.Tensor) -> torch.Tensor:
    """Crop start of every window: uniform on [0, n_offsets), a pure function of (seed, epoch, uid).

    uid: (B,) int64 on any device -> (B,) int64 on the same device; n_offsets an int or (B,) int64.
    """
    key = seed_for("crop", seed, epoch)
    return (_splitmix64(uid.long() + key) & 0x7FFFFFFFFFFF) % n_offsets


def crop(x: torch.Tensor, offsets: torch.Tensor, length: int) -> torch.Tensor:
    """(B, C, T) -> (B, C, length), window b starting at offsets[b]; one gather, no loop."""
    B, C, T = x.shape
    if length > T:
        raise ValueError(f"cannot crop {length} samples from windows of {T}")
    # Index the sliding-window view: one copy kernel, faster than a gather of the same elements
    # (docs/decisions.md).
    return x.unfold(2, length, 1)[torch.arange(B, device=x.device), :, offsets.to(x.device)]


def to_model_input(signal: torch.Tensor, uid: torch.Tensor, seed: int, epoch: int, length: int) -> torch.Tensor:
    """A stored batch (B, C, T_stored), any float dtype, on the training device -> the epoch's
    crops as float32 (B, C, length).

    A short record's window (real samples first, NaN padding after: docs/data_pipeline.md "Short
    records") is cropped so that the crop holds as much real signal as it can: offsets are
    uniform on [0, clamp(real - length, 0, T - length)], i.e. within the real part when it is
    longer than the crop, else 0. The NaN padding stays in the crop (the model's padding mask).
    A full window has real = T: the same offsets as without padding. One elementwise count on
    the device, no sync.
    """
    T = signal.shape[-1]
    n_offsets = (valid_samples(signal) - length + 1).clamp(1, T - length + 1)
    offsets = crop_offsets(uid, seed, epoch, n_offsets)
    return crop(signal, offsets, length).float()


# ---------------------------------------------------------------------------- the split's files


READERS = 2         # shard files read at once by each worker (threads)


@dataclass(frozen=True)
class ShardFiles:
    """A split too large for the object store, streamed by every worker straight from its shard
    files (on storage every node sees) with pyarrow.

    Per epoch, the files are put in an order seeded by (seed, epoch) and their kept rows laid
    end to end; rank r of W takes rows [r*q, (r+1)*q), q = kept // W: the same number of rows on
    every rank (DDP's equal steps), each row on one rank, and the assignment a pure function of
    (seed, epoch, rank, W), so a multi-worker epoch is reproducible too. READERS threads read
    the rank's files ahead of the training step; consecutive files make groups of at least
    `shuffle_buffer` rows, each permuted by (seed, epoch, rank, group) and cut into batches that
    are gathered straight from the Arrow buffers (one copy from file to batch).
    """

    files: tuple[str, ...]
    first_uid: tuple[int, ...]          # uid of each file's first row (split numbering)
    rows: tuple[int, ...]               # rows stored in each file
    kept: tuple[int, ...]               # rows of each file that `keep` keeps
    shape: tuple[int, ...]              # stored window (C, T)
    dtype: str
    # (N,) over uids: bool (kept or not), or ints (copies of each window: coreecg.train.mixture)
    keep: np.ndarray | None = field(default=None, compare=False, repr=False)

    @property
    def windows(self) -> int:
        return sum(self.kept)

    def rank_parts(self, seed: int, epoch: int, rank: int, world: int) -> list[tuple[int, int, int]]:
        """The epoch's rows of one rank: (file index, first, end) over each file's kept rows."""
        order = np.random.default_rng(seed_for("file-order", seed, epoch)).permutation(len(self.files))
        quota = self.windows // world
        lo, hi = rank * quota, (rank + 1) * quota
        parts, at = [], 0
        for f in order:
            a, b = max(at, lo), min(at + self.kept[f], hi)
            if a < b:
                parts.append((int(f), a - at, b - at))
            at += self.kept[f]
        return parts

    def _read(self, f: int, first: int, end: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Kept rows [first, end) of file f: (signal view (n, C, T), uid (n,)) per Arrow chunk."""
        path = self.files[f]
        try:
            col = read_shard(path, ["signal"]).column("signal")
        except (OSError, ValueError, KeyError) as e:   # pyarrow's errors derive from these
            raise CorpusError(f"{path}: cannot read the signal column: {e}") from e
        if col.length() != self.rows[f]:
            raise CorpusError(f"{path}: {col.length()} rows, the manifest says {self.rows[f]}")
        uid = np.arange(self.first_uid[f], self.first_uid[f] + self.rows[f], dtype=np.int64)
        if self.keep is None:
            rows = np.arange(first, end)
        elif self.keep.dtype == bool:
            rows = np.flatnonzero(self.keep[uid])[first:end]
        else:                                           # copies per window (a mixture's epoch draw)
            rows = np.repeat(np.arange(self.rows[f]), self.keep[uid])[first:end]
        parts, at = [], 0
        for chunk in col.chunks:                        # a chunk per row group: views, no copy
            n = len(chunk)
            mine = rows[(rows >= at) & (rows < at + n)] - at
            if len(mine):
                view = signal_view(chunk, self.shape, self.dtype)
                parts.append((view[mine[0]:mine[-1] + 1] if _contiguous(mine) else view[mine], uid[mine + at]))
            at += n
        return parts

    def epoch_batches(self, batch_size: int, epoch: int, seed: int, rank: int, world: int,
                      shuffle_buffer: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """One epoch of rank `rank` of `world`: (signal (b, C, T) float16, uid (b,)) on `device`;
        as with drop_last, only a final partial batch is dropped."""
        parts = self.rank_parts(seed, epoch, rank, world)
        group_rows = max(shuffle_buffer, batch_size)
        per_file = max(1, self.windows // max(1, len(self.files)))
        ahead = READERS + -(-group_rows // per_file)        # files in flight: the next group's, and more
        pending: list[tuple[np.ndarray, np.ndarray]] = []   # this group's chunks: (signal view, uid)
        n, g = 0, 0
        carry: tuple[np.ndarray, np.ndarray] | None = None   # < batch_size rows left from a group
        for i, chunks in enumerate(_read_ahead(self._read, parts, READERS, ahead)):
            pending += chunks
            n += sum(len(u) for _, u in chunks)
            if n < group_rows and i < len(parts) - 1:
                continue
            group = _Group(pending)
            order = (np.random.default_rng(seed_for("shuffle", seed, epoch, rank, g)).permutation(n)
                     if shuffle_buffer > 0 else np.arange(n))
            pending, n, g = [], 0, g + 1
            if carry is not None:                           # complete the last group's partial batch
                head, order = order[:batch_size - len(carry[1])], order[batch_size - len(carry[1]):]
                carry = tuple(np.concatenate([c, x]) for c, x in zip(carry, group.take(head)))
                if len(carry[1]) < batch_size:               # this group was smaller still
                    continue
                yield _to(carry[0], device), _to(carry[1], device)
                carry = None
            full = len(order) - len(order) % batch_size
            for j in range(0, full, batch_size):
                signal, uid = group.take(order[j:j + batch_size])
                yield _to(signal, device), _to(uid, device)
            if full < len(order):
                carry = group.take(order[full:])


class _Group:
    """A shuffle group: the Arrow chunks of consecutive files, read without copying; `take`
    gathers rows straight from them (the one copy between the file and the batch)."""

    def __init__(self, chunks: list[tuple[np.ndarray, np.ndarray]]):
        self.views = [v for v, _ in chunks]
        sizes = [len(u) for _, u in chunks]
        self.uid = np.concatenate([u for _, u in chunks])
        self.chunk = np.repeat(np.arange(len(chunks)), sizes)
        self.row = np.arange(len(self.uid)) - np.repeat(np.cumsum(sizes) - sizes, sizes)

    def take(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows `idx` of the group: (signal (b, C, T), uid (b,)), grouped by chunk (the batch
        holds the same rows in a fixed order; one np.take per chunk, written in place)."""
        idx = idx[np.argsort(self.chunk[idx], kind="stable")]
        chunk, row = self.chunk[idx], self.row[idx]
        view0 = self.views[0]
        out = np.empty((len(idx), *view0.shape[1:]), dtype=view0.dtype.newbyteorder("="))
        starts = np.flatnonzero(np.diff(chunk, prepend=-1))
        for s, e in zip(starts, [*starts[1:], len(idx)]):
            np.take(self.views[chunk[s]], row[s:e], axis=0, out=out[s:e], mode="clip")   # clip: unbuffered
        return out, self.uid[idx]


def _read_ahead(read, parts: list[tuple], workers: int, ahead: int) -> Iterator:
    """read(*part) for every part, in order, on `workers` threads with up to `ahead` parts read
    ahead of the consumer: files are read while the training step runs (pyarrow releases the GIL).
    Closing the generator cancels what has not started."""
    pool = ThreadPoolExecutor(workers, thread_name_prefix="coreecg-ingest")
    todo, running = iter(parts), deque()
    try:
        for part in itertools.islice(todo, ahead):
            running.append(pool.submit(read, *part))
        while running:
            result = running.popleft().result()
            for part in itertools.islice(todo, 1):
                running.append(pool.submit(read, *part))
            yield result
    finally:
        for future in running:
            future.cancel()
        pool.shutdown(wait=False)


def _contiguous(rows: np.ndarray) -> bool:
    """Whether sorted `rows` are consecutive (a row drawn twice is not)."""
    return int(rows[-1]) - int(rows[0]) + 1 == len(rows) and (len(rows) < 2 or bool(np.all(np.diff(rows) == 1)))


def _to(a: np.ndarray, device: torch.device) -> torch.Tensor:
    return to_device(torch.from_numpy(a), device)


# ---------------------------------------------------------------------------- the dataset


def training_dataset(corpus: str | Path | OpenCorpus, seed: int, cache_in_memory_gb: float = 2.0, split: str = "train",
                     keep: np.ndarray | None = None, materialise: bool = True):
    """The split's windows ({"signal": (C, T) float16, "uid": int64}, uids numbered as
    `coreecg.data.reading.read_split` numbers them) for training, in one of two forms:

    - below `cache_in_memory_gb`: a Ray Dataset materialised in the object store (one block per
      shard file, in an order shuffled once with `seed`), shared by the workers of a node, so
      epochs re-read no Parquet; Ray Train splits it between workers;
    - otherwise `ShardFiles`: each worker streams its share of the files itself (see there; Ray
      Data's streaming pipeline was measured at 0.11x of plain pyarrow's rate on this path,
      docs/performance.md).
    keep: (N,) bool over the split's uids (e.g. a label-efficiency subset); None keeps all.
    corpus: a path, or the run's opened corpus (its manifest and shard list are not read again).
    materialise=False: the Ray Dataset is returned before it is materialised (the driver of a
    Ray Train fit materialises it beside the worker group's start: coreecg.train.data_handoff).
    """
    corpus = open_corpus(corpus)
    files = corpus.split_files(split)
    rows = corpus.shard_rows(split)
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(int)
    kept_rows = list(rows)
    if keep is not None:
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (sum(rows),):
            raise ValueError(f"{corpus}: keep mask of shape {keep.shape} for {sum(rows)} {split} windows")
        kept_rows = [int(keep[u:u + r].sum()) for u, r in zip(starts, rows)]
    shape, dtype = corpus.signal_shape, corpus.signal_dtype
    nbytes = sum(kept_rows) * int(np.prod(shape)) * np.dtype(dtype).itemsize
    if nbytes >= cache_in_memory_gb * 2**30:
        return ShardFiles(tuple(str(f) for f in files), tuple(int(u) for u in starts), tuple(rows),
                          tuple(kept_rows), shape, dtype, keep)

    import ray.data

    items = [{"path": str(f), "first_uid": int(u)} for f, u in zip(files, starts)]
    items = [it for it, r in zip(items, kept_rows) if r]     # files with no kept row: not read
    order = np.random.default_rng(seed_for("file-order", seed)).permutation(len(items))
    ds = ray.data.from_items([items[i] for i in order], override_num_blocks=len(items))
    ds = ds.map_batches(read_windows, batch_size=1, fn_kwargs={"shape": shape, "dtype": dtype, "keep": keep})
    return ds.materialize() if materialise else ds


def local_source(data):
    """What a single process (a Tune trial, a study cell) iterates: a materialised dataset's
    iterator, or the `ShardFiles` themselves."""
    return data if isinstance(data, ShardFiles) else data.iterator()


FETCH_ROWS = 256   # rows per Ray batch: Ray's shuffling batcher costs per batch, not per row


def epoch_batches(source, batch_size: int, epoch: int, seed: int, rank: int, shuffle_buffer: int,
                  device: torch.device, world: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of a worker's data: (signal (b, C, T) float16, uid (b,)) on `device`.

    source: `ShardFiles` (streamed; `world` workers share each epoch), or a worker's Ray Data
    shard / iterator of a materialised dataset. From Ray, rows arrive in batches of a multiple of
    `batch_size` of at least FETCH_ROWS and are sliced on the device (measured 12.4k -> about
    19k windows/s at a batch of 32); as with drop_last, only a final partial batch is dropped.
    """
    if isinstance(source, ShardFiles):
        yield from source.epoch_batches(batch_size, epoch, seed, rank, world, shuffle_buffer, device)
        return
    kwargs = {"pin_memory": True} if device.type == "cuda" else {}   # async host-to-device copies
    if shuffle_buffer > 0:
        kwargs.update(local_shuffle_buffer_size=max(shuffle_buffer, batch_size),
                      local_shuffle_seed=seed_for("shuffle", seed, epoch, rank) % 2**31)
    fetch = batch_size * max(1, -(-FETCH_ROWS // batch_size))
    for batch in source.iter_torch_batches(batch_size=fetch, drop_last=False, device=device,
                                           dtypes={"signal": torch.float16, "uid": torch.int64},
                                           prefetch_batches=1, **kwargs):   # >1 reorders batches
        signal, uid = batch["signal"], batch["uid"]
        for i in range(0, len(uid) - batch_size + 1, batch_size):
            yield signal[i:i + batch_size], uid[i:i + batch_size]


def memory_epoch_batches(windows: torch.Tensor, batch_size: int, epoch: int, seed: int,
                         device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The same contract without Ray, for in-memory windows (n, C, T): a seeded permutation per
    epoch, uid = row index (the plain reference loop and benchmarks)."""
    gen = torch.Generator().manual_seed(seed_for("shuffle", seed, epoch, 0) % 2**63)
    perm = torch.randperm(len(windows), generator=gen)
    for i in range(len(windows) // batch_size):
        idx = perm[i * batch_size:(i + 1) * batch_size]
        yield to_device(windows[idx], device), to_device(idx, device)
