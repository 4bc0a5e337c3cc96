"""Differences between methods in one table cell, and whether they are more than noise: the
training run is the unit of replication, test patients are resampled within (docs/evaluation.md,
"Differences between methods").

A cell is one (dataset, mode, leads, train fraction); a method has one run per seed there, each
one pretraining x fine-tuning. Training randomness is the larger source of variance between
methods, and a single run per method measures two particular models, not two methods; so the
runs of a method are exchangeable replicates and two methods are compared through their run
means, whatever their seeds (no pairing by seed value). All runs of a cell are scored on one test
set, so each bootstrap resample draws the test patients once for every run of every method.

    d = cell_differences({"CoRe-ECG": core, "ST-MEM": stmem}, "CoRe-ECG", ["auroc"], False, names,
                         min_runs=3)["ST-MEM"]["auroc"]
    d.diff, d.low, d.high, d.p_value, d.unmarkable       # ST-MEM - CoRe-ECG, fractions

The test (`run_level_test`), for reference runs a_1..a_n and other runs b_1..b_m, each run's
metric on the full test set: D = mean(b) - mean(a); SE^2 = s_a^2/n + s_b^2/m + V_shared, with s^2
the sample variances of the run metrics (training randomness plus each run's own test-set noise)
and V_shared the part of the patient-bootstrap variance of D that a method's runs share (the
bootstrap variance of D less its run-specific part, which s^2 already holds); t = D / SE against
Student's t with Welch-Satterthwaite degrees of freedom; interval D -/+ t_q SE. A percentile
bootstrap over 3 runs is anti-conservative (a mean of 3 resampled values has 10 possible values
and 2/3 of the variance, with normal tails where t has 4 df): it marks 8 % of A/A comparisons at a
nominal 5 % (experiments/significance_calibration.py; this test 5 %).

A method with fewer than `min_runs` runs gets the percentile interval of D over patient
resamples alone ("test-set sampling only, not a claim about the methods"), no p-value, and a
reason in `unmarkable`; so does a test set of fewer than `min_test_patients` patients (with its
p-value). Multiple comparisons: `adjust_p` (Holm, Benjamini-Hochberg) over a table's family.

Draw order: patients are numbered in sorted order of their ids (P of them); resample b's patient
counts are the b-th draw of Generator.multinomial(P, [1/P] * P) from default_rng(seed) (the draws
of `bootstrap_ci` with the same seed: `patient_resample_weights`); every record of a patient drawn
k times counts k times. One draw serves every run of the cell and every metric.

Direction: the test, its interval, the detectable difference, TOST and the Holm families are
symmetric in the sign of D; which sign is better is the metric's (`direction`): higher for the
label metrics, R² and r, lower for MAE, MAE in SD units and RMSE (coreecg.eval.regression). A
regression cell's differences (`regression_cell_differences`) read predictions.csv's target and
prediction columns; MAE in SD units is each run's MAE over its own scaler's SD
(metrics.json target_scaler.sd).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np
from scipy import special, stats
from scipy.optimize import brentq

from coreecg.eval.metrics import BOOTSTRAP_CHUNK, kept_classes, patient_resample_weights, resample_metrics
from coreecg.eval.regression import LOWER_IS_BETTER, METRICS as REGRESSION_SUPPORTED, resample_regression

# Lazy imports: the predictions reader (coreecg.eval.downstream: torch), where a run's predictions.csv is
# read: the report's tables import this module torch-free (1,343 -> 2,452 modules, 1.1 s).
PREDICTIONS = "predictions.csv"
# A comparison whose difference has no variance at all: not a test, and not counted in a family.
NOT_TESTABLE = ("not testable: zero variance on both sides (every run of both methods gives the same value "
                "on every patient resample, to rounding)")
# A spread under this share of the metric's scale is rounding, not variance: the mean of identical
# runs differs from each of them in the last bits, and that must not make a comparison testable.
ZERO_SPREAD = 1e-9
SUPPORTED = ("acc", "f1", "f1_argmax", "auroc")
ADJUSTMENTS = ("holm", "bh", "none")


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` is the better one (MAE, MAE in SD units, RMSE)."""
    return metric in LOWER_IS_BETTER


