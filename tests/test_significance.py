"""Paired differences (coreecg/eval/significance.py, docs/evaluation.md "Paired differences"):
the interval and p-value against an independent loop over materialised resamples scored with
scikit-learn; a copy of the reference is never marked, a sharper method is; mismatched test sets
are refused; the report's Markdown, CSV and LaTeX carry the differences."""
import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score, roc_auc_score

import coreecg.eval.significance as significance
from coreecg.config import ReportConfig
from coreecg.eval.downstream import RecordScores, read_predictions, write_predictions
from coreecg.eval.metrics import classification_metrics
from coreecg.eval.report import RunError, write_report
from coreecg.eval.significance import PairingError, cell_differences, paired_difference

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
             level: float = 0.95):
    """Paired bootstrap written out: per resample, draw patients (and seeds) in the documented
    order, build the resampled copy record by record, score each seed with scikit-learn."""
    seeds = sorted(set(ref) & set(other))
    data = {(m, s): read_by_hand(runs[s]) for m, runs in (("ref", ref), ("other", other)) for s in seeds}
    first = data[("ref", seeds[0])]
    records = sorted(first)
    patients = sorted({first[r][0] for r in records})          # numbered in sorted order of their ids
    records_of = {p: [i for i, r in enumerate(records) if first[r][0] == p] for p in patients}
    y = np.array([first[r][1] for r in records])
    probs = {k: np.array([d[r][2] for r in records]) for k, d in data.items()}
    scored_f1 = [k for k in range(4) if y[:, k].sum() > 0]
    scored_auroc = [k for k in range(4) if 0 < y[:, k].sum() < len(y)]

    def score(key, rows):
        return sklearn_metric(metric, y[rows], probs[key][rows], multilabel, scored_f1, scored_auroc)

    point = (np.mean([score(("other", s), np.arange(len(y))) for s in seeds])
             - np.mean([score(("ref", s), np.arange(len(y))) for s in seeds]))
    rng = np.random.default_rng(seed)
    seed_rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    stats = []
    for _ in range(B):
        counts = rng.multinomial(len(patients), [1 / len(patients)] * len(patients))
        rows = []
        for p, c in zip(patients, counts):
            for _ in range(c):
                rows += records_of[p]
        drawn = seeds
        if len(seeds) > 1:
            drawn = [s for s, c in zip(seeds, seed_rng.multinomial(len(seeds), [1 / len(seeds)] * len(seeds)))
                     for _ in range(c)]
        per_seed = {s: (score(("other", s), rows), score(("ref", s), rows)) for s in set(drawn)}
        if any(v is None for pair in per_seed.values() for v in pair):
            continue
        stats.append(np.mean([per_seed[s][0] - per_seed[s][1] for s in drawn]))
    stats = np.array(stats)
    low, high = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    p = min(1.0, 2 * min((1 + (stats <= 0).sum()) / (1 + len(stats)), (1 + (stats >= 0).sum()) / (1 + len(stats))))
    return point, low, high, p, B - len(stats)


@pytest.mark.parametrize("multilabel, metrics", [(False, ["acc", "f1", "f1_argmax", "auroc"]),
                                                 (True, ["acc", "f1", "auroc"])])
