"""How often the below-chance flag fires on runs with no skill at all (issue 54): its interval is
over training runs on one test set, so runs whose scores move alike (networks collapsed the same
way) share that test set's luck, and the flag says "worse than constant outputs on this test set",
not on others (docs/evaluation.md, "Below chance").

    python -m experiments.below_chance_null             # a few seconds

Each cell: a test set like the tiny label-efficiency study's (98 records, 5 classes, multi-label,
random labels) and `runs` runs whose scores are sqrt(rho) x a shared draw + sqrt(1 - rho) x the
run's own, all independent of the labels (true AUROC 0.5 on any other test set). Prints one JSON
line per correlation rho: the share of cells the flag fires in (mean + t_{n-1, 0.975} SD / sqrt(n)
under 0.5, `chance_interval_high`).
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from coreecg.eval.metrics import resample_metrics
from coreecg.eval.tables.table import CHANCE, chance_interval_high


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cells", type=int, default=2000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rho", type=float, nargs="+", default=[0.0, 0.5, 0.9, 0.99])
    args = p.parse_args()
    rng = np.random.default_rng(0)
    ones = np.ones((1, 98))
    for rho in args.rho:
        fired = 0
        for _ in range(args.cells):
            y = rng.random((98, 5)) < rng.uniform(0.1, 0.5, 5)
            shared = rng.normal(size=y.shape)
            auroc = [resample_metrics(y, np.sqrt(rho) * shared + np.sqrt(1 - rho) * rng.normal(size=y.shape), True,
                                      ones)["auroc"][0] for _ in range(args.runs)]
            fired += chance_interval_high(auroc, None) < CHANCE
        print(json.dumps({"rho": rho, "runs": args.runs, "cells": args.cells,
                          "share_flagged": round(fired / args.cells, 4)}), flush=True)


if __name__ == "__main__":
    main()