def direction(metric: str) -> str:
    """'lower is better' or 'higher is better': what a table states beside the metric."""
    return "lower is better" if lower_is_better(metric) else "higher is better"
# Gauss-Legendre nodes per run variance, on the chi-square's probability scale (no tail is cut off):
# the power at an estimated df to 1e-7.
POWER_NODES = 32


class SEParts(NamedTuple):
    """The run-level test's SE^2 = reference + other + shared, in squared fractions: the variances of
    the two run means (s_a^2 / n and s_b^2 / m, estimates with n - 1 and m - 1 degrees of freedom)
    and the test-set term the methods' runs share, taken as known (many patients)."""

    reference: float
    other: float
    shared: float
    n: int
    m: int

    @property
    def se(self) -> float:
        return float(np.sqrt(self.reference + self.other + self.shared))

    @property
    def df(self) -> float:
        """Welch-Satterthwaite's; inf when both run variances are 0 and only the shared term is left."""
        welch = self.reference ** 2 / (self.n - 1) + self.other ** 2 / (self.m - 1)
        return float(self.se ** 4 / welch) if welch > 0 else np.inf


class PairingError(ValueError):
    """Runs that cannot be compared (other test records, labels, classes, two runs of a method with
    one seed, an unreadable predictions.csv); the message names the run folders."""


@dataclass(frozen=True)
class Difference:
    """metric(other) - metric(reference) in one cell, as fractions (None where undefined).

    diff: mean over the other's runs minus mean over the reference's, each run scored on the full
    test set (classification_metrics' values, from predictions.csv); low, high: interval at `level`, from
    `run_level_test` when both methods have min_runs runs, else the percentile interval over
    patient resamples alone; p_value: two-sided p of the run-level test (None below min_runs);
    seeds, reference_seeds: the runs compared (ascending seeds); unmarkable: why the difference
    may not be marked whatever its p (too few runs or test patients, undefined), None when it may;
    undefined_resamples: patient resamples in which the metric is undefined (left out)."""

    metric: str
    diff: float | None
    low: float | None
    high: float | None
    p_value: float | None
    seeds: tuple[int, ...]
    reference_seeds: tuple[int, ...]
    n_records: int
    n_patients: int
    n_resamples: int
    undefined_resamples: int
    level: float
    unmarkable: str | None
    se: float | None = None         # the run-level test's standard error of diff (None below min_runs)
    df: float | None = None         # its Welch-Satterthwaite degrees of freedom
    parts: SEParts | None = None    # what se and df are made of: the df's own sampling (detectable_difference)

    @property
    def testable(self) -> bool:
        """It belongs to its table's family of comparisons (multiple-comparison correction)."""
        return self.unmarkable is None and self.p_value is not None

    @property
    def significant(self) -> bool:
        """Testable and p < 1 - level, before any correction for multiple comparisons."""
        return self.testable and self.p_value < 1 - self.level

    @property
    def better(self) -> bool | None:
        """Whether the other method's value is the better one (the metric's `direction`); None when
        the difference is undefined or 0."""
        if self.diff is None or self.diff == 0:
            return None
        return (self.diff < 0) if lower_is_better(self.metric) else (self.diff > 0)


def run_seed_dir(run) -> tuple[int, Path]:
    """(seed, folder) of a run: a report `Run` (anything with .seed and .path) or a run folder,
    whose metrics.json holds the seed."""
    if hasattr(run, "seed") and hasattr(run, "path"):
        return int(run.seed), Path(run.path)
    path = Path(run)
    try:
        return int(json.loads((path / "metrics.json").read_text())["seed"]), path
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PairingError(f"{path}: cannot read its seed from metrics.json ({e})") from None


def _by_seed(runs: Sequence, name: str) -> dict[int, Path]:
    """seed -> folder, ascending; a seed twice would count one training twice."""
    out: dict[int, Path] = {}
    for run in runs:
        seed, path = run_seed_dir(run)
        if seed in out:
            raise PairingError(f"{out[seed]} and {path}: two runs of {name} with seed {seed}")
        out[seed] = path
    return dict(sorted(out.items()))