def test_interval_and_p_match_an_independent_loop(tmp_path, monkeypatch, multilabel, metrics):
    monkeypatch.setattr(significance, "BOOTSTRAP_CHUNK", 12)    # 30 resamples in chunks of 12, 12, 6
    task = make_task(multilabel)
    y = task[2]
    shuffled = np.random.default_rng(3).permutation(N_RECORDS)   # rows aligned by record_id, not position
    ref = {s: make_run(tmp_path, f"ref{s}", "CoRe-ECG", s, task, make_probs(y, multilabel, 10 + s), multilabel)
           for s in (0, 1)}
    other = {s: make_run(tmp_path, f"other{s}", "ST-MEM", s, task, make_probs(y, multilabel, 20 + s, 0.1),
                         multilabel, rows=shuffled) for s in (0, 1)}
    B, seed = 30, 5
    got = cell_differences({"CoRe-ECG": list(ref.values()), "ST-MEM": list(other.values())}, "CoRe-ECG",
                           metrics, multilabel, CLASSES, n_resamples=B, seed=seed)["ST-MEM"]
    for metric in metrics:
        point, low, high, p, undefined = by_loops(ref, other, metric, multilabel, B, seed)
        d = got[metric]
        assert d.seeds == (0, 1) and d.unpaired_seeds == 0 and (d.n_records, d.n_patients) == (60, 40)
        assert d.diff == pytest.approx(point, abs=1e-12)
        assert (d.low, d.high) == (pytest.approx(low, abs=1e-12), pytest.approx(high, abs=1e-12)), metric
        assert d.p_value == pytest.approx(p, abs=1e-12) and d.undefined_resamples == undefined
        assert d.low < d.high                                   # the resamples do vary
        # the point estimate is the table's: the difference of the metrics.json means
        table = [np.mean([json.loads((r / "metrics.json").read_text())["test"][metric] for r in runs.values()])
                 for runs in (other, ref)]
        assert d.diff == pytest.approx(table[0] - table[1], abs=1e-12)


def test_one_paired_seed_draws_no_seeds_and_counts_the_unpaired(tmp_path):
    task = make_task(False)
    y = task[2]
    ref = {s: make_run(tmp_path, f"ref{s}", "CoRe-ECG", s, task, make_probs(y, False, 10 + s), False) for s in (0, 1)}
    other = {0: make_run(tmp_path, "other0", "ST-MEM", 0, task, make_probs(y, False, 20, 0.1), False),
             3: make_run(tmp_path, "other3", "ST-MEM", 3, task, make_probs(y, False, 23, 0.1), False)}
    d = paired_difference(list(ref.values()), list(other.values()), "auroc", False, CLASSES, n_resamples=20, seed=2)
    assert d.seeds == (0,) and d.unpaired_seeds == 2                   # ref seed 1 and other seed 3 left out
    point, low, high, p, _ = by_loops({0: ref[0]}, {0: other[0]}, "auroc", False, 20, 2)
    assert (d.diff, d.low, d.high, d.p_value) == pytest.approx((point, low, high, p), abs=1e-12)


def test_a_copy_is_zero_and_a_sharper_method_excludes_zero(tmp_path):
    task = make_task(False)
    y = task[2]
    ref = [make_run(tmp_path, f"ref{s}", "CoRe-ECG", s, task, make_probs(y, False, 10 + s), False) for s in (0, 1)]
    copy = [make_run(tmp_path, f"copy{s}", "Copy", s, task, make_probs(y, False, 10 + s), False) for s in (0, 1)]
    sharp = [make_run(tmp_path, f"sharp{s}", "Sharp", s, task, make_probs(y, False, 10 + s, 0.6), False)
             for s in (0, 1)]
    out = cell_differences({"CoRe-ECG": ref, "Copy": copy, "Sharp": sharp}, "CoRe-ECG", ["acc", "f1", "auroc"],
                           False, CLASSES, n_resamples=200)
    for metric in ("acc", "f1", "auroc"):
        same, better = out["Copy"][metric], out["Sharp"][metric]
        assert (same.diff, same.low, same.high, same.p_value) == (0.0, 0.0, 0.0, 1.0) and not same.significant
        assert better.diff > 0 and better.low > 0 and better.significant and better.p_value < 0.05
    with pytest.raises(ValueError, match="f1_argmax"):
        paired_difference(ref, copy, "f1_argmax", True, CLASSES)


