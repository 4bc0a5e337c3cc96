"""Calibration and power of the report's significance rule on synthetic predictions.csv files
(coreecg/eval/calibration.py; the table in docs/evaluation.md, "Calibration").

    python -m experiments.significance_calibration            # about 7 minutes on 2 busy cores

A/A tables (one method against itself on disjoint seeds): the observed share of raw p below the
nominal 1, 5 and 10 % on AUROC, the share of cells and of tables marked after Holm over ACC, F1 and
AUROC, and, for contrast, the two-stage percentile bootstrap (runs then patients resampled, the
interval excluding 0) at 3 runs. Real differences: the share marked at two effect sizes and two
run counts. Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from coreecg.eval.calibration import CLASSES, Scenario, mark_rates, simulate_table
from coreecg.eval.downstream import read_predictions
from coreecg.eval.metrics import patient_resample_weights, resample_metrics


def percentile_bootstrap_rate(root: Path, runs: int, n_tables: int, n_resamples: int, seed: int) -> float:
    """The share of A/A tables whose two-stage percentile bootstrap interval of the AUROC difference
    (each method's runs drawn with replacement, then the patients, jointly) excludes 0."""
    rng = np.random.default_rng(seed)
    marked = []
    for t in range(n_tables):
        folders = simulate_table(root / f"table{t:04d}", Scenario(runs=runs), rng)
        scores = {m: [read_predictions(f / "predictions.csv", list(CLASSES)) for f in fs] for m, fs in folders.items()}
        first = scores["reference"][0]
        w = patient_resample_weights(first.patient_id, n_resamples, rng)
        boot = {m: np.stack([resample_metrics(first.y, s.probs, False, w)["auroc"] for s in ss])
                for m, ss in scores.items()}                                  # (runs, B)
        pick = {m: rng.integers(0, runs, (n_resamples, runs)) for m in boot}  # runs drawn per resample
        cols = np.arange(n_resamples)[:, None]
        d = boot["other"][pick["other"], cols].mean(1) - boot["reference"][pick["reference"], cols].mean(1)
        low, high = np.nanquantile(d, [0.025, 0.975])
        marked.append(low > 0 or high < 0)
    return float(np.mean(marked))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tables", type=int, default=400, help="simulated tables per row")
    p.add_argument("--resamples", type=int, default=200, help="patient resamples per table")
    args = p.parse_args()
    out: dict = {"tables": args.tables, "resamples": args.resamples, "scenario": vars(Scenario()) | {"runs": None},
                 "aa": {}, "power": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for runs in (3, 5):
            r = mark_rates(root / f"aa{runs}", Scenario(runs=runs), args.tables, seed=runs, n_resamples=args.resamples)
            p_values = np.array(r.pop("auroc_p"))
            out["aa"][f"{runs} runs"] = {**{f"raw p < {a:g}": float(np.mean(p_values < a)) for a in (0.01, 0.05, 0.1)},
                                         **{k: r[k] for k in ("cell_adjusted", "table_any", "run_sd_auroc")}}
        out["aa"]["3 runs"]["percentile bootstrap, interval excludes 0"] = percentile_bootstrap_rate(
            root / "pb", 3, args.tables, args.resamples, seed=7)
        for effect in (0.2, 0.4):
            for runs in (3, 5):
                r = mark_rates(root / f"p{effect}-{runs}", Scenario(runs=runs, effect=effect), args.tables,
                               seed=10 * runs + int(10 * effect), n_resamples=args.resamples)
                out["power"][f"effect {effect}, {runs} runs"] = {
                    k: r[k] for k in ("mean_auroc_diff", "run_sd_auroc", "auroc_raw", "auroc_marked", "table_any")}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