def _encoder_of(path: Path) -> str:
    """The pretrained encoder a run was fine-tuned from (metrics.json "encoder"), or the run itself
    when it has none (trained from scratch: its own replicate) or a random one (finetune.encoder=
    random: each seed draws its own weights, so each run is its own replicate)."""
    try:
        encoder = json.loads((path / "metrics.json").read_text()).get("encoder")
    except (OSError, ValueError) as e:
        raise PairingError(f"{path}: cannot read metrics.json ({e})") from None
    return f"encoder:{Path(encoder).expanduser().resolve()}" if encoder and encoder != "random" else f"run:{path}"


def _read(path: Path, class_names: Sequence[str]):
    """predictions.csv of a run folder -> RecordScores; PairingError naming the file otherwise."""
    from coreecg.eval.downstream import read_predictions

    file = path / PREDICTIONS
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {PREDICTIONS}")
    try:
        scores = read_predictions(file, class_names)
    except (KeyError, ValueError) as e:
        raise PairingError(f"{file}: not a predictions file for classes {list(class_names)} ({e})") from None
    if len(set(scores.record_id)) != len(scores.record_id):
        raise PairingError(f"{file}: a record_id appears twice")
    return scores


class _Cell:
    """The test set of one cell, aligned over runs: the first run read fixes the record order;
    every other run must hold the same records with the same labels and patients."""

    def __init__(self, class_names: Sequence[str]):
        self.class_names = list(class_names)
        self.first: Path | None = None
        self.probs: dict[Path, np.ndarray] = {}

    def add(self, path: Path) -> None:
        if path in self.probs:
            return
        s = _read(path, self.class_names)
        if self.first is None:
            self.first, self.record_id, self.patient_id, self.y = path, list(s.record_id), s.patient_id, s.y
            self.index = {r: i for i, r in enumerate(self.record_id)}
            self.probs[path] = s.probs
            return
        differ = set(self.record_id) ^ set(s.record_id)
        if differ:
            raise PairingError(f"{self.first} and {path}: scored on different test records ({len(differ)} "
                               "record ids are in only one of them); a cell's runs need one test set")
        order = np.argsort([self.index[r] for r in s.record_id])     # this file's rows in our order
        if (s.y[order] != self.y).any() or (np.asarray(s.patient_id)[order] != self.patient_id).any():
            raise PairingError(f"{self.first} and {path}: the same test records with other labels or patients")
        self.probs[path] = s.probs[order]


def run_level_parts(a: np.ndarray, b: np.ndarray, a_boot: np.ndarray, b_boot: np.ndarray) -> tuple[float, SEParts]:
    """(D, its SE's parts) of the run-level test: D = mean(b) - mean(a), SE^2 = s_a^2/n + s_b^2/m +
    V_shared (`SEParts`). Each of s_a, s_b, sqrt(V_shared) and D counts as 0 when under ZERO_SPREAD x
    the largest |value|: identical runs give D = SE = 0 exactly, however their means were rounded.

    a (n,), b (m,): each run's metric on the full test set, n, m >= 2; a_boot (n, B), b_boot (m, B):
    the same runs on B >= 2 patient resamples (one draw per column for all runs)."""
    n, m = len(a), len(b)
    tol = ZERO_SPREAD * max(np.abs(x).max() for x in (a, b, a_boot, b_boot))

    def variance(v: float) -> float:
        return float(v) if np.sqrt(v) > tol else 0.0

    va, vb = variance(np.var(a, ddof=1)) / n, variance(np.var(b, ddof=1)) / m
    d_boot = b_boot.mean(0) - a_boot.mean(0)
    # each run's own test-set noise, which the run variances va, vb already hold (var(w) / n)
    own = sum(np.var(x - x.mean(0), axis=1, ddof=1).mean() / (len(x) - 1) for x in (a_boot, b_boot))
    shared = variance(max(0.0, np.var(d_boot, ddof=1) - own))
    diff = float(np.mean(b) - np.mean(a))
    return (diff if abs(diff) > tol else 0.0), SEParts(va, vb, shared, n, m)