def test_different_test_records_are_refused_naming_both_folders(tmp_path):
    task = make_task(False)
    rids, pids, y = task
    ref = [make_run(tmp_path, "ref0", "CoRe-ECG", 0, task, make_probs(y, False, 10), False)]
    other_ids = list(rids)
    other_ids[5] = "R999"                                   # one record replaced: 2 ids in only one set
    bad = [make_run(tmp_path, "other0", "ST-MEM", 0, (other_ids, pids, y), make_probs(y, False, 20), False)]
    with pytest.raises(ValueError, match=r"ref0.*other0.*\b2 record ids") as e:
        paired_difference(ref, bad, "auroc", False, CLASSES, n_resamples=10)
    assert isinstance(e.value, PairingError)
    with pytest.raises(RunError, match=r"ref0.*other0"):             # the report names them too
        write_report(ref + bad, tmp_path / "out", report=ReportConfig(bootstrap_resamples=10))
    assert not (tmp_path / "out").exists()
    relabelled = [make_run(tmp_path, "other1", "ST-MEM", 0, (rids, pids, np.roll(y, 1, axis=0)),
                           make_probs(y, False, 20), False)]
    with pytest.raises(PairingError, match=r"ref0 and .*other1: the same test records with other labels"):
        paired_difference(ref, relabelled, "acc", False, CLASSES, n_resamples=10)


# ----------------------------------------------------------------- the report


def md_rows(text: str, first: str = "| Method") -> dict[str, dict[str, str]]:
    """The first Markdown table of `text` whose header starts with `first`: {row: {column: cell}}."""
    block = next(b for b in text.split("\n\n") if b.startswith(first)).splitlines()
    header = [c.strip() for c in block[0].strip("|").split("|")]
    return {r[0]: dict(zip(header[1:], r[1:])) for r in
            ([c.strip() for c in line.strip("|").split("|")] for line in block[2:])}


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """PTB-XL (single-label) and Ningbo (multi-label): CoRe-ECG, an exact copy, a sharper method
    (2 seeds each), a method without predictions.csv, one whose only seed CoRe-ECG lacks."""
    tmp_path = tmp_path_factory.mktemp("significance_report")
    runs = []
    for dataset, multilabel in (("ptbxl", False), ("ningbo", True)):
        task = make_task(multilabel)
        y = task[2]
        for s in (0, 1):
            base = make_probs(y, multilabel, 10 + s)
            runs += [make_run(tmp_path / "runs", f"{dataset}-core{s}", "CoRe-ECG", s, task, base, multilabel, dataset),
                     make_run(tmp_path / "runs", f"{dataset}-copy{s}", "Copy", s, task, base, multilabel, dataset),
                     make_run(tmp_path / "runs", f"{dataset}-sharp{s}", "Sharp", s, task,
                              make_probs(y, multilabel, 10 + s, 0.6), multilabel, dataset)]
        runs += [make_run(tmp_path / "runs", f"{dataset}-nopred", "NoPred", 0, task, make_probs(y, multilabel, 30),
                          multilabel, dataset, predictions=False),
                 make_run(tmp_path / "runs", f"{dataset}-seed7", "Seed7", 7, task, make_probs(y, multilabel, 31),
                          multilabel, dataset)]
    out = tmp_path / "report"
    written = write_report(runs, out, report=ReportConfig(bootstrap_resamples=200))
    return out, written, runs


def test_report_marks_significant_differences(report):
    out, written, _ = report
    text = (out / "comparison.md").read_text()
    table = md_rows(text)
    sharp, copy, core = table["Sharp"], table["Copy"], table["CoRe-ECG"]
    for column in ("PTB-XL ACC", "PTB-XL F1", "PTB-XL AUROC", "Ningbo F1", "Ningbo AUROC"):
        assert sharp[column].startswith("**") and sharp[column].endswith("\\*"), column   # best, and marked
        assert not copy[column].endswith("\\*") and not core[column].endswith("\\*")
    assert not any(v.endswith("\\*") for m in ("NoPred", "Seed7") for v in table[m].values())
    assert "\\* the difference to CoRe-ECG has a 95 % paired-bootstrap interval that excludes 0 (200 resamples" in text
    # NoPred and Seed7 each have 6 cells (2 datasets x 3 metrics) without a difference, and say why
    assert "12 cell(s) have no difference: 6 with no predictions.csv, 6 with no seed in common." in text
    diffs = md_rows(text.split("Differences to CoRe-ECG")[1])
    assert diffs["Copy"]["PTB-XL AUROC"] == "+0.0 [+0.0, +0.0]" and set(diffs) == {"Copy", "Sharp"}
    assert re.fullmatch(r"\+\d+\.\d \[\+\d+\.\d, \+\d+\.\d\]", diffs["Sharp"]["PTB-XL AUROC"])
    assert "F1: macro F1 at the paper's fixed 0.5 threshold" in text
    # the lead and fraction tables hold the same 12-lead cells, so the same marks
    assert md_rows((out / "lead_reduction.md").read_text())["Sharp"]["PTB-XL 12-lead AUROC"].endswith("\\*")


