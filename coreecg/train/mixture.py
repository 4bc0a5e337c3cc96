"""Pretraining on a mixture of corpora (`data.corpus` a list, `data.corpus_weights`), docs/mixtures.md.

Resolved once on the driver (`resolve_mixture`, called by the pretraining planner):
- every corpus's manifest `preprocess` (and stored signal shape and dtype) must equal the first's:
  otherwise a MixtureError naming both corpora and the key;
- a recording that is in an earlier corpus of the list (the same fingerprint,
  coreecg.data.fingerprints, matched as the leakage guard matches them) is used once: every train
  window of that recording in the later corpus is dropped (the same corpus listed twice: all of
  the second); the plan and run.json say how many, from which corpus, duplicates of which;
- weights: `data.corpus_weights`, else proportional to each corpus's train windows (after
  dropping duplicates). The epoch holds as many windows as the corpora together (N); corpus c
  gets quota q_c = w_c * N windows (largest-remainder rounding, so the quotas sum to N).

Per epoch (`Mixture.draw`, a pure function of (seed, epoch)): corpus c's q_c windows are drawn
without replacement within a pass: every kept window floor(q_c / n_c) times, and q_c mod n_c
of them, chosen at random, once more. A corpus weighted up repeats its windows evenly (a copy
shares its uid, hence its crop, within the epoch; masks differ); a corpus weighted down shows
a fresh random subset every epoch. The draw is then streamed like any large split
(`MixtureFiles`, a `coreecg.train.ingest.ShardFiles` over every corpus's train files whose
per-epoch `keep` is the number of copies of each window): the rank shares are a pure function
of (seed, epoch, rank, world), so the rows drawn, and every rank's share, do not depend on the
number of workers beyond the split itself. uids number the corpora's train windows end to end
(corpus c's local uid + offsets[c]): unique across corpora.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import torch

from coreecg.data.corpus import OpenCorpus, open_corpora
from coreecg.data.fingerprints import corpus_fingerprints
from coreecg.data.overlap import only_splits, signal_windows
from coreecg.train.ingest import ShardFiles, seed_for

log = logging.getLogger(__name__)


class MixtureError(ValueError):
    """A mixture that cannot be trained on (the message names the corpora and the key)."""


@dataclass(frozen=True)
class Mixture:
    """A resolved mixture. `keep` (per corpus, (stored,) bool over its train uids; None: all)
    stays where the draw is made (the driver and the streamed files); `to_dict` leaves it out."""

    corpora: tuple[str, ...]                # resolved paths, in data.corpus order
    stored: tuple[int, ...]                 # train windows stored in each corpus
    sizes: tuple[int, ...]                  # train windows used (duplicates dropped)
    weights: tuple[float, ...]              # normalised to sum 1
    quotas: tuple[int, ...]                 # windows drawn from each corpus per epoch
    duplicates: tuple[dict, ...] = ()       # per corpus: what was dropped, duplicates of which
    weights_given: bool = False             # data.corpus_weights (False: proportional to size)
    keep: tuple[np.ndarray | None, ...] | None = field(default=None, compare=False, repr=False)

    @property
    def offsets(self) -> np.ndarray:
        """(n_corpora + 1,) first global uid of each corpus, and the total."""
        return np.concatenate([[0], np.cumsum(self.stored)]).astype(np.int64)

    @property
    def epoch_windows(self) -> int:
        return int(sum(self.quotas))

    def names(self) -> list[str]:
        """Short names for logs and figures: folder names, numbered where two are alike."""
        base = [Path(c).name for c in self.corpora]
        return [f"{b}#{i + 1}" if base.count(b) > 1 else b for i, b in enumerate(base)]

    def corpus_of(self, uid: torch.Tensor, bounds: torch.Tensor | None = None) -> torch.Tensor:
        """Index of the corpus of each global uid (any device); bounds: `self.bounds(device)`, kept."""
        bounds = self.bounds(uid.device) if bounds is None else bounds
        return torch.bucketize(uid.long(), bounds, right=True)

    def bounds(self, device: torch.device) -> torch.Tensor:
        """The first uid of every corpus but the first, on `device` (for `corpus_of`)."""
        return torch.as_tensor(self.offsets[1:-1], device=device)

    def draw(self, seed: int, epoch: int) -> np.ndarray:
        """(total stored,) int32: copies of every window in the epoch (0: not drawn)."""
        if self.keep is None:
            raise MixtureError("the mixture's keep masks stay on the driver; draw from the driver's mixture")
        counts = np.zeros(int(self.offsets[-1]), np.int32)
        for c, (lo, quota) in enumerate(zip(self.offsets[:-1], self.quotas)):
            keep = self.keep[c]
            kept = np.flatnonzero(keep) if keep is not None else np.arange(self.stored[c])
            counts[lo + kept] = corpus_counts(seed, epoch, c, len(kept), quota)
        return counts

    def record(self) -> dict[str, Any]:
        """What the plan, run.json and metrics.jsonl's first line say of the mixture."""
        return {"corpora": [{"corpus": c, "stored_train_windows": s, "train_windows": n, "weight": round(w, 6),
                             "windows_per_epoch": q, **(d or {})}
                            for c, s, n, w, q, d in zip(self.corpora, self.stored, self.sizes, self.weights,
                                                        self.quotas, self.duplicates or [None] * len(self.corpora))],
                "weights": "data.corpus_weights" if self.weights_given else "proportional to train windows",
                "epoch_windows": self.epoch_windows}

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(dataclasses.replace(self, keep=None))
        d.pop("keep")
        return json.loads(json.dumps(d))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Mixture":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()})


