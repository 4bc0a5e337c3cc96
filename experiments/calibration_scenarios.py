"""The run-level rule's size and power when the methods err on the same patients or on their own
(issue 43): coreecg/eval/calibration.py's synthetic tables with a share `specific` of each
patient's difficulty that is each method's own (0: shared, 0.5: half, 1: all), for 3 and 5 runs
per method; and whether the per-cell detectable difference the report states (from each cell's SE
and df) matches the power observed (docs/evaluation.md, "What a table can detect").

    python -m experiments.calibration_scenarios              # about 15 minutes on 2 cores

Prints one JSON line per (scenario, runs, patients, effect): the share of tables whose AUROC
difference has p < 0.05 (one test: size when effect = 0, power otherwise), the mean AUROC
difference, the SD of that difference over tables against the mean SE the rule estimated, and the
mean detectable difference the report would state (80 % power, one test).
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from coreecg.eval.calibration import Scenario, mark_rates


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, default=200, help="simulated tables for the size")
    p.add_argument("--power-tables", type=int, default=100, help="simulated tables per effect for the power")
    p.add_argument("--resamples", type=int, default=200)
    p.add_argument("--specific", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    p.add_argument("--runs", type=int, nargs="+", default=[3, 5])
    p.add_argument("--effects", type=float, nargs="*", default=[0.4, 0.8], help="skill effects for the power (none: size only)")
    p.add_argument("--patients", type=int, nargs="+", default=[100], help="test patients (300 too: what more buys)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for specific in args.specific:
            for runs in args.runs:
                for n in args.patients:
                    for effect in [0.0, *args.effects]:
                        start = time.perf_counter()
                        tables = args.tables if effect == 0 else args.power_tables
                        scenario = Scenario(runs=runs, effect=effect, n_patients=n, specific=specific)
                        root = Path(tmp) / f"s{specific}-r{runs}-n{n}-e{effect}"
                        r = mark_rates(root, scenario, tables, seed=int(1000 * specific) + 10 * runs + n + int(100 * effect),
                                       n_resamples=args.resamples)
                        row = {"specific": specific, "runs": runs, "patients": n, "effect": effect, "tables": tables,
                               "auroc_p_below_005": r["auroc_raw"],
                               "mean_auroc_diff_points": round(100 * r["mean_auroc_diff"], 2),
                               "sd_auroc_diff_points": round(100 * r["sd_auroc_diff"], 2),
                               "mean_se_points": round(100 * r["mean_se_auroc"], 2),
                               "detectable_points": round(100 * r["detectable_auroc"], 2),
                               "run_sd_auroc_points": round(100 * r["run_sd_auroc"], 2),
                               "seconds": round(time.perf_counter() - start, 1)}
                        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
