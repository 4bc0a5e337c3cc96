"""A method is one module (issue 27, item 5): the test plugin (tests/plugin_method.py, named in
plugins) brings its typed options section, their check and its structural keys, and no
file in coreecg names it; the config and the training code name no built-in method either."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coreecg.config import METHODS, ConfigError, config_from_dict, load_config
from coreecg.train.resume_check import CheckpointError, check_compatible
from tests.helpers import tiny_config

REPO = Path(__file__).resolve().parents[1]
PLUGIN = ["plugins=[tests.plugin_method]", "pretrain.method=patch_regression"]


def test_the_plugins_section_is_typed_checked_and_saved(tmp_path):
    cfg = tiny_config(*PLUGIN, "methods.patch_regression.ratio=0.3", "methods.patch_regression.hidden_dim=16")
    assert (cfg.method_options.ratio, cfg.method_options.hidden_dim) == (0.3, 16)
    assert cfg.method_label == "Patch regression" and config_from_dict(cfg.to_dict()) == cfg
    # its own check, its error prefixed with the section's key
    with pytest.raises(ConfigError, match=r"^overrides: methods\.patch_regression: need 0 < ratio < 1.*ratio=1\.5"):
        tiny_config(*PLUGIN, "methods.patch_regression.ratio=1.5")
    with pytest.raises(ConfigError, match=r"methods\.patch_regression\.hidden_dim: expects an integer"):
        tiny_config(*PLUGIN, "methods.patch_regression.hidden_dim=wide")
    # a file naming the plugin sets its section; an unknown key names the file and the key
    f = tmp_path / "run.yaml"
    f.write_text("pretrain: {plugins: [tests.plugin_method], method: patch_regression}\n"
                 "methods: {patch_regression: {ratio: 0.25, ratoi: 0.3}}\n")
    with pytest.raises(ConfigError, match=rf"^{f}: methods\.patch_regression\.ratoi: unknown key"):
        load_config(f)
    f.write_text(f.read_text().replace(", ratoi: 0.3", ""))
    assert load_config(f).methods.patch_regression.ratio == 0.25


def test_resume_refuses_a_change_of_the_plugins_structural_key(tmp_path):
    from coreecg.train.pretraining import pretrain_local

    run = ["optim.batch_size=8", "train.eval_every_epochs=0", "methods.patch_regression.hidden_dim=16"]
    saved = tiny_config(*PLUGIN, *run)
    check_compatible("x.pt", saved, tiny_config(*PLUGIN, *run, "methods.patch_regression.ratio=0.3"))  # not structural
    windows = np.zeros((8, 12, 2500), dtype=np.float32)
    pretrain_local(tiny_config(*PLUGIN, *run, "optim.epochs=1"), windows, tmp_path)
    wider = tiny_config(*PLUGIN, *run, "optim.epochs=2", "methods.patch_regression.hidden_dim=32")
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt.*methods\.patch_regression\.hidden_dim: 16 -> 32"):
        pretrain_local(wider, windows, tmp_path)
    summary = pretrain_local(tiny_config(*PLUGIN, *run, "optim.epochs=2"), windows, tmp_path)
    assert summary["epoch"] == 2                  # the same structure resumes


def _method_names_in(path: Path, names: set[str]) -> list[str]:
    """String constants in `path` that are a method's name, and sections read as `<x>.methods.<name>`."""
    hits = []
    for node in ast.walk(ast.parse(path.read_text())):
        value = node.value if isinstance(node, ast.Constant) else None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and node.value.attr == "methods":
            value = node.attr
        if isinstance(value, str) and value in names:
            hits.append(f"{path.relative_to(REPO)}:{node.lineno}: {value}")
    return hits


