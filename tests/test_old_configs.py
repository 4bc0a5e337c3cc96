"""What was written before CoRe-ECG's options moved under `methods.core` (issue 42) still loads:
every config, tune space and study shipped at 7162f21 (copies in tests/data/configs-7162f21) reads
as the same configs as today's files, and a run folder written by 7162f21's code
(tests/data/run-7162f21: config.yaml, encoder.pt, a step checkpoint) opens, builds, resumes and
compares. A moved key is read at its new place, or refused naming where its section went; never
ignored."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from coreecg.config import ConfigError, config_from_dict, load_config
from coreecg.eval.fairness import flatten

REPO = Path(__file__).resolve().parents[1]
OLD = REPO / "tests" / "data" / "configs-7162f21"
OLD_RUN = REPO / "tests" / "data" / "run-7162f21"
# Values today's shipped files changed on purpose since 7162f21 (not a loading difference):
# train.compile is auto by default (issue 41), and the short-run configs keep it false.
CHANGED_SINCE = ("train.compile",)


def _as_today(old: dict, new: dict) -> dict:
    """`old` (a flattened config) with the values changed on purpose since taken from `new`."""
    return {**old, **{k: new[k] for k in CHANGED_SINCE if k in new}}


@pytest.mark.parametrize("name", ["quickstart", "sweep", "paper"])
def test_every_shipped_config_of_7162f21_loads_as_todays(name):
    old, new = load_config(OLD / "configs" / f"{name}.yaml"), load_config(REPO / "configs" / f"{name}.yaml")
    a, b = flatten(old.to_dict()), flatten(new.to_dict())
    assert _as_today(a, b) == b
    assert {k for k in a if a[k] != b[k]} <= set(CHANGED_SINCE)
    text = (OLD / "configs" / f"{name}.yaml").read_text()
    assert name == "paper" or "time_decoder_dim" in text          # the old spelling is what was read


def test_the_quickstart_configs_moved_values_land_at_their_new_places():
    c = load_config(OLD / "configs" / "quickstart.yaml")
    o = c.methods.core
    assert (o.loss.alpha, o.time_decoder.dim, o.time_decoder.depth, o.projection.hidden_dim) == (2.3, 64, 3, 256)
    assert "masking" not in c.to_dict() and "loss" not in c.to_dict() and "time_decoder_dim" not in c.to_dict()["model"]


@pytest.mark.parametrize("name, base", [("ablations", ()), ("core", ()), ("mask_rates", ()), ("mask_rates_tiny", ()),
                                        ("quickstart", ()), ("moco_v3", ("pretrain.method=moco_v3",)),
                                        ("cmsc", ("pretrain.method=cmsc",))])
def test_every_tune_space_of_7162f21_loads_as_todays(name, base):
    from coreecg.tune.spaces import load_space

    old = load_space(OLD / "tune_spaces" / f"{name}.yaml", base=list(base))
    new = load_space(REPO / "tune_spaces" / f"{name}.yaml", base=list(base))
    assert (old.grid, old.params, old.variants, old.tables, old.unavailable) == \
        (new.grid, new.params, new.variants, new.tables, new.unavailable)
    assert [(a.variants, a.keys) for a in old.allow] == [(a.variants, a.keys) for a in new.allow]
    assert not [k for k in [*old.grid, *old.params] if k.startswith(("masking.", "loss.", "augment."))]


def _old_tree(tmp_path: Path) -> Path:
    """The 7162f21 studies, configs and tune spaces laid out as in a checkout beside ../shared
    (their paths are relative to the study file)."""
    root = tmp_path / "repo"
    for part in ("studies", "configs", "tune_spaces"):
        shutil.copytree(OLD / part, root / part)
    (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    return root


@pytest.mark.parametrize("name", ["tiny", "paper", "label_efficiency_tiny", "benchmark_tiny", "label_efficiency",
                                  "benchmark"])
def test_every_study_of_7162f21_plans_todays_runs(tmp_path, monkeypatch, name):
    """Every shipped study; the full-scale ones read their data and encoders from environment
    variables, pointed here at the shared records, the 7162f21 run's encoder and ST-MEM's fixture."""
    from coreecg.study.reader import load_study

    shared = REPO.parent / "shared"
    if not (shared / "ecg-data").is_dir():
        pytest.skip("needs ../shared/ecg-data")
    data = shared / "ecg-data"
    for var, path in {"MIMIC_IV_ECG": data / "mimic-iv-ecg-layout", "CODE15": data / "cinc2021",
                      "CINC2021": data / "cinc2021", "PTBXL": data / "ptbxl", "CPSC2018": data / "cpsc2018-cinc2020",
                      "COREECG_ENCODER": OLD_RUN / "encoder.pt",
                      "STMEM_WEIGHTS": shared / "fixtures" / "st-mem" / "encoder.pth"}.items():
        monkeypatch.setenv(var, str(path))
    root = _old_tree(tmp_path)
    old, new = load_study(root / "studies" / f"{name}.yaml"), load_study(REPO / "studies" / f"{name}.yaml")
    assert [r.name for r in old.pretrain_runs()] == [r.name for r in new.pretrain_runs()]
    before, today = [r.name for r in old.finetune_runs()], [r.name for r in new.finetune_runs()]
    if name == "label_efficiency":
        # since 2026-12-03 the study also runs its PTB-XL age corpus (issue 64): the old runs are
        # planned as before, in the same order, and the added ones are all of that corpus
        assert [r for r in today if r in set(before)] == before
        assert set(today) - set(before) and all("-ptbxl-age-" in r for r in set(today) - set(before))
    else:
        assert before == today
    for a, b in zip(old.pretrain_runs(), new.pretrain_runs()):
        ca = flatten(load_config(old.config_file, old.pretrain_overrides(a)).to_dict())
        cb = flatten(load_config(new.config_file, new.pretrain_overrides(b)).to_dict())
        here = {k: v.replace(str(root), str(REPO)) if isinstance(v, str) else v for k, v in ca.items()}
        assert _as_today(here, cb) == cb, a.name


def test_a_run_folder_of_7162f21_opens_builds_and_resumes():
    from coreecg.loading import load_encoder, load_method, open_method
    from coreecg.methods import build_method
    from coreecg.train.resume_check import check_compatible, structural_differences

    saved = yaml.safe_load((OLD_RUN / "config.yaml").read_text())
    assert saved["masking"]["p_time"] == 0.4 and saved["loss"]["alpha"] == 1.5 and "core" not in saved["methods"]
    config = config_from_dict(saved)
    o = config.methods.core
    assert (o.masking.p_time, o.loss.alpha, o.fda.init, o.ema.momentum) == (0.4, 1.5, "random", 0.99)
    assert (o.time_decoder.dim, o.latent_decoder.depth, o.projection.dim) == (32, 1, 32)

    encoder = load_encoder(OLD_RUN)
    assert sum(p.numel() for p in encoder.parameters()) > 0
    method = load_method(OLD_RUN, build_method)
    assert method.model.options.masking.p_time == 0.4 and method.model.time_decoder is not None
    state = torch.load(OLD_RUN / "checkpoint_step000000001" / "checkpoint.pt", map_location="cpu",
                       weights_only=False)["model"]
    assert torch.equal(method.model.state_dict()["time_decoder.head.weight"], state["time_decoder.head.weight"])

    # the same run under today's spelling: nothing structural differs, a resume is allowed
    today = load_config(overrides=[f"{k}={v}" for k, v in [
        ("model.embed_dim", 32), ("model.depth", 2), ("model.num_heads", 2), ("methods.core.masking.p_time", 0.4),
        ("methods.core.loss.alpha", 1.5), ("methods.core.fda.init", "random"), ("methods.core.ema.momentum", 0.99),
        ("methods.core.time_decoder.dim", 32), ("methods.core.time_decoder.depth", 2),
        ("methods.core.time_decoder.heads", 2), ("methods.core.latent_decoder.dim", 32),
        ("methods.core.latent_decoder.depth", 1), ("methods.core.latent_decoder.heads", 2),
        ("methods.core.projection.hidden_dim", 64), ("methods.core.projection.dim", 32)]])
    assert structural_differences(config, today) == []
    check_compatible(OLD_RUN, config, today)
    wider = load_config(overrides=[*(f"{k}={v}" for k, v in flatten(today.to_dict()).items() if k.startswith("model.")),
                                   "methods.core.time_decoder.dim=64", "methods.core.time_decoder.heads=2"])
    assert "methods.core.time_decoder" in structural_differences(config, wider)
    assert open_method(OLD_RUN).config == config


def test_a_moved_key_is_mapped_or_refused_naming_its_new_place(tmp_path):
    c = load_config(overrides=["masking.p_time=0.6", "augment.fda=false", "loss.gather_negatives=false",
                               "model.latent_decoder_layout=lead", "optim.ema_momentum_end=0.999"])
    o = c.methods.core
    assert (o.masking.p_time, o.fda.enabled, c.optim.gather_negatives) == (0.6, False, False)
    assert (o.latent_decoder.layout, o.ema.momentum_end) == ("lead", 0.999)
    with pytest.raises(ConfigError, match=r"masking\.p_tyme: the masking section moved \(its keys are now "
                                          r"methods\.core\.masking\.\*\)"):
        load_config(overrides=["masking.p_tyme=0.6"])
    f = tmp_path / "old.yaml"
    f.write_text("loss:\n  alpha: 2.0\n  temprature: 0.1\n")
    with pytest.raises(ConfigError, match=rf"{f}: loss\.temprature: the loss section moved .*methods\.core\.loss\.\*"):
        load_config(f)
    f.write_text("masking: {p_time: 0.6}\nmethods:\n  core:\n    masking: {p_time: 0.7}\n")
    with pytest.raises(ConfigError, match=r"masking\.p_time \(moved to methods\.core\.masking\.p_time\) and "
                                          r"methods\.core\.masking\.p_time are both given"):
        load_config(f)


RUN_94BC297 = REPO / "tests" / "data" / "run-94bc297"


def test_a_run_folder_of_94bc297_opens_builds_and_resumes_after_the_encoder_registry():
    """A run folder written by 94bc297's code (before encoders were registered, with `pretrain.plugins`
    and no `encoders` section): its config reads as today's (the plugins key moved to `plugins`), its
    encoder loads as the registered ViT, its method rebuilds from the checkpoint, and today's config
    of the same run may resume it."""
    from coreecg.loading import load_encoder, load_method, open_method
    from coreecg.methods import build_method
    from coreecg.model.encoder import Encoder
    from coreecg.train.resume_check import check_compatible, structural_differences

    saved = yaml.safe_load((RUN_94BC297 / "config.yaml").read_text())
    assert saved["pretrain"]["plugins"] == [] and "encoders" not in saved and saved["model"]["arch"] == "coreecg"
    config = config_from_dict(saved)
    assert config.plugins == () and not hasattr(config.pretrain, "plugins")
    assert config.model.arch == "coreecg" and config.methods.core.masking.p_time == 0.4
    encoder = load_encoder(RUN_94BC297)
    assert type(encoder) is Encoder and encoder.pooled(torch.zeros(1, 12, 2250)).shape == (1, 32)
    method = load_method(RUN_94BC297, build_method)
    state = torch.load(RUN_94BC297 / "checkpoint_step000000001" / "checkpoint.pt", map_location="cpu",
                       weights_only=False)["model"]
    assert torch.equal(method.model.state_dict()["time_decoder.head.weight"], state["time_decoder.head.weight"])
    today = load_config(overrides=["model.embed_dim=32", "model.depth=2", "model.num_heads=2",
                                   "methods.core.time_decoder.dim=32", "methods.core.time_decoder.depth=2",
                                   "methods.core.time_decoder.heads=2", "methods.core.latent_decoder.dim=32",
                                   "methods.core.latent_decoder.depth=1", "methods.core.latent_decoder.heads=2",
                                   "methods.core.projection.hidden_dim=64", "methods.core.projection.dim=32",
                                   "methods.core.masking.p_time=0.4"])
    assert structural_differences(config, today) == []
    check_compatible(RUN_94BC297, config, today)
    assert open_method(RUN_94BC297).config == config
