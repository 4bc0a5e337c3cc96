"""The encoder x objective table (coreecg/eval/tables/encoder_objective.py) on synthetic run folders:
rows grouped by the encoder their config.yaml builds (never by name), each encoder's rows against its
own baselines, its parameters and train FLOPs beside them (coreecg.encoders.cost, whose count
tests/test_encoders.py checks against the ViT's hand count), published numbers as context rows, and
the rows' protocol checked."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

from coreecg.config import ReportConfig, load_config
from coreecg.encoders import build_encoder
from coreecg.eval.calibration import _test_set, write_run
from coreecg.encoders.cost import encoder_cost
from coreecg.eval.fairness import Allowance, UnfairTableError
from coreecg.eval.report import load_run
from coreecg.eval.significance import Difference
from coreecg.eval.tables import TableInputs, table_for
from coreecg.eval.tables.benchmark import load_published
from coreecg.eval.tables.encoder_objective import (PARAMS, encoder_objective_table, format_params,
                                                   write_encoder_objective)

REPORT = ReportConfig(bootstrap_resamples=200)
TINY = {"xresnet1d": {"stem": [8, 8, 16], "widths": [16, 32], "layers": [1, 1], "expansion": 1},
        "s4": {"d_model": 16, "n_layers": 2, "d_state": 8, "stem": [16, 16], "stem_strides": [5, 3]}}
# (row name, arch, mode, encoder, skill): neutral names, so only config.yaml says which encoder a
# row is; per encoder a probe baseline, a scratch baseline and one objective in both modes. Each
# encoder's objective beats its own Random init under the probe and loses to its own Supervised
# fine-tuned; the S4 rows sit far above the xresnet1d ones, so a baseline of the wrong encoder
# flips both signs.
ROWS = [("Untrained A", "xresnet1d", "linear", "random", 0.2), ("Scratch A", "xresnet1d", "scratch", None, 1.4),
        ("Obj A", "xresnet1d", "linear", "enc-a", 0.9), ("Obj A", "xresnet1d", "finetune", "enc-a", 0.9),
        ("Untrained B", "s4", "linear", "random", 1.6), ("Scratch B", "s4", "scratch", None, 3.0),
        ("Obj B", "s4", "linear", "enc-b", 2.3), ("Obj B", "s4", "finetune", "enc-b", 2.3)]


def _config(arch: str, **more) -> dict:
    return {"model": {"arch": arch}, "encoders": {arch: TINY[arch]}, **more}


def _runs(root: Path, rng: np.random.Generator, configs: dict[str, dict] | None = None) -> list[Path]:
    """3 seeds per row of ROWS on one test set of 100 patients (dataset "ptbxl-super", patient
    split); each run's config.yaml names its encoder (`configs`: row -> another config.yaml)."""
    task = _test_set(100, rng)
    y, hard = task[2], rng.normal(0, 1.0, task[2].shape)
    out = []
    for method, arch, mode, encoder, skill in ROWS:
        for seed in range(3):
            logits = y * (skill + rng.normal(0, 0.15)) + hard + rng.normal(0, 0.5, y.shape)
            folder = write_run(root / f"{method}-{mode}-s{seed}".replace(" ", "_"), method, seed, task, logits)
            record = json.loads((folder / "metrics.json").read_text())
            record.update(mode=mode, dataset="ptbxl-super", split_rule="patients",
                          encoder=encoder if encoder in (None, "random") else str(root / f"{encoder}{seed}.pt"))
            (folder / "metrics.json").write_text(json.dumps(record))
            config = (configs or {}).get(method, _config(arch))
            (folder / "config.yaml").write_text(yaml.safe_dump(config))
            out.append(folder)
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> list[Path]:
    return _runs(tmp_path_factory.mktemp("enc"), np.random.default_rng(7))


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pub") / "published.yaml"
    path.write_text(yaml.safe_dump({
        "source": "a benchmark", "protocol": "its folds", "mode": "finetune",
        "rows": {"Above all": {"ptbxl-super": 0.999}, "elsewhere": {"cpsc2018": 0.9}},
        "shares": {"ptbxl-super": {"test_split": "folds", "classes": "same"}}}))
    return path


@pytest.fixture(scope="module")
def table(folders, published):
    return encoder_objective_table([load_run(f) for f in folders], REPORT, [load_published(published)])


def _auroc(table) -> int:
    return next(j for j, c in enumerate(table.columns) if c.metric == "auroc" and c.fraction == 1.0)


def test_rows_are_grouped_by_the_encoder_their_config_builds(table):
    assert list(table.cells) == ["Untrained A (linear)", "Scratch A", "Obj A (linear)", "Obj A (fine-tune)",
                                 "Untrained B (linear)", "Scratch B", "Obj B (linear)", "Obj B (fine-tune)"]
    assert table.references == {"Obj A (linear)": "Untrained A (linear)", "Obj A (fine-tune)": "Scratch A",
                                "Obj B (linear)": "Untrained B (linear)", "Obj B (fine-tune)": "Scratch B"}
    assert table.lead_columns["Encoder"] == {r: "xresnet1d" if r.startswith(("Untrained A", "Scratch A", "Obj A"))
                                             else "s4" for r in table.cells}


