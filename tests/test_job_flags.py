"""Jobs' command lines: one merge order (defaults < --config < --set < the job's flags), a key set
both by --set and by a flag is an error, and the docs a job names exist."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "jobs"))

from _cli import config_parser, flag_overrides  # noqa: E402


def test_a_flag_left_out_leaves_its_key_to_set_and_a_given_flag_comes_last():
    parser = config_parser("x")
    got = flag_overrides(parser, ["train.seed=3", "optim.lr=1e-3"],
                         {"train.seed": ("--seed", None), "finetune.train_fraction": ("--train-fraction", 0.5)})
    assert got == ["train.seed=3", "optim.lr=1e-3", "finetune.train_fraction=0.5"]


def test_a_key_set_both_ways_is_an_error_naming_both(capsys):
    parser = config_parser("x")
    with pytest.raises(SystemExit) as e:
        flag_overrides(parser, ["train.seed=3"], {"train.seed": ("--seed", 2)})
    assert e.value.code == 2 and "--seed" in capsys.readouterr().err


def test_finetune_job_refuses_a_conflict_before_any_work(tmp_path):
    done = subprocess.run([sys.executable, "jobs/finetune.py", "--encoder", "none", "--corpus", str(tmp_path),
                           "--output", str(tmp_path / "run"), "--seed", "1", "--set", "train.seed=4"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "train.seed is set twice" in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("job", sorted(p.name for p in (REPO / "jobs").glob("*.py")))
def test_job_docstrings_name_only_files_that_exist(job):
    text = (REPO / "jobs" / job).read_text()
    for path in re.findall(r"\b((?:configs|tune_spaces|studies)/[\w.-]+\.yaml)", text):
        assert (REPO / path).is_file(), f"jobs/{job} names {path}, which does not exist"