def run_level_se(a: np.ndarray, b: np.ndarray, a_boot: np.ndarray, b_boot: np.ndarray) -> tuple[float, float, float]:
    """(D, SE, df) of the run-level test (`run_level_parts`): df Welch-Satterthwaite's, inf when the
    run variances are 0 and only the shared term is left."""
    diff, parts = run_level_parts(a, b, a_boot, b_boot)
    return diff, parts.se, parts.df


def run_level_test(a: np.ndarray, b: np.ndarray, a_boot: np.ndarray, b_boot: np.ndarray,
                   level: float) -> tuple[float, float, float]:
    """Welch's t over training runs with a shared test-set term from the patient bootstrap:
    (low, high, two-sided p) of mean(b) - mean(a) at `level` (`run_level_se`; module docstring).
    A comparison with SE = 0 (every run of both methods alike on every resample, to rounding) has no
    test: the interval is the point and p is NaN (`_compare` names it "not testable")."""
    diff, se, df = run_level_se(a, b, a_boot, b_boot)
    if se == 0:
        return diff, diff, float("nan")
    q = stats.t.ppf((1 + level) / 2, df)
    return diff - q * se, diff + q * se, float(2 * stats.t.sf(abs(diff) / se, df))


def detectable_difference(se: float, df: float, alpha: float, family: int = 1, power: float = 0.8,
                          parts: SEParts | None = None) -> float:
    """The smallest true difference the run-level test detects with probability `power` at level
    `alpha` after a Bonferroni/Holm family of `family` tests (the bar of a family's smallest p), for
    a comparison with standard error `se` and `df` degrees of freedom (fractions, as se).

    With `parts` (the comparison's `SEParts`, whose se and df these are): the power of the test as
    the report runs it, its df estimated from each replicate's own run variances, at the estimated
    parts (`estimated_df_power`). Without: the df taken as known, delta x SE / c4(df), delta the
    noncentrality at which the noncentral t with df degrees of freedom passes the two-sided bar
    t_{df, 1-alpha/2k} with probability `power`, SE / c4(df) the unbiased estimate of the SD (E[SE]
    = c4 x SD, c4 = E[sqrt(chi2_df / df)]). A df taken as known leaves out that a replicate of few
    runs often has a smaller df, whose bar at alpha/2k is far higher (docs/evaluation.md)."""
    k = max(1, int(family))
    if not alpha / k < power < 1:
        raise ValueError(f"power {power} must lie between the level alpha/k = {alpha / k:g} and 1")
    if parts is not None:
        if not (np.isclose(parts.se, se, rtol=1e-9, atol=0) and np.isclose(parts.df, df, rtol=1e-9)):
            raise ValueError(f"se {se:g} and df {df:g} are not those of {parts}")
        at = estimated_df_power(parts, alpha / k)
        high = (stats.t.ppf(1 - alpha / (2 * k), parts.df) + stats.norm.ppf(power)) * se
        while at(high) < power:
            high *= 2
        return float(brentq(lambda d: at(d) - power, 0.0, high, xtol=1e-10 * se))
    q = stats.t.ppf(1 - alpha / (2 * k), df)

    def short(delta: float) -> float:                   # power at noncentrality delta, less the target
        # the lower tail as the upper one of -delta: nct.cdf's far tail can be NaN (scipy 1.17)
        return stats.nct.sf(q, df, delta) + stats.nct.sf(q, df, -delta) - power

    high = q + stats.norm.ppf(power)                    # the normal-theory value, then doubled until enough
    while short(high) < 0:
        high *= 2
    c4 = stats.chi(df).mean() / np.sqrt(df) if np.isfinite(df) else 1.0
    return float(brentq(short, 0.0, high, xtol=1e-10) * se / c4)


