"""The run-folder mirror (`train.mirror_uri`, coreecg/train/mirror.py) on a file:// URI, which
pyarrow opens with the same FileSystem API as s3:// or gs://."""
from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from coreecg.config import ConfigError, load_config
from coreecg.train.mirror import MirrorError, RunMirror, pull_if_missing, push_quietly


def _run(root: Path) -> Path:
    run = root / "runs" / "exp"
    (run / "checkpoint_step000000005").mkdir(parents=True)
    (run / "checkpoint_step000000005" / "checkpoint.pt").write_bytes(b"weights-5" * 1000)
    (run / "checkpoint_step000000005" / "checkpoint.pt.sha256").write_text("abc\n")
    (run / "config.yaml").write_text("seed: 0\n")
    (run / "metrics.jsonl").write_text('{"kind": "epoch", "epoch": 1}\n')
    (run / ".checkpoint_step000000010.tmp").mkdir()                     # a write in flight: not pushed
    return run


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_push_uploads_what_changed_prunes_checkpoints_and_pull_restores(tmp_path):
    run = _run(tmp_path)
    bucket = tmp_path / "bucket"
    mirror = RunMirror(run, bucket.as_uri())
    assert mirror.push() == 4
    assert _files(bucket / "exp") == {k: v for k, v in _files(run).items() if not k.startswith(".")}
    assert mirror.push() == 0                                            # nothing changed: nothing sent
    time.sleep(0.01)
    (run / "config.yaml").write_text("seed: 1\n")                        # rewritten, same size (a resume)
    assert mirror.push() == 1 and (bucket / "exp" / "config.yaml").read_text() == "seed: 1\n"
    with open(run / "metrics.jsonl", "a") as f:                          # the run goes on
        f.write('{"kind": "epoch", "epoch": 2}\n')
    (run / "checkpoint_step000000010").mkdir()
    (run / "checkpoint_step000000010" / "checkpoint.pt").write_bytes(b"weights-10" * 1000)
    (run / "checkpoint_step000000010" / "checkpoint.pt.sha256").write_text("def\n")
    for f in (run / "checkpoint_step000000005").iterdir():               # pruned (keep_checkpoints)
        f.unlink()
    (run / "checkpoint_step000000005").rmdir()
    assert mirror.push() == 3
    assert _files(bucket / "exp") == {k: v for k, v in _files(run).items() if not k.startswith(".")}
    assert not (bucket / "exp" / "checkpoint_step000000005").exists()

    fresh = tmp_path / "elsewhere" / "exp"                               # a new machine: no run folder
    assert pull_if_missing(fresh, bucket.as_uri()) == 4
    assert _files(fresh) == _files(bucket / "exp")
    assert pull_if_missing(fresh, bucket.as_uri()) == 0                  # has checkpoints: left as it is
    assert pull_if_missing(tmp_path / "new" / "exp", "") == 0            # no mirror configured


def test_an_unreachable_mirror_is_a_warning_that_never_fails_the_run(tmp_path, caplog):
    run = _run(tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the mirror's folder should be")
    mirror = RunMirror(run, blocker.as_uri())
    with pytest.raises(MirrorError, match="cannot upload"):
        mirror.push()
    with caplog.at_level(logging.WARNING, logger="coreecg.train.mirror"):
        push_quietly(mirror)
    assert "mirror not updated" in caplog.text and str(run) in caplog.text


def test_mirror_and_storage_settings_are_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match="train.mirror_uri=s3://bucket/runs"):
        load_config(overrides=["train.storage_path=s3://bucket/runs"])        # the error names the fix
    with pytest.raises(ConfigError, match="expected a URI"):
        load_config(overrides=["train.mirror_uri=/mnt/bucket"])
    assert load_config(overrides=["train.mirror_uri=s3://bucket/runs"]).train.mirror_uri == "s3://bucket/runs"