def test_each_objective_is_compared_with_its_own_encoders_baselines(table):
    j = _auroc(table)
    for row, sign in (("Obj A (linear)", 1), ("Obj A (fine-tune)", -1), ("Obj B (linear)", 1),
                      ("Obj B (fine-tune)", -1)):
        d = table.difference(row, j)
        assert isinstance(d, Difference) and d.testable and np.sign(d.diff) == sign, row
        assert d.reference_seeds == (0, 1, 2)
    assert table.marked("Obj A (linear)", j) and table.marked("Obj B (fine-tune)", j)
    for baseline in ("Untrained A (linear)", "Scratch A", "Untrained B (linear)", "Scratch B"):
        assert table.difference(baseline, j) is None


def test_parameters_and_flops_come_from_the_encoder_as_built(table):
    for arch, row in (("xresnet1d", "Scratch A"), ("s4", "Obj B (fine-tune)")):
        config = load_config(None, [f"model.arch={arch}", *(f"encoders.{arch}.{k}={json.dumps(v)}"
                                                             for k, v in TINY[arch].items())])
        built = build_encoder(config)
        assert table.lead_columns[PARAMS][row] == format_params(sum(p.numel() for p in built.parameters()))
        assert table.lead_columns["Train GFLOP/sample"][row] == f"{encoder_cost(config)['train_gflop_per_sample']:.3g}"
    assert format_params(3_454_464) == "3.45M" and format_params(12_512) == "12.5k" and format_params(950) == "950"


def test_published_numbers_are_context_rows_never_compared(table):
    j = _auroc(table)
    rows = dict(table.context)
    assert rows["Above all°"] == {j: "99.9"}
    assert rows["*published°: shares with the measured rows*"] == {j: "classes, not test records"}
    assert "elsewhere°" not in rows                  # no column of its dataset here
    assert table.best(j) < 99.9 and not [m for m in table.cells if "Above" in m]     # not a row, not the best
    assert any(n.startswith("° Published, not run here (fine-tuned)") for n in table.notes)


def test_written_with_the_cost_columns_and_every_renderer_aligned(table, tmp_path):
    names = {p.name for p in write_encoder_objective(table, tmp_path)}
    assert names == {f"encoder_objective{end}" for end in (".md", ".csv", ".tex", "_verdicts.md")}
    md = (tmp_path / "encoder_objective.md").read_text()
    assert re.search(r"^\| Method \| Encoder \| Params \| Train GFLOP/sample \| ", md, re.MULTILINE)
    assert re.search(r"^\| Above all° \|[ |]*99\.9 \|$", md, re.MULTILINE) and "Obj B (fine-tune) − Scratch B" in md
    assert "# Encoders x objectives: verdicts" in (tmp_path / "encoder_objective_verdicts.md").read_text()
    header = (tmp_path / "encoder_objective.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["method", "baseline", "Encoder", "Params", "Train GFLOP/sample"]
    tex = (tmp_path / "encoder_objective.tex").read_text()
    spec = re.search(r"\\begin\{tabular\}\{([^}]*)\}", tex).group(1).replace(" ", "")
    body = tex.split("\\midrule", 1)[1].split("\\bottomrule")[0]
    rows = [ln for ln in body.splitlines() if ln.endswith("\\\\")]
    assert rows and all(ln.count(" & ") == len(spec) - 1 for ln in rows)


def test_the_report_checks_its_rows_protocol(tmp_path, published):
    """Differences the variants file declares are footnotes; any other one (here optim.lr) refuses
    the table, naming the key."""
    lr = {"Obj B": _config("s4", optim={"lr": 0.01})}
    runs = [load_run(f) for f in _runs(tmp_path, np.random.default_rng(2), lr)]
    kind = table_for("encoder_objective")
    allow = [Allowance(tuple({r[0] for r in ROWS}), ("model.*", "encoders.*"), "the rows compare encoders")]
    with pytest.raises(UnfairTableError, match=r"optim\.lr"):
        kind.build("encoder_objective", TableInputs(runs, REPORT, allow=allow))
    fair = [load_run(f) for f in _runs(tmp_path / "fair", np.random.default_rng(2))]
    with pytest.raises(UnfairTableError, match=r"model\.arch"):
        kind.build("encoder_objective", TableInputs(fair, REPORT))
    built = kind.build("encoder_objective", TableInputs(fair, REPORT, allow=allow, published=(str(published),)))
    # declared: one line however many comparisons (pretraining, each fine-tuning cell) it shows in
    assert [n for n in built.footnotes if "model.arch" in n] == [
        "the rows differ in model.arch ('xresnet1d', 's4'): the rows compare encoders"]