def estimated_df_power(parts: SEParts, level: float):
    """d -> the two-sided power at level `level` of the run-level test of a true difference d
    (fractions), the parts taken as the truth: D ~ N(d, parts.se^2), each replicate's run variances
    reference x chi2_{n-1} / (n - 1) and other x chi2_{m-1} / (m - 1) (the shared term known), and
    its bar t_{df', 1-level/2} x SE' at that replicate's own Welch-Satterthwaite df', as
    `run_level_test` computes it. Integrated over the two chi-squares by Gauss-Legendre quadrature
    of their quantiles (POWER_NODES each)."""
    u, w = special.roots_legendre(POWER_NODES)

    def variances(v: float, dof: int) -> np.ndarray:      # v x chi2_dof / dof at the nodes
        return v * stats.chi2.ppf((u + 1) / 2, dof) / dof

    va = variances(parts.reference, parts.n - 1)[:, None]
    vb = variances(parts.other, parts.m - 1)[None, :]
    se2 = va + vb + parts.shared
    welch = va ** 2 / (parts.n - 1) + vb ** 2 / (parts.m - 1)
    df = np.divide(se2 ** 2, welch, out=np.full(se2.shape, np.inf), where=welch > 0)
    bar = (stats.t.ppf(1 - level / 2, df) * np.sqrt(se2)).ravel()
    weight = np.outer(w, w).ravel() / 4                   # each rule's weights sum to 2 on [-1, 1]
    sd = parts.se

    def power(d: float) -> float:
        return float(weight @ (stats.norm.sf((bar - d) / sd) + stats.norm.sf((bar + d) / sd)))
    return power


def equivalence_p(diff: float, se: float, df: float, margin: float) -> float:
    """Two one-sided tests (TOST) of |true difference| < `margin`: the larger of the p-values of
    H0: d <= -margin and H0: d >= +margin, each a one-sided t with `df`. Below alpha: the
    difference is shown to lie within +-margin (its 1 - 2 alpha interval inside it)."""
    if not se > 0:
        return float("nan")
    lower = stats.t.sf((diff + margin) / se, df)      # against d <= -margin
    upper = stats.t.cdf((diff - margin) / se, df)     # against d >= +margin
    return float(max(lower, upper))


