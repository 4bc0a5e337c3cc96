"""How long the patient bootstrap takes (the figure in `bootstrap_ci`'s docstring).

    python -m experiments.bootstrap_ci               # 3,000 records, 1,500 patients, 1,000 resamples

Random labels and scores of the paper's two shapes: single-label with 9 classes (ICBEB2018) and
multi-label with 25 (Ningbo). Prints one JSON object of seconds per call.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from coreecg.eval.metrics import bootstrap_ci


def fake_set(n: int, n_classes: int, multilabel: bool, rng: np.random.Generator):
    if multilabel:
        y = (rng.random((n, n_classes)) < 0.1).astype(int)
    else:
        y = np.eye(n_classes, dtype=int)[rng.integers(0, n_classes, n)]
    probs = np.clip(0.6 * y + rng.random((n, n_classes)) * 0.6, 0, 1)
    return y, probs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=3000)
    p.add_argument("--patients", type=int, default=1500)
    p.add_argument("--resamples", type=int, default=1000)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    patients = rng.permutation(np.arange(args.records) * args.patients // args.records)
    out = {"records": args.records, "patients": args.patients, "resamples": args.resamples}
    for name, n_classes, multilabel in (("single_label_9", 9, False), ("multi_label_25", 25, True)):
        y, probs = fake_set(args.records, n_classes, multilabel, rng)
        t = time.perf_counter()
        names = [f"c{k}" for k in range(n_classes)]
        bootstrap_ci(y, probs, patients, multilabel, names, n_resamples=args.resamples)
        out[f"{name}_s"] = round(time.perf_counter() - t, 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