def test_report_csv_holds_difference_interval_and_p(report):
    out, _, runs = report
    with open(out / "comparison.csv", newline="") as f:
        rows = {r["method"]: r for r in csv.DictReader(f)}
    sharp, copy = rows["Sharp"], rows["Copy"]
    assert (copy["PTB-XL F1 diff"], copy["PTB-XL F1 diff low"], copy["PTB-XL F1 diff high"], copy["PTB-XL F1 p"]) \
        == ("0.00", "0.00", "0.00", "1")
    low, high, p = (float(sharp[f"Ningbo AUROC {k}"]) for k in ("diff low", "diff high", "p"))
    assert 0 < low < float(sharp["Ningbo AUROC diff"]) < high and p == pytest.approx(2 / 201, abs=1e-3)
    assert sharp["PTB-XL ACC diff seeds"] == "2"
    # the difference is the one of the table's means (metrics.json), in percentage points
    auroc = {m: np.mean([json.loads((r / "metrics.json").read_text())["test"]["auroc"] for r in runs
                         if r.name.startswith(f"ptbxl-{m}")]) for m in ("core", "sharp")}
    assert float(sharp["PTB-XL AUROC diff"]) == pytest.approx(100 * (auroc["sharp"] - auroc["core"]), abs=0.005)
    assert all(rows[m][k] == "" for m in ("CoRe-ECG", "NoPred", "Seed7") for k in ("PTB-XL ACC diff", "PTB-XL ACC p"))
    assert rows["Sharp"]["PTB-XL ACC n"] == "2" and rows["Sharp"]["PTB-XL ACC"]      # old columns unchanged


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
    assert r"\textsuperscript{*} the difference to CoRe-ECG has a 95 \% paired-bootstrap interval" in tex
    # 12 leads only: one column block, no block layout
    assert r"\textbf{Leads}" not in (out / "lead_reduction.tex").read_text()
    # with 6-lead runs of two methods: the paper's Table 2 layout, a row block per lead set, those two methods
    task = make_task(False)
    six = [make_run(tmp_path / "six", f"{m}-6", m, 0, task, make_probs(task[2], False, 40 + i), False, leads="6")
           for i, m in enumerate(("CoRe-ECG", "Sharp"))]
    write_report([*runs, *six], tmp_path / "report6", report=ReportConfig(bootstrap_resamples=20))
    lead = (tmp_path / "report6" / "lead_reduction.tex").read_text()
    assert r"\multirow{2}{*}{\textbf{Leads}}" in lead and r"\multirow{2}{*}{12}" in lead and r"\multirow{2}{*}{6}" in lead
    assert "Copy" not in lead and "Seed7" not in lead


def test_the_bootstrap_seed_comes_from_the_config(report, tmp_path):
    _, _, runs = report
    diffs = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        write_report(runs, tmp_path / name, report=ReportConfig(bootstrap_resamples=50, seed=seed))
        diffs[name] = (tmp_path / name / "comparison.csv").read_text()
    assert diffs["a"] == diffs["b"] and diffs["a"] != diffs["c"]     # same seed, same intervals