def corpus_counts(seed: int, epoch: int, corpus: int, n: int, quota: int) -> np.ndarray:
    """(n,) copies of each of a corpus's n kept windows in an epoch that draws `quota` of them:
    floor(quota / n) each, plus one for quota mod n windows drawn without replacement, seeded by
    (seed, epoch, corpus)."""
    if n == 0:
        if quota:
            raise MixtureError(f"corpus {corpus}: {quota} windows to draw from none")
        return np.zeros(0, np.int32)
    full, rest = divmod(int(quota), n)
    counts = np.full(n, full, np.int32)
    if rest:
        rng = np.random.default_rng(seed_for("mixture", seed, epoch, corpus))
        counts[rng.choice(n, rest, replace=False)] += 1
    return counts


def quotas(sizes: Sequence[int], weights: Sequence[float]) -> list[int]:
    """Windows per corpus in an epoch of sum(sizes) windows, in proportion to `weights`
    (largest remainder: the quotas sum to the epoch exactly, each within 1 of w_c * N)."""
    total = int(sum(sizes))
    w = np.asarray(weights, float) / float(np.sum(weights))
    exact = w * total
    out = np.floor(exact).astype(int)
    for i in np.argsort(-(exact - out), kind="stable")[:total - int(out.sum())]:
        out[i] += 1
    return [int(x) for x in out]


# ---------------------------------------------------------------------------- resolving


def check_preprocessing(corpora: Sequence[str | Path | OpenCorpus], manifests: Sequence[dict[str, Any]]) -> None:
    """MixtureError naming both corpora and the key when a corpus is preprocessed (or stored)
    other than the first of the list."""
    def described(m: dict[str, Any]) -> dict[str, Any]:
        out = {f"preprocess.{k}": v for k, v in (m.get("preprocess") or {}).items()}
        signal = m.get("signal") or {}
        out.update({f"signal.{k}": signal.get(k) for k in ("shape", "dtype", "leads")})
        return out

    first = described(manifests[0])
    for corpus, m in zip(corpora[1:], manifests[1:]):
        other = described(m)
        for key in sorted(set(first) | set(other)):
            if json.dumps(first.get(key)) != json.dumps(other.get(key)):
                raise MixtureError(
                    f"data.corpus: {corpora[0]} and {corpus} differ in {key} ({first.get(key)!r} vs "
                    f"{other.get(key)!r}); the corpora of a mixture must be preprocessed alike (rebuild one "
                    "with the other's data.preprocess)")


