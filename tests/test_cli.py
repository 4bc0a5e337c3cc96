"""Jobs' command lines: one merge order (defaults < --config < --set < the job's flags), a key set
both by --set and by a flag is an error, --help shows the whole docstring and the real defaults,
one flag vocabulary, --print-config, the installed commands, and the docs a job names exist."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import yaml

from coreecg.cli import flag_overrides, job_parser

REPO = Path(__file__).resolve().parents[1]
JOBS = sorted(p.stem for p in (REPO / "jobs").glob("*.py") if not p.name.startswith("_"))


def test_a_flag_left_out_leaves_its_key_to_set_and_a_given_flag_comes_last():
    parser = job_parser("x")
    got = flag_overrides(parser, ["train.seed=3", "optim.lr=1e-3"],
                         {"train.seed": ("--seed", None), "finetune.train_fraction": ("--train-fraction", 0.5)})
    assert got == ["train.seed=3", "optim.lr=1e-3", "finetune.train_fraction=0.5"]


def test_a_key_set_both_ways_is_an_error_naming_both(capsys):
    parser = job_parser("x")
    with pytest.raises(SystemExit) as e:
        flag_overrides(parser, ["train.seed=3"], {"train.seed": ("--seed", 2)})
    assert e.value.code == 2 and "--seed" in capsys.readouterr().err


def test_fit_job_reports_bad_input_once_and_lets_training_failures_through(monkeypatch, capsys):
    """pretrain and finetune share one fit error handling (coreecg.cli.fit_job): input at fault,
    raised in planning or as the cause of a worker's failure, is one "error:" line (None: exit 2);
    anything else propagates."""
    import coreecg.train.fit as fit_module
    from coreecg.cli import fit_job
    from coreecg.data.corpus import CorpusError
    from coreecg.train.finetuning import FinetuneError

    def failing(error):
        def fit(plan):
            raise error
        return fit

    def in_worker(cause):                 # what Ray's TrainingFailedError carries
        error = RuntimeError("Training failed (traceback ...)")
        error.__cause__ = cause
        return error

    monkeypatch.setattr(fit_module, "plan_run", lambda config, kind: (config, kind))
    monkeypatch.setattr(fit_module, "fit", lambda plan: ("done", plan))
    assert fit_job("cfg", "pretrain") == ("done", ("cfg", "pretrain"))
    monkeypatch.setattr(fit_module, "fit", failing(CorpusError("corpora/x: manifest.json missing")))
    assert fit_job("cfg", "pretrain") is None
    assert capsys.readouterr().err == "error: corpora/x: manifest.json missing\n"
    monkeypatch.setattr(fit_module, "fit", failing(in_worker(FinetuneError("corpora/x: no labels"))))
    assert fit_job("cfg", "finetune", input_errors=(FinetuneError,)) is None
    assert capsys.readouterr().err == "error: corpora/x: no labels\n"
    with pytest.raises(RuntimeError, match="Training failed"):      # pretraining names no FinetuneError
        fit_job("cfg", "pretrain")
    monkeypatch.setattr(fit_module, "fit", failing(in_worker(ValueError("nan loss"))))
    with pytest.raises(RuntimeError, match="Training failed"):      # a worker's ValueError is a failure
        fit_job("cfg", "finetune", input_errors=(FinetuneError,))

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


def _job(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)


def _help(job: str, *args: str) -> subprocess.CompletedProcess:
    """`jobs/<job>.py [args] --help`, in this process (each job parses before it imports anything heavy)."""
    import contextlib
    import importlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e:
        importlib.import_module(f"coreecg.jobs.{job}").main([*args, "--help"])
    assert e.value.code == 0
    return subprocess.CompletedProcess([job, *args, "--help"], 0, out.getvalue(), "")


@pytest.mark.parametrize("job", JOBS)
def test_help_is_the_whole_docstring_with_real_defaults(job):
    import importlib

    module = importlib.import_module(f"coreecg.jobs.{job}")
    done = _help(job)
    doc = module.__doc__.strip()
    assert "Exit codes" in doc, f"jobs/{job}.py: its docstring must say its exit codes"
    # every line of the docstring, examples included, is in the help as written
    for line in doc.splitlines():
        assert line.rstrip() in done.stdout, f"jobs/{job}.py --help lacks: {line!r}"
    if "--config" in done.stdout:      # a config-driven job shows the config it really starts from
        assert "--print-config" in done.stdout
        default = re.search(r"--config CONFIG.*?\(default: ([^)]+)\)", done.stdout, re.S)
        expected = {"pretrain": "configs/quickstart.yaml", "sweep": "configs/sweep.yaml",
                    "sweep_mask_rates": "configs/sweep.yaml", "ablate": "configs/sweep.yaml"}.get(job)
        if expected:
            assert default and default.group(1).split()[0].endswith(expected), done.stdout
        else:
            assert default is None, f"jobs/{job}.py starts from the paper defaults; --help must not name a file"


def test_one_flag_vocabulary_across_jobs():
    """--output is what a job writes, --corpus a corpus it reads, --model the model it reads
    (fine-tuning's --encoder is finetune.encoder); the old spellings are gone (tests/test_vocabulary.py)."""
    helps = {job: _help(job).stdout for job in JOBS}
    figures = _help("figures", "reconstruction").stdout
    for job, text in {**helps, "figures reconstruction": figures}.items():
        assert "--checkpoint" not in text and "--out " not in text, job
    for job in ("pretrain", "finetune", "preprocess", "report", "study", "sweep", "ablate", "sweep_mask_rates",
                "export", "predict", "leaderboard"):
        assert "--output" in helps[job], job
    for job in ("pretrain", "finetune", "sweep", "ablate", "sweep_mask_rates"):
        assert "--corpus" in helps[job], job
    assert "--encoder" in helps["finetune"] and "--model" in figures and "--encoder" not in figures


def test_print_config_is_the_resolved_config_and_runs_nothing(tmp_path):
    done = _job("jobs/pretrain.py", "--set", "optim.lr=0.002", "--output", str(tmp_path / "run"), "--print-config")
    assert done.returncode == 0, done.stderr
    cfg = yaml.safe_load(done.stdout)
    assert cfg["optim"]["lr"] == 0.002 and cfg["encoders"]["coreecg"]["embed_dim"] == 64   # quickstart + --set
    assert cfg["train"]["name"] == "run" and cfg["train"]["storage_path"] == str(tmp_path)  # the job's flag
    assert not (tmp_path / "run").exists()
    conflict = _job("jobs/pretrain.py", "--output", str(tmp_path / "run"), "--set", "train.name=x", "--print-config")
    assert conflict.returncode == 2 and "train.name is set twice" in conflict.stderr


def test_packages_listed_in_pyproject_are_the_tree():
    """pyproject.toml lists every package (the jobs and shipped YAML are mapped into coreecg):
    a new subpackage left out would be missing from an installed coreecg."""
    import tomllib

    meta = tomllib.loads((REPO / "pyproject.toml").read_text())
    listed = set(meta["tool"]["setuptools"]["packages"])
    tree = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "coreecg").rglob("__init__.py")}
    assert tree <= listed, f"add to [tool.setuptools] packages: {sorted(tree - listed)}"
    scripts = meta["project"]["scripts"]
    assert {v.split(":")[0].rsplit(".", 1)[1] for v in scripts.values()} == set(JOBS)


def test_installed_commands_run_outside_a_checkout(tmp_path):
    """The console entry points work from any folder and find their shipped defaults."""
    import shutil

    exe = shutil.which("coreecg-pretrain")
    if exe is None:
        pytest.skip("coreecg is not installed (pip install -e .)")
    done = subprocess.run([exe, "--print-config"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert yaml.safe_load(done.stdout)["train"]["name"] == "quickstart"
    assert "usage: coreecg-pretrain" in subprocess.run([exe, "--help"], cwd=tmp_path, capture_output=True,
                                                       text=True, timeout=120).stdout
