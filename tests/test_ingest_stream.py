"""Streamed training ingest (`ShardFiles`, the path above `data.cache_in_memory_gb`): every
rank's share of an epoch, the seeded shuffle, the keep mask, the reader thread's lifetime and a
bad file's error. No Ray: the shard files are written here, each window's first sample = its uid."""
from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.data.corpus import CorpusError, windows_table, write_parquet
from coreecg.train.ingest import ShardFiles, crop, crop_offsets, epoch_batches

SHAPE = (2, 16)
CPU = torch.device("cpu")


def _files(root: Path, rows: list[int], row_group_rows: int = 4, keep: np.ndarray | None = None) -> ShardFiles:
    """Shard files of `rows` windows each; window uid u holds u in every sample."""
    paths, first, u = [], [], 0
    for i, n in enumerate(rows):
        uid = np.arange(u, u + n)
        meta = [{"dataset": "t", "record_id": str(k), "patient_id": str(k), "window_index": 0, "split": "train",
                 "labels": []} for k in uid]
        signals = np.broadcast_to(uid[:, None, None], (n, *SHAPE)).astype(np.float16)
        path = root / f"shard-{i:05d}.parquet"
        write_parquet(windows_table(meta, signals), path, row_group_rows=row_group_rows)
        paths.append(str(path))
        first.append(u)
        u += n
    kept = rows if keep is None else [int(keep[f:f + n].sum()) for f, n in zip(first, rows)]
    return ShardFiles(tuple(paths), tuple(first), tuple(rows), tuple(kept), SHAPE, "float16", keep)


def _epoch(files: ShardFiles, batch: int, epoch: int, rank: int = 0, world: int = 1, shuffle: int = 8,
           seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    sig, uid = zip(*epoch_batches(files, batch, epoch, seed, rank, shuffle, CPU, world))
    return torch.cat(sig), torch.cat(uid)


ROWS = [10, 7, 10, 3, 10, 10]          # 50 windows; files of unequal size, chunks of 4 rows


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_rank_gets_an_equal_disjoint_share_of_the_epoch(tmp_path, world):
    files = _files(tmp_path, ROWS)
    batch = 4
    shares = [_epoch(files, batch, epoch=1, rank=r, world=world) for r in range(world)]
    quota = 50 // world
    seen = []
    for sig, uid in shares:
        assert len(uid) == quota - quota % batch                    # full batches of the rank's quota
        assert sig.dtype == torch.float16 and sig.shape[1:] == SHAPE
        assert torch.equal(sig[:, 0, 0].long(), uid)                 # each row is the window its uid names
        assert torch.equal(sig.amin((1, 2)), sig.amax((1, 2)))
        seen += uid.tolist()
    assert len(seen) == len(set(seen))                               # no window on two ranks
    # the ranks' rows (before dropping partial batches) are the epoch's rows laid end to end
    parts = [files.rank_parts(0, 1, r, world) for r in range(world)]
    assert [sum(b - a for _, a, b in p) for p in parts] == [quota] * world


def test_stream_is_seeded_by_seed_and_epoch_and_mixes_files(tmp_path):
    files = _files(tmp_path, ROWS)
    s0, u0 = _epoch(files, 5, 0)
    s0b, u0b = _epoch(files, 5, 0)
    _, u1 = _epoch(files, 5, 1)
    _, u0_other_seed = _epoch(files, 5, 0, seed=1)
    assert torch.equal(u0, u0b) and torch.equal(s0, s0b)              # same (seed, epoch): same stream
    assert not torch.equal(u0, u1) and not torch.equal(u0, u0_other_seed)
    assert sorted(u0.tolist()) == sorted(u1.tolist()) == list(range(50))
    # the shuffle mixes rows across files: a batch of 5 holds windows of more than one file
    file_of = np.searchsorted(np.cumsum(ROWS), u0.numpy(), side="right")
    assert max(len(set(file_of[i:i + 5])) for i in range(0, 50, 5)) > 1
    _, plain = _epoch(files, 5, 0, shuffle=0)                        # no shuffle: file order, rows in order
    order = [f for f, _, _ in files.rank_parts(0, 0, 0, 1)]
    assert plain.tolist() == [u for f in order for u in range(files.first_uid[f], files.first_uid[f] + ROWS[f])]


def test_keep_mask_streams_only_kept_windows(tmp_path):
    keep = np.zeros(50, dtype=bool)
    keep[[0, 3, 11, 12, 13, 20, 27, 28, 31, 40, 41, 49]] = True      # file 3 (uids 27..29) keeps one, ...
    files = _files(tmp_path, ROWS, keep=keep)
    assert files.windows == 12
    for world in (1, 2):
        got = sorted(u for r in range(world) for u in _epoch(files, 2, 0, rank=r, world=world)[1].tolist())
        assert got == np.flatnonzero(keep).tolist()


def test_the_reader_threads_end_when_the_loop_stops_early(tmp_path):
    files = _files(tmp_path, [200] * 4, row_group_rows=16)
    batches = epoch_batches(files, 4, 0, 0, 0, 8, CPU)
    next(batches), next(batches)                                      # the loop took what it needed
    readers = [t for t in threading.enumerate() if t.name.startswith("coreecg-ingest")]
    assert readers
    batches.close()
    for t in readers:
        t.join(timeout=5)
    assert not any(t.is_alive() for t in readers)


def test_a_damaged_shard_file_is_an_error_naming_it(tmp_path):
    files = _files(tmp_path, ROWS)
    bad = Path(files.files[2])
    bad.write_bytes(bad.read_bytes()[:200])
    with pytest.raises(CorpusError, match=bad.name):
        _epoch(files, 4, 0)


def test_crop_takes_each_window_at_its_offset():
    x = torch.arange(3 * 2 * 10, dtype=torch.float32).reshape(3, 2, 10)
    off = crop_offsets(torch.tensor([5, 6, 7]), 0, 0, 4)
    out = crop(x, off, 7)
    assert out.shape == (3, 2, 7)
    for b in range(3):
        assert torch.equal(out[b], x[b, :, int(off[b]):int(off[b]) + 7])
    with pytest.raises(ValueError, match="cannot crop 11"):
        crop(x, off, 11)


def test_spaced_read_reads_only_the_row_groups_holding_its_rows(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from coreecg.data.reading import read_split

    files = _files(tmp_path, ROWS)                                   # row groups of 4 rows
    manifest = {"shards": [{"split": "train", "path": Path(f).name, "rows": n} for f, n in zip(files.files, ROWS)],
                "signal": {"shape": list(SHAPE), "dtype": "float16"}, "class_names": []}
    read_groups = []
    real = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups",
                        lambda self, groups, **kw: read_groups.extend(groups) or real(self, groups, **kw))
    for max_windows, stride in ((4, 13), (7, 8), (50, 1)):
        read_groups.clear()
        got = read_split(tmp_path, "train", ["signal"], max_windows=max_windows, manifest=manifest)
        want = np.arange(0, 50, stride)[:max_windows]
        assert got["uid"].tolist() == want.tolist()
        assert got["signal"][:, 0, 0].tolist() == want.tolist()       # the rows of those uids
        if stride > 1:                                                 # one group per spaced row at most
            assert len(read_groups) <= len(want) < sum(-(-n // 4) for n in ROWS)
