"""Checkpoints rebuild the model and the encoder from their own config; the store (coreecg.checkpoints)
lists, prunes and verifies step folders, and its writes (coreecg.files) are whole or absent."""
import pytest
import torch

import coreecg
from coreecg.checkpoints import load_checkpoint, save_checkpoint
from coreecg.methods import CoReECG
from tests.helpers import tiny_config


def test_checkpoint_round_trip_and_load_encoder(tmp_path):
    cfg = tiny_config("methods.core.masking.p_time=0.4")
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


# ---------------------------------------------------------------------------- the store and its files


def test_step_folders_list_oldest_first_prune_to_the_newest_and_load_the_latest(tmp_path):
    from coreecg.checkpoints import (CHECKPOINT_FILE, checkpoint_dirs, latest_checkpoint, load_latest,
                                     prune_checkpoints, save_step, step_of)

    cfg = tiny_config()
    assert latest_checkpoint(tmp_path) is None and load_latest(tmp_path) is None
    for step in (120, 7, 45):                      # written out of order: listed by step
        path = save_step(tmp_path, step, {"w": torch.full((2,), float(step))}, cfg, epoch=step)
        assert path == tmp_path / f"checkpoint_step{step:09d}" / CHECKPOINT_FILE
        assert path.with_name(CHECKPOINT_FILE + ".sha256").is_file()
    (tmp_path / "checkpoint_step000000200").mkdir()  # a folder without its file: not a checkpoint
    assert [step_of(d) for d in checkpoint_dirs(tmp_path)] == [7, 45, 120]
    payload, config, path = load_latest(tmp_path)
    assert payload["epoch"] == 120 and config == cfg and path == latest_checkpoint(tmp_path)
    assert [step_of(d) for d in prune_checkpoints(tmp_path, keep=2)] == [7]
    assert [step_of(d) for d in checkpoint_dirs(tmp_path)] == [45, 120]
    assert not (tmp_path / "checkpoint_step000000007").exists()


def test_a_step_folder_can_be_written_anywhere_and_moved_whole(tmp_path):
    """The Ray Train path writes into a temporary folder and hands the step folder to Ray."""
    from coreecg.checkpoints import checkpoint_dirs, load_checkpoint, save_step

    path = save_step(tmp_path / "scratch", 3, {"w": torch.ones(1)}, tiny_config(), epoch=0)
    run = tmp_path / "run"
    run.mkdir()
    path.parent.rename(run / path.parent.name)
    moved = checkpoint_dirs(run)
    assert [d.name for d in moved] == ["checkpoint_step000000003"]
    assert sorted(p.name for p in moved[0].iterdir()) == ["checkpoint.pt", "checkpoint.pt.sha256"]  # no temp files
    assert torch.equal(load_checkpoint(moved[0] / "checkpoint.pt")[0]["model"]["w"], torch.ones(1))


def test_a_flipped_byte_or_a_truncated_file_is_an_error_naming_it(tmp_path):
    from coreecg.checkpoints import CheckpointError, load_checkpoint, save_checkpoint

    path = save_checkpoint(tmp_path / "c.pt", {"w": torch.arange(100.0)}, tiny_config())
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"c\.pt: corrupted checkpoint \(sha256 differs from c\.pt\.sha256\)"):
        load_checkpoint(path)
    path.write_bytes(bytes(data[:200]))
    path.with_name("c.pt.sha256").unlink()           # no sidecar: the unpickling itself must fail, named
    with pytest.raises(CheckpointError, match=r"c\.pt: unreadable checkpoint"):
        load_checkpoint(path)


def test_an_atomic_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    import hashlib

    from coreecg.files import sha256_file, write_atomic, write_json

    target = write_json(tmp_path / "deep" / "m.json", {"a": 1})
    assert target.read_text() == '{\n "a": 1\n}\n'
    assert sha256_file(target) == hashlib.sha256(target.read_bytes()).hexdigest()

    def half_then_fail(tmp):
        tmp.write_text('{"a": ')
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, half_then_fail)
    assert target.read_text() == '{\n "a": 1\n}\n'
    assert sorted(p.name for p in target.parent.iterdir()) == ["m.json"]