def duplicate_windows(corpora: Sequence[Path | OpenCorpus],
                      stored: Sequence[int]) -> tuple[list[np.ndarray | None], list[dict]]:
    """Per corpus: the keep mask over its train uids (None: all kept) and what was dropped.

    Corpus j loses every train window of a recording with a window whose fingerprint matches a
    kept train window of corpora 0..j-1 (coreecg.data.overlap.signal_windows: the leakage
    guard's match). The same folder listed again loses all of its windows. corpora: paths, or the
    plan's opened corpora (their fingerprint files are then checked once)."""
    keeps: list[np.ndarray | None] = []
    notes: list[dict] = []
    tables: list[pa.Table | None] = []   # each earlier corpus's kept train fingerprints
    n_records: list[int] = []            # train recordings of each corpus
    for j, corpus in enumerate(corpora):
        first = [i for i in range(j) if str(corpora[i]) == str(corpus)]
        if first:
            keeps.append(np.zeros(stored[j], bool))
            notes.append({"dropped_windows": int(stored[j]), "dropped_records": n_records[first[0]],
                          "duplicate_of": {str(corpora[first[0]]): int(stored[j])}})
            tables.append(None)
            n_records.append(n_records[first[0]])
            continue
        table = only_splits(corpus_fingerprints(corpus), ["train"])
        if table.num_rows != stored[j]:
            raise MixtureError(f"{corpus}: fingerprints hold {table.num_rows} train windows, the manifest {stored[j]}")
        records = np.asarray(table.column("dataset").to_numpy(zero_copy_only=False), dtype=object) + "\x1f" + \
            np.asarray(table.column("record_id").to_numpy(zero_copy_only=False), dtype=object)
        keep, dup_of = _in_earlier(table, records, tables[:j], [str(c) for c in corpora[:j]])
        n_records.append(int(len(np.unique(records))))
        dropped = int((~keep).sum())
        notes.append({"dropped_windows": dropped,
                      "dropped_records": int(len(np.unique(records[~keep]))), "duplicate_of": dup_of})
        keeps.append(None if dropped == 0 else keep)
        tables.append(table.filter(pa.array(keep)) if dropped else table)
        if dropped:
            log.warning("mixture: %d train window(s) of %s (%d recording(s)) are in an earlier corpus and are "
                        "left out: %s", dropped, corpus, notes[-1]["dropped_records"], dup_of)
    return keeps, notes


def _in_earlier(table, records: np.ndarray, earlier: list, names: list[str]) -> tuple[np.ndarray, dict[str, int]]:
    """One corpus's train fingerprints (`table`; records: each window's dataset + record id) against
    the earlier corpora's kept ones -> (the keep mask: False for every window of a recording with a
    window matching one of theirs; windows dropped per earlier corpus, by name)."""
    keep = np.ones(table.num_rows, bool)
    dup_of: dict[str, int] = {}
    for name, kept in zip(names, earlier):
        if kept is None or not kept.num_rows:
            continue
        _, rows_b, _ = signal_windows(kept, table)
        hit = np.isin(records, np.unique(records[rows_b])) & keep if len(rows_b) else np.zeros(len(keep), bool)
        if hit.any():
            dup_of[name] = int(hit.sum())
            keep &= ~hit
    return keep, dup_of


