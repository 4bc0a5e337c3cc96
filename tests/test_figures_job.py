"""jobs/figures.py reconstruction: the in-loop figure's code for any saved checkpoint."""
import subprocess
import sys
from pathlib import Path

from coreecg.data.reading import read_split
from coreecg.data.locate import synthetic_corpus
from coreecg.checkpoints import CHECKPOINT_FILE, checkpoint_dirs
from coreecg.train.pretraining import pretrain_local
from tests.helpers import tiny_config

REPO = Path(__file__).resolve().parents[1]


def test_reconstruction_figure_from_a_checkpoint(ray_session, tmp_path):
    cfg = tiny_config("data.synthetic_records=30", f"data.cache_dir={tmp_path}", "optim.batch_size=8",
                      "optim.epochs=1", "train.eval_every_epochs=0")
    corpus = synthetic_corpus(cfg)
    pretrain_local(cfg, read_split(corpus, "train", columns=["signal"])["signal"], tmp_path / "run")
    ckpt = checkpoint_dirs(tmp_path / "run")[-1] / CHECKPOINT_FILE
    job = [sys.executable, "jobs/figures.py", "reconstruction", "--corpus", str(corpus)]

    out = tmp_path / "recon.png"
    done = subprocess.run([*job, "--model", str(ckpt), "--output", str(out), "--split", "train"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000

    encoder_only = subprocess.run([*job, "--model", str(tmp_path / "run" / "encoder.pt"),
                                   "--output", str(tmp_path / "x.png")],
                                  cwd=REPO, capture_output=True, text=True, timeout=300)
    assert encoder_only.returncode == 2 and "no Time Decoder weights" in encoder_only.stderr
    assert not (tmp_path / "x.png").exists()


def test_a_model_source_without_the_time_decoder_is_refused_naming_why(tmp_path):
    """--model takes a run folder or a checkpoint; an export folder (encoder only) is refused."""
    import argparse

    import pytest

    from coreecg.checkpoints import CheckpointError
    from coreecg.jobs.figures import reconstruction

    (tmp_path / "export").mkdir()
    (tmp_path / "export" / "config.json").write_text("{}")
    args = argparse.Namespace(model=str(tmp_path / "export"), corpus=str(tmp_path), split="val", windows=2,
                              seed=None, output=str(tmp_path / "x.png"))
    with pytest.raises(CheckpointError, match="Time Decoder") as e:
        reconstruction(args)
    assert str(tmp_path / "export") in str(e.value) and not (tmp_path / "x.png").exists()
