"""Every shipped search space and ablation names real config keys with valid values."""
from pathlib import Path

import pytest
import yaml

from coreecg.config import load_config
from coreecg.model import CoReECG
from tests.helpers import TINY

SPACES = Path(__file__).resolve().parents[1] / "tune_spaces"


def test_search_space_keys_and_bounds_are_valid():
    space = yaml.safe_load((SPACES / "mask_rates.yaml").read_text())
    assert {"masking.p_time", "masking.p_lead", "masking.k", "loss.tau"} <= set(space)
    for key, dist in space.items():
        assert dist["type"] in {"uniform", "loguniform", "int", "choice"}
        values = dist["values"] if dist["type"] == "choice" else [dist["low"], dist["high"]]
        for v in values:                     # both ends of every range make a valid config
            load_config(overrides=[f"{key}={v}"])


@pytest.mark.parametrize("name", list(yaml.safe_load((SPACES / "ablations.yaml").read_text())))
def test_ablation_configs_build_and_run(name):
    import torch

    overrides = yaml.safe_load((SPACES / "ablations.yaml").read_text())[name]
    cfg = load_config(overrides=[*TINY, *overrides])
    out = CoReECG(cfg)(torch.randn(2, 12, 2250))
    assert torch.isfinite(out["loss"])
