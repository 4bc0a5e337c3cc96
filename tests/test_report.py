"""The report job: the paper's three tables from fake run folders (seeds, missing cells, bold,
run counts), all_runs.csv, and clear errors for unreadable folders."""
import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from coreecg.config import ReportConfig
from coreecg.eval.report import RunError, load_run, write_report

REPO = Path(__file__).resolve().parents[1]


def make_run(root: Path, name: str, method="CoRe-ECG", dataset="ptbxl", mode="finetune", leads="12",
             fraction=1.0, seed=0, acc=0.8, f1=0.6, auroc=0.9, f1_argmax="same", **extra) -> Path:
    run = root / name
    run.mkdir()
    test = {"acc": acc, "f1": f1, "f1_argmax": f1 if f1_argmax == "same" else f1_argmax, "auroc": auroc, "n": 100,
            "ci": {"acc": {"low": acc - 0.02, "high": acc + 0.02, "undefined_resamples": 0}},
            "per_class": {}, "classes_left_out": {"auroc": [], "f1": []}}
    record = {**extra, "method": method, "dataset": dataset, "mode": mode, "leads": leads, "train_fraction": fraction,
              "seed": seed, "multilabel": dataset == "ningbo", "class_names": ["a", "b"], "test": test,
              "val": dict(test, acc=acc - 0.01), "crop_rule": "centre", "encoder": None,
              "encoder_config_hash": "abc"}
    (run / "metrics.json").write_text(json.dumps(record))
    (run / "config.yaml").write_text("{}\n")
    return run


@pytest.fixture
def runs(tmp_path) -> list[Path]:
    r = tmp_path / "runs"
    r.mkdir()
    return [
        # three seeds: ACC 81.0 ± 1.0; seed 2's F1 undefined -> F1 from two runs
        make_run(r, "core0", seed=0, acc=0.81, f1=0.70, auroc=0.9419),
        make_run(r, "core1", seed=1, acc=0.82, f1=0.68, auroc=0.9419),
        make_run(r, "core2", seed=2, acc=0.80, f1=None, auroc=0.9419),

        make_run(r, "stmem", method="ST-MEM", seed=0, acc=0.809, f1=0.634, auroc=0.9421),  # AUROC ties at 94.2
        make_run(r, "sup", method="Supervised", mode="scratch", acc=0.714, f1=0.602, auroc=0.896),
        make_run(r, "core_icbeb", dataset="icbeb2018", acc=0.869, f1=0.84, auroc=0.979),
        make_run(r, "core_icbeb1", dataset="cpsc2018", seed=1, acc=0.869, f1=float("nan"), auroc=0.979),
        make_run(r, "core_6a", leads="6", seed=0, acc=0.77), make_run(r, "core_6b", leads=6, seed=1, acc=0.772),
        make_run(r, "stmem_6", method="ST-MEM", leads="6", acc=0.768),
        make_run(r, "core_1", leads="1", acc=0.695),
        make_run(r, "core_5pct", fraction=0.05, acc=0.76),
        make_run(r, "stmem_50pct", method="ST-MEM", fraction=0.5, acc=0.794),
        make_run(r, "core_linear", mode="linear", acc=0.99, f1=0.99, auroc=0.99),    # in no table
        make_run(r, "core_ningbo_25pct", dataset="ningbo", leads="6", fraction=0.25),  # in no table
        make_run(r, "core_25pct", fraction=0.25, acc=0.78),                           # a study's own fraction
        make_run(r, "core_folds", mode="linear", split_rule="folds"),                    # in no table
    ]


def read_md_table(path: Path) -> dict[str, dict[str, str]]:
    """The first Markdown table of a file: {row name: {column: cell}}."""
    lines = [ln for ln in path.read_text().split("\n\n") if ln.startswith("| Method")][0].splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines[2:]]
    return {row[0]: dict(zip(header[1:], row[1:])) for row in rows}


