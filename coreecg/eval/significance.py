"""Paired differences between methods in one table cell, with paired-bootstrap intervals and
p-values, from the runs' predictions.csv (docs/evaluation.md, "Paired differences").

A cell is one (dataset, mode, leads, train fraction); a method has one fine-tuning run per seed
there. The two methods of a comparison are scored on the same test records, so the bootstrap
resamples those records once for both (paired), which removes the between-patient variation
the two share and leaves the variation of their difference.

    d = paired_difference(core_runs, stmem_runs, "auroc", multilabel=False, class_names=names)
    d.diff, d.low, d.high, d.p_value, d.significant      # ST-MEM - CoRe-ECG, fractions

Statistic of resample b, over the S seeds both methods ran (paired by seed value: one seed is
one label-fraction subset for both): mean over the drawn seeds of metric(other) - metric(ref)
on the drawn patients. Draw order, fixed so that an independent computation reproduces every
resample bit for bit:

  patients  numbered in sorted order of their ids (P of them); resample b's patient counts are
            the b-th draw of Generator.multinomial(P, [1/P] * P) from default_rng(seed) (the
            draws of `bootstrap_ci` with the same seed: `patient_resample_weights`); every record
            of a patient drawn k times counts k times. One draw serves both methods and all seeds.
  seeds     only when S > 1: resample b's counts of the paired seeds (ascending seed order) are
            the b-th draw of multinomial(S, [1/S] * S) from
            default_rng(SeedSequence(seed).spawn(1)[0]), a stream of its own that restarts for
            every pair of methods (so a pair's result does not depend on the cell's other rows)
            and serves every metric of the pair.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from coreecg.eval.metrics import (BOOTSTRAP_CHUNK, classification_metrics, patient_resample_weights,
                                  resample_metrics)

PREDICTIONS = "predictions.csv"
SUPPORTED = ("acc", "f1", "f1_argmax", "auroc")


class PairingError(ValueError):
    """Runs that cannot be compared pairwise (other test records, labels, classes, no common
    seed, an unreadable predictions.csv); the message names the run folders."""


@dataclass(frozen=True)
class PairedDifference:
    """metric(other) - metric(reference) in one cell, as fractions (None where undefined).

    diff: difference of the metric means over the paired seeds on the full test set
    (classification_metrics on predictions.csv); low, high: percentile interval at `level` of the
    resampled statistic; p_value: two-sided bootstrap p (docs/evaluation.md); seeds: the paired
    seed values; unpaired_seeds: runs of either method whose seed the other lacks (left out);
    undefined_resamples: resamples skipped because the metric is undefined on them."""

    metric: str
    diff: float | None
    low: float | None
    high: float | None
    p_value: float | None
    seeds: tuple[int, ...]
    unpaired_seeds: int
    n_records: int
    n_patients: int
    n_resamples: int
    undefined_resamples: int
    level: float

    @property
    def significant(self) -> bool:
        """The interval excludes 0."""
        return self.low is not None and (self.low > 0 or self.high < 0)


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
    out: dict[int, Path] = {}
    for run in runs:
        seed, path = run_seed_dir(run)
        if seed in out:
            raise PairingError(f"{out[seed]} and {path}: two runs of {name} with seed {seed}")
        out[seed] = path
    return out


def paired_seeds(reference_runs: Sequence, other_runs: Sequence) -> tuple[list[int], int]:
    """-> (the seeds both have, ascending; how many runs of either have a seed the other lacks)."""
    a, b = set(_by_seed(reference_runs, "the reference")), set(_by_seed(other_runs, "the other method"))
    return sorted(a & b), len(a ^ b)


def _read(path: Path, class_names: Sequence[str]):
    """predictions.csv of a run folder -> RecordScores; PairingError naming the file otherwise."""
    from coreecg.eval.downstream import read_predictions   # lazy: downstream imports torch

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
                               "record ids are in only one of them); a paired difference needs one test set")
        order = np.argsort([self.index[r] for r in s.record_id])     # this file's rows in our order
        if (s.y[order] != self.y).any() or (np.asarray(s.patient_id)[order] != self.patient_id).any():
            raise PairingError(f"{self.first} and {path}: the same test records with other labels or patients")
        self.probs[path] = s.probs[order]


def cell_differences(runs: Mapping[str, Sequence], reference: str, metrics: Sequence[str], multilabel: bool,
                     class_names: Sequence[str], n_resamples: int = 1000, seed: int = 0,
                     level: float = 0.95) -> dict[str, dict[str, PairedDifference]]:
    """Every other method's paired difference to `reference` in one cell, from one set of resamples.

    runs: method -> its runs in the cell (report `Run`s or run folders), one per seed, each with
    predictions.csv; metrics: of SUPPORTED (f1_argmax single-label only). Only the runs of paired
    seeds are read, each resampled once however many methods it is compared with (B weighted
    copies through `resample_metrics`, BOOTSTRAP_CHUNK at a time). -> {method: {metric: diff}}.
    PairingError when a method shares no seed with the reference or the runs do not share one
    test set; FileNotFoundError naming the folder when a paired run has no predictions.csv.
    """
    unknown = [m for m in metrics if m not in SUPPORTED]
    if unknown or (multilabel and "f1_argmax" in metrics):
        raise ValueError(f"metrics {list(metrics)}: supported are {SUPPORTED} (f1_argmax single-label only)")
    if n_resamples < 1 or not 0 < level < 1:
        raise ValueError(f"need n_resamples >= 1 and 0 < level < 1, got {n_resamples} and {level}")
    if reference not in runs:
        raise PairingError(f"no runs of the reference {reference!r}")
    ref = _by_seed(runs[reference], reference)
    pairs: dict[str, tuple[list[int], int, dict[int, Path]]] = {}
    for method, method_runs in runs.items():
        if method == reference:
            continue
        other = _by_seed(method_runs, method)
        seeds = sorted(set(ref) & set(other))
        if not seeds:
            raise PairingError(f"{method} (seeds {sorted(other)}) and {reference} (seeds {sorted(ref)}) have "
                               f"no seed in common: {', '.join(map(str, other.values()))}")
        pairs[method] = seeds, len(set(ref) ^ set(other)), other
    cell = _Cell(class_names)
    for s in sorted({s for seeds, _, _ in pairs.values() for s in seeds}):
        cell.add(ref[s])
    for seeds, _, other in pairs.values():
        for s in seeds:
            cell.add(other[s])
    if cell.first is None:
        return {}

    paths = list(cell.probs)
    point = {p: classification_metrics(cell.y, cell.probs[p], multilabel, class_names) for p in paths}
    resampled = {p: {m: np.empty(n_resamples) for m in metrics} for p in paths}
    rng = np.random.default_rng(seed)
    for start in range(0, n_resamples, BOOTSTRAP_CHUNK):      # the draws do not depend on the chunking
        w = patient_resample_weights(cell.patient_id, min(BOOTSTRAP_CHUNK, n_resamples - start), rng)
        for p in paths:
            r = resample_metrics(cell.y, cell.probs[p], multilabel, w)
            for m in metrics:
                resampled[p][m][start:start + len(w)] = r[m]

    n_patients = len(np.unique(cell.patient_id))
    out = {}
    for method, (seeds, unpaired, other) in pairs.items():
        S = len(seeds)
        counts = None
        if S > 1:   # seeds drawn with replacement, shared by both methods and every metric
            seed_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
            counts = seed_rng.multinomial(S, np.full(S, 1 / S), size=n_resamples)       # (B, S)
        out[method] = {}
        for m in metrics:
            ref_values = [point[ref[s]][m] for s in seeds]
            other_values = [point[other[s]][m] for s in seeds]
            diff = (None if None in ref_values + other_values
                    else float(np.mean(other_values) - np.mean(ref_values)))
            d = np.stack([resampled[other[s]][m] - resampled[ref[s]][m] for s in seeds])   # (S, B)
            stats = d[0] if counts is None else (counts * d.T).sum(1) / S
            ok = stats[~np.isnan(stats)]
            low = high = p_value = None
            if len(ok):
                low, high = (float(q) for q in np.quantile(ok, [(1 - level) / 2, (1 + level) / 2]))
                # two-sided: twice the smaller tail at 0, each tail with the (1 + count) / (1 + B) correction
                tail = min((ok <= 0).sum(), (ok >= 0).sum())
                p_value = float(min(1.0, 2 * (1 + tail) / (1 + len(ok))))
            out[method][m] = PairedDifference(m, diff, low, high, p_value, tuple(seeds), unpaired,
                                              len(cell.record_id), n_patients, n_resamples,
                                              int(n_resamples - len(ok)), level)
    return out


def paired_difference(reference_runs: Sequence, other_runs: Sequence, metric: str, multilabel: bool,
                      class_names: Sequence[str], n_resamples: int = 1000, seed: int = 0,
                      level: float = 0.95) -> PairedDifference:
    """metric(other) - metric(reference) over one cell's paired seeds and test patients, with its
    paired-bootstrap interval and p-value (`cell_differences` for two methods)."""
    return cell_differences({"reference": reference_runs, "other": other_runs}, "reference", [metric],
                            multilabel, class_names, n_resamples, seed, level)["other"][metric]
