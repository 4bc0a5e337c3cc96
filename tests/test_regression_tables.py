"""Regression runs in the report (coreecg/eval/tables/regression.py, coreecg/eval/significance.py):
a regression run loads; the regression table's cells are its runs' MAE; a method with a clearly
lower MAE is marked better and one with a clearly higher MAE worse (the direction), R² the other
way; the run-level test, Holm and TOST on MAE give what their definitions give, computed here by
hand from materialised resamples; the label tables are byte-identical with regression runs beside
them, and each table leaves the other kind's runs out."""
import csv
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import mean_absolute_error

from coreecg.config import ReportConfig, load_config
from coreecg.eval.metrics import patient_resample_weights
from coreecg.eval.regression import regression_bootstrap_ci, regression_metrics
from coreecg.eval.report import RunError, load_run, write_report
from coreecg.eval.runs import is_regression, label_runs, regression_runs
from coreecg.eval.significance import (equivalence_p, holm, lower_is_better, regression_cell_differences,
                                       run_level_test)
from coreecg.eval.tables.label_efficiency import extra_tables
from coreecg.eval.tables.regression import (BETTER, EFFICIENCY_TABLE, MARGIN_SD, WORSE, regression_label_efficiency,
                                            regression_table, table_markdown, write_regression)
from coreecg.study.spec import load_study
from tests.test_significance import make_probs, make_run as make_label_run, make_task

N_RECORDS, N_PATIENTS, SD = 60, 40, 15.0
B = 300
REPORT = ReportConfig(bootstrap_resamples=B, min_runs=3, min_test_patients=30)


def age_task():
    """60 records of 40 patients (the first 20 have two), ages in years."""
    rng = np.random.default_rng(3)
    patients = [f"P{i:02d}" for i in range(N_PATIENTS)]
    pids = np.array(patients + patients[:N_RECORDS - N_PATIENTS])
    rids = [f"R{i:03d}" for i in range(N_RECORDS)]
    return rids, pids, np.round(rng.normal(55, SD, N_RECORDS), 1)


