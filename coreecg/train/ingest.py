"""Training ingest: a corpus's train split as a Ray Dataset of float16 windows, and the
per-epoch randomness (shuffle, crops) that is reproducible from `train.seed`.

Where the randomness lives, and why:
- Ray Data runs one execution per epoch and gives its functions no epoch number, so a seeded
  operator inside the dataset would repeat itself every epoch. The dataset is therefore fixed
  (shard files in a seeded random order, each window tagged with a stable `uid`), and the
  per-epoch randomness is applied where the epoch is known, on each worker:
  * shuffle: Ray's local shuffle buffer (`data.shuffle_buffer` rows, mixing across shard files),
    seeded by (seed, epoch, rank);
  * crop: a 2,250-sample window of each 2,500-sample row at an offset that is a hash of
    (seed, epoch, uid): fresh every epoch, identical between runs, and independent of which
    worker or batch the row lands in. It is one batched gather on the training device.
- float16 stays float16 until the batch is on the training device (half the bytes through
  the object store and the host-to-device copy); `to_model_input` casts there.
With one worker the whole sample stream is reproducible. With several, Ray's streaming split
hands blocks to whichever worker asks first, so the global set per epoch is fixed but its
assignment to ranks is not (docs/training.md).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from coreecg.data.corpus import decode_signals, load_manifest, split_files
from coreecg.data.reading import read_shard
from coreecg.devices import to_device


def seed_for(*parts: object) -> int:
    """A 62-bit seed from any tuple of ints/strings (stable across processes and Python runs)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 2


def _splitmix64(z: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrapping arithmetic; masks emulate logical shifts)."""
    z = (z ^ ((z >> 30) & 0x3FFFFFFFF)) * -4658895280553007687
    z = (z ^ ((z >> 27) & 0x1FFFFFFFFF)) * -7723592293110705685
    return z ^ ((z >> 31) & 0x1FFFFFFFF)


def crop_offsets(uid: torch.Tensor, seed: int, epoch: int, n_offsets: int) -> torch.Tensor:
    """Crop start of every window: uniform on [0, n_offsets), a pure function of (seed, epoch, uid).

    uid: (B,) int64 on any device -> (B,) int64 on the same device.
    """
    key = seed_for("crop", seed, epoch)
    return (_splitmix64(uid.long() + key) & 0x7FFFFFFFFFFF) % n_offsets


def crop(x: torch.Tensor, offsets: torch.Tensor, length: int) -> torch.Tensor:
    """(B, C, T) -> (B, C, length), window b starting at offsets[b]; one gather, no loop."""
    B, C, T = x.shape
    if length > T:
        raise ValueError(f"cannot crop {length} samples from windows of {T}")
    idx = offsets.to(x.device)[:, None] + torch.arange(length, device=x.device)[None, :]
    return torch.take_along_dim(x, idx[:, None, :].expand(B, C, length), dim=2)


def to_model_input(signal: torch.Tensor, uid: torch.Tensor, seed: int, epoch: int, length: int) -> torch.Tensor:
    """A stored batch (B, C, T_stored), any float dtype, on the training device -> the epoch's
    crops as float32 (B, C, length)."""
    offsets = crop_offsets(uid, seed, epoch, signal.shape[-1] - length + 1)
    return crop(signal, offsets, length).float()


# ---------------------------------------------------------------------------- Ray Data


def _read_shard(batch: dict[str, np.ndarray], shape: tuple[int, ...], dtype: str,
                keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """map_batches fn: one shard file -> {"signal": (n, C, T) stored dtype, "uid": (n,) int64},
    only the rows whose uid is True in `keep` (the split's (N,) bool mask) when given."""
    path, first_uid = str(batch["path"][0]), int(batch["first_uid"][0])
    table = read_shard(path, ["signal"])
    uid = np.arange(first_uid, first_uid + table.num_rows, dtype=np.int64)
    if keep is not None:
        rows = np.flatnonzero(keep[uid])
        table, uid = table.take(rows), uid[rows]
    signal = decode_signals(table.column("signal"), shape, dtype, as_stored=True)
    return {"signal": signal, "uid": uid}


def training_dataset(corpus: str | Path, seed: int, cache_in_memory_gb: float = 2.0, split: str = "train",
                     keep: np.ndarray | None = None):
    """The split's windows as a Ray Dataset of {"signal": (C, T) float16, "uid": int64} (uids
    numbered as `coreecg.data.reading.read_split` numbers them).

    One block per shard file, in an order shuffled once with `seed`. A split smaller than
    `cache_in_memory_gb` is materialised in the object store, so epochs re-read no Parquet.
    keep: (N,) bool over the split's uids (e.g. a label-efficiency subset); None keeps all.
    """
    import ray.data

    manifest = load_manifest(corpus)
    files = split_files(corpus, split, manifest)
    rows = [s["rows"] for s in manifest["shards"] if s["split"] == split]
    starts = np.concatenate([[0], np.cumsum(rows)[:-1]]).astype(int)
    items = [{"path": str(f), "first_uid": int(u)} for f, u in zip(files, starts)]
    kept_rows = list(rows)
    if keep is not None:
        keep = np.asarray(keep, dtype=bool)
        if keep.shape != (sum(rows),):
            raise ValueError(f"{corpus}: keep mask of shape {keep.shape} for {sum(rows)} {split} windows")
        kept_rows = [int(keep[u:u + r].sum()) for u, r in zip(starts, rows)]
        items = [it for it, r in zip(items, kept_rows) if r]     # files with no kept row: not read
    order = np.random.default_rng(seed_for("file-order", seed)).permutation(len(items))
    ds = ray.data.from_items([items[i] for i in order], override_num_blocks=len(items))
    ds = ds.map_batches(_read_shard, batch_size=1,
                        fn_kwargs={"shape": tuple(manifest["signal"]["shape"]), "dtype": manifest["signal"]["dtype"],
                                   "keep": keep})
    nbytes = sum(kept_rows) * int(np.prod(manifest["signal"]["shape"])) * np.dtype(manifest["signal"]["dtype"]).itemsize
    if nbytes < cache_in_memory_gb * 2**30:
        ds = ds.materialize()
    return ds


FETCH_ROWS = 256   # rows per Ray batch: Ray's shuffling batcher costs per batch, not per row


def epoch_batches(shard, batch_size: int, epoch: int, seed: int, rank: int, shuffle_buffer: int,
                  device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of a worker's Ray Data shard: (signal (b, C, T) float16, uid (b,)) on `device`.

    Rows arrive from Ray in batches of a multiple of `batch_size` of at least FETCH_ROWS and are
    sliced on the device (measured 12.4k -> about 19k windows/s at a batch of 32); as with
    drop_last, only a final partial batch is dropped.
    """
    kwargs = {"pin_memory": True} if device.type == "cuda" else {}   # async host-to-device copies
    if shuffle_buffer > 0:
        kwargs.update(local_shuffle_buffer_size=max(shuffle_buffer, batch_size),
                      local_shuffle_seed=seed_for("shuffle", seed, epoch, rank) % 2**31)
    fetch = batch_size * max(1, -(-FETCH_ROWS // batch_size))
    for batch in shard.iter_torch_batches(batch_size=fetch, drop_last=False, device=device,
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
