"""Differences between methods (coreecg/eval/significance.py, docs/evaluation.md "Differences
between methods"): the interval and p-value against an independent loop over materialised
resamples scored with scikit-learn; single-run cells are never significant; disjoint seed sets are
compared; Holm and Benjamini-Hochberg against hand computations; the A/A false-mark rate and the
power on synthetic predictions.csv files; mismatched test sets are refused; the report's Markdown,
CSV and LaTeX carry the differences, marks after the table's correction, and reasons."""
import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

import coreecg.eval.significance as significance
from coreecg.config import ReportConfig
from coreecg.eval.downstream import RecordScores, read_predictions, write_predictions
from coreecg.eval.metrics import classification_metrics
from coreecg.eval.report import RunError, write_report
from coreecg.eval.calibration import Scenario, binomial_upper, mark_rates
from coreecg.eval.significance import (PairingError, adjust_p, benjamini_hochberg, cell_differences, difference,
                                       holm)

CLASSES = ["NORM", "MI", "STTC", "CD"]
N_RECORDS, N_PATIENTS = 60, 40


def make_task(multilabel: bool):
    """60 records of 40 patients (the first 20 have two records): ids, patients, labels (60, 4)."""
    rng = np.random.default_rng(7)
    patients = [f"P{i:02d}" for i in range(N_PATIENTS)]
    pids = np.array(patients + patients[:N_RECORDS - N_PATIENTS])
    rids = [f"R{i:03d}" for i in range(N_RECORDS)]
    y = ((rng.random((N_RECORDS, 4)) < 0.35).astype(int) if multilabel
         else np.eye(4, dtype=int)[np.arange(N_RECORDS) % 4])
    return rids, pids, y


def make_probs(y: np.ndarray, multilabel: bool, noise: int, sharpen: float = 0.0) -> np.ndarray:
    """Noisy probabilities; `sharpen` mixes them towards the truth (a clearly better method)."""
    logits = np.random.default_rng(noise).normal(0, 1.0, y.shape) + y
    p = 1 / (1 + np.exp(-logits)) if multilabel else np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    return (1 - sharpen) * p + sharpen * y


def make_run(root: Path, name: str, method: str, seed: int, task, probs, multilabel: bool,
             dataset: str = "ptbxl", rows=None, predictions: bool = True, leads: str = "12") -> Path:
    """A fine-tuning run folder: predictions.csv (rows in the order `rows`) and a metrics.json whose
    test metrics are classification_metrics of that file, as the fine-tuning job writes them."""
    rids, pids, y = task
    rows = np.arange(len(rids)) if rows is None else np.asarray(rows)
    run = root / name
    run.mkdir(parents=True)
    scores = RecordScores([rids[i] for i in rows], pids[rows], y[rows], probs[rows], None)
    write_predictions(run / "predictions.csv", scores, CLASSES)
    back = read_predictions(run / "predictions.csv", CLASSES)
    test = classification_metrics(back.y, back.probs, multilabel, CLASSES)
    record = {"method": method, "dataset": dataset, "mode": "finetune", "leads": leads, "train_fraction": 1.0,
              "seed": seed, "multilabel": multilabel, "class_names": CLASSES, "test": {**test, "ci": {}},
              "val": test, "crop_rule": "test", "encoder": None, "encoder_config_hash": "x"}
    (run / "metrics.json").write_text(json.dumps(record))
    if not predictions:
        (run / "predictions.csv").unlink()
    return run


# ----------------------------------------------------------------- the independent computation


def read_by_hand(run: Path) -> dict[str, tuple[str, list[int], list[float]]]:
    with open(run / "predictions.csv", newline="") as f:
        return {r["record_id"]: (r["patient_id"], [int(c in r["labels"].split("|")) for c in CLASSES],
                                 [float(r[f"p_{c}"]) for c in CLASSES]) for r in csv.DictReader(f)}


def sklearn_metric(metric: str, y: np.ndarray, p: np.ndarray, multilabel: bool, scored_f1, scored_auroc):
    """The metric of a (materialised) set with scikit-learn; None where a class scored on the
    full set has no positive (or, for AUROC, no negative) here."""
    if metric == "acc":
        if multilabel:
            return accuracy_score(y.ravel(), (p >= 0.5).ravel())
        return accuracy_score(y.argmax(1), p.argmax(1))
    if metric in ("f1", "f1_argmax"):
        if any(y[:, k].sum() == 0 for k in scored_f1):
            return None
        if metric == "f1_argmax":
            return f1_score(y.argmax(1), p.argmax(1), labels=scored_f1, average="macro", zero_division=0)
        # per class, one-vs-rest at 0.5 (the indicator form scores every column on its own)
        return np.mean(f1_score(y[:, scored_f1], p[:, scored_f1] >= 0.5, average=None, zero_division=0))
    if any(y[:, k].sum() in (0, len(y)) for k in scored_auroc):
        return None
    return np.mean(roc_auc_score(y[:, scored_auroc], p[:, scored_auroc], average=None))


def by_loops(ref: dict[int, Path], other: dict[int, Path], metric: str, multilabel: bool, B: int, seed: int,
             level: float = 0.95, min_runs: int = 3):
    """The rule written out: per resample, draw patients in the documented order, build the
    resampled copy record by record, score every run with scikit-learn; then Welch's t over runs
    with the shared patient term (or, below min_runs, the percentile interval), in plain loops."""
    data = {(m, s): read_by_hand(runs[s]) for m, runs in (("ref", ref), ("other", other)) for s in runs}
    first = data[("ref", min(ref))]
    records = sorted(first)
    patients = sorted({first[r][0] for r in records})          # numbered in sorted order of their ids
    records_of = {p: [i for i, r in enumerate(records) if first[r][0] == p] for p in patients}
    y = np.array([first[r][1] for r in records])
    probs = {k: np.array([d[r][2] for r in records]) for k, d in data.items()}
    scored_f1 = [k for k in range(4) if y[:, k].sum() > 0]
    scored_auroc = [k for k in range(4) if 0 < y[:, k].sum() < len(y)]

    def score(key, rows):
        return sklearn_metric(metric, y[rows], probs[key][rows], multilabel, scored_f1, scored_auroc)

    keys_a, keys_b = [("ref", s) for s in sorted(ref)], [("other", s) for s in sorted(other)]
    a = [score(k, np.arange(len(y))) for k in keys_a]
    b = [score(k, np.arange(len(y))) for k in keys_b]
    rng = np.random.default_rng(seed)
    boot_a, boot_b = [], []
    for _ in range(B):
        counts = rng.multinomial(len(patients), [1 / len(patients)] * len(patients))
        rows = [i for p, c in zip(patients, counts) for _ in range(c) for i in records_of[p]]
        ra, rb = [score(k, rows) for k in keys_a], [score(k, rows) for k in keys_b]
        if None not in ra + rb:
            boot_a.append(ra)
            boot_b.append(rb)
    n, m, kept = len(a), len(b), len(boot_a)
    point = sum(b) / m - sum(a) / n
    d_boot = [sum(rb) / m - sum(ra) / n for ra, rb in zip(boot_a, boot_b)]
    if min(n, m) < min_runs:
        low, high = np.quantile(d_boot, [(1 - level) / 2, (1 + level) / 2])
        return point, low, high, None, B - kept

    def sample_var(xs):
        mean = sum(xs) / len(xs)
        return sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)

    own = 0.0
    for boot, k in ((boot_a, n), (boot_b, m)):        # each run's own patient noise: var(w) / k
        own += np.mean([sample_var([r[i] - sum(r) / k for r in boot]) for i in range(k)]) / (k - 1)
    va, vb = sample_var(a) / n, sample_var(b) / m
    se = np.sqrt(va + vb + max(0.0, sample_var(d_boot) - own))
    df = se ** 4 / (va ** 2 / (n - 1) + vb ** 2 / (m - 1))
    half = stats.t.ppf((1 + level) / 2, df) * se
    return point, point - half, point + half, 2 * stats.t.sf(abs(point) / se, df), B - kept