def make_age_run(root: Path, name: str, method: str, seed: int, task, noise: float, *, mode: str = "finetune",
                 fraction: float = 1.0, dataset: str = "ptbxl-age", predictions: bool = True,
                 encoder: str | None = None) -> Path:
    """A regression fine-tuning run folder as coreecg.train.finetuning writes one: predictions.csv
    (record_id, patient_id, target, prediction) and a metrics.json with task, target_scaler and
    test/val = regression_metrics + patient-bootstrap "ci" of that file's values."""
    rids, pids, y = task
    pred = y + np.random.default_rng(1000 + seed + int(noise * 10) + len(method)).normal(0, noise, len(y))
    run = root / name
    run.mkdir(parents=True)
    with open(run / "predictions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["record_id", "patient_id", "target", "prediction"])
        w.writerows([r, p, f"{t:.8g}", f"{q:.8g}"] for r, p, t, q in zip(rids, pids, y, pred))
    back = np.array([float(r["prediction"]) for r in csv.DictReader(open(run / "predictions.csv"))])
    test = regression_metrics(y, back, SD, "years", pids)
    test["ci"] = regression_bootstrap_ci(y, back, pids, SD, n_resamples=50, seed=0)
    record = {"method": method, "dataset": dataset, "mode": mode, "leads": "12", "train_fraction": fraction,
              "seed": seed, "multilabel": False, "class_names": ["age"], "test": test, "val": test,
              "task": {"name": "age", "kind": "regression", "unit": "years", "plausible": [0.0, 120.0]},
              "target_scaler": {"mean": 55.0, "sd": SD, "records": 500, "unit": "years"},
              "crop_rule": "test", "encoder": encoder, "encoder_config_hash": "x"}
    (run / "metrics.json").write_text(json.dumps(record))
    if not predictions:
        (run / "predictions.csv").unlink()
    return run


@pytest.fixture(scope="module")
def age_runs(tmp_path_factory) -> dict[str, list[Path]]:
    """Three seeds each: the reference (noise SD 8 years), a clearly better method (3), a clearly
    worse one (16), and one like the reference (8, other draws)."""
    root, task = tmp_path_factory.mktemp("age"), age_task()
    noise = {"CoRe-ECG": 8.0, "Better": 3.0, "Worse": 16.0, "Alike": 8.0}
    return {m: [make_age_run(root, f"{m}-{s}", m, s, task, n) for s in range(3)] for m, n in noise.items()}


def test_a_regression_run_loads_and_needs_its_mae(age_runs, tmp_path):
    run = load_run(age_runs["CoRe-ECG"][0])
    assert is_regression(run) and run.dataset == "ptbxl-age" and run.record["test"]["mae"] > 0
    assert regression_runs([run]) == [run] and label_runs([run]) == []
    record = json.loads((age_runs["CoRe-ECG"][0] / "metrics.json").read_text())
    bad = tmp_path / "no_mae"
    bad.mkdir()
    del record["test"]["mae"]
    (bad / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(RunError, match="no 'test.mae'"):
        load_run(bad)


def test_cells_are_the_runs_mae_and_the_direction_marks_better_and_worse(age_runs):
    runs = [load_run(p) for paths in age_runs.values() for p in paths]
    table = regression_table(runs, REPORT)
    assert [c.label for c in table.columns] == ["ptbxl-age"] and table.columns[0].unit == "years"
    for method, paths in age_runs.items():
        maes = [json.loads((p / "metrics.json").read_text())["test"]["mae"] for p in paths]
        assert table.values(method, 0, "mae") == pytest.approx(maes)
    assert lower_is_better("mae") and lower_is_better("mae_sd") and not lower_is_better("r2")
    better, worse = table.difference("Better", 0, "mae"), table.difference("Worse", 0, "mae")
    assert better.diff < 0 and better.better and worse.diff > 0 and worse.better is False
    assert table.mark("Better", 0, "mae") == "\\*" + BETTER and table.mark("Worse", 0, "mae") == "\\*" + WORSE
    assert table.verdict("Better", 0).startswith("better") and table.verdict("Worse", 0).startswith("worse")
    # R²: higher is better, so the better method's positive difference is "better" too
    r2 = table.difference("Better", 0, "r2")
    assert r2.diff > 0 and r2.better and table.mark("Better", 0, "r2") == "\\*" + BETTER
    assert table.mark("Alike", 0, "mae") == ""
    text = table_markdown(table)
    assert "lower is better" in text and "MAE (years) ↓" in text and "R² ↑" in text
    row = next(line for line in text.splitlines() if line.startswith("| Better |"))
    mean = np.mean(table.values("Better", 0, "mae"))
    assert row.split(" | ")[1].startswith(f"{mean:.2f} ± ") and BETTER in row.split(" | ")[1]



def test_the_latex_table_bolds_each_columns_best_by_its_direction_and_marks_as_the_markdown(age_runs):
    from coreecg.eval.tables.regression import table_latex

    table = regression_table([load_run(p) for paths in age_runs.values() for p in paths], REPORT)
    tex = table_latex(table)
    assert tex.count("{") == tex.count("}") and "²" not in tex and "▲" not in tex and "\\*" not in tex
    rows = {line.split(" & ")[0]: line.split(" & ")[1:] for line in tex.splitlines()
            if line.endswith(r" \\") and line.split(" & ")[0] in age_runs}
    assert set(rows) == set(age_runs) and all(len(cells) == 3 for cells in rows.values())
    # MAE and MAE in SD: the lowest (Better) bold; R²: the highest (Better again) bold; Worse last, plain
    assert all(c.startswith(r"\textbf{") for c in rows["Better"])
    assert not any(c.startswith((r"\textbf{", r"\underline{")) for c in rows["Worse"])
    assert sum(c.startswith(r"\underline{") for cells in rows.values() for c in cells) == 3
    # the marks the Markdown shows: a marked difference, its direction
    assert rows["Better"][0].endswith(r"\textsuperscript{*}$\blacktriangle$")
    assert rows["Worse"][0].endswith(r"\textsuperscript{*}$\blacktriangledown$")
    assert "*" not in rows["Alike"][0] and "MAE (years) $\\downarrow$" in tex and "R$^2$ $\\uparrow$" in tex


def by_hand(ref: list[Path], other: list[Path], seed: int = 0):
    """The run-level test of MAE written out: each run's MAE with scikit-learn on the full set and
    on each materialised patient resample (the documented draw order), then `run_level_test`."""
    def read(p):
        rows = list(csv.DictReader(open(p / "predictions.csv")))
        return (np.array([r["patient_id"] for r in rows]), np.array([float(r["target"]) for r in rows]),
                np.array([float(r["prediction"]) for r in rows]))
    pids = read(ref[0])[0]
    w = patient_resample_weights(pids, B, np.random.default_rng(seed))
    full, boot = [], []
    for runs in (ref, other):
        f, b = [], []
        for p in runs:
            _, y, q = read(p)
            f.append(mean_absolute_error(y, q))
            b.append([mean_absolute_error(np.repeat(y, k.astype(int)), np.repeat(q, k.astype(int))) for k in w])
        full.append(np.array(f))
        boot.append(np.array(b))
    return full[0], full[1], boot[0], boot[1]


def test_the_run_level_test_holm_and_tost_on_mae_are_their_definitions(age_runs):
    found = regression_cell_differences({m: age_runs[m] for m in age_runs}, "CoRe-ECG", ["mae"], B, 0, 0.95, 3, 30)
    ps = {}
    for method in ("Better", "Worse", "Alike"):
        a, b, a_boot, b_boot = by_hand(age_runs["CoRe-ECG"], age_runs[method])
        d = found[method]["mae"]
        assert d.diff == pytest.approx(b.mean() - a.mean(), rel=1e-9)
        low, high, p = run_level_test(a, b, a_boot, b_boot, 0.95)
        assert (d.low, d.high, d.p_value) == pytest.approx((low, high, p), rel=1e-7)
        ps[method] = d
    runs = [load_run(p) for paths in age_runs.values() for p in paths]
    table = regression_table(runs, REPORT)
    family = table.families["mae"]
    assert sorted(m for m, _ in family) == ["Alike", "Better", "Worse"]
    # Holm over the three MAE differences, by hand: sorted p times (k - rank), then running maximum
    p = np.array([ps[m].p_value for m, _ in family])
    order = np.argsort(p)
    stepped = np.maximum.accumulate(np.minimum(1, (3 - np.arange(3)) * p[order]))
    hand = np.empty(3)
    hand[order] = stepped
    assert [table.adjusted[(m, j, "mae")] for m, j in family] == pytest.approx(hand)
    assert hand == pytest.approx(holm(p))
    # TOST at ±MARGIN_SD x SD years: the larger one-sided p of each, then Holm
    margin = MARGIN_SD * SD
    tost = []
    for m, _ in family:
        d = ps[m]
        tost.append(max(stats.t.sf((d.diff + margin) / d.se, d.df), stats.t.cdf((d.diff - margin) / d.se, d.df)))
        assert tost[-1] == pytest.approx(equivalence_p(d.diff, d.se, d.df, margin))
    assert [table.equivalence[(m, j)] for m, j in family] == pytest.approx(holm(tost))
    assert all(table.detectable[(m, j, "mae")] > 0 for m, j in family)


def test_label_tables_are_unchanged_beside_regression_runs(age_runs, tmp_path):
    label_root = tmp_path / "label"
    task = make_task(False)
    label = [make_label_run(label_root, f"{m}-{s}", m, s, task, make_probs(task[2], False, 10 * s + k, sharpen),
                            False)
             for k, (m, sharpen) in enumerate((("CoRe-ECG", 0.3), ("ST-MEM", 0.0))) for s in range(3)]
    ages = [p for paths in age_runs.values() for p in paths]
    alone, beside = tmp_path / "alone", tmp_path / "beside"
    written = write_report(label, alone, report=REPORT, extra=extra_tables())
    both = write_report(label + ages, beside, report=REPORT, extra=extra_tables())
    names = {p.name for p in written}
    assert {p.name for p in both} == names | {"regression.md", "regression.csv", "regression.tex"}
    assert "regression.md" not in names
    for name in names - {"all_runs.csv"}:
        assert (beside / name).read_bytes() == (alone / name).read_bytes(), name
    # all_runs.csv: the label runs' rows as before, the regression columns after them
    before, after = (list(csv.DictReader(open(d / "all_runs.csv"))) for d in (alone, beside))
    assert [{k: r[k] for k in before[0]} for r in after[:len(before)]] == before
    age_row = next(r for r in after if r["method"] == "Better")
    assert age_row["tables"] == "regression" and age_row["unit"] == "years" and age_row["task"] == "age"
    assert float(age_row["test_mae"]) == pytest.approx(load_run(age_runs["Better"][0]).record["test"]["mae"])
    # each table holds its own kind: no regression row in the comparison, no label row in the regression table
    comparison = (beside / "comparison.md").read_text()
    assert "Better" not in comparison and "ptbxl-age" not in comparison
    regression = (beside / "regression.md").read_text()
    assert "ST-MEM" not in regression and "| Better |" in regression
    assert regression_table([load_run(p) for p in label], REPORT) is None


def test_a_regression_run_without_predictions_has_no_difference(tmp_path):
    task = age_task()
    runs = [make_age_run(tmp_path, f"ref{s}", "CoRe-ECG", s, task, 8.0) for s in range(3)]
    runs += [make_age_run(tmp_path, f"other{s}", "Other", s, task, 3.0, predictions=s != 1) for s in range(3)]
    table = regression_table([load_run(p) for p in runs], REPORT)
    assert table.difference("Other", 0, "mae") == "no predictions.csv" and not table.families
    files = write_regression(table, tmp_path / "out")
    rows = list(csv.DictReader(open(files[1])))
    other = next(r for r in rows if r["method"] == "Other")
    assert other["mae direction"] == "lower is better" and other["mae verdict"] == "no predictions.csv"
    assert float(other["mae mean"]) == pytest.approx(np.mean(table.values("Other", 0, "mae")))


def test_fraction_columns_make_the_mae_curve(tmp_path):
    task = age_task()
    runs = [make_age_run(tmp_path, f"r{f}-{s}", "CoRe-ECG", s, task, 8.0 / f ** 0.5, fraction=f)
            for f in (1.0, 0.1) for s in range(2)]
    table = regression_table([load_run(p) for p in runs], REPORT)
    assert [c.label for c in table.columns] == ["ptbxl-age 100%", "ptbxl-age 10%"]
    assert np.mean(table.values("CoRe-ECG", 1, "mae")) > np.mean(table.values("CoRe-ECG", 0, "mae"))


def test_the_label_efficiency_curve_compares_each_row_with_its_baseline(tmp_path):
    """Random init and Supervised are baselines; CoRe-ECG (linear), clearly lower MAE than Random init
    under the same probe, is marked better; CoRe-ECG (fine-tune), clearly higher than Supervised, worse."""
    task = age_task()
    grid = [("Random init", "linear", 12.0, "random"), ("Supervised", "scratch", 4.0, None),
            ("CoRe-ECG", "linear", 4.0, None), ("CoRe-ECG", "finetune", 12.0, None)]
    runs = [make_age_run(tmp_path, f"{m}-{mode}-{f}-{s}", m, s, task, noise / f ** 0.25, mode=mode, fraction=f,
                         encoder=enc if enc else str(tmp_path / f"enc{s}") if m == "CoRe-ECG" else None)
            for m, mode, noise, enc in grid for f in (1.0, 0.1) for s in range(3)]
    loaded = [load_run(p) for p in runs]
    table = regression_label_efficiency(loaded, REPORT)
    assert list(table.runs) == ["Random init (linear)", "Supervised", "CoRe-ECG (linear)", "CoRe-ECG (fine-tune)"]
    assert table.references == {"CoRe-ECG (linear)": "Random init (linear)", "CoRe-ECG (fine-tune)": "Supervised"}
    assert [c.label for c in table.columns] == ["ptbxl-age 100%", "ptbxl-age 10%"]
    for j in range(2):
        assert table.mark("CoRe-ECG (linear)", j, "mae") == "\\*" + BETTER
        assert table.mark("CoRe-ECG (fine-tune)", j, "mae") == "\\*" + WORSE
        assert table.difference("Supervised", j, "mae") is None
    assert len(table.families["mae"]) == 4
    text = table_markdown(table)
    assert "CoRe-ECG (linear) − Random init (linear)" in text and "lower is better" in text
    assert extra_tables()(loaded, REPORT) == ["regression", EFFICIENCY_TABLE]      # no label run: no label table
    assert extra_tables(False)(loaded, REPORT) == ["regression"]
    assert extra_tables()([r for r in loaded if r.mode != "linear"], REPORT) == ["regression"]
    # the label table of the same runs holds none of them (regression runs are the curve's only)
    out = tmp_path / "out"
    written = write_report(runs, out, report=REPORT, tables=[EFFICIENCY_TABLE, "label_efficiency"])
    assert [p.name for p in written][:2] == ["regression_label_efficiency.md", "regression_label_efficiency.csv"]
    assert "ptbxl-age" in (out / "regression_label_efficiency.md").read_text()
    assert "ptbxl-age" not in (out / "label_efficiency.md").read_text()
    assert "CoRe-ECG (linear) |" not in (out / "label_efficiency.md").read_text()


def test_the_age_preset_is_the_tiny_label_efficiency_grid_with_a_ptbxl_age_corpus(ecg_data):
    repo = Path(__file__).resolve().parents[1]
    age, tiny = (load_study(repo / "studies" / f"{name}.yaml")
                 for name in ("label_efficiency_age_tiny", "label_efficiency_tiny"))
    assert [c.name for c in age.corpora] == ["ptbxl", "ptbxl-age"]
    sets = {c.name: load_config(age.config_file, [*age.base, *c.set, *age.extra]).data for c in age.corpora}
    assert sets["ptbxl-age"].sources.ptbxl.task == "age" and sets["ptbxl"].sources.ptbxl.label_view == "multi"
    assert age.tables == ("label_efficiency", EFFICIENCY_TABLE)
    # every row, fraction and seed of the tiny grid, on both corpora; pretraining excludes both
    cells = Counter((r.method, r.mode, r.fraction, r.seed) for r in age.finetune_runs() if r.corpus == "ptbxl-age")
    assert cells == Counter((r.method, r.mode, r.fraction, r.seed) for r in tiny.finetune_runs())
    assert all(set(c.exclude) == {"ptbxl", "ptbxl-age"} for c in age.pretrain_corpora)
    assert len(age.pretrain_runs()) == len(tiny.pretrain_runs())