def read_csv(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {row["method"]: row for row in csv.DictReader(f)}


def test_comparison_table(runs, tmp_path):
    out = tmp_path / "report"
    written = write_report(runs, out)
    assert sorted(p.name for p in written) == sorted(
        [f"{t}.{ext}" for t in ("comparison", "lead_reduction", "train_fraction") for ext in ("md", "csv", "tex")]
        + ["all_runs.csv"])
    md = read_md_table(out / "comparison.md")
    assert list(md) == ["CoRe-ECG", "ST-MEM", "Supervised"]          # first-seen order
    assert list(md["CoRe-ECG"]) == ["PTB-XL ACC", "PTB-XL F1", "PTB-XL AUROC",
                                    "ICBEB2018 ACC", "ICBEB2018 F1", "ICBEB2018 AUROC"]
    # mean ± sample std over the three seeds; the linear run (0.99) is not averaged in
    assert md["CoRe-ECG"]["PTB-XL ACC"] == "**81.0 ± 1.0**"
    assert md["CoRe-ECG"]["PTB-XL F1"] == "**69.0 ± 1.4**"           # seeds 0 and 1 only
    assert md["ST-MEM"]["PTB-XL ACC"] == "<u>80.9</u>"                      # one run: the mean alone
    assert md["Supervised"]["PTB-XL ACC"] == "71.4"
    # equal printed values are both best
    assert md["CoRe-ECG"]["PTB-XL AUROC"] == "**94.2 ± 0.0**" and md["ST-MEM"]["PTB-XL AUROC"] == "**94.2**"
    assert md["Supervised"]["PTB-XL AUROC"] == "<u>89.6</u>"
    assert md["ST-MEM"]["ICBEB2018 ACC"] == "–" and md["CoRe-ECG"]["ICBEB2018 ACC"] == "**86.9 ± 0.0**"
    text = (out / "comparison.md").read_text()
    assert md["CoRe-ECG"]["ICBEB2018 F1"] == "**84.0**"            # NaN read as undefined; cpsc2018 alias
    assert "| CoRe-ECG | 3/2/3 | 2/1/2 |" in text and "| ST-MEM | 1 | – |" in text   # runs per cell
    # the fake runs have no predictions.csv: no difference, no mark, and the legend says so
    assert "6 cell(s) have no difference: 6 with no predictions.csv." in text and "\\*" not in text.split("\n\n")[2]
    assert "F1: macro F1 at the paper's fixed 0.5 threshold (metrics.json test.f1)." in text

    rows = read_csv(out / "comparison.csv")
    assert rows["CoRe-ECG"]["PTB-XL ACC"] == "81.0 ± 1.0" and rows["CoRe-ECG"]["PTB-XL ACC n"] == "3"
    assert rows["CoRe-ECG"]["PTB-XL F1 n"] == "2"
    assert rows["ST-MEM"]["ICBEB2018 ACC"] == "" and rows["ST-MEM"]["ICBEB2018 ACC n"] == "0"
    assert all(rows["ST-MEM"][f"PTB-XL F1 {k}"] == "" for k in ("diff", "diff low", "diff high", "p", "p adjusted",
                                                                 "diff runs", "diff reference runs"))
    assert rows["ST-MEM"]["PTB-XL F1 unmarked because"] == "no predictions.csv"
    assert rows["Supervised"]["PTB-XL F1 unmarked because"] == "no predictions.csv"
    assert rows["CoRe-ECG"]["PTB-XL F1 unmarked because"] == ""                 # the reference's own row


def test_lead_and_fraction_tables(runs, tmp_path):
    out = tmp_path / "report"
    write_report(runs, out)
    leads = read_md_table(out / "lead_reduction.md")
    assert leads["CoRe-ECG"]["PTB-XL 6-lead ACC"] == "**77.1 ± 0.1**"    # "6" and 6 are one setting
    assert leads["ST-MEM"]["PTB-XL 6-lead ACC"] == "<u>76.8</u>"
    assert leads["CoRe-ECG"]["PTB-XL 1-lead ACC"] == "**69.5**" and leads["ST-MEM"]["PTB-XL 1-lead ACC"] == "–"
    assert leads["CoRe-ECG"]["PTB-XL 12-lead ACC"] == "**81.0 ± 1.0**"
    assert "ICBEB2018 1-lead AUROC" in leads["CoRe-ECG"]
    fractions = read_md_table(out / "train_fraction.md")
    assert list(fractions["CoRe-ECG"])[:3] == ["PTB-XL 100% ACC", "PTB-XL 100% F1", "PTB-XL 100% AUROC"]
    assert fractions["CoRe-ECG"]["PTB-XL 5% ACC"] == "**76.0**" and fractions["ST-MEM"]["PTB-XL 5% ACC"] == "–"
    assert fractions["ST-MEM"]["PTB-XL 50% ACC"] == "**79.4**"
    # a fraction the paper has not (a study's) gets its own column after the paper's three
    assert [c for c in fractions["CoRe-ECG"] if c.startswith("PTB-XL") and c.endswith("ACC")] == [
        "PTB-XL 100% ACC", "PTB-XL 50% ACC", "PTB-XL 5% ACC", "PTB-XL 25% ACC"]
    assert fractions["CoRe-ECG"]["PTB-XL 25% ACC"] == "**78.0**"
    assert not any(c.startswith("Ningbo") for c in fractions["CoRe-ECG"])     # 6 leads at 25 %: in no table
    # as in the paper's Tables 2 and 3: rows are the methods run beyond 12 leads / all data
    assert list(leads) == ["CoRe-ECG", "ST-MEM"] and list(fractions) == ["CoRe-ECG", "ST-MEM"]
    assert read_csv(out / "train_fraction.csv")["CoRe-ECG"]["PTB-XL 50% ACC n"] == "0"


def test_all_runs_lists_every_run(runs, tmp_path):
    out = tmp_path / "report"
    write_report(runs, out)
    with open(out / "all_runs.csv", newline="") as f:
        rows = {Path(r["run_dir"]).name: r for r in csv.DictReader(f)}
    assert len(rows) == len(runs)
    assert rows["core_linear"]["tables"] == "" and rows["core_linear"]["test_acc"] == "0.99"
    assert rows["core_ningbo_25pct"]["tables"] == ""
    assert rows["core0"]["tables"] == "comparison;lead_reduction;train_fraction"
    assert rows["core_6a"]["tables"] == "lead_reduction"
    assert rows["core0"]["test_acc_low"] == str(0.81 - 0.02) and rows["core0"]["val_acc"] == str(0.81 - 0.01)
    assert rows["core_folds"]["split_rule"] == "folds" and rows["core0"]["split_rule"] == ""  # older runs: none


def test_job_writes_the_tables(runs, tmp_path):
    out = tmp_path / "cli"
    done = subprocess.run([sys.executable, str(REPO / "jobs" / "report.py"), *map(str, runs), "--output", str(out)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (out / "comparison.md").is_file() and str(out / "all_runs.csv") in done.stdout


@pytest.mark.parametrize("content, needle", [
    (None, "no metrics.json"),
    ("{not json", "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"method": "M", "dataset": "ptbxl", "mode": "finetune", "leads": "12",
                 "train_fraction": 1.0, "test": {"acc": 1, "f1": 1, "auroc": 1}}), "'seed'"),
    (json.dumps({"method": "M", "dataset": "ptbxl", "mode": "finetune", "leads": "12", "train_fraction": 1.0,
                 "seed": 0, "test": {"acc": "high", "f1": 1, "auroc": 1}}), "'test.acc'"),
    (json.dumps({"method": "M", "dataset": "ptbxl", "mode": "finetune", "leads": "12", "train_fraction": 2,
                 "seed": 0, "test": {"acc": 1, "f1": 1, "auroc": 1}}), "train_fraction"),
])
def test_malformed_folder_is_named(tmp_path, content, needle):
    bad = tmp_path / "bad_run"
    bad.mkdir()
    if content is not None:
        (bad / "metrics.json").write_text(content)
    with pytest.raises(RunError, match=needle) as e:
        load_run(bad)
    assert str(bad) in str(e.value)


def test_job_reports_a_bad_folder(runs, tmp_path, capsys):
    sys.path.insert(0, str(REPO / "jobs"))
    try:
        import report as job
    finally:
        sys.path.remove(str(REPO / "jobs"))
    empty = tmp_path / "empty_run"
    empty.mkdir()
    assert job.main([*map(str, runs), str(empty), "--output", str(tmp_path / "out")]) == 2
    assert f"error: {empty}: no metrics.json" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()                 # nothing half-written


def test_two_runs_with_one_seed_are_refused(runs, tmp_path):
    twin = make_run(tmp_path, "core0_again", seed=0)
    with pytest.raises(RunError, match="core0_again.*core0|core0.*core0_again"):
        write_report(runs + [twin], tmp_path / "out")


def test_f1_argmax_is_selectable_and_named(tmp_path):
    runs = [make_run(tmp_path, "core", f1=0.60, f1_argmax=0.66),
            make_run(tmp_path, "core_ningbo", dataset="ningbo", f1=0.40, f1_argmax=None)]
    out = tmp_path / "argmax"
    write_report(runs, out, report=ReportConfig(f1="argmax", bootstrap_resamples=0))
    md = read_md_table(out / "comparison.md")
    assert md["CoRe-ECG"]["PTB-XL F1"] == "**66.0**" and md["CoRe-ECG"]["Ningbo F1"] == "**40.0**"
    text = (out / "comparison.md").read_text()
    assert "F1: macro F1 of argmax decisions, as ST-MEM's code computes it (metrics.json test.f1_argmax)" in text
    assert "Ningbo: multi-label, no argmax decision, so F1 at the 0.5 threshold (test.f1)" in text
    assert "No differences between methods (report.bootstrap_resamples = 0)." in text
    assert "argmax decisions" in (out / "lead_reduction.tex").read_text()
    write_report(runs, tmp_path / "threshold", report=ReportConfig(bootstrap_resamples=0))
    assert read_md_table(tmp_path / "threshold" / "comparison.md")["CoRe-ECG"]["PTB-XL F1"] == "**60.0**"


def test_argmax_needs_f1_argmax_and_multilabel(tmp_path):
    run = make_run(tmp_path, "core")
    record = json.loads((run / "metrics.json").read_text())
    del record["test"]["f1_argmax"]
    (run / "metrics.json").write_text(json.dumps(record))
    write_report([run], tmp_path / "ok")                         # the threshold F1 does not read it
    with pytest.raises(RunError, match="'test.f1_argmax'") as e:
        write_report([run], tmp_path / "out", report=ReportConfig(f1="argmax"))
    assert str(run) in str(e.value)
    del record["multilabel"]
    (run / "metrics.json").write_text(json.dumps(record))
    with pytest.raises(RunError, match="'multilabel'"):
        write_report([run], tmp_path / "out", report=ReportConfig(f1="argmax"))


def test_reference_is_selectable(runs, tmp_path):
    out = tmp_path / "ref"
    write_report(runs, out, report=ReportConfig(reference="ST-MEM", bootstrap_resamples=10))
    text = (out / "comparison.md").read_text()
    assert "the difference to ST-MEM has a p-value below 0.05 after Holm's correction" in text
    write_report(runs, tmp_path / "none", report=ReportConfig(reference="MoCo V3", bootstrap_resamples=10))
    assert ("No MoCo V3 runs in this table: no differences between methods."
            in (tmp_path / "none" / "comparison.md").read_text())