def runs_of(tmp_path, name, method, seeds, task, multilabel, noise0, sharpen=0.0, rows=None):
    """{seed: run folder} of one method; run s has probability noise seed noise0 + s."""
    return {s: make_run(tmp_path, f"{name}{s}", method, s, task, make_probs(task[2], multilabel, noise0 + s, sharpen),
                        multilabel, rows=rows) for s in seeds}


@pytest.mark.parametrize("multilabel, metrics", [(False, ["acc", "f1", "f1_argmax", "auroc"]),
                                                 (True, ["acc", "f1", "auroc"])])
def test_interval_and_p_match_an_independent_loop(tmp_path, monkeypatch, multilabel, metrics):
    monkeypatch.setattr(significance, "BOOTSTRAP_CHUNK", 12)    # 30 resamples in chunks of 12, 12, 6
    task = make_task(multilabel)
    shuffled = np.random.default_rng(3).permutation(N_RECORDS)   # rows aligned by record_id, not position
    ref = runs_of(tmp_path, "ref", "CoRe-ECG", (0, 1, 2), task, multilabel, 10)
    other = runs_of(tmp_path, "other", "ST-MEM", (5, 6, 7), task, multilabel, 20, 0.1, shuffled)  # disjoint seeds
    B, seed = 30, 5
    runs = {"CoRe-ECG": list(ref.values()), "ST-MEM": list(other.values())}
    got = cell_differences(runs, "CoRe-ECG", metrics, multilabel, CLASSES, n_resamples=B, seed=seed)["ST-MEM"]
    few = cell_differences(runs, "CoRe-ECG", metrics, multilabel, CLASSES, n_resamples=B, seed=seed,
                           min_runs=4)["ST-MEM"]
    for metric in metrics:
        point, low, high, p, undefined = by_loops(ref, other, metric, multilabel, B, seed)
        d = got[metric]
        assert d.seeds == (5, 6, 7) and d.reference_seeds == (0, 1, 2) and (d.n_records, d.n_patients) == (60, 40)
        assert d.diff == pytest.approx(point, abs=1e-12)
        assert (d.low, d.high) == (pytest.approx(low, abs=1e-9), pytest.approx(high, abs=1e-9)), metric
        assert d.p_value == pytest.approx(p, abs=1e-9) and d.undefined_resamples == undefined
        assert d.testable and d.unmarkable is None and d.low < d.high
        # the point estimate is the table's: the difference of the metrics.json means
        table = [np.mean([json.loads((r / "metrics.json").read_text())["test"][metric] for r in runs.values()])
                 for runs in (other, ref)]
        assert d.diff == pytest.approx(table[0] - table[1], abs=1e-12)
        # below min_runs: the percentile interval of patient resamples alone, no p, not testable
        point, low, high, p, _ = by_loops(ref, other, metric, multilabel, B, seed, min_runs=4)
        f = few[metric]
        assert (f.diff, f.low, f.high) == pytest.approx((point, low, high), abs=1e-12)
        assert f.p_value is None and p is None
        assert not f.testable and "test-set sampling only, not a claim about the methods" in f.unmarkable


def test_single_run_cells_are_never_significant(tmp_path):
    task = make_task(False)
    ref = runs_of(tmp_path, "ref", "CoRe-ECG", (0,), task, False, 10)
    sharp = runs_of(tmp_path, "sharp", "Sharp", (0,), task, False, 10, 0.6)
    d = difference(list(ref.values()), list(sharp.values()), "auroc", False, CLASSES, n_resamples=200)
    assert d.low > 0 and d.diff > 0.1                       # far from 0 on this test set ...
    assert d.p_value is None and not d.testable and not d.significant      # ... yet not a claim
    assert d.unmarkable == ("fewer than 3 runs (1 and 1 of the reference, runs fine-tuned from one pretrained "
                            "encoder count once): test-set sampling only, not a claim about the methods")
    point, low, high, _, _ = by_loops(ref, sharp, "auroc", False, 200, 0)
    assert (d.low, d.high) == pytest.approx((low, high), abs=1e-12)


def test_disjoint_seed_sets_are_compared(tmp_path):
    """Runs are exchangeable replicates: no seed in common is no obstacle, and unequal run counts
    are fine; a clearly better method is significant, a second set of seeds of the same method not."""
    task = make_task(False)
    ref = runs_of(tmp_path, "ref", "CoRe-ECG", (0, 1, 2), task, False, 10)
    sharp = runs_of(tmp_path, "sharp", "Sharp", (10, 11, 12, 13), task, False, 30, 0.6)
    same = runs_of(tmp_path, "same", "Same", (20, 21, 22), task, False, 40)       # CoRe-ECG, other seeds
    out = cell_differences({"CoRe-ECG": list(ref.values()), "Sharp": list(sharp.values()),
                            "Same": list(same.values())}, "CoRe-ECG", ["acc", "auroc"], False, CLASSES,
                           n_resamples=200)
    for metric in ("acc", "auroc"):
        better, aa = out["Sharp"][metric], out["Same"][metric]
        assert better.seeds == (10, 11, 12, 13) and better.reference_seeds == (0, 1, 2)
        assert better.testable and better.significant and better.p_value < 0.01 and better.low > 0
        assert aa.testable and not aa.significant and aa.low < 0 < aa.high


def test_fine_tunings_of_one_pretrained_encoder_are_one_run(tmp_path):
    """Three fine-tuning seeds from one pretraining replicate the fine-tuning only: they count as
    one run (averaged), so the cell is not marked; three pretrainings are three runs."""
    task = make_task(False)
    ref = runs_of(tmp_path, "ref", "CoRe-ECG", (0, 1, 2), task, False, 10)
    sharp = runs_of(tmp_path, "sharp", "Sharp", (10, 11, 12), task, False, 30, 0.6)

    def encoders(runs: dict, name) -> None:
        for seed, run in runs.items():
            record = json.loads((run / "metrics.json").read_text())
            (run / "metrics.json").write_text(json.dumps({**record, "encoder": str(tmp_path / name(seed))}))

    encoders(ref, lambda s: "enc-ref")
    encoders(sharp, lambda s: "enc-sharp")
    shared = difference(list(ref.values()), list(sharp.values()), "auroc", False, CLASSES, n_resamples=200)
    assert not shared.testable and shared.p_value is None and shared.unmarkable.startswith("fewer than 3 runs (1 and 1")
    assert shared.seeds == (10, 11, 12)                      # the runs are still listed
    encoders(ref, lambda s: f"enc-ref-{s}")
    encoders(sharp, lambda s: f"enc-sharp-{s}")
    own = difference(list(ref.values()), list(sharp.values()), "auroc", False, CLASSES, n_resamples=200)
    assert own.testable and own.significant and own.diff == pytest.approx(shared.diff)


