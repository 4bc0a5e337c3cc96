"""The shared pretraining loop without Ray (the reference): exact resume, checkpoint rules."""
import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from coreecg.checkpoints import CheckpointError, checkpoint_dirs, latest_checkpoint, load_checkpoint
from coreecg.train import loop
from coreecg.train.pretraining import pretrain_local
from tests.helpers import crash_on_save, tiny_config

REPO_JOB = "jobs/pretrain.py"


def _latest(run_dir):
    return load_checkpoint(latest_checkpoint(run_dir))[0]


def test_pretrain_job_rejects_unknown_key():
    done = subprocess.run([sys.executable, REPO_JOB, "--set", "optim.learning_rate=1"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "optim.learning_rate" in done.stderr


def test_resume_after_crash_matches_uninterrupted_run(tmp_path, monkeypatch):
    cfg = tiny_config("optim.batch_size=8", "optim.epochs=3", "optim.warmup_epochs=1",
                      "train.checkpoint_every_steps=3", "train.eval_every_epochs=0")
    windows = np.random.default_rng(0).standard_normal((16, 12, 2500)).astype(np.float32)
    pretrain_local(cfg, windows, tmp_path / "a")

    real_save = loop.save_step
    crash_on_save(monkeypatch, 2)      # epoch 0's end (step 2), then mid-epoch 1 (step 3)
    with pytest.raises(KeyboardInterrupt):
        pretrain_local(cfg, windows, tmp_path / "b")
    assert _latest(tmp_path / "b")["trainer"]["step"] == 3
    monkeypatch.setattr(loop, "save_step", real_save)
    pretrain_local(cfg, windows, tmp_path / "b")

    a, b = _latest(tmp_path / "a"), _latest(tmp_path / "b")
    assert a["trainer"]["step"] == b["trainer"]["step"] == 6 and a["epoch"] == b["epoch"] == 2
    for key, value in a["model"].items():   # bit-identical: per-step seeds, per-(epoch, uid) crops
        assert torch.equal(value, b["model"][key]), key
    lines = [json.loads(x) for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x.get("event") == "resume"] == [3]
    assert [x["epoch"] for x in lines if x.get("kind") == "epoch"] == [1, 2, 3]     # epochs count from 1
    assert len(checkpoint_dirs(tmp_path / "b")) == cfg.train.keep_checkpoints


def test_mid_epoch_resume_skips_the_done_batches(tmp_path, monkeypatch):
    cfg = tiny_config("optim.batch_size=4", "optim.epochs=1", "train.checkpoint_every_steps=2",
                      "train.eval_every_epochs=0")
    windows = np.random.default_rng(1).standard_normal((16, 12, 2500)).astype(np.float32)
    pretrain_local(cfg, windows, tmp_path / "a")
    real_save = loop.save_step

    def crash(*a, **k):
        real_save(*a, **k)
        raise KeyboardInterrupt("after the step-2 checkpoint")

    monkeypatch.setattr(loop, "save_step", crash)
    with pytest.raises(KeyboardInterrupt):
        pretrain_local(cfg, windows, tmp_path / "b")
    assert _latest(tmp_path / "b")["batches_done"] == 2
    monkeypatch.setattr(loop, "save_step", real_save)
    pretrain_local(cfg, windows, tmp_path / "b")
    a, b = _latest(tmp_path / "a"), _latest(tmp_path / "b")
    assert a["trainer"]["step"] == b["trainer"]["step"] == 4
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key


def test_resume_refuses_a_different_model(tmp_path):
    windows = np.zeros((8, 12, 2500), dtype=np.float32)
    pretrain_local(tiny_config("optim.batch_size=8", "optim.epochs=1", "train.eval_every_epochs=0"),
                        windows, tmp_path)
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt.*encoders\.coreecg\.depth: 2 -> 3"):
        pretrain_local(tiny_config("optim.batch_size=8", "optim.epochs=2", "encoders.coreecg.depth=3"), windows,
                       tmp_path)
    # a longer schedule on the same model is a legitimate resume
    summary = pretrain_local(tiny_config("optim.batch_size=8", "optim.epochs=2", "train.eval_every_epochs=0"),
                                  windows, tmp_path)
    assert summary["epoch"] == 2 and summary["step"] == 2


def _epoch_lines(run_dir):
    return [x for x in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if x.get("kind") == "epoch"]


def test_a_worker_lost_before_an_epochs_checkpoint_leaves_no_line_of_that_epoch(tmp_path, monkeypatch):
    """Lost between the epoch's last step and its checkpoint: the resumed run trains that epoch
    again, and metrics.jsonl still has one line per epoch (a line written before the checkpoint
    was seen twice in the multi-node test)."""
    cfg = tiny_config("optim.batch_size=8", "optim.epochs=2", "optim.warmup_epochs=1",
                      "train.checkpoint_every_steps=0", "train.eval_every_epochs=0")
    windows = np.random.default_rng(2).standard_normal((16, 12, 2500)).astype(np.float32)

    def lost(*a, **k):
        raise KeyboardInterrupt("lost before the epoch's checkpoint")

    real_save = loop.save_step
    monkeypatch.setattr(loop, "save_step", lost)
    with pytest.raises(KeyboardInterrupt):
        pretrain_local(cfg, windows, tmp_path)
    assert _epoch_lines(tmp_path) == [] and latest_checkpoint(tmp_path) is None
    monkeypatch.setattr(loop, "save_step", real_save)
    pretrain_local(cfg, windows, tmp_path)
    assert [x["epoch"] for x in _epoch_lines(tmp_path)] == [1, 2]


def test_a_worker_lost_after_an_epochs_checkpoint_gets_its_line_back_on_resume(tmp_path, monkeypatch):
    """Lost between the epoch's checkpoint and its line: the resumed run starts the next epoch and
    writes the missing line from the checkpoint, marked as restored, with the same figures."""
    cfg = tiny_config("optim.batch_size=8", "optim.epochs=2", "optim.warmup_epochs=1",
                      "train.checkpoint_every_steps=0", "train.eval_every_epochs=0")
    windows = np.random.default_rng(3).standard_normal((16, 12, 2500)).astype(np.float32)
    pretrain_local(cfg, windows, tmp_path / "a")
    crash_on_save(monkeypatch, 1)                 # epoch 1's checkpoint is written, then the worker is lost
    with pytest.raises(KeyboardInterrupt):
        pretrain_local(cfg, windows, tmp_path / "b")
    assert _epoch_lines(tmp_path / "b") == [] and _latest(tmp_path / "b")["epoch_record"]["epoch"] == 1
    monkeypatch.undo()
    pretrain_local(cfg, windows, tmp_path / "b")
    a, b = _epoch_lines(tmp_path / "a"), _epoch_lines(tmp_path / "b")
    assert [x["epoch"] for x in b] == [1, 2] and "restored_from" in b[0] and "restored_from" not in b[1]
    assert b[0]["loss"] == a[0]["loss"] and b[1]["loss"] == a[1]["loss"] and b[0]["step"] == a[0]["step"]


def test_a_resume_compares_the_encoders_own_sizes_and_the_grid_it_reads():
    """Structural for every encoder: its own section encoders.<arch> (an S4's width, not the ViT's),
    and for an encoder without a patch, the ViT patch its grid shares (CMSC's segments)."""
    from coreecg.train.resume_check import structural_differences

    s4 = tiny_config("model.arch=s4")
    assert structural_differences(s4, tiny_config("model.arch=s4", "encoders.s4.d_model=64")) == ["encoders.s4.d_model"]
    assert structural_differences(s4, tiny_config("model.arch=s4", "encoders.coreecg.depth=5")) == []
    assert structural_differences(s4, tiny_config("model.arch=s4", "encoders.coreecg.patch_size=50")) == \
        ["encoders.coreecg.patch_size"]
    assert structural_differences(tiny_config(), tiny_config("encoders.coreecg.depth=3")) == ["encoders.coreecg.depth"]
