"""The label-efficiency table: rows per (method, mode), each row's difference to the baseline of
its mode (linear: Random init; fine-tune: Supervised) under the report's run-level rule, the
verdict sentences, and the report and study wiring."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from coreecg.config import ReportConfig
from coreecg.eval.calibration import _test_set, write_run
from coreecg.eval.label_efficiency import (VERDICTS_FILE, detectable_note, detectable_summary, extra_tables,
                                           label_efficiency_rows, label_efficiency_table, verdicts)
from coreecg.eval.report import load_run, write_report
from coreecg.eval.significance import Difference, holm

REPORT = ReportConfig(bootstrap_resamples=200)

# (method, mode, encoder, skill): a random-init linear probe (named so nothing but "encoder" says
# so), the supervised baseline far above it, and a pretrained method in between in both modes: its
# linear row beats Random init, its fine-tune row loses to Supervised (a wrong baseline flips both
# signs). ST-MEM-like (linear) has Random init's skill: an A/A comparison.
ROWS = [("Untrained", "linear", "random", 0.2), ("Supervised", "scratch", None, 2.0),
        ("CoRe-ECG", "linear", "enc", 1.2), ("CoRe-ECG", "finetune", "enc", 1.2),
        ("ST-MEM-like", "linear", "enc-st", 0.2), ("ST-MEM-like", "finetune", "enc-st", 2.0)]


def _cell(root: Path, fraction: float, runs: dict[tuple[str, str], int], rng: np.random.Generator,
          n_patients: int = 100) -> list[Path]:
    """One test set (the calibration's: 4 classes, a fifth of the patients with two records) and
    `runs[(method, mode)]` runs per row of ROWS on it; metrics.json says the row's mode, encoder and
    fraction (each pretrained seed its own encoder, so each run is a replicate)."""
    task = _test_set(n_patients, rng)
    y = task[2]
    hard = rng.normal(0, 1.0, y.shape)
    out = []
    for method, mode, encoder, skill in ROWS:
        for seed in range(runs.get((method, mode), 4)):
            logits = y * (skill + rng.normal(0, 0.15)) + hard + rng.normal(0, 0.5, y.shape)
            folder = write_run(root / f"{method}-{mode}-{fraction}-s{seed}".replace(" ", "_"), method, seed, task,
                               logits)
            record = json.loads((folder / "metrics.json").read_text())
            record.update(mode=mode, dataset="ptbxl", train_fraction=fraction,
                          encoder=encoder if encoder in (None, "random") else str(root / f"{encoder}{seed}.pt"))
            (folder / "metrics.json").write_text(json.dumps(record))
            (folder / "config.yaml").write_text("{}\n")
            out.append(folder)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("le")
    rng = np.random.default_rng(3)
    # 10 %: CoRe-ECG's linear probe has 2 runs only (unmarkable); 100 %: every row 4 runs
    return (_cell(root, 0.1, {("CoRe-ECG", "linear"): 2}, rng) + _cell(root, 1.0, {}, rng))


@pytest.fixture(scope="module")
def table(folders):
    return label_efficiency_table([load_run(f) for f in folders], REPORT)


def _column(table, fraction: float, metric: str = "auroc") -> int:
    return next(j for j, c in enumerate(table.columns) if c.fraction == fraction and c.metric == metric)


def _mean_auroc(folders, method, mode, fraction) -> float:
    values = [json.loads((f / "metrics.json").read_text()) for f in folders]
    return float(np.mean([v["test"]["auroc"] for v in values if v["method"] == method and v["mode"] == mode
                          and v["train_fraction"] == fraction]))


def test_rows_columns_and_baselines(table):
    assert list(table.cells) == ["Untrained (linear)", "Supervised", "CoRe-ECG (linear)", "CoRe-ECG (fine-tune)",
                                 "ST-MEM-like (linear)", "ST-MEM-like (fine-tune)"]
    assert table.references == {"CoRe-ECG (linear)": "Untrained (linear)", "CoRe-ECG (fine-tune)": "Supervised",
                                "ST-MEM-like (linear)": "Untrained (linear)", "ST-MEM-like (fine-tune)": "Supervised"}
    assert [c.label for c in table.columns] == [f"PTB-XL {f} {m}" for f in ("100%", "10%")
                                                for m in ("ACC", "F1", "AUROC")]
    for baseline in ("Untrained (linear)", "Supervised"):            # baselines have no difference
        assert all(table.difference(baseline, j) is None for j in range(len(table.columns)))
    assert [c for c in table.cells["CoRe-ECG (linear)"][_column(table, 0.1)]] and \
        len(table.cells["CoRe-ECG (linear)"][_column(table, 0.1)]) == 2


def test_rows_recognise_random_init_by_encoder_not_name(folders, tmp_path):
    runs = [load_run(f) for f in folders]
    named = [r for r in runs if r.method == "Untrained"]
    rows = label_efficiency_rows(runs)
    assert rows[0].role == "random" and rows[0].name == "Untrained (linear)"
    # a method called "Random init" with a pretrained encoder is a pretrained row, not a baseline
    fake = [r.__class__(**{**r.__dict__, "method": "Random init",
                           "record": {**r.record, "encoder": "/x/enc.pt"}}) for r in named]
    rows = label_efficiency_rows([*fake, *runs])
    by_name = {r.name: r for r in rows}
    assert by_name["Random init (linear)"].role == "pretrained"
    assert by_name["Random init (linear)"].baseline == "Untrained (linear)"


def test_each_row_is_compared_with_the_baseline_of_its_mode(table, folders):
    j = _column(table, 1.0)
    linear, finetune = table.difference("CoRe-ECG (linear)", j), table.difference("CoRe-ECG (fine-tune)", j)
    assert isinstance(linear, Difference) and isinstance(finetune, Difference)
    # the sign tells the baseline: above Random init under the probe, below Supervised fine-tuned
    assert linear.diff > 0.05 and finetune.diff < -0.02
    assert linear.diff == pytest.approx(_mean_auroc(folders, "CoRe-ECG", "linear", 1.0)
                                        - _mean_auroc(folders, "Untrained", "linear", 1.0), abs=1e-6)
    assert finetune.diff == pytest.approx(_mean_auroc(folders, "CoRe-ECG", "finetune", 1.0)
                                          - _mean_auroc(folders, "Supervised", "scratch", 1.0), abs=1e-6)
    assert linear.reference_seeds == finetune.reference_seeds == (0, 1, 2, 3)
    assert table.marked("CoRe-ECG (linear)", j) and table.marked("CoRe-ECG (fine-tune)", j)


def test_marks_follow_the_run_level_rule(table):
    j, small = _column(table, 1.0), _column(table, 0.1)
    # A/A: ST-MEM-like's probe has Random init's skill
    aa = table.difference("ST-MEM-like (linear)", j)
    assert aa.testable and not table.marked("ST-MEM-like (linear)", j)
    assert table.unmarked_because("ST-MEM-like (linear)", j).startswith("adjusted p (holm)")
    # a 2-run cell: an interval from test-set sampling only, never marked, and it says why
    d = table.difference("CoRe-ECG (linear)", small)
    assert d.p_value is None and not table.marked("CoRe-ECG (linear)", small)
    assert "fewer than 3 runs" in table.unmarked_because("CoRe-ECG (linear)", small)
    assert ("CoRe-ECG (linear)", small) not in table.adjusted             # not in the family
    # the families: one per metric, each its metric's testable differences, adjusted by Holm together
    testable = [(m, k) for m in table.cells for k in range(len(table.columns))
                if isinstance(x := table.difference(m, k), Difference) and x.testable]
    assert sorted(table.adjusted) == sorted(testable) and len(testable) == 3 * 4 + 3 * 3
    assert sorted(table.families) == ["acc", "auroc", "f1"]
    for metric, family in table.families.items():
        assert {table.columns[k].metric for _, k in family} == {metric} and len(family) == 7
        p = [table.difference(m, k).p_value for m, k in family]
        assert [table.adjusted[key] for key in family] == pytest.approx(list(holm(p)))   # within its own family


def test_verdicts_quote_the_differences(table):
    lines = verdicts(table)
    assert len(lines) == 2 * 2 * 2       # fractions x pretrained methods x (linear, fine-tune)
    j = _column(table, 1.0)
    line = next(v for v in lines if v.startswith("PTB-XL, 100 %: CoRe-ECG vs Untrained under the linear probe: "))
    d = table.difference("CoRe-ECG (linear)", j)
    m = re.search(r": ([+-]\d+\.\d) \[(-?\d+\.\d), (-?\d+\.\d)\] AUROC points, marked \(adjusted p (\S+) < 0.05\)$",
                  line)
    assert m, line
    assert m.group(1) == f"{100 * d.diff:+.1f}" and float(m.group(2)) == round(100 * d.low, 1)
    assert float(m.group(3)) == round(100 * d.high, 1)
    assert m.group(4) == f"{table.adjusted[('CoRe-ECG (linear)', j)]:.3g}"
    assert any(v.startswith("PTB-XL, 100 %: CoRe-ECG vs Supervised under fine-tuning: -") for v in lines)
    aa = next(v for v in lines if v.startswith("PTB-XL, 100 %: ST-MEM-like vs Untrained under the linear probe"))
    assert re.search(r"AUROC points, not marked \(adjusted p \S+ >= 0.05\): (inconclusive: the smallest detectable "
                     r"difference here is \d+\.\d points \(power 0.8\)|equivalent within ±2 points .*)$", aa), aa
    few = next(v for v in lines if v.startswith("PTB-XL, 10 %: CoRe-ECG vs Untrained under the linear probe"))
    assert "not marked: fewer than 3 runs" in few


def test_the_detectable_difference_comes_from_each_cells_own_data(table):
    """The difference at which the run-level test of the Difference's own SE parts, its df estimated
    as the report estimates it, passes the bar at alpha/k with probability 0.8, k = its family's
    size (`estimated_df_power`); summarised under the table over the primary metric's family."""
    from coreecg.eval.significance import estimated_df_power

    family = table.families["auroc"]
    for key in family:
        d, k = table.difference(*key), len(family)
        assert d.parts.se == pytest.approx(d.se, rel=1e-12) and d.se > 0
        assert estimated_df_power(d.parts, 0.05 / k)(table.detectable[key]) == pytest.approx(0.8, abs=1e-8)
    summary = detectable_summary(table)
    sizes = sorted(100 * table.detectable[key] for key in family)
    assert (summary["family"], summary["n"], summary["untested"]) == (7, 7, 1)     # the 2-run 10 % cell
    assert summary["low"] == pytest.approx(sizes[0]) and summary["high"] == pytest.approx(sizes[-1])
    note = detectable_note(table)
    assert f"median {summary['median']:.1f} points" in note and "1 AUROC difference(s) could not be tested" in note


def test_report_writes_it_when_random_init_runs_exist_and_keeps_other_tables(folders, tmp_path):
    written = write_report(folders, tmp_path / "with", report=REPORT, extra=extra_tables())   # auto: a random run
    names = {p.name for p in written}
    assert {"label_efficiency.md", "label_efficiency.csv", "label_efficiency.tex", VERDICTS_FILE} <= names
    without = write_report(folders, tmp_path / "without", report=REPORT, extra=extra_tables(False))
    assert not {n for n in (p.name for p in without) if n.startswith("label_efficiency")}
    for p in without:       # every other table as without it
        if p.name != "all_runs.csv":
            assert (tmp_path / "with" / p.name).read_text() == p.read_text(), p.name
    md = (tmp_path / "with" / "label_efficiency.md").read_text()
    assert "| CoRe-ECG (linear) − Untrained (linear) |" in md and "## Verdicts" in md
    assert "Smallest detectable difference" in (tmp_path / "with" / VERDICTS_FILE).read_text()
    header = (tmp_path / "with" / "label_efficiency.csv").read_text().splitlines()[0].split(",")
    assert header[:2] == ["method", "baseline"]
    all_runs = (tmp_path / "with" / "all_runs.csv").read_text()
    assert "label_efficiency" in all_runs


def test_a_study_may_ask_for_the_table(tmp_path, ecg_data):
    from coreecg.study.spec import LABEL_EFFICIENCY_TABLE, load_study
    from tests.test_study import _study

    study = load_study(_study(tmp_path, ecg_data, report__tables=["comparison", LABEL_EFFICIENCY_TABLE]))
    assert list(study.tables) == ["comparison", LABEL_EFFICIENCY_TABLE]


def test_a_row_without_a_baseline_says_so(folders):
    from dataclasses import replace

    runs = [load_run(f) for f in folders]
    frozen = [replace(r, mode="frozen") for r in runs if r.method == "CoRe-ECG" and r.mode == "linear"]
    table = label_efficiency_table([r for r in runs if r.method == "Supervised"] + frozen,
                                   ReportConfig(bootstrap_resamples=0))
    assert list(table.cells) == ["Supervised", "CoRe-ECG (frozen)"] and table.references == {}
    assert verdicts(table)[0] == ("PTB-XL, 100 %: CoRe-ECG vs Random init with the encoder frozen: no Random init "
                                  "run with the encoder frozen, no difference")


def test_a_study_report_writes_and_indexes_it(monkeypatch, tmp_path):
    from types import SimpleNamespace

    import coreecg.study.summary as study_report

    rng = np.random.default_rng(5)
    folders = _cell(tmp_path, 1.0, {}, rng, n_patients=40)
    monkeypatch.setattr(study_report, "finished_runs",
                        lambda study, output, phase: {f.name: f for f in folders} if phase == "finetune" else {})
    study = SimpleNamespace(
        name="s", path="s.yaml", config_file=str(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"),
        report_overrides=lambda: ["report.bootstrap_resamples=50"], pretrain_runs=lambda: [],
        finetune_runs=lambda: folders, methods=["Untrained", "Supervised", "CoRe-ECG", "ST-MEM-like"],
        method_tables={}, tables=("comparison", "label_efficiency"), unavailable={}, encoders=[], allow=[],
        published=(), figures=())
    index = study_report.write_study_report(study, tmp_path / "out").read_text()
    lines = [ln for ln in index.splitlines() if ln.startswith("- **")]
    assert lines[0].startswith("- **comparison**") and lines[1].startswith("- **label_efficiency**")
    assert f"{len(folders)} run(s)" in lines[1] and VERDICTS_FILE in lines[1]
    assert (tmp_path / "out" / "report" / "tables" / VERDICTS_FILE).is_file()