def test_a_copy_is_zero_and_too_few_patients_are_not_marked(tmp_path):
    task = make_task(False)
    ref = list(runs_of(tmp_path, "ref", "CoRe-ECG", (0, 1, 2), task, False, 10).values())
    copy = list(runs_of(tmp_path, "copy", "Copy", (0, 1, 2), task, False, 10).values())
    sharp = list(runs_of(tmp_path, "sharp", "Sharp", (0, 1, 2), task, False, 10, 0.6).values())
    out = cell_differences({"CoRe-ECG": ref, "Copy": copy, "Sharp": sharp}, "CoRe-ECG", ["acc", "f1", "auroc"],
                           False, CLASSES, n_resamples=200)
    for metric in ("acc", "f1", "auroc"):
        same, better = out["Copy"][metric], out["Sharp"][metric]
        assert same.diff == 0.0 and same.p_value == 1.0 and same.low < 0 < same.high and not same.significant
        assert better.diff > 0 and better.low > 0 and better.significant and better.p_value < 0.05
    # 40 test patients: with min_test_patients 50 the p-value stays, the mark goes
    few = difference(ref, sharp, "auroc", False, CLASSES, n_resamples=200, min_test_patients=50)
    assert few.p_value == out["Sharp"]["auroc"].p_value and few.unmarkable == "40 test patients, fewer than 50"
    assert not few.testable and not few.significant
    both = difference(ref[:1], sharp[:1], "auroc", False, CLASSES, n_resamples=50, min_test_patients=50)
    assert both.unmarkable == ("fewer than 3 runs (1 and 1 of the reference, runs fine-tuned from one pretrained "
                               "encoder count once): test-set sampling only, not a claim about the methods; "
                               "40 test patients, fewer than 50")     # tiny's ICBEB2018 cells
    with pytest.raises(ValueError, match="f1_argmax"):
        difference(ref, copy, "f1_argmax", True, CLASSES)
    with pytest.raises(ValueError, match="min_runs >= 2"):
        difference(ref, copy, "acc", False, CLASSES, min_runs=1)
    with pytest.raises(PairingError, match=r"copy0 and .*copy0\b.*two runs of other with seed 0"):
        difference(ref, [copy[0], copy[0]], "acc", False, CLASSES)


def test_holm_and_benjamini_hochberg_against_a_hand_computation():
    p = [0.01, 0.04, 0.03, 0.005, 0.5]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04, 0.5 times 5, 4, 3, 2, 1 -> 0.025, 0.04, 0.09, 0.08, 0.5,
    # made non-decreasing -> 0.025, 0.04, 0.09, 0.09, 0.5
    assert holm(p) == pytest.approx([0.04, 0.09, 0.09, 0.025, 0.5])
    # BH: sorted times 5/1, 5/2, 5/3, 5/4, 5/5 -> 0.025, 0.025, 0.05, 0.05, 0.5, non-increasing from the top
    assert benjamini_hochberg(p) == pytest.approx([0.025, 0.05, 0.05, 0.025, 0.5])
    assert adjust_p(p, "holm") == pytest.approx(holm(p)) and list(adjust_p(p, "none")) == p
    assert holm([0.3, 0.6]) == pytest.approx([0.6, 0.6]) and holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])
    assert len(adjust_p([], "bh")) == 0
    with pytest.raises(ValueError, match="adjust='bonferroni'"):
        adjust_p(p, "bonferroni")


def test_different_test_records_are_refused_naming_both_folders(tmp_path):
    task = make_task(False)
    rids, pids, y = task
    ref = [make_run(tmp_path, "ref0", "CoRe-ECG", 0, task, make_probs(y, False, 10), False)]
    other_ids = list(rids)
    other_ids[5] = "R999"                                   # one record replaced: 2 ids in only one set
    bad = [make_run(tmp_path, "other0", "ST-MEM", 0, (other_ids, pids, y), make_probs(y, False, 20), False)]
    with pytest.raises(ValueError, match=r"ref0.*other0.*\b2 record ids") as e:
        difference(ref, bad, "auroc", False, CLASSES, n_resamples=10)
    assert isinstance(e.value, PairingError)
    with pytest.raises(RunError, match=r"ref0.*other0"):             # the report names them too
        write_report(ref + bad, tmp_path / "out", report=ReportConfig(bootstrap_resamples=10))
    assert not (tmp_path / "out").exists()
    relabelled = [make_run(tmp_path, "other1", "ST-MEM", 0, (rids, pids, np.roll(y, 1, axis=0)),
                           make_probs(y, False, 20), False)]
    with pytest.raises(PairingError, match=r"ref0 and .*other1: the same test records with other labels"):
        difference(ref, relabelled, "acc", False, CLASSES, n_resamples=10)


# ----------------------------------------------------------------- calibration (docs/evaluation.md)


def test_an_aa_comparison_is_marked_in_at_most_5_percent_of_tables(tmp_path):
    """One method against itself on disjoint seeds, 3 runs each, in 200 simulated tables: the share
    with a raw p < 0.05 on AUROC (independent tables) and the share of tables with any mark after
    Holm over ACC, F1, AUROC stay within what a true 5 % gives 99 % of the time."""
    rates = mark_rates(tmp_path, Scenario(runs=3), n_tables=200, seed=1, n_resamples=100)
    bound = binomial_upper(0.05, 200)                         # 0.086
    assert rates["auroc_raw"] <= bound and rates["table_any"] <= bound and rates["cell_adjusted"] <= bound
    assert abs(rates["mean_auroc_diff"]) < 0.01 and rates["run_sd_auroc"] > 0.02     # the runs do vary


def test_a_real_difference_is_marked_with_the_stated_power(tmp_path):
    """The other method's skill +0.4 (8.3 AUROC points, 2.3 run standard deviations), 5 runs each:
    docs/evaluation.md states 0.91 raw and 0.77 marked after Holm (400 tables); 60 tables must not
    fall below what that power gives 99 % of the time."""
    rates = mark_rates(tmp_path, Scenario(runs=5, effect=0.4), n_tables=60, seed=2, n_resamples=100)
    assert 0.06 < rates["mean_auroc_diff"] < 0.11
    assert rates["auroc_raw"] >= 0.91 - 2.326 * np.sqrt(0.91 * 0.09 / 60)
    assert rates["auroc_marked"] >= 0.77 - 2.326 * np.sqrt(0.77 * 0.23 / 60)


