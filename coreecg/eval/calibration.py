"""Synthetic fine-tuning runs that calibrate the report's significance rule (docs/evaluation.md,
"Calibration"): run folders holding predictions.csv and metrics.json, as the fine-tuning job
writes them, whose metrics vary between training runs and between test patients; and the share of
simulated tables in which the rule (coreecg/eval/significance.py) marks a difference.

One simulated table is one cell (a test set of `n_patients` patients, the first fifth with two
records; 4 single-label classes) with a reference method and one other method. Run r of a method
of skill s scores record i, class k with the logit

    y[i, k] (s + u_r) + hard_M[i, k] + e_r[i, k],   u_r ~ N(0, run_sd), e_r ~ N(0, noise_sd)

    hard_M = sqrt(1 - specific) hard + sqrt(specific) hard'_M,   hard, hard'_M ~ N(0, hard_sd)

and softmax probabilities: u_r is the training randomness of a run (pretraining x fine-tuning
seed), hard a patient's difficulty that every run of the table shares, hard'_M the part that is
method M's own (`specific`: 0, every method errs on the same patients; 1, each on its own; the
test set's sampling then adds a term to a difference that more test patients shrink), e_r a
run's own errors.
An A/A table gives both methods one skill (the other method's runs are the same method's with
disjoint seeds); a real difference gives the other method skill s + effect.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence
import tempfile

import numpy as np

from coreecg.eval.metrics import patient_resample_weights, resample_metrics
from coreecg.eval.significance import SEParts, adjust_p, cell_differences, detectable_difference, run_level_parts
from coreecg.eval.downstream import RecordScores, read_predictions, write_predictions

CLASSES = ("A", "B", "C", "D")
METRICS = ("acc", "f1", "auroc")


@dataclass(frozen=True)
class Scenario:
    """One kind of simulated table: runs per method, the other method's skill advantage (0: A/A),
    the test set's size, the run-to-run and patient spreads (module docstring)."""

    runs: int = 3
    effect: float = 0.0
    n_patients: int = 100
    skill: float = 1.0
    run_sd: float = 0.15
    hard_sd: float = 1.0
    noise_sd: float = 0.5
    specific: float = 0.0       # share of the patients' difficulty that is each method's own