def test_no_core_file_names_a_method():
    tiny_config(*PLUGIN)
    assert {"core", "moco_v3", "cmsc", "patch_regression"} <= set(METHODS)
    assert not [p for p in (REPO / "coreecg").rglob("*.py") if "patch_regression" in p.read_text()]
    core = [*sorted((REPO / "coreecg" / "config").glob("*.py")), REPO / "coreecg" / "typed.py",
            *(REPO / "coreecg" / "train").glob("*.py")]
    hits = [h for p in core for h in _method_names_in(p, set(METHODS))]
    default = 'method: str = "core"'                       # the paper's method as the default value
    line = next(i for i, x in enumerate((REPO / "coreecg" / "config" / "methods.py").read_text().splitlines(), 1)
                if default in x)
    assert hits == [f"coreecg/config/methods.py:{line}: core"]


def test_the_config_reads_built_in_sections_without_importing_the_methods():
    """The registry is a leaf the config imports plainly; the built-ins' options modules declare
    them without torch, so a config read imports neither torch nor a method's model."""
    code = ("import sys; from coreecg.config import load_config; "
            "c = load_config(overrides=['methods.cmsc.dim=8', 'methods.moco_v3.views.crop_min=0.9', "
            "'methods.core.masking.p_time=0.3']); "
            "assert (c.methods.cmsc.dim, c.methods.moco_v3.views.crop_min) == (8, 0.9); "
            "assert c.methods.core.masking.p_time == 0.3 and c.method.reported_losses == ('loss_rec', 'loss_con'); "
            "leaked = [m for m in sys.modules if m.split('.')[0] == 'torch' or m.endswith('.method')]; "
            "assert not leaked, leaked; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_plugins_own_loss_term_is_on_the_console_line_and_a_sweep_objective():
    from coreecg.train.console import progress_line
    from coreecg.tune.sweep import SweepError, check_objective
    from tests.plugin_method import PatchRegression

    record = {"epoch": 1, "step": 4, "loss": 0.5, "loss_patch": 0.25, "samples_per_s": 8.0, "seconds": 1.0}
    line = progress_line(record, 2, PatchRegression.reported_losses)
    assert "| loss 0.5000 | patch 0.2500 |" in line and " rec " not in line
    assert progress_line(record, 2) == line                  # the driver's follower: the record's loss_* keys
    assert "patch" not in progress_line(record, 2, ())       # a method that reports no term shows none
    plugin = tiny_config(*PLUGIN)
    assert check_objective("loss_patch", plugin) == "min" and check_objective("probe_auroc", plugin) == "max"
    with pytest.raises(SweepError, match=r"--metric loss_rec: .*patch_regression, which reports loss_patch "):
        check_objective("loss_rec", plugin)
    assert check_objective("loss_rec", tiny_config()) == "min"          # CoRe-ECG reports it
    with pytest.raises(SweepError, match="which reports loss_con besides loss"):
        check_objective("loss_rec", tiny_config("pretrain.method=moco_v3"))


def test_a_plugin_run_reports_its_loss_term_on_the_console_summary_and_leaderboard(tmp_path, caplog):
    import logging

    from coreecg.eval.leaderboard import leaderboard_rows
    from coreecg.train.pretraining import pretrain_local

    cfg = tiny_config(*PLUGIN, "optim.batch_size=8", "optim.epochs=1", "train.eval_every_epochs=0")
    with caplog.at_level(logging.INFO, logger="coreecg.train.console.progress"):
        summary = pretrain_local(cfg, np.zeros((8, 12, 2500), dtype=np.float32), tmp_path)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("epoch 1/1")]
    assert f"patch {summary['loss_patch']:.4f}" in line and "loss_rec" not in summary
    (row,) = leaderboard_rows([tmp_path])
    assert row["loss_patch"] == pytest.approx(summary["loss_patch"]) and "loss_rec" not in row


def test_a_reported_loss_must_be_named_loss_something():
    from coreecg.methods import PretrainMethod, register_method

    bad = type("Bad", (PretrainMethod,), {"reported_losses": ("mse",)})
    with pytest.raises(ConfigError, match=r"'bad_losses': reported_losses must be a tuple of 'loss_<label>'"):
        register_method("bad_losses")(bad)
    assert "bad_losses" not in METHODS
