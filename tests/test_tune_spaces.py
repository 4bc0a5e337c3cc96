"""Every shipped search space and ablation names real config keys with valid values, and a bad
space is refused with the file and the key named."""
from pathlib import Path

import pytest
import torch
import yaml

from coreecg.config import load_config
from coreecg.methods import CoReECG, build_method
from coreecg.tune.spaces import SCRATCH, SpaceError, load_space, overrides_for
from tests.helpers import TINY

SPACES = Path(__file__).resolve().parents[1] / "tune_spaces"


def test_shipped_spaces_are_valid():
    grid = load_space(SPACES / "mask_rates.yaml")
    assert grid.grid == {"methods.core.masking.p_time": [0.3, 0.4, 0.5, 0.6, 0.8],
                         "methods.core.masking.p_lead": [0.0, 0.1, 0.2, 0.3, 0.4]}
    core = load_space(SPACES / "core.yaml")
    assert set(core.params) == {"methods.core.masking.p_time", "methods.core.masking.p_lead", "methods.core.masking.k",
                                "methods.core.loss.tau", "methods.core.loss.alpha", "methods.core.loss.beta"}
    abl = load_space(SPACES / "ablations.yaml")
    assert abl.variants["Supervised"] == SCRATCH and abl.variants["CoRe-ECG"] == []
    assert set(abl.tables) == {"comparison", "paradigm", "masking", "stdm_fda"}
    assert abl.tables["comparison"] == ["Supervised", "MoCo V3", "CMSC", "MTAE-like", "MLAE-like", "ST-MEM-like",
                                        "BMIRC", "CoRe-ECG"]                       # the paper's Table 1 rows
    assert set(abl.unavailable) == {"BMIRC"} and "bimodal encoder" in abl.unavailable["BMIRC"]
    moco = load_space(SPACES / "moco_v3.yaml", base=["pretrain.method=moco_v3"])
    assert "methods.moco_v3.temperature" in moco.params and "methods.moco_v3.views.crop_min" in moco.params
    assert "methods.cmsc.temperature" in load_space(SPACES / "cmsc.yaml", base=["pretrain.method=cmsc"]).params


@pytest.mark.parametrize("text, match", [
    ("grid: {masking.p_tyme: [0.3]}", "masking.p_tyme"),
    ("grid: {methods.core.masking.p_time: [0.3, 1.5]}", r"grid: methods.core.masking: p_time=1.5 must lie in \[0, 1\]"),
    ("params: {methods.core.loss.tau: {type: loguniform, low: 0.0, high: 0.5}}",
     "methods.core.loss.tau: loguniform needs low > 0"),
    ("params: {methods.core.masking.k: {type: int, low: 2, high: 12}}", r"methods.core.masking.k=12"),
    ("params: {methods.core.masking.k: {type: normal, low: 2, high: 3}}",
     r"params\.methods\.core\.masking\.k\.type: 'normal' is not one of"),
    ("variants: {bad: [methods.core.loss.alpha=0, methods.core.loss.beta=0]}", r"variants\.bad: .*not both 0"),
    ("variants: {a: []}\ntables: {t: [a, b]}", r"unknown variants \['b'\]"),
    ("sweep: {}", "top-level keys"),
])
def test_bad_spaces_name_file_and_key(tmp_path, text, match):
    path = tmp_path / "space.yaml"
    path.write_text(text)
    with pytest.raises(SpaceError, match=match) as e:
        load_space(path)
    assert str(path) in str(e.value)


def test_overrides_print_values_as_written():
    assert overrides_for({"methods.core.masking.p_time": 0.1 + 0.2, "methods.core.masking.k": 4,
                          "methods.core.fda.enabled": False}) == \
        ["methods.core.masking.p_time=0.3", "methods.core.masking.k=4", "methods.core.fda.enabled=false"]


@pytest.mark.parametrize("name", [n for n, v in
                                  yaml.safe_load((SPACES / "ablations.yaml").read_text())["variants"].items()
                                  if isinstance(v, list)])
def test_ablation_variants_build_the_intended_model(name):
    overrides = load_space(SPACES / "ablations.yaml").variants[name]
    cfg = load_config(overrides=[*TINY, *overrides, "methods.moco_v3.hidden_dim=64"])
    model = build_method(cfg)
    out = model(torch.randn(4, 12, 2250), patient=torch.arange(4))
    assert torch.isfinite(out["loss"])
    if cfg.pretrain.method != "core":               # a baseline: its own class, no CoRe-ECG branch
        assert not isinstance(model, CoReECG) and "loss_rec" not in out and "loss_con" in out
        return
    loss = cfg.methods.core.loss
    assert (model.time_decoder is None) == (loss.alpha == 0) and ("loss_rec" in out) == (loss.alpha > 0)
    assert (model.teacher_encoder is None) == (loss.beta == 0) and ("loss_con" in out) == (loss.beta > 0)
    assert (model.fda is None) == (cfg.methods.core.loss.beta == 0 or not cfg.methods.core.fda.enabled)