def _defined(a_boot: np.ndarray, b_boot: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The resamples (columns) where the metric is defined for every run of both: (a_boot, b_boot,
    how many were left out); undefined is decided by the labels alone."""
    ok = ~np.isnan(np.vstack([a_boot, b_boot])).any(0)
    return a_boot[:, ok], b_boot[:, ok], int((~ok).sum())


def _compare(a: np.ndarray, b: np.ndarray, a_boot: np.ndarray, b_boot: np.ndarray, level: float,
             min_runs: int, min_test_patients: int, n_patients: int) -> tuple:
    """One method against the reference on one metric: (diff, low, high, p, unmarkable, undefined,
    se, df).
    a, b: full-set metrics (NaN where undefined); a_boot, b_boot: (runs, B) resampled."""
    a_boot, b_boot, undefined = _defined(a_boot, b_boot)
    if np.isnan(a).any() or np.isnan(b).any() or a_boot.shape[1] < 2:
        return None, None, None, None, "the metric undefined on the test set or its resamples", undefined, None, None
    diff, few = float(np.mean(b) - np.mean(a)), min(len(a), len(b)) < min_runs
    why = [f"fewer than {min_runs} runs ({len(b)} and {len(a)} of the reference, runs fine-tuned from one "
           "pretrained encoder count once): test-set sampling only, not a claim about the methods"] if few else []
    why += [f"{n_patients} test patients, fewer than {min_test_patients}"] if n_patients < min_test_patients else []
    if few:                     # no variance over runs to test with: the test set's sampling alone
        d_boot = b_boot.mean(0) - a_boot.mean(0)
        low, high = (float(x) for x in np.quantile(d_boot, [(1 - level) / 2, (1 + level) / 2]))
        return diff, low, high, None, "; ".join(why), undefined, None, None
    diff, se, df = run_level_se(a, b, a_boot, b_boot)
    if se == 0:                 # d is one number on every resample and every run: nothing to test it against
        why += [NOT_TESTABLE]
        return diff, diff, diff, None, "; ".join(why), undefined, None, None
    low, high, p = run_level_test(a, b, a_boot, b_boot, level)
    return diff, low, high, p, "; ".join(why) or None, undefined, se, df


def _resampled(cell: _Cell, metrics: Sequence[str], multilabel: bool, n_resamples: int,
               seed: int, keep: np.ndarray | None = None) -> dict[Path, dict[str, np.ndarray]]:
    """Every run's metrics on the same B patient resamples: {run: {metric: (B,)}}, NaN where
    undefined (BOOTSTRAP_CHUNK resamples at a time; the draws do not depend on the chunking)."""
    out = {p: {m: np.empty(n_resamples) for m in metrics} for p in cell.probs}
    rng = np.random.default_rng(seed)
    for start in range(0, n_resamples, BOOTSTRAP_CHUNK):
        w = patient_resample_weights(cell.patient_id, min(BOOTSTRAP_CHUNK, n_resamples - start), rng)
        for p in cell.probs:
            r = resample_metrics(cell.y, cell.probs[p], multilabel, w, keep)
            for m in metrics:
                out[p][m][start:start + len(w)] = r[m]
    return out


def _check_arguments(metrics, multilabel, n_resamples, level, min_runs) -> None:
    unknown = [m for m in metrics if m not in SUPPORTED]
    if unknown or (multilabel and "f1_argmax" in metrics):
        raise ValueError(f"metrics {list(metrics)}: supported are {SUPPORTED} (f1_argmax single-label only)")
    if n_resamples < 2 or not 0 < level < 1 or min_runs < 2:
        raise ValueError(f"need n_resamples >= 2, 0 < level < 1 and min_runs >= 2 (a variance over runs), "
                         f"got {n_resamples}, {level} and {min_runs}")


def _replicates(runs: Iterable[Path], m: str, point: dict[Path, dict[str, np.ndarray]],
                resampled: dict[Path, dict[str, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """A method's runs' metric `m` -> (replicates,) full-set and (replicates, B) resampled values:
    runs fine-tuned from one pretrained encoder share its pretraining randomness, so they are
    averaged into one."""
    groups: dict[str, list[Path]] = {}
    for p in runs:
        groups.setdefault(_encoder_of(p), []).append(p)
    full = np.array([np.mean([point[p][m][0] for p in g]) for g in groups.values()])
    return full, np.stack([np.mean([resampled[p][m] for p in g], axis=0) for g in groups.values()])


def cell_differences(runs: Mapping[str, Sequence], reference: str, metrics: Sequence[str], multilabel: bool,
                     class_names: Sequence[str], n_resamples: int = 1000, seed: int = 0, level: float = 0.95,
                     min_runs: int = 3, min_test_patients: int = 30,
                     min_positive_patients: int = 1) -> dict[str, dict[str, Difference]]:
    """Every other method's difference to `reference` in one cell, from one set of patient resamples.

    runs: method -> its runs in the cell (report `Run`s or run folders), one per seed, each with
    predictions.csv; metrics: of SUPPORTED (f1_argmax single-label only). Each run is resampled
    once however many methods it is compared with; a class with fewer than `min_positive_patients`
    positive test patients is left out of the macro metrics, as the fine-tuning job's metrics.json
    leaves it out. -> {method: {metric: Difference}}.
    PairingError when the runs do not share one test set or a method has one seed twice;
    FileNotFoundError naming the folder when a run has no predictions.csv.
    """
    _check_arguments(metrics, multilabel, n_resamples, level, min_runs)
    if reference not in runs:
        raise PairingError(f"no runs of the reference {reference!r}")
    by_seed = {method: _by_seed(method_runs, method) for method, method_runs in runs.items()}
    if len(by_seed) < 2 or not by_seed[reference]:
        return {}
    cell = _Cell(class_names)
    for folders in by_seed.values():
        for path in folders.values():
            cell.add(path)
    # the full test set as one copy of weight 1: classification_metrics' values, at bootstrap speed
    ones = np.ones((1, len(cell.y)))
    keep = kept_classes(cell.y, cell.patient_id, min_positive_patients)
    point = {p: resample_metrics(cell.y, cell.probs[p], multilabel, ones, keep) for p in cell.probs}
    resampled = _resampled(cell, metrics, multilabel, n_resamples, seed, keep)
    return _method_differences(by_seed, reference, metrics, point, resampled, len(cell.record_id),
                               len(np.unique(cell.patient_id)), n_resamples, level, min_runs, min_test_patients)


def difference(reference_runs: Sequence, other_runs: Sequence, metric: str, multilabel: bool,
               class_names: Sequence[str], n_resamples: int = 1000, seed: int = 0, level: float = 0.95,
               min_runs: int = 3, min_test_patients: int = 30) -> Difference:
    """metric(other) - metric(reference) over one cell's runs and test patients, with its interval,
    p-value and whether it may be marked (`cell_differences` for two methods)."""
    return cell_differences({"reference": reference_runs, "other": other_runs}, "reference", [metric], multilabel,
                            class_names, n_resamples, seed, level, min_runs, min_test_patients)["other"][metric]


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error): the i-th smallest of k is
    max over j <= i of min(1, (k - j + 1) p_(j)). (k,) -> (k,) in the input order."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, (len(p) - np.arange(len(p))) * p[order])
    out = np.empty_like(p)
    out[order] = np.maximum.accumulate(stepped)
    return out


def benjamini_hochberg(p: Sequence[float]) -> np.ndarray:
    """Benjamini-Hochberg step-up adjusted p-values (false discovery rate): the i-th smallest of
    k is min over j >= i of min(1, k p_(j) / j). (k,) -> (k,) in the input order."""
    p = np.asarray(p, dtype=float)
    order = np.argsort(p, kind="stable")[::-1]                 # largest first: the step-up minimum
    stepped = np.minimum(1.0, len(p) * p[order] / (len(p) - np.arange(len(p))))
    out = np.empty_like(p)
    out[order] = np.minimum.accumulate(stepped)
    return out


def adjust_p(p: Sequence[float], how: str) -> np.ndarray:
    """A family's p-values adjusted by `how` (ADJUSTMENTS: holm, bh, none); mark where < alpha."""
    if how not in ADJUSTMENTS:
        raise ValueError(f"adjust={how!r} is not one of {ADJUSTMENTS}")
    if how == "none" or not len(p):
        return np.asarray(p, dtype=float)
    return holm(p) if how == "holm" else benjamini_hochberg(p)


class _RegressionCell:
    """A regression cell's test set, aligned over runs as `_Cell` aligns a label cell's: the same
    records with the same targets and patients in every run; per run its predictions and its
    scaler's SD (MAE in SD units)."""

    def __init__(self):
        self.first: Path | None = None
        self.pred: dict[Path, np.ndarray] = {}
        self.sd: dict[Path, float] = {}

    def add(self, path: Path) -> None:
        if path in self.pred:
            return
        record_id, patient_id, y, pred = read_regression_predictions(path)
        self.sd[path] = _scaler_sd(path)
        if self.first is None:
            self.first, self.record_id, self.patient_id, self.y = path, record_id, patient_id, y
            self.index = {r: i for i, r in enumerate(record_id)}
            self.pred[path] = pred
            return
        differ = set(self.record_id) ^ set(record_id)
        if differ:
            raise PairingError(f"{self.first} and {path}: scored on different test records ({len(differ)} "
                               "record ids are in only one of them); a cell's runs need one test set")
        order = np.argsort([self.index[r] for r in record_id])
        if (y[order] != self.y).any() or (patient_id[order] != self.patient_id).any():
            raise PairingError(f"{self.first} and {path}: the same test records with other targets or patients")
        self.pred[path] = pred[order]


def read_regression_predictions(path: Path) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """A regression run's predictions.csv (record_id, patient_id, target, prediction) -> (record ids,
    patient ids (n,), targets (n,), predictions (n,)); FileNotFoundError / PairingError naming it."""
    import csv

    file = Path(path) / PREDICTIONS
    if not file.is_file():
        raise FileNotFoundError(f"{path}: no {PREDICTIONS}")
    try:
        with open(file, newline="") as f:
            rows = list(csv.DictReader(f))
        record_id = [r["record_id"] for r in rows]
        patient_id = np.array([r["patient_id"] for r in rows])
        y = np.array([float(r["target"]) for r in rows])
        pred = np.array([float(r["prediction"]) for r in rows])
    except (KeyError, ValueError, TypeError) as e:
        raise PairingError(f"{file}: not a regression predictions file (record_id, patient_id, target, "
                           f"prediction): {e}") from None
    if not rows:
        raise PairingError(f"{file}: no records")
    if len(set(record_id)) != len(record_id):
        raise PairingError(f"{file}: a record_id appears twice")
    return record_id, patient_id, y, pred


def _scaler_sd(path: Path) -> float:
    """The train split's target SD of a regression run (metrics.json target_scaler.sd)."""
    try:
        sd = float(json.loads((path / "metrics.json").read_text())["target_scaler"]["sd"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PairingError(f"{path}: cannot read target_scaler.sd from metrics.json ({e})") from None
    if not sd > 0:
        raise PairingError(f"{path}: metrics.json target_scaler.sd is {sd}, not > 0")
    return sd


def regression_cell_differences(runs: Mapping[str, Sequence], reference: str, metrics: Sequence[str],
                                n_resamples: int = 1000, seed: int = 0, level: float = 0.95, min_runs: int = 3,
                                min_test_patients: int = 30) -> dict[str, dict[str, Difference]]:
    """`cell_differences` for a regression cell: every other method's difference to `reference`
    on metrics of REGRESSION_SUPPORTED (mae, mae_sd, rmse, r2, pearson_r), one set of patient
    resamples for every run (the draw order of the module docstring), the same run-level test and
    replicates (runs of one pretrained encoder count once). D = other - reference as for every
    metric: for MAE a negative D is the better method (`Difference.better`).
    -> {method: {metric: Difference}}; PairingError / FileNotFoundError as cell_differences."""
    unknown = [m for m in metrics if m not in REGRESSION_SUPPORTED]
    if unknown:
        raise ValueError(f"metrics {list(metrics)}: supported are {REGRESSION_SUPPORTED}")
    _check_arguments([], False, n_resamples, level, min_runs)
    if reference not in runs:
        raise PairingError(f"no runs of the reference {reference!r}")
    by_seed = {method: _by_seed(method_runs, method) for method, method_runs in runs.items()}
    if len(by_seed) < 2 or not by_seed[reference]:
        return {}
    cell = _RegressionCell()
    for folders in by_seed.values():
        for path in folders.values():
            cell.add(path)
    ones = np.ones((1, len(cell.y)))
    point = {p: resample_regression(cell.y, cell.pred[p], cell.sd[p], ones) for p in cell.pred}
    resampled = {p: {m: np.empty(n_resamples) for m in metrics} for p in cell.pred}
    rng = np.random.default_rng(seed)
    for start in range(0, n_resamples, BOOTSTRAP_CHUNK):
        w = patient_resample_weights(cell.patient_id, min(BOOTSTRAP_CHUNK, n_resamples - start), rng)
        for p in cell.pred:
            r = resample_regression(cell.y, cell.pred[p], cell.sd[p], w)
            for m in metrics:
                resampled[p][m][start:start + len(w)] = r[m]
    return _method_differences(by_seed, reference, metrics, point, resampled, len(cell.record_id),
                               len(np.unique(cell.patient_id)), n_resamples, level, min_runs, min_test_patients)


def _method_differences(by_seed: dict, reference: str, metrics: Sequence[str], point: dict, resampled: dict,
                        n_records: int, n_patients: int, n_resamples: int, level: float, min_runs: int,
                        min_test_patients: int) -> dict[str, dict[str, "Difference"]]:
    """Every method's Difference from `reference` per metric, from one cell's point values and
    patient resamples (per prediction file): the label and the regression cells' common last step."""
    out: dict[str, dict[str, Difference]] = {}
    for method in by_seed:
        if method == reference or not by_seed[method]:
            continue
        out[method] = {}
        for m in metrics:
            a, a_boot = _replicates(by_seed[reference].values(), m, point, resampled)
            b, b_boot = _replicates(by_seed[method].values(), m, point, resampled)
            diff, low, high, p, why, undefined, se, df = _compare(a, b, a_boot, b_boot, level, min_runs,
                                                                  min_test_patients, n_patients)
            parts = None if se is None else run_level_parts(a, b, *_defined(a_boot, b_boot)[:2])[1]
            out[method][m] = Difference(m, diff, low, high, p, tuple(by_seed[method]), tuple(by_seed[reference]),
                                        n_records, n_patients, n_resamples, undefined, level, why, se, df, parts)
    return out
