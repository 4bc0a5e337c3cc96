"""Checkpoints rebuild the model and the encoder from their own config."""
import torch

import coreecg
from coreecg.methods import CoReECG
from coreecg.checkpoints import load_checkpoint, save_checkpoint
from tests.helpers import tiny_config


def test_checkpoint_round_trip_and_load_encoder(tmp_path):
    cfg = tiny_config("masking.p_time=0.4")
    model = CoReECG(cfg).eval()
    path = save_checkpoint(tmp_path / "ckpt.pt", model, cfg, epoch=3)
    payload, back_cfg = load_checkpoint(path)
    assert back_cfg == cfg and payload["epoch"] == 3
    clone = CoReECG(back_cfg)
    clone.load_state_dict(payload["model"])
    for (k, a), (_, b) in zip(model.state_dict().items(), clone.state_dict().items()):
        assert torch.equal(a, b), k
    enc = coreecg.load_encoder(path)
    assert not enc.training
    x = torch.randn(2, 12, 2250)
    assert torch.allclose(enc.pooled(x), model.encoder.pooled(x))
    assert torch.allclose(enc.pooled(x[:, :1]), model.encoder.pooled(x[:, :1]))


def test_load_rejects_non_checkpoint(tmp_path):
    torch.save({"weights": torch.zeros(1)}, tmp_path / "x.pt")
    try:
        load_checkpoint(tmp_path / "x.pt")
    except ValueError as e:
        assert "x.pt" in str(e)
    else:
        raise AssertionError("a file without config/model must be rejected")
