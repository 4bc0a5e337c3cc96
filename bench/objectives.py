"""What the online objectives cost per pretraining evaluation (issue 56): the one embedding pass of
the probe corpus's windows, then each registered objective on those embeddings (the few-label
probe, kNN, RankMe), at the tiny test size and the paper size of the encoder.

    python -m bench.objectives                       # synthetic probe windows, 1,000 per split (the default cap)
    python -m bench.objectives --windows 200 --sizes tiny

Prints one JSON object: per size the encoder's width, seconds to embed both splits, seconds per
objective, and the objectives' share of the evaluation. The encoder is randomly initialised (what
is timed is the work, not the score); windows are the embedded synthetic source's, labelled.
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from coreecg.config import load_config
from coreecg.data import synthetic_windows
from coreecg.encoders import build_encoder
from coreecg.eval.objectives import OBJECTIVES, Embeddings
from coreecg.eval.probe import ProbeData, ProbeSplit, embed

SIZES = {"tiny": ["encoders.coreecg.embed_dim=32", "encoders.coreecg.depth=2", "encoders.coreecg.num_heads=2"],
         "paper": []}


def split(windows: np.ndarray, labels: np.ndarray, k: int) -> ProbeSplit:
    return ProbeSplit(windows, np.eye(k, dtype=np.float32)[labels], labels.astype(np.int64))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--windows", type=int, default=1000, help="probe windows per split (data.probe_max_windows)")
    p.add_argument("--sizes", default="tiny,paper")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    windows, meta = synthetic_windows(2 * args.windows, seed=0)
    labels = np.asarray(meta, dtype=np.int64)
    k = int(labels.max()) + 1
    data = ProbeData(split(windows[: args.windows], labels[: args.windows], k),
                     split(windows[args.windows:], labels[args.windows:], k), [f"c{i}" for i in range(k)],
                     False, "synthetic")
    out = {"windows_per_split": args.windows, "threads": torch.get_num_threads(), "load": os.getloadavg()[0]}
    for size in args.sizes.split(","):
        cfg = load_config(overrides=SIZES[size])
        encoder = build_encoder(cfg)
        t0 = time.perf_counter()
        train_x = embed(encoder, data.train.windows, cfg.data.crop_samples, torch.device("cpu"))
        val_x = embed(encoder, data.val.windows, cfg.data.crop_samples, torch.device("cpu"))
        t_embed = time.perf_counter() - t0
        e = Embeddings(train_x, val_x, data, cfg.data.probe_labels_per_class, cfg.data.probe_subsets)
        per = {}
        for name, o in OBJECTIVES.items():
            t0 = time.perf_counter()
            o.compute(e)
            per[name] = time.perf_counter() - t0
        total = t_embed + sum(per.values())
        out[size] = {"width": int(train_x.shape[1]), "embed_s": t_embed, "objective_s": per,
                     "knn_and_rankme_share_of_evaluation": (per.get("knn_auroc", 0) + per.get("rankme", 0)) / total}
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
