"""The run-level rule's size and power when the methods err on the same patients or on their own
(issues 43 and 54): coreecg/eval/calibration.py's synthetic tables with a share `specific` of each
patient's difficulty that is each method's own (0: shared, 0.5: half, 1: all), for 3 and 5 runs
per method; and whether the detectable difference the report states (from each cell's SE and df,
for its family's size) gives the power it claims (docs/evaluation.md, "Calibration").

    python -m experiments.calibration_scenarios --effect-check 300     # about 3 minutes on 2 busy cores
    python -m experiments.calibration_scenarios --tost --runs 10 --run-sd 0.05 --specific 0

Prints one JSON line per (scenario, runs, patients): over `--tables` A/A tables (scored in memory,
`table_statistics`), the share with p < 0.05, the SD of the AUROC difference against the mean SE,
and per family size k: the mean detectable difference the report states (`detectable_difference`,
noncentral t with SE / c4, power 0.8) and the power at it, i.e. the share of the A/A tables shifted by that
difference whose p is under 0.05 / k (the bar of a family's smallest p); the same for the
normal-theory formula used before issue 54. With --effect-check, also the power of tables whose
other method really is better by about that difference (a skill effect found by interpolation).
With --tost: the two one-sided tests' rejection rate at a true difference of +-margin.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
from scipy import stats

from coreecg.eval.calibration import Scenario, table_logits, table_statistics
from coreecg.eval.metrics import resample_metrics
from coreecg.eval.significance import detectable_difference, equivalence_p

ALPHA = 0.05


def p_values(d: np.ndarray, se: np.ndarray, df: np.ndarray) -> np.ndarray:
    """Two-sided p of the run-level t, vectorised over tables."""
    return 2 * stats.t.sf(np.abs(d) / se, df)


def normal_theory(se: float, df: float, alpha: float, k: int, power: float = 0.8) -> float:
    """The detectable difference before issue 54: (t_{df, 1-alpha/2k} + t_{df, power}) x SE."""
    return (stats.t.ppf(1 - alpha / (2 * k), df) + stats.t.ppf(power, df)) * se


def mean_difference(scenario: Scenario, tables: int, seed: int) -> float:
    """The mean full-test-set AUROC difference a scenario's effect produces (no resamples: cheap)."""
    rng, out = np.random.default_rng(seed), []
    for _ in range(tables):
        (_, _, y), logits = table_logits(scenario, rng)
        ones = np.ones((1, len(y)))
        auroc = {m: np.mean([resample_metrics(y, np.exp(x) / np.exp(x).sum(1, keepdims=True), False, ones)["auroc"][0]
                             for x in runs]) for m, runs in logits.items()}
        out.append(auroc["other"] - auroc["reference"])
    return float(np.mean(out))


def effect_for(target: float, base: Scenario, seed: int, grid=(0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0),
               tables: int = 100) -> float | None:
    """The skill effect whose mean AUROC difference is `target` (linear interpolation on a grid);
    None when the grid's largest effect falls short (the AUROC ceiling)."""
    diffs = [mean_difference(Scenario(**{**base.__dict__, "effect": e}), tables, seed) for e in grid]
    if target > diffs[-1]:
        return None
    return float(np.interp(target, diffs, grid))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, default=1500, help="A/A tables per scenario")
    p.add_argument("--resamples", type=int, default=200)
    p.add_argument("--specific", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    p.add_argument("--runs", type=int, nargs="+", default=[3, 5])
    p.add_argument("--patients", type=int, nargs="+", default=[100], help="test patients (300 too: what more buys)")
    p.add_argument("--families", type=int, nargs="+", default=[1, 12], help="family sizes k of the stated difference")
    p.add_argument("--run-sd", type=float, default=Scenario.run_sd, help="training randomness of a run's skill")
    p.add_argument("--effect-check", type=int, default=0, help="tables per real-effect check (0: none)")
    p.add_argument("--tost", action="store_true", help="the equivalence test's rate at a true difference of +-2 points")
    args = p.parse_args()
    for specific in args.specific:
        for runs in args.runs:
            for n in args.patients:
                start = time.perf_counter()
                seed = int(1000 * specific) + 10 * runs + n
                scenario = Scenario(runs=runs, n_patients=n, specific=specific, run_sd=args.run_sd)
                rng = np.random.default_rng(seed)
                d, se, df = np.array([table_statistics(scenario, rng, args.resamples) for _ in range(args.tables)]).T
                row = {"specific": specific, "runs": runs, "patients": n, "run_sd": args.run_sd, "tables": args.tables,
                       "aa_p_below_005": round(float(np.mean(p_values(d, se, df) < ALPHA)), 4),
                       "sd_diff_points": round(100 * float(np.std(d, ddof=1)), 2),
                       "mean_se_points": round(100 * float(np.mean(se)), 2),
                       "median_df": round(float(np.median(df)), 2)}
                for k in args.families:
                    for name, formula in (("", detectable_difference), ("normal_theory_", normal_theory)):
                        stated = float(np.mean([formula(s, f, ALPHA, k) for s, f in zip(se, df)]))
                        power = float(np.mean(p_values(d + stated, se, df) < ALPHA / k))
                        row[f"k{k}_{name}detectable_points"] = round(100 * stated, 2)
                        row[f"k{k}_{name}power_shifted"] = round(power, 3)
                    if args.effect_check:
                        effect = effect_for(row[f"k{k}_detectable_points"] / 100, scenario, seed + 1)
                        if effect is not None:
                            real = Scenario(**{**scenario.__dict__, "effect": effect})
                            r = np.random.default_rng(seed + 2)
                            rd, rse, rdf = np.array([table_statistics(real, r, args.resamples)
                                                     for _ in range(args.effect_check)]).T
                            row[f"k{k}_effect"] = round(effect, 3)
                            row[f"k{k}_effect_mean_diff_points"] = round(100 * float(np.mean(rd)), 2)
                            row[f"k{k}_power_real_effect"] = round(
                                float(np.mean(p_values(rd, rse, rdf) < ALPHA / k)), 3)
                        else:
                            row[f"k{k}_power_real_effect"] = None       # beyond the AUROC ceiling of this model
                if args.tost:                      # a true difference at the margin: equivalence wrongly shown
                    for sign in (1, -1):
                        tost = [equivalence_p(x + sign * 0.02, s, f, 0.02) for x, s, f in zip(d, se, df)]
                        row[f"tost_at_{'+' if sign > 0 else '-'}2_points"] = round(
                            float(np.mean(np.array(tost) < ALPHA)), 4)
                    # and a real effect of about +2 points (its mean difference printed beside the rate)
                    effect = effect_for(0.02, scenario, seed + 3, grid=(0.05, 0.1, 0.15, 0.2), tables=400)
                    if effect is not None:
                        r = np.random.default_rng(seed + 4)
                        real = Scenario(**{**scenario.__dict__, "effect": effect})
                        rd, rse, rdf = np.array([table_statistics(real, r, args.resamples)
                                                 for _ in range(args.tables)]).T
                        row["tost_real_effect_mean_diff_points"] = round(100 * float(np.mean(rd)), 3)
                        row["tost_real_effect_rate"] = round(float(np.mean([equivalence_p(x, s, f, 0.02) < ALPHA
                                                                            for x, s, f in zip(rd, rse, rdf)])), 4)
                row["seconds"] = round(time.perf_counter() - start, 1)
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