# ----------------------------------------------------------------- the report


def md_rows(text: str, first: str = "| Method") -> dict[str, dict[str, str]]:
    """The first Markdown table of `text` whose header starts with `first`: {row: {column: cell}}."""
    block = next(b for b in text.split("\n\n") if b.startswith(first)).splitlines()
    header = [c.strip() for c in block[0].strip("|").split("|")]
    return {r[0]: dict(zip(header[1:], r[1:])) for r in
            ([c.strip() for c in line.strip("|").split("|")] for line in block[2:])}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """PTB-XL (single-label) and Ningbo (multi-label): CoRe-ECG (seeds 0-2), an exact copy (the same
    seeds), a sharper method on other seeds (10-12), a method without predictions.csv, and a sharper
    method with one run (tiny.yaml's case: far from CoRe-ECG on this test set, not a claim)."""
    tmp_path = tmp_path_factory.mktemp("significance_report")
    runs = []
    for dataset, multilabel in (("ptbxl", False), ("ningbo", True)):
        task = make_task(multilabel)
        y = task[2]
        for s in (0, 1, 2):
            base = make_probs(y, multilabel, 10 + s)
            runs += [make_run(tmp_path / "runs", f"{dataset}-core{s}", "CoRe-ECG", s, task, base, multilabel, dataset),
                     make_run(tmp_path / "runs", f"{dataset}-copy{s}", "Copy", s, task, base, multilabel, dataset),
                     make_run(tmp_path / "runs", f"{dataset}-sharp{s}", "Sharp", 10 + s, task,
                              make_probs(y, multilabel, 20 + s, 0.6), multilabel, dataset)]
        runs += [make_run(tmp_path / "runs", f"{dataset}-nopred", "NoPred", 0, task, make_probs(y, multilabel, 30),
                          multilabel, dataset, predictions=False),
                 make_run(tmp_path / "runs", f"{dataset}-single", "Single", 7, task,
                          make_probs(y, multilabel, 31, 0.6), multilabel, dataset)]
    out = tmp_path / "report"
    written = write_report(runs, out, report=ReportConfig(bootstrap_resamples=200))
    return out, written, runs


def test_report_marks_significant_differences(report):
    out, written, _ = report
    text = (out / "comparison.md").read_text()
    table = md_rows(text)
    sharp, copy, core, single = table["Sharp"], table["Copy"], table["CoRe-ECG"], table["Single"]
    for column in ("PTB-XL ACC", "PTB-XL F1", "PTB-XL AUROC", "Ningbo F1", "Ningbo AUROC"):
        assert sharp[column].startswith("**") and sharp[column].endswith("\\*"), column   # best, and marked
        assert not copy[column].endswith("\\*") and not core[column].endswith("\\*")
        assert not single[column].endswith("\\*")                       # sharp too, but one run
    assert not any(v.endswith("\\*") for v in table["NoPred"].values())
    assert ("\\* the difference to CoRe-ECG has a p-value below 0.05 after Holm's correction within its metric's "
            "family: AUROC (primary): 4 comparison(s); ACC, F1 (secondary, each corrected in its own family): 4, 4. "
            "Welch's t over training runs (each method >= 3 runs in the cell), test patients resampled within "
            "(200 resamples") in text
    assert re.search(r"AUROC: [1-4] different, \d equivalent within ±2 points \(two one-sided tests, "
                     r"report\.equivalence_margin\), \d inconclusive\. The smallest AUROC difference", text)
    # Single (one run) and NoPred each have 6 cells (2 datasets x 3 metrics) that cannot be marked, and say why
    assert ("6 cell(s) have fewer than 3 runs of a method: their difference interval is test-set sampling only, "
            "not a claim about the methods; never marked. 6 cell(s) have no difference: 6 with no "
            "predictions.csv. Cells that cannot be marked are not counted in the correction.") in text
    diffs = md_rows(text.split("Differences to CoRe-ECG")[1])
    assert set(diffs) == {"Copy", "Sharp", "Single"}
    assert re.fullmatch(r"\+0\.0 \[-\d+\.\d, \+\d+\.\d\]", diffs["Copy"]["PTB-XL AUROC"])   # run-to-run spread
    assert re.fullmatch(r"\+\d+\.\d \[\+\d+\.\d, \+\d+\.\d\]", diffs["Sharp"]["PTB-XL AUROC"])
    assert re.fullmatch(r"\+\d+\.\d \[\+\d+\.\d, \+\d+\.\d\]§", diffs["Single"]["PTB-XL AUROC"])  # excludes 0
    assert "§ fewer than 3 runs of a method: test-set sampling only, not a claim about the methods" in text
    assert "F1: macro F1 at the paper's fixed 0.5 threshold" in text
    # the lead and fraction tables hold the same 12-lead cells, each corrected within its own table
    assert md_rows((out / "lead_reduction.md").read_text())["Sharp"]["PTB-XL 12-lead AUROC"].endswith("\\*")


