"""The smallest difference the report's significance rule finds with >= 80 % power, on the
calibration's synthetic runs (coreecg/eval/calibration.py: minimal_detectable_effect), for the
run counts and test-set sizes of a label-efficiency table (docs/evaluation.md, "Label-efficiency
table"; the figures there and in coreecg/eval/label_efficiency.py DETECTABLE come from this).

    python -m experiments.minimal_detectable_effect            # about 15 minutes on 2 busy cores

Prints one JSON object: per (runs, patients) the effects scanned, the share of tables whose AUROC
difference is marked (Holm over ACC, F1, AUROC) and the mean AUROC difference each produced.
"""
from __future__ import annotations

import argparse
import json
import time

from coreecg.eval.calibration import minimal_detectable_effect


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, default=200, help="simulated tables per effect")
    p.add_argument("--resamples", type=int, default=200, help="patient resamples per table")
    p.add_argument("--runs", type=int, nargs="+", default=[3, 5])
    p.add_argument("--patients", type=int, nargs="+", default=[100, 300])
    p.add_argument("--effects", type=float, nargs="+", default=[0.2, 0.4, 0.6, 0.8, 1.0, 1.2])
    p.add_argument("--family", type=int, default=3,
                   help="tests in the table's Holm family (3: one comparison's metrics; a label-efficiency "
                        "table: comparisons x 3)")
    args = p.parse_args()
    out = {"tables": args.tables, "resamples": args.resamples, "results": []}
    for runs in args.runs:
        for n in args.patients:
            start = time.perf_counter()
            r = minimal_detectable_effect(runs, n, args.effects, n_tables=args.tables, n_resamples=args.resamples,
                                          seed=100 * runs + n, family=args.family)
            out["results"].append({**r, "seconds": round(time.perf_counter() - start, 1)})
            print(json.dumps(out["results"][-1]), flush=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
