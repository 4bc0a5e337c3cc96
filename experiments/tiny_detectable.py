"""The tiny label-efficiency study's detectable differences under issue 54's rule, recovered from its
published verdicts when its runs are not at hand (docs/results.md, "What the tiny study can
detect"): each verdict prints the 95 % interval D -/+ t_{df, 0.975} SE and the detectable
difference of the rule before issue 54, (t_{df, 1-alpha/2k} + t_{df, 0.8}) SE with k = 12; the
two give back df and SE (to the verdicts' 0.1-point rounding), and `detectable_difference` the
figure the report now states.

    git show 94bc297:docs/results.md > /tmp/results-before-54.md      # the page as published before issue 54
    python -m experiments.tiny_detectable /tmp/results-before-54.md

Prints one JSON object: per verdict line the recovered SE and df, the old and the new detectable
difference (points), and their median and range. Rerunning the study (jobs/study.py
studies/label_efficiency_tiny.yaml) gives the exact figures.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
from scipy import stats
from scipy.optimize import brentq

from coreecg.eval.significance import detectable_difference

VERDICT = re.compile(r"^- (PTB-XL, \d+ %: .+?): [+-]\d+\.\d \[(-?\d+\.\d), (-?\d+\.\d)\] AUROC points.*"
                     r"smallest detectable difference here is (\d+\.\d) points", re.MULTILINE)


def old_formula(df: float, k: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """(t_{df, 1-alpha/2k} + t_{df, power}) per unit SE: the rule before issue 54."""
    return stats.t.ppf(1 - alpha / (2 * k), df) + stats.t.ppf(power, df)


def recover(half: float, detectable: float, k: int) -> tuple[float, float]:
    """(SE, df) from an interval's half-width t_{df, 0.975} SE and the old detectable difference."""
    ratio = detectable / half

    def gap(log_df: float) -> float:
        df = np.exp(log_df)
        return old_formula(df, k) / stats.t.ppf(0.975, df) - ratio

    # the ratio falls with df towards (z_{1-alpha/2k} + z_{power}) / z_{0.975}; under it: df as good as infinite
    df = np.inf if gap(np.log(1e6)) > 0 else float(np.exp(brentq(gap, np.log(1.01), np.log(1e6))))
    return half / stats.t.ppf(0.975, df), df


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results", type=Path)
    p.add_argument("--family", type=int, default=12, help="the AUROC family's size in those verdicts")
    args = p.parse_args()
    rows = []
    for name, low, high, old in VERDICT.findall(args.results.read_text()):
        se, df = recover((float(high) - float(low)) / 2, float(old), args.family)
        rows.append({"comparison": name, "se_points": round(se, 2), "df": round(df, 2), "old_points": float(old),
                     "new_points": round(detectable_difference(se, df, 0.05, args.family), 1)})
    summary = {key: {"median": round(float(np.median([r[key] for r in rows])), 2), "low": min(r[key] for r in rows),
                     "high": max(r[key] for r in rows)} for key in ("old_points", "new_points")}
    print(json.dumps({"family": args.family, "comparisons": rows, "summary": summary}, indent=1))


if __name__ == "__main__":
    main()