def hand_holm(p: list[float]) -> list[float]:
    """Holm written out: the i-th smallest of k times (k - i), never below the one before."""
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def test_report_csv_holds_raw_and_adjusted_p_run_counts_and_reasons(report, tmp_path):
    out, _, runs = report
    with open(out / "comparison.csv", newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    sharp, copy, single = rows["Sharp"], rows["Copy"], rows["Single"]
    assert (copy["PTB-XL F1 diff"], copy["PTB-XL F1 p"], copy["PTB-XL F1 p adjusted"]) == ("0.00", "1", "1")
    assert copy["PTB-XL F1 unmarked because"] == "adjusted p (holm) 1 >= 0.05"
    assert (copy["PTB-XL F1 family"], copy["PTB-XL AUROC family"]) == ("f1 (4)", "auroc (4)")
    assert copy["PTB-XL F1 equivalence p adjusted"] == "" and copy["PTB-XL AUROC equivalence p adjusted"] != ""
    assert sharp["PTB-XL AUROC verdict"].startswith("different (adjusted p ")
    assert float(copy["PTB-XL AUROC detectable"]) > 0
    low, high = (float(sharp[f"Ningbo AUROC {k}"]) for k in ("diff low", "diff high"))
    assert 0 < low < float(sharp["Ningbo AUROC diff"]) < high and float(sharp["Ningbo AUROC p adjusted"]) < 0.05
    assert (sharp["PTB-XL ACC diff runs"], sharp["PTB-XL ACC diff reference runs"]) == ("3", "3")
    assert sharp["PTB-XL ACC unmarked because"] == ""                                   # marked
    # the adjusted p-values are Holm's within each metric's family of 4 testable cells (Copy and Sharp), by hand
    family = []
    for metric in ("ACC", "F1", "AUROC"):
        own = [(m, f"{d} {metric}") for m in ("Copy", "Sharp") for d in ("PTB-XL", "Ningbo")]
        expected = hand_holm([float(rows[m][f"{c} p"]) for m, c in own])
        assert [float(rows[m][f"{c} p adjusted"]) for m, c in own] == pytest.approx(expected, rel=0.01)
        family += own
    # one run: an interval, no p, the reason; no predictions: the reason
    assert (single["PTB-XL AUROC p"], single["PTB-XL AUROC p adjusted"]) == ("", "")
    assert float(single["PTB-XL AUROC diff low"]) > 0 and single["PTB-XL AUROC diff runs"] == "1"
    assert single["PTB-XL AUROC unmarked because"] == ("fewer than 3 runs (1 and 3 of the reference, runs fine-tuned "
                                                       "from one pretrained encoder count once): test-set "
                                                       "sampling only, not a claim about the methods")
    assert rows["NoPred"]["PTB-XL ACC unmarked because"] == "no predictions.csv"
    # the difference is the one of the table's means (metrics.json), in percentage points
    auroc = {m: np.mean([json.loads((r / "metrics.json").read_text())["test"]["auroc"] for r in runs
                         if r.name.startswith(f"ptbxl-{m}")]) for m in ("core", "sharp")}
    assert float(sharp["PTB-XL AUROC diff"]) == pytest.approx(100 * (auroc["sharp"] - auroc["core"]), abs=0.005)
    assert all(rows[m][k] == "" for m in ("CoRe-ECG", "NoPred") for k in ("PTB-XL ACC diff", "PTB-XL ACC p"))
    assert rows["Sharp"]["PTB-XL ACC n"] == "3" and rows["Sharp"]["PTB-XL ACC"]      # old columns unchanged
    # Benjamini-Hochberg, or no correction, on request, named in the legend
    write_report(runs, tmp_path / "bh", report=ReportConfig(bootstrap_resamples=200, adjust="bh"))
    write_report(runs, tmp_path / "none", report=ReportConfig(bootstrap_resamples=200, adjust="none"))
    assert "after the Benjamini-Hochberg correction (false discovery rate) within its metric's family" in \
        (tmp_path / "bh" / "comparison.md").read_text()
    with open(tmp_path / "none" / "comparison.csv", newline="") as f:
        none = {r["method"]: r for r in csv.DictReader(f)}
    assert all(none[m][f"{c} p adjusted"] == none[m][f"{c} p"] == rows[m][f"{c} p"] for m, c in family)


def test_more_runs_or_patients_asked_unmark_everything(report, tmp_path):
    _, _, runs = report
    write_report(runs, tmp_path / "r", report=ReportConfig(bootstrap_resamples=50, min_runs=4))
    text = (tmp_path / "r" / "comparison.md").read_text()
    assert "\\*" not in text.split("\n\n")[2] and "AUROC (primary): no testable comparison" in text
    assert "18 cell(s) have fewer than 4 runs of a method" in text
    write_report(runs, tmp_path / "p", report=ReportConfig(bootstrap_resamples=50, min_test_patients=50))
    text = (tmp_path / "p" / "comparison.md").read_text()
    assert "\\*" not in text.split("\n\n")[2] and "AUROC (primary): no testable comparison" in text
    assert ("6 cell(s) have fewer than 3 runs of a method: their difference interval is test-set sampling only, "
            "not a claim about the methods; never marked. 18 cell(s) have fewer than 50 test patients: not marked.") \
        in text


def test_report_writes_latex(report, tmp_path):
    out, written, runs = report
    assert {p.name for p in written} >= {"comparison.tex", "lead_reduction.tex", "train_fraction.tex"}
    tex = (out / "comparison.tex").read_text()
    assert tex.index(r"\toprule") < tex.index(r"\midrule") < tex.index(r"\bottomrule")
    assert r"\multicolumn{3}{c}{\textbf{PTB-XL}}" in tex and r"\multicolumn{3}{c}{\textbf{Ningbo}}" in tex
    sharp = next(line for line in tex.splitlines() if line.startswith("Sharp &"))
    cells = [c.strip() for c in sharp.removesuffix(r"\\").split("&")][1:]
    assert len(cells) == 6 and all(c.startswith(r"\textbf{") and c.endswith(r"\textsuperscript{*}") for c in cells[1:3])
    core = next(line for line in tex.splitlines() if line.startswith("CoRe-ECG &"))
    assert r"\textsuperscript{*}" not in core and r"$\pm$" in core
    assert r"\underline{" in tex                                        # second best
    assert r"\textsuperscript{*} the difference to CoRe-ECG has a p-value below 0.05 after Holm's" in tex
    assert "test-set sampling only, not a claim about the methods" in tex
    # 12 leads only: one column block, no block layout
    assert r"\textbf{Leads}" not in (out / "lead_reduction.tex").read_text()
    # with 6-lead runs of two methods: the paper's Table 2 layout, a row block per lead set, those two methods
    task = make_task(False)
    six = [make_run(tmp_path / "six", f"{m}-6", m, 0, task, make_probs(task[2], False, 40 + i), False, leads="6")
           for i, m in enumerate(("CoRe-ECG", "Sharp"))]
    write_report([*runs, *six], tmp_path / "report6", report=ReportConfig(bootstrap_resamples=20))
    lead = (tmp_path / "report6" / "lead_reduction.tex").read_text()
    assert r"\multirow{2}{*}{\textbf{Leads}}" in lead
    assert r"\multirow{2}{*}{12}" in lead and r"\multirow{2}{*}{6}" in lead
    assert "Copy" not in lead and "Single" not in lead


def test_the_bootstrap_seed_comes_from_the_config(report, tmp_path):
    _, _, runs = report
    diffs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        write_report(runs, tmp_path / name, report=ReportConfig(bootstrap_resamples=50, seed=seed))
        diffs[name] = (tmp_path / name / "comparison.csv").read_text()
    assert diffs["a"] == diffs["b"] and diffs["a"] != diffs["c"]     # same seed, same intervals


def test_a_comparison_with_no_variance_is_not_testable_and_not_counted(tmp_path):
    """Constant outputs in every run of both methods: d is one number on every run and resample, so
    there is nothing to test it against; it is named "not testable", has no p and joins no family."""
    task = make_task(False)
    flat = np.full((N_RECORDS, 4), 0.25)
    ref = [make_run(tmp_path, f"ref{s}", "CoRe-ECG", s, task, flat, False) for s in range(3)]
    other = [make_run(tmp_path, f"oth{s}", "Flat", 10 + s, task, flat, False) for s in range(3)]
    d = difference(ref, other, "auroc", False, CLASSES, n_resamples=50)
    assert d.diff == 0.0 and d.p_value is None and not d.testable and d.se is None
    assert d.unmarkable == significance.NOT_TESTABLE and "zero variance on both sides" in d.unmarkable
    sharp = [make_run(tmp_path, f"sh{s}", "Sharp", 20 + s, task, make_probs(task[2], False, s, 0.1), False)
             for s in range(3)]
    out = cell_differences({"CoRe-ECG": ref, "Flat": other, "Sharp": sharp}, "CoRe-ECG", ["auroc"], False,
                           CLASSES, n_resamples=50)
    assert not out["Flat"]["auroc"].testable and out["Sharp"]["auroc"].testable       # only Sharp in the family


@pytest.mark.parametrize("n, m", [(3, 3), (4, 3), (5, 3), (5, 5)])
def test_identical_runs_averaged_in_any_order_and_count_are_not_testable(n, m):
    """Replicates that all give one value, each the mean of its 1-3 fine-tunings, in any order: their
    means differ from it in the last bits, which an SE tested against 0 exactly counted testable in
    13-96 % of such comparisons (experiments/zero_variance.py). Under ZERO_SPREAD of the metric's
    scale they are not testable: no p, no interval, no TOST."""
    from coreecg.eval.significance import _compare, equivalence_p, run_level_se

    rng = np.random.default_rng(10 * n + m)
    rounded = 0

    def replicates(k: int, x: float, xb: np.ndarray):
        sizes = rng.integers(1, 4, k)                      # fine-tunings of one pretraining, averaged
        order = rng.permutation(k)
        return (np.array([np.mean([x] * g) for g in sizes])[order],
                np.stack([np.mean([xb] * g, axis=0) for g in sizes])[order])

    for _ in range(200):
        x, xb = rng.uniform(0.05, 0.95), rng.uniform(0.05, 0.95, 50)
        (a, a_boot), (b, b_boot) = replicates(n, x, xb), replicates(m, x, xb)
        rounded += bool(np.var(a, ddof=1) > 0 or np.var(b_boot.mean(0) - a_boot.mean(0), ddof=1) > 0)
        assert run_level_se(a, b, a_boot, b_boot)[1:] == (0.0, np.inf)
        diff, low, high, p, why, _, se, df = _compare(a, b, a_boot, b_boot, 0.95, 3, 30, 100)
        assert p is None and why == significance.NOT_TESTABLE and se is None and low == high == diff
    assert rounded > 20                        # the rounding the tolerance is there for
    assert np.isnan(equivalence_p(0.0, 0.0, np.inf, 0.02))


def test_class_prior_runs_are_not_testable_and_marked_so(tmp_path):
    """5 runs against 3 that all output one class prior (the study design: 5 Random-init or
    Supervised replicates, 3 pretraining seeds): ACC, F1 and AUROC not testable in the report, in
    no family, no verdict but the reason, and their own mark and legend line under the table."""
    task = make_task(False)
    prior = np.tile([0.55, 0.2, 0.15, 0.1], (N_RECORDS, 1))
    runs = [make_run(tmp_path / "runs", f"ref{s}", "CoRe-ECG", s, task, prior, False) for s in range(3)]
    runs += [make_run(tmp_path / "runs", f"prior{s}", "Prior", 10 + s, task, prior, False) for s in range(5)]
    runs += [make_run(tmp_path / "runs", f"one{s}", "One", 20 + s, task, make_probs(task[2], False, s), False)
             for s in range(1)]
    found = cell_differences({"CoRe-ECG": runs[:3], "Prior": runs[3:8]}, "CoRe-ECG", ["acc", "f1", "auroc"],
                             False, CLASSES, n_resamples=50)["Prior"]
    assert all(found[m].unmarkable == significance.NOT_TESTABLE and found[m].p_value is None for m in found)
    write_report(runs, tmp_path / "out", report=ReportConfig(bootstrap_resamples=50))
    text = (tmp_path / "out" / "comparison.md").read_text()
    diffs = md_rows(text.split("Differences to CoRe-ECG")[1])
    assert all(diffs["Prior"][c] == "+0.0 [+0.0, +0.0]∅" for c in ("PTB-XL ACC", "PTB-XL F1", "PTB-XL AUROC"))
    assert diffs["One"]["PTB-XL AUROC"].endswith("§")                       # fewer runs keeps its own mark
    assert ("∅ not testable: every run of both methods gives the same value on every patient resample (to "
            "rounding), no variance to test the difference against, no p]") in text
    assert ("3 cell(s) are not testable (∅ under the differences): every run of both methods gives the same value "
            "on every patient resample, to rounding") in text
    assert "AUROC (primary): no testable comparison" in text
    with open(tmp_path / "out" / "comparison.csv", newline="") as f:
        prior = next(r for r in csv.DictReader(f) if r["method"] == "Prior")
    assert prior["PTB-XL AUROC verdict"] == significance.NOT_TESTABLE
    assert prior["PTB-XL AUROC equivalence p adjusted"] == prior["PTB-XL AUROC detectable"] == ""
    assert r"$\emptyset$" in (tmp_path / "out" / "comparison.tex").read_text()


def test_two_one_sided_tests_against_a_hand_computation():
    """TOST p = max(P(T > (d + m)/SE), P(T < (d - m)/SE)); below alpha exactly when the 1 - 2 alpha
    interval d -/+ t_{1-alpha} SE lies inside (-m, m)."""
    from coreecg.eval.significance import equivalence_p

    d, se, df, m = 0.004, 0.006, 5.0, 0.02
    lower = 1 - stats.t.cdf((d + m) / se, df)            # H0: d <= -m
    upper = stats.t.cdf((d - m) / se, df)                # H0: d >= +m
    assert equivalence_p(d, se, df, m) == pytest.approx(max(lower, upper), rel=1e-12)
    for diff, s in [(0.004, 0.006), (0.004, 0.012), (0.015, 0.003), (-0.019, 0.0005), (0.0, 0.0101)]:
        q = stats.t.ppf(0.95, df)
        inside = -m < diff - q * s and diff + q * s < m
        assert (equivalence_p(diff, s, df, m) < 0.05) == inside, (diff, s)


def power_by_integration(delta: float, df: float, q: float) -> float:
    """P(|T| > q) for T = (Z + delta) / sqrt(V / df), Z normal and V chi-square with df degrees of
    freedom, integrated over V directly (no noncentral t): the power at noncentrality delta."""
    from scipy import integrate

    def given(v: float) -> float:
        bar = q * np.sqrt(v / df)
        return (stats.norm.sf(bar - delta) + stats.norm.cdf(-bar - delta)) * stats.chi2.pdf(v, df)

    return integrate.quad(given, 0, np.inf, limit=200)[0]


def test_the_detectable_difference_against_a_direct_power_computation():
    """The stated difference is delta x SE / c4(df): at delta the t-test's power, integrated over the
    SE's chi-square, is the stated power at the family's level alpha / k, and SE / c4 is the mean
    of SE over that chi-square scaled to the SD. The normal-theory sum (t_{df, 1-alpha/2k} + t_{df,
    power}) x SE it replaced falls short at few df and a family of 12."""
    from scipy import integrate

    from coreecg.eval.significance import detectable_difference

    for df, k, power in [(2.0, 12, 0.8), (3.0, 1, 0.8), (4.0, 12, 0.8), (2.5, 6, 0.9), (10.0, 3, 0.8), (40.0, 12, 0.7)]:
        se = 0.02
        # E[sqrt(V / df)] for V chi-square(df), integrated: the c4 that turns SE into the SD's estimate
        c4 = integrate.quad(lambda v, df=df: np.sqrt(v / df) * stats.chi2.pdf(v, df), 0, np.inf)[0]
        found = detectable_difference(se, df, 0.05, k, power)
        q = stats.t.ppf(1 - 0.05 / (2 * k), df)
        assert power_by_integration(found * c4 / se, df, q) == pytest.approx(power, abs=1e-6), (df, k)
        normal_theory = (q + stats.t.ppf(power, df)) * se
        assert found > normal_theory
        if df <= 4 and k == 12:
            assert found > 1.15 * normal_theory and power_by_integration(normal_theory / se, df, q) < 0.74
    # many patients and runs: the normal power, 1.96 + 0.8416 for one test (the far tail adds 1e-6)
    assert detectable_difference(0.01, np.inf, 0.05, 1) == pytest.approx(0.028016, rel=1e-4)
    assert detectable_difference(0.01, 1e9, 0.05, 1) == pytest.approx(0.028016, rel=1e-4)
    assert detectable_difference(0.01, 10.0, 0.05, 3) > detectable_difference(0.01, 10.0, 0.05, 1)
    with pytest.raises(ValueError, match="power 0.001 must lie between"):
        detectable_difference(0.01, 4.0, 0.05, 1, 0.001)


def test_the_detectable_difference_holds_its_power_when_the_df_is_estimated():
    """Issue 61: with 3 runs per method and patients every method errs on alike, the run variances
    make the SE and the df (2-4, estimated per table); a table whose df came out small has a far
    higher bar at 0.05 / 24. Over seeded A/A tables of runs x patients, the median of what each
    table states for a family of 12 (the df's sampling integrated, from the table's SEParts) has
    power >= 0.78 among the tables shifted by it (p < 0.05 / 12) and is not far above the shift that
    has 0.8 ("true"); the df taken as known (issue 54) states 0.9 of it, power about 0.73."""
    from coreecg.eval.metrics import patient_resample_weights
    from coreecg.eval.significance import detectable_difference, run_level_parts

    rng = np.random.default_rng(0)
    d, parts = [], []
    for _ in range(400):
        w = patient_resample_weights(np.arange(50), 40, rng).T / 50            # (patients, resamples)
        hard = rng.normal(0, 0.3, 50)                                          # shared by both methods
        runs = [rng.normal(0, 0.03, (3, 1)) + hard + rng.normal(0, 0.15, (3, 50)) for _ in range(2)]
        diff, x = run_level_parts(runs[0].mean(1), runs[1].mean(1), runs[0] @ w, runs[1] @ w)
        d.append(diff)
        parts.append(x)
    d, se, df = np.array(d), np.array([x.se for x in parts]), np.array([x.df for x in parts])
    assert 3 < np.median(df) < 4 and df.min() >= 2

    def power(shift: float) -> float:
        return float(np.mean(2 * stats.t.sf(np.abs(d + shift) / se, df) < 0.05 / 12))

    low, high = 0.0, 1.0
    for _ in range(40):
        low, high = ((low + high) / 2, high) if power((low + high) / 2) < 0.8 else (low, (low + high) / 2)
    stated = np.median([detectable_difference(x.se, x.df, 0.05, 12, parts=x) for x in parts])
    known = np.median([detectable_difference(x.se, x.df, 0.05, 12) for x in parts])
    assert power(stated) >= 0.78 and 0.97 < stated / low < 1.2, (power(stated), stated / low)
    assert power(known) < 0.76 and known / low < 0.95


@pytest.mark.parametrize("parts", [(1e-4, 1e-4, 0.0, 3, 3), (1e-4, 9e-4, 2e-4, 3, 5), (2e-4, 0.0, 0.0, 3, 3),
                                   (0.0, 0.0, 1e-4, 3, 3), (1e-4, 1e-4, 1e-5, 5, 5)])
def test_the_power_with_the_df_estimated_against_a_simulation_of_the_test(parts):
    """At the stated difference, the run-level test as run_level_parts and run_level_test compute it
    (Gaussian run means with the parts' variances, each replicate's own s^2 and Welch df, the shared
    term known) rejects at 0.05 / k with the stated power, for k = 1 and 12 (40,000 replicates: a
    binomial SE of 0.002); with no run variance left it is the normal-theory value."""
    from coreecg.eval.significance import SEParts, detectable_difference, estimated_df_power

    parts = SEParts(*parts)
    rng = np.random.default_rng(1)
    n, m, size = parts.n, parts.m, 40_000
    a = rng.normal(0, np.sqrt(n * parts.reference), (size, n))
    b = rng.normal(0, np.sqrt(m * parts.other), (size, m))
    va, vb = a.var(1, ddof=1) / n, b.var(1, ddof=1) / m
    se = np.sqrt(va + vb + parts.shared)
    welch = va ** 2 / (n - 1) + vb ** 2 / (m - 1)
    df = np.where(welch > 0, se ** 4 / np.where(welch > 0, welch, 1), np.inf)
    noise = b.mean(1) - a.mean(1) + rng.normal(0, np.sqrt(parts.shared), size)
    for k in (1, 12):
        found = detectable_difference(parts.se, parts.df, 0.05, k, parts=parts)
        assert estimated_df_power(parts, 0.05 / k)(found) == pytest.approx(0.8, abs=1e-8)
        rejected = np.abs(noise + found) / se > stats.t.ppf(1 - 0.05 / (2 * k), df)
        assert rejected.mean() == pytest.approx(0.8, abs=0.008), (k, rejected.mean())
        if parts.reference == parts.other == 0:
            assert found == pytest.approx((stats.norm.ppf(1 - 0.05 / (2 * k)) + stats.norm.ppf(0.8)) * parts.se,
                                          rel=1e-4)
    with pytest.raises(ValueError, match="are not those of"):
        detectable_difference(2 * parts.se, parts.df, 0.05, 1, parts=parts)


def test_a_cell_below_chance_is_flagged_in_the_table(tmp_path):
    """Scores that rank the classes the wrong way round: every run's AUROC under 0.5, the cell's
    interval over runs under 50, flagged ↓ in the Markdown and LaTeX with a legend naming it; the
    sane rows are not flagged."""
    from coreecg.eval.tables.table import BELOW, chance_interval_high

    task = make_task(False)
    y = task[2]
    runs = []
    for s in range(3):
        runs.append(make_run(tmp_path / "runs", f"core{s}", "CoRe-ECG", s, task, make_probs(y, False, 10 + s), False))
        wrong = make_probs(y, False, 20 + s)[:, ::-1].copy()         # another class's score: below chance
        runs.append(make_run(tmp_path / "runs", f"wrong{s}", "Wrong", 10 + s, task, wrong, False))
    aurocs = [json.loads((r / "metrics.json").read_text())["test"]["auroc"] for r in runs if "wrong" in r.name]
    assert max(aurocs) < 0.5
    high = chance_interval_high(aurocs, None)
    assert high == pytest.approx(np.mean(aurocs) + stats.t.ppf(0.975, 2) * np.std(aurocs, ddof=1) / np.sqrt(3))
    write_report(runs, tmp_path / "out", report=ReportConfig(bootstrap_resamples=0))
    text = (tmp_path / "out" / "comparison.md").read_text()
    rows = md_rows(text)
    assert rows["Wrong"]["PTB-XL AUROC"].endswith(BELOW) and not rows["CoRe-ECG"]["PTB-XL AUROC"].endswith(BELOW)
    assert not rows["Wrong"]["PTB-XL ACC"].endswith(BELOW)                   # AUROC only
    assert f"{BELOW} below chance: the cell's 95 % AUROC interval lies under 50" in text
    assert f"Wrong PTB-XL AUROC (up to {100 * high:.1f})" in text
    assert r"$\downarrow$" in (tmp_path / "out" / "comparison.tex").read_text()
    assert chance_interval_high([0.45], 0.52) == 0.52 and chance_interval_high([], 0.4) is None   # one run: its own CI


def test_the_calibration_scenarios_with_method_specific_patient_effects(tmp_path):
    """Scenario.specific: the methods' own share of each patient's difficulty. All of it their own
    makes the difference between two methods spread more over test sets than a shared difficulty
    does (the test set no longer cancels), and the rule's SE follows that spread; A/A tables stay
    near the nominal rate in both."""
    shared = mark_rates(tmp_path / "shared", Scenario(runs=3, specific=0.0), 60, seed=5, n_resamples=100)
    own = mark_rates(tmp_path / "own", Scenario(runs=3, specific=1.0), 60, seed=5, n_resamples=100)
    assert own["sd_auroc_diff"] > 1.25 * shared["sd_auroc_diff"]
    for r in (shared, own):
        assert 0.7 < r["mean_se_auroc"] / r["sd_auroc_diff"] < 1.3
        assert r["auroc_raw"] <= binomial_upper(0.05, 60)
        assert r["detectable_auroc"] > 2.8 * r["mean_se_auroc"]       # the noncentral t at finite df: > 1.96 + 0.84
    assert own["detectable_auroc"] > shared["detectable_auroc"]


def test_rare_classes_are_named_in_the_tables_legend(tmp_path):
    from tests.test_report import make_run as report_run

    (tmp_path / "runs").mkdir()
    runs = []
    for seed in range(2):
        run = report_run(tmp_path / "runs", f"r{seed}", seed=seed)
        record = json.loads((run / "metrics.json").read_text())
        record["test"]["per_class"] = {"a": {"auroc": 0.8, "f1": 0.6, "positive_patients": 30},
                                       "b": {"auroc": 0.4, "f1": 0.2, "positive_patients": 2}}
        (run / "metrics.json").write_text(json.dumps(record))
        runs.append(run)
    old = report_run(tmp_path / "runs", "old", dataset="ningbo")          # written before the rule
    write_report([*runs, old], tmp_path / "out", report=ReportConfig(bootstrap_resamples=0))
    text = (tmp_path / "out" / "comparison.md").read_text()
    assert ("Rare classes: PTB-XL: 1 class(es) with fewer positive test patients than report.min_positive_patients, "
            "left out of its macro F1 and AUROC: b (2 positive patients)") in text
    assert "Rare classes: Ningbo: run(s) written before report.min_positive_patients hold every class" in text
    rows = md_rows(text)
    assert rows["CoRe-ECG"]["PTB-XL AUROC"].strip("*").startswith("80.0")       # b's 0.4 left out of the macro
    assert rows["CoRe-ECG"]["PTB-XL F1"].strip("*").startswith("60.0")
    write_report([*runs, old], tmp_path / "all", report=ReportConfig(bootstrap_resamples=0, min_positive_patients=1))
    assert md_rows((tmp_path / "all" / "comparison.md").read_text())["CoRe-ECG"]["PTB-XL AUROC"].strip("*") \
        .startswith("90.0")                                                       # the stored macro: every class


def test_the_argmax_f1_cell_leaves_out_the_rare_class_its_difference_leaves_out(tmp_path):
    """report.f1 = argmax with a class of 2 positive patients (under min_positive_patients 5): the
    printed F1 is the mean over runs of the macro argmax F1 over the kept classes, the classes its
    difference is tested on, not metrics.json's stored macro (which holds the rare class); a run
    written before per-class argmax F1 keeps its stored value and the legend says so."""
    from coreecg.eval.metrics import kept_classes, resample_metrics

    rids, pids, _ = make_task(False)
    labels = np.arange(N_RECORDS) % 3
    labels[:2] = 3                                      # CD: records 0 and 1, patients P00 and P01
    task = (rids, pids, np.eye(4, dtype=int)[labels])
    y = task[2]
    runs = {m: [make_run(tmp_path / "runs", f"{m}{s}", m, s, task, make_probs(y, False, 10 * i + s, sharpen), False)
                for s in range(3)] for i, (m, sharpen) in enumerate((("CoRe-ECG", 0.0), ("Sharp", 0.3)))}
    keep = kept_classes(y, pids, 5)
    assert list(keep) == [True, True, True, False]
    printed, stored = {}, {}
    for m, folders in runs.items():
        tested = [resample_metrics(y.astype(bool), read_predictions(r / "predictions.csv", CLASSES).probs, False,
                                   np.ones((1, N_RECORDS)), keep)["f1_argmax"][0] for r in folders]
        printed[m] = np.mean(tested)
        stored[m] = np.mean([json.loads((r / "metrics.json").read_text())["test"]["f1_argmax"] for r in folders])
    assert abs(printed["Sharp"] - stored["Sharp"]) > 0.005           # the rare class moves the stored macro
    write_report([r for rs in runs.values() for r in rs], tmp_path / "out",
                 report=ReportConfig(f1="argmax", bootstrap_resamples=50))
    text = (tmp_path / "out" / "comparison.md").read_text()
    rows = md_rows(text)
    for m in runs:
        assert re.search(r"(\d+\.\d) ±", rows[m]["PTB-XL F1"]).group(1) == f"{100 * printed[m]:.1f}", (m, rows[m])
    with open(tmp_path / "out" / "comparison.csv", newline="") as f:
        sharp = next(r for r in csv.DictReader(f) if r["method"] == "Sharp")
    assert float(sharp["PTB-XL F1 diff"]) == pytest.approx(100 * (printed["Sharp"] - printed["CoRe-ECG"]), abs=0.006)
    assert "stored argmax F1" not in text
    # a run written before per-class argmax F1: its stored macro is printed, and the legend names it
    record = json.loads((runs["Sharp"][0] / "metrics.json").read_text())
    for v in record["test"]["per_class"].values():
        del v["f1_argmax"]
    (runs["Sharp"][0] / "metrics.json").write_text(json.dumps(record))
    write_report([r for rs in runs.values() for r in rs], tmp_path / "old",
                 report=ReportConfig(f1="argmax", bootstrap_resamples=0))
    assert ("Rare classes: PTB-XL: the F1 column prints run(s)' stored argmax F1 (metrics.json test.f1_argmax, "
            "written before per-class argmax F1), which holds the rare classes"
            in (tmp_path / "old" / "comparison.md").read_text())
