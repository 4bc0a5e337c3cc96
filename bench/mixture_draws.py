"""Pretraining mixtures: windows drawn per corpus per epoch against the target proportions
(coreecg.train.mixture, docs/mixtures.md). Prints JSON.

    python -m bench.mixture_draws                              # two synthetic corpora (200 and 600 records), 3:1
    python -m bench.mixture_draws --corpus corpora/ptbxl --corpus corpora/cpsc --weights 1 1 --epochs 5

The sampler only (no training, no signal read): per epoch, each corpus's windows (what
metrics.jsonl's "drawn" says), its share of the epoch against the target weight, the distinct
windows it showed and how many it showed more than once, and for each --world the windows per
rank per corpus with a check that the ranks' shares, laid end to end, are the 1-worker epoch's
rows (the draw does not depend on the worker count). Without --corpus, two synthetic corpora
are built under --cache (in this process, no Ray) from different seeds.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


class _InProcess:
    """ray.data.from_items(...).map(fn).take_all() in this process (a small corpus needs no cluster)."""

    def __init__(self, items):
        self.items = list(items)

    def map(self, fn, fn_kwargs=None, **_):
        return _InProcess(fn(item, **(fn_kwargs or {})) for item in self.items)

    def take_all(self):
        return self.items


def synthetic(out: Path, records: int, seed: int) -> Path:
    import ray.data

    from coreecg.config import load_config
    from coreecg.data.pipeline import build_corpus

    if (out / "manifest.json").is_file():
        return out
    cfg = load_config(overrides=["data.shard_records=64", f"data.sources.synthetic_seed={seed}"]).data
    real = ray.data.from_items
    ray.data.from_items = lambda items, **_: _InProcess(items)
    try:
        build_corpus("synthetic", None, out, cfg, source_options=cfg.sources.for_source("synthetic", records),
                     log_warnings=False)
    finally:
        ray.data.from_items = real
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", action="append", help="a corpus folder (twice or more; default: two synthetic ones)")
    p.add_argument("--weights", type=float, nargs="*", default=[3, 1], help="data.corpus_weights (none: by size)")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--world", type=int, nargs="*", default=[2, 3], help="worker counts to split each epoch over")
    p.add_argument("--cache", default="corpora/bench-mixture", help="where the synthetic corpora are built")
    args = p.parse_args()

    from coreecg.train.mixture import mixture_files, resolve_mixture

    corpora = args.corpus or [synthetic(Path(args.cache) / "a-200", 200, 1),
                              synthetic(Path(args.cache) / "b-600", 600, 2)]
    if len(corpora) < 2:
        p.error("give --corpus at least twice")
    mixture = resolve_mixture(corpora, args.weights or ())
    files = mixture_files(mixture)
    names, bounds = mixture.names(), mixture.offsets
    out = {"mixture": mixture.record(), "seed": args.seed, "epochs": []}
    for epoch in range(args.epochs):
        uids = files.rank_uids(args.seed, epoch, 0, 1)
        corpus = np.searchsorted(bounds[1:], uids, side="right")
        row = {"epoch": epoch, "corpora": {}}
        for c, name in enumerate(names):
            mine = uids[corpus == c]
            distinct = np.unique(mine, return_counts=True)[1]
            row["corpora"][name] = {"windows": int(len(mine)), "share": round(len(mine) / len(uids), 4),
                                    "target": round(mixture.weights[c], 4), "distinct": int(len(distinct)),
                                    "repeated": int((distinct > 1).sum()), "train_windows": mixture.sizes[c]}
        for world in args.world:
            shares = [files.rank_uids(args.seed, epoch, r, world) for r in range(world)]
            q = len(shares[0])
            row[f"world_{world}"] = {
                "per_rank": [{n: int((np.searchsorted(bounds[1:], s, side="right") == c).sum())
                              for c, n in enumerate(names)} for s in shares],
                "shares_are_the_1_worker_rows": bool(np.array_equal(np.concatenate(shares), uids[:q * world])),
                "left_over": int(len(uids) - q * world)}
        out["epochs"].append(row)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
