"""How well a patient bootstrap covers one class's AUROC when the class has few positive test
patients (issue 43; docs/evaluation.md, "Rare classes"): the reason for report.min_positive_patients.

A test set of `negatives` negative patients and k positive patients (k = 1, 2, 3, 5, 10, 20),
one record each; scores N(delta, 1) for positives and N(0, 1) for negatives, so the true AUROC is
Phi(delta / sqrt 2). For each of `sets` test sets: the AUROC, and its 95 % percentile interval from
`resamples` patient resamples (coreecg.eval.metrics, the report's bootstrap; resamples without a
positive are left out, as the report leaves them out). Prints one JSON line per k: coverage of the
true AUROC, the mean bootstrap SD against the SD of the AUROC over test sets, and the share of
resamples left out.

    python -m experiments.rare_class_coverage          # about a minute on 2 cores
"""
from __future__ import annotations

import argparse
import json

import numpy as np
from scipy import stats

from coreecg.eval.metrics import _weighted_auroc, patient_resample_weights


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--positives", type=int, nargs="+", default=[1, 2, 3, 5, 10, 20])
    p.add_argument("--negatives", type=int, default=200)
    p.add_argument("--delta", type=float, default=1.0, help="positives' mean score shift (true AUROC 0.76)")
    p.add_argument("--sets", type=int, default=1000)
    p.add_argument("--resamples", type=int, default=500)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    truth = float(stats.norm.cdf(args.delta / np.sqrt(2)))
    rng = np.random.default_rng(args.seed)
    for k in args.positives:
        n = args.negatives + k
        y = np.r_[np.ones(k, bool), np.zeros(args.negatives, bool)]
        point, covered, sds, left_out = [], 0, [], []
        for _ in range(args.sets):
            score = rng.normal(0, 1, n) + args.delta * y
            auc = _weighted_auroc(y, score, np.ones((1, n)))[0]
            boot = _weighted_auroc(y, score, patient_resample_weights(np.arange(n), args.resamples, rng))
            ok = boot[~np.isnan(boot)]
            low, high = np.quantile(ok, [0.025, 0.975])
            covered += low <= truth <= high
            point.append(auc)
            sds.append(ok.std(ddof=1))
            left_out.append(1 - len(ok) / len(boot))
        print(json.dumps({"positive_patients": k, "negatives": args.negatives, "true_auroc": round(truth, 4),
                          "coverage_95": round(covered / args.sets, 3),
                          "bootstrap_sd_points": round(100 * float(np.mean(sds)), 2),
                          "true_sd_points": round(100 * float(np.std(point, ddof=1)), 2),
                          "sd_ratio": round(float(np.mean(sds) / np.std(point, ddof=1)), 2),
                          "resamples_left_out": round(float(np.mean(left_out)), 3), "sets": args.sets}), flush=True)


if __name__ == "__main__":
    main()
