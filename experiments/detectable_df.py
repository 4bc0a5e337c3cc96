"""Issue 61 item 8: power at the median stated detectable difference, df known vs integrated (docs/evaluation.md).

    python -m experiments.detectable_df
"""
import numpy as np
from scipy import stats
from coreecg.eval.metrics import patient_resample_weights
from coreecg.eval.significance import detectable_difference, run_level_parts
for runs_n in (3, 5):
    rng = np.random.default_rng(0)
    d, parts = [], []
    for _ in range(400):
        w = patient_resample_weights(np.arange(50), 40, rng).T / 50
        hard = rng.normal(0, 0.3, 50)
        runs = [rng.normal(0, 0.03, (runs_n, 1)) + hard + rng.normal(0, 0.15, (runs_n, 50)) for _ in range(2)]
        diff, x = run_level_parts(runs[0].mean(1), runs[1].mean(1), runs[0] @ w, runs[1] @ w)
        d.append(diff)
        parts.append(x)
    d, se, df = np.array(d), np.array([x.se for x in parts]), np.array([x.df for x in parts])
    for k in (1, 12):
        def power(s, k=k):
            return float(np.mean(2 * stats.t.sf(np.abs(d + s) / se, df) < 0.05 / k))
        lo, hi = 0.0, 1.0
        for _ in range(40):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if power(mid) < 0.8 else (lo, mid)
        st = np.median([detectable_difference(x.se, x.df, 0.05, k, parts=x) for x in parts])
        kn = np.median([detectable_difference(x.se, x.df, 0.05, k) for x in parts])
        print(f"runs {runs_n} k {k}: after power {power(st):.3f} stated/true {st / lo:.3f}; "
              f"before (df known) power {power(kn):.3f} stated/true {kn / lo:.3f}")