def resolve_mixture(corpora: Sequence[str | Path | OpenCorpus], weights: Sequence[float] = ()) -> Mixture:
    """The mixture of `corpora` (paths, or the planner's opened corpora: nothing is read again) at
    `weights` (empty: proportional to train windows)."""
    opened = open_corpora(c if isinstance(c, OpenCorpus) else Path(c).expanduser().resolve() for c in corpora)
    check_preprocessing(opened, [c.manifest for c in opened])
    for c in opened:
        c.split_files("train")                              # CorpusError naming a corpus without train windows
    stored = [sum(c.shard_rows("train")) for c in opened]
    keeps, notes = duplicate_windows(opened, stored)
    sizes = [s if k is None else int(k.sum()) for s, k in zip(stored, keeps)]
    given = bool(weights)
    w = np.asarray(weights if given else sizes, float)
    if given and any(n == 0 and x > 0 for n, x in zip(sizes, w)):
        empty = [str(c) for c, n, x in zip(opened, sizes, w) if n == 0 and x > 0]
        raise MixtureError(f"data.corpus_weights gives weight to {empty}, which have no train window left "
                           "(all duplicates of an earlier corpus)")
    w = w / w.sum()
    return Mixture(tuple(str(c.path) for c in opened), tuple(stored), tuple(sizes), tuple(float(x) for x in w),
                   tuple(quotas(sizes, w)), tuple(notes), given, tuple(keeps))


# ---------------------------------------------------------------------------- streaming


@dataclass(frozen=True)
class MixtureFiles(ShardFiles):
    """Every corpus's train files as one streamed split (global uids); each epoch streams
    `mixture.draw(seed, epoch)` (copies per window) through ShardFiles' rank shares."""

    mixture: Mixture | None = field(default=None, compare=False, repr=False)

    @property
    def windows(self) -> int:
        return self.mixture.epoch_windows

    def epoch_files(self, seed: int, epoch: int) -> ShardFiles:
        """The epoch as plain ShardFiles whose keep is the number of copies of each window."""
        counts = self.mixture.draw(seed, epoch)
        kept = tuple(int(counts[u:u + r].sum()) for u, r in zip(self.first_uid, self.rows))
        return ShardFiles(self.files, self.first_uid, self.rows, kept, self.shape, self.dtype, counts)

    def rank_parts(self, seed: int, epoch: int, rank: int, world: int) -> list[tuple[int, int, int]]:
        return self.epoch_files(seed, epoch).rank_parts(seed, epoch, rank, world)

    def rank_uids(self, seed: int, epoch: int, rank: int, world: int) -> np.ndarray:
        """The global uids of a rank's share of the epoch (a copy drawn twice appears twice),
        without reading any signal: what `epoch_batches` streams, before its shuffle."""
        files = self.epoch_files(seed, epoch)
        out = []
        for f, first, end in files.rank_parts(seed, epoch, rank, world):
            uid = np.arange(files.first_uid[f], files.first_uid[f] + files.rows[f])
            out.append(np.repeat(uid, files.keep[uid])[first:end])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def epoch_batches(self, batch_size: int, epoch: int, seed: int, rank: int, world: int,
                      shuffle_buffer: int, device: torch.device) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from self.epoch_files(seed, epoch).epoch_batches(batch_size, epoch, seed, rank, world,
                                                               shuffle_buffer, device)


def mixture_files(mixture: Mixture, corpora: Sequence[OpenCorpus] | None = None) -> MixtureFiles:
    """The mixture's train split to stream (always streamed: a per-epoch draw of rows cannot be a
    materialised Ray Dataset, whose epochs repeat one execution). corpora: the mixture's corpora
    as the planner opened them (None: opened here)."""
    paths, first, rows = [], [], []
    shape = dtype = None
    for c, lo in zip(open_corpora(corpora or mixture.corpora), mixture.offsets[:-1]):
        shape, dtype = c.signal_shape, c.signal_dtype
        n = c.shard_rows("train")
        paths += [str(f) for f in c.split_files("train")]
        first += [int(lo + u) for u in np.concatenate([[0], np.cumsum(n)[:-1]])]
        rows += n
    return MixtureFiles(tuple(paths), tuple(first), tuple(rows), tuple(rows), shape, dtype, None, mixture)
