"""Identical runs are not testable (issue 54): how often a comparison of n runs against m runs that
all give one and the same prediction (a class prior learned by every run, as at the tiny
label-efficiency study's 10 %) is counted testable by the run-level rule, whose SE then holds
only the rounding of the runs' means (docs/evaluation.md, "Not testable").

    python -m experiments.zero_variance                 # about 20 s on 2 busy cores

Each case: a test set like the tiny study's (98 records of 88 patients, 5 classes, multi-label,
random labels) and one constant-output run (per class a probability drawn in [0.3, 0.7], the same
on every record); the reference has n copies of it, the other method m. Prints one JSON line per
(n, m) and metric: the share of cases whose `run_level_se` SE is above 0 (goal 0), the largest SE.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from coreecg.eval.metrics import patient_resample_weights, resample_metrics
from coreecg.eval.significance import run_level_se


def case(rng: np.random.Generator, n_resamples: int) -> dict[str, np.ndarray]:
    """One test set and one constant-output run: {metric: (1 + B,) full-set value, then resamples}."""
    patients = np.r_[np.arange(88), np.arange(10)]
    y = rng.random((len(patients), 5)) < rng.uniform(0.05, 0.5, 5)
    probs = np.broadcast_to(rng.uniform(0.3, 0.7, 5), y.shape)
    w = np.vstack([np.ones((1, len(y))), patient_resample_weights(patients, n_resamples, rng)])
    return resample_metrics(y, probs, True, w)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--resamples", type=int, default=200)
    p.add_argument("--designs", default="3x3,4x3,5x3,5x5", help="n x m runs, comma-separated")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    cases = [case(rng, args.resamples) for _ in range(args.cases)]
    for design in args.designs.split(","):
        n, m = map(int, design.split("x"))
        for metric in ("acc", "f1"):
            se = []
            for c in cases:
                x = c[metric]
                if np.isnan(x).any():
                    continue
                runs = {k: np.tile(x, (k, 1)) for k in (n, m)}
                se.append(run_level_se(runs[n][:, 0], runs[m][:, 0], runs[n][:, 1:], runs[m][:, 1:])[1])
            se = np.array(se)
            print(json.dumps({"design": f"{n} v {m}", "metric": metric, "cases": len(se),
                              "share_testable": round(float(np.mean(se > 0)), 4),
                              "largest_se": float(se.max())}), flush=True)


if __name__ == "__main__":
    main()
