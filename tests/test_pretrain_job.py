"""The pretraining job end to end at tiny scale: outputs, checkpoint, exact resume after a crash."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import coreecg
from coreecg.train import loop
from coreecg.train.checkpoint import load_checkpoint
from tests.helpers import TINY, tiny_config

REPO_JOB = "jobs/pretrain.py"


def test_pretrain_job_cli(tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, REPO_JOB, *sum((["--set", s] for s in TINY), []),
            "--set", "data.synthetic_records=16", "--set", "optim.batch_size=8", "--set", "optim.epochs=2",
            "--set", "optim.warmup_epochs=1", "--set", f"train.output_dir={out}"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["epoch"] for line in lines] == [0, 1]
    assert json.loads(lines[-1])["step"] == 4
    payload, cfg = load_checkpoint(out / "checkpoint.pt")
    assert cfg.optim.epochs == 2 and cfg.model.embed_dim == 32 and payload["epoch"] == 1
    assert (out / "config.yaml").read_text() == cfg.to_yaml()
    assert any((out / "tensorboard").iterdir())
    enc = coreecg.load_encoder(out / "checkpoint.pt")
    assert enc.pooled(torch.randn(2, 12, 2250)).shape == (2, 32)


def test_pretrain_job_rejects_unknown_key():
    done = subprocess.run([sys.executable, REPO_JOB, "--set", "optim.learning_rate=1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "optim.learning_rate" in done.stderr


def test_resume_after_crash_matches_uninterrupted_run(tmp_path, monkeypatch):
    cfg = tiny_config("optim.batch_size=8", "optim.epochs=3", "optim.warmup_epochs=1")
    windows = np.random.default_rng(0).standard_normal((16, 12, 2500)).astype(np.float32)
    loop.pretrain_local(cfg, windows, tmp_path / "a")

    real_save = loop.save_checkpoint
    calls = {"n": 0}

    def crash_after_first(*a, **k):
        real_save(*a, **k)
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyboardInterrupt("simulated crash after epoch 0")

    monkeypatch.setattr(loop, "save_checkpoint", crash_after_first)
    with pytest.raises(KeyboardInterrupt):
        loop.pretrain_local(cfg, windows, tmp_path / "b")
    assert load_checkpoint(tmp_path / "b" / "checkpoint.pt")[0]["epoch"] == 0
    loop.pretrain_local(cfg, windows, tmp_path / "b")

    a = load_checkpoint(tmp_path / "a" / "checkpoint.pt")[0]
    b = load_checkpoint(tmp_path / "b" / "checkpoint.pt")[0]
    assert a["epoch"] == b["epoch"] == 2
    for key, value in a["model"].items():
        assert torch.allclose(value, b["model"][key], atol=1e-6), key
    assert len((tmp_path / "b" / "metrics.jsonl").read_text().splitlines()) == 3


def test_resume_refuses_a_different_config(tmp_path):
    windows = np.zeros((8, 12, 2500), dtype=np.float32)
    loop.pretrain_local(tiny_config("optim.batch_size=8", "optim.epochs=1"), windows, tmp_path)
    with pytest.raises(ValueError, match="different config"):
        loop.pretrain_local(tiny_config("optim.batch_size=8", "optim.epochs=2"), windows, tmp_path)