def _test_set(n_patients: int, rng: np.random.Generator):
    """record ids (n,), patient ids (n,), one-hot labels (n, 4): the first fifth of the patients
    have two records (with one label), so the bootstrap moves records in patient groups."""
    patients = np.r_[np.arange(n_patients), np.arange(n_patients // 5)]
    labels = rng.integers(0, len(CLASSES), n_patients)[patients]
    return ([f"R{i:04d}" for i in range(len(patients))], np.array([f"P{p:04d}" for p in patients]),
            np.eye(len(CLASSES), dtype=int)[labels])


def write_run(folder: Path, method: str, seed: int, task, logits: np.ndarray) -> Path:
    """A run folder as the fine-tuning job leaves it: predictions.csv (softmax of `logits`) and
    metrics.json with the keys the report reads (test metrics from that file)."""
    rids, pids, y = task
    probs = np.exp(logits - logits.max(1, keepdims=True))
    folder.mkdir(parents=True)
    write_predictions(folder / "predictions.csv", RecordScores(rids, pids, y, probs / probs.sum(1, keepdims=True),
                                                               None), list(CLASSES))
    back = read_predictions(folder / "predictions.csv", list(CLASSES))
    # classification_metrics' values (tests/test_eval_metrics.py), without its per-call overhead
    test = {m: float(v[0]) for m, v in resample_metrics(back.y, back.probs, False, np.ones((1, len(y)))).items()}
    record = {"method": method, "dataset": "synthetic", "mode": "finetune", "leads": "12", "train_fraction": 1.0,
              "seed": seed, "multilabel": False, "class_names": list(CLASSES), "test": test}
    (folder / "metrics.json").write_text(json.dumps(record))
    return folder


def table_logits(scenario: Scenario, rng: np.random.Generator) -> tuple[tuple, dict[str, list[np.ndarray]]]:
    """One simulated table's test set (record ids, patient ids, one-hot labels) and its runs' logits:
    {"reference": [runs x (n, 4)], "other": [...]} (module docstring)."""
    task = _test_set(scenario.n_patients, rng)
    y = task[2]
    shared = rng.normal(0, scenario.hard_sd, y.shape)
    out: dict[str, list[np.ndarray]] = {}
    for method, skill in (("reference", scenario.skill), ("other", scenario.skill + scenario.effect)):
        own = rng.normal(0, scenario.hard_sd, y.shape)
        hard = np.sqrt(1 - scenario.specific) * shared + np.sqrt(scenario.specific) * own
        out[method] = [y * (skill + rng.normal(0, scenario.run_sd)) + hard + rng.normal(0, scenario.noise_sd, y.shape)
                       for _ in range(scenario.runs)]
    return task, out


def simulate_table(root: Path, scenario: Scenario, rng: np.random.Generator) -> dict[str, list[Path]]:
    """The run folders of one simulated table under `root`: {"reference": seeds 0..runs-1,
    "other": seeds runs..2 runs-1 (disjoint)}."""
    task, logits = table_logits(scenario, rng)
    return {method: [write_run(root / f"{method}-s{i * scenario.runs + r}", method, i * scenario.runs + r, task, x)
                     for r, x in enumerate(runs)] for i, (method, runs) in enumerate(logits.items())}


def table_parts(scenario: Scenario, rng: np.random.Generator, n_resamples: int = 200,
                metric: str = "auroc") -> tuple[float, SEParts]:
    """(D, the SE's parts) of one simulated table's `metric` by `run_level_parts`, in memory: the same
    runs as `simulate_table` without the files (and their 8-digit rounding), for scans of thousands of
    tables."""
    (_, pids, y), logits = table_logits(scenario, rng)
    w = np.vstack([np.ones((1, len(y))), patient_resample_weights(pids, n_resamples, rng)])
    values = {}
    for method, runs in logits.items():
        probs = [np.exp(x - x.max(1, keepdims=True)) for x in runs]
        values[method] = np.stack([resample_metrics(y, p / p.sum(1, keepdims=True), False, w)[metric] for p in probs])
    a, b = values["reference"], values["other"]
    ok = ~np.isnan(np.vstack([a, b])).any(0)
    ok[0] = False                                              # column 0: the full test set
    return run_level_parts(a[:, 0], b[:, 0], a[:, ok], b[:, ok])


def table_statistics(scenario: Scenario, rng: np.random.Generator, n_resamples: int = 200,
                     metric: str = "auroc") -> tuple[float, float, float]:
    """(D, SE, df) of one simulated table's `metric` (`table_parts`)."""
    diff, parts = table_parts(scenario, rng, n_resamples, metric)
    return diff, parts.se, parts.df


def table_marks(runs: dict[str, list[Path]], n_resamples: int, seed: int, adjust: str, alpha: float = 0.05,
                min_runs: int = 3, min_test_patients: int = 30) -> dict:
    """The rule on one simulated table: per metric of METRICS, {"p": raw p, "marked_raw": p < alpha,
    "marked": adjusted p < alpha (`adjust` over the table's testable metrics), "diff": difference,
    "se", "df" and "parts" (a list: SEParts or None) of the run-level test}."""
    found = cell_differences(runs, "reference", METRICS, False, CLASSES, n_resamples, seed, 1 - alpha, min_runs,
                             min_test_patients)["other"]
    d = [found[m] for m in METRICS]
    p = np.array([x.p_value if x.testable else np.nan for x in d])
    testable = ~np.isnan(p)
    adjusted = np.full(len(p), np.nan)
    adjusted[testable] = adjust_p(p[testable], adjust)
    return {"p": p, "marked_raw": p < alpha, "marked": adjusted < alpha,
            "diff": np.array([np.nan if x.diff is None else x.diff for x in d]),
            "se": np.array([np.nan if x.se is None else x.se for x in d]),
            "df": np.array([np.nan if x.df is None else x.df for x in d]), "parts": [x.parts for x in d]}


def mark_rates(root: Path, scenario: Scenario, n_tables: int, seed: int = 0, n_resamples: int = 200,
               adjust: str = "holm", alpha: float = 0.05) -> dict:
    """Simulate `n_tables` tables of `scenario` under `root` and count the marks. -> {"tables",
    "auroc_raw": share of tables whose AUROC difference has raw p < 0.05 (one test per table,
    independent), "auroc_marked": share whose AUROC cell is marked after `adjust` over the table's
    3 metrics, "cell_adjusted": share of (table, metric) cells marked, "table_any": share of tables
    with any mark, "mean_auroc_diff", "run_sd_auroc": mean sample sd of the reference's run AUROCs,
    "auroc_p": every table's raw AUROC p}."""
    rng = np.random.default_rng(seed)
    rows, sds = [], []
    for t in range(n_tables):
        runs = simulate_table(root / f"table{t:04d}", scenario, rng)
        rows.append(table_marks(runs, n_resamples, seed + t, adjust, alpha))
        auroc = [json.loads((r / "metrics.json").read_text())["test"]["auroc"] for r in runs["reference"]]
        sds.append(np.std(auroc, ddof=1) if len(auroc) > 1 else np.nan)
    k = METRICS.index("auroc")
    return {"tables": n_tables,
            "auroc_raw": float(np.mean([r["marked_raw"][k] for r in rows])),
            "auroc_marked": float(np.mean([r["marked"][k] for r in rows])),
            "cell_adjusted": float(np.mean([r["marked"] for r in rows])),
            "table_any": float(np.mean([r["marked"].any() for r in rows])),
            "mean_auroc_diff": float(np.mean([r["diff"][k] for r in rows])),
            "run_sd_auroc": float(np.nanmean(sds)),
            "sd_auroc_diff": float(np.nanstd([r["diff"][k] for r in rows], ddof=1)) if n_tables > 1 else float("nan"),
            "mean_se_auroc": float(np.nanmean([r["se"][k] for r in rows])),
            # the per-cell detectable AUROC difference for one test (family 1) at 80 % power, as the report states it
            "detectable_auroc": float(np.nanmean([detectable_difference(r["se"][k], r["df"][k], alpha, 1,
                                                                         parts=r["parts"][k])
                                                   for r in rows if np.isfinite(r["se"][k])])),
            "auroc_p": [float(r["p"][k]) for r in rows]}


def binomial_upper(rate: float, n: int, z: float = 2.326) -> float:
    """The largest share of n independent trials that a true rate `rate` exceeds with probability
    about 1 % (normal approximation): the tolerance of an observed false-mark rate."""
    return rate + z * np.sqrt(rate * (1 - rate) / n)



def minimal_detectable_effect(runs: int, n_patients: int, effects: Sequence[float] = (0.2, 0.4, 0.6, 0.8, 1.0),
                              power: float = 0.8, n_tables: int = 100, n_resamples: int = 200, seed: int = 0,
                              adjust: str = "holm", family: int = 3) -> dict:
    """The smallest skill advantage in `effects` (ascending) whose AUROC difference the rule marks
    (after `adjust` over a table's 3 metrics) in at least `power` of `n_tables` simulated tables of
    `runs` runs per method and `n_patients` test patients, the calibration's spreads otherwise
    (Scenario). Synthetic runs: a statement about this simulation, not about any real method.
    -> {"runs", "n_patients", "power", "tables", "found": {effect, mean_auroc_diff, run_sd_auroc,
    auroc_marked} or None when no effect scanned reaches `power`, "scanned": [the same per effect]}.
    `family` > 3: the table's Holm family holds that many tests (e.g. 36: 12 comparisons x 3
    metrics); the AUROC difference then counts as marked when family x p < 0.05, Holm's adjusted p
    when it is the family's smallest (a real effect among null ones), so never easier than the table.
    Costs about 0.2 s per simulated table (3 runs per method, 100 patients, 200 resamples, 2 busy
    cores), so minutes per scan: experiments/minimal_detectable_effect.py runs it. The report states
    each cell's own detectable difference instead (coreecg/eval/tables/detectable.py); this scan
    checks that formula against simulated power."""
    scanned, found = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for i, effect in enumerate(sorted(effects)):
            r = mark_rates(Path(tmp) / f"e{i}", Scenario(runs=runs, effect=effect, n_patients=n_patients), n_tables,
                           seed=seed + 1000 * i, n_resamples=n_resamples, adjust=adjust)
            if family > 3:
                r["auroc_marked"] = float(np.mean([family * p < 0.05 for p in r["auroc_p"]]))
            row = {"effect": effect, **{k: r[k] for k in ("mean_auroc_diff", "run_sd_auroc", "auroc_marked")}}
            scanned.append(row)
            if r["auroc_marked"] >= power:
                found = row
                break
    return {"runs": runs, "n_patients": n_patients, "family": family, "power": power, "tables": n_tables,
            "found": found, "scanned": scanned}
