"""One command-line vocabulary across jobs/*.py (coreecg.cli.VOCABULARY, docs/cli.md): a flag name
means one thing in every job, every flag says what it does, help shows no machine's folders and
keeps the docstrings' line continuations, --print-config needs none of a job's required arguments,
and an old spelling is an error naming the new one. Parsers are built in this process, never run."""
from __future__ import annotations

import argparse
import ast
import importlib
import re
from pathlib import Path

import pytest
import yaml

from coreecg.cli import VOCABULARY, replicate_seeds
from coreecg.run_record import COMMAND_ENV

REPO = Path(__file__).resolve().parents[1]
JOBS = sorted(p.stem for p in (REPO / "jobs").glob("*.py") if not p.name.startswith("_"))


def _module(job: str):
    return importlib.import_module(f"coreecg.jobs.{job}")


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every job's parser, and each subcommand's (`figures reconstruction`), by name."""
    out = {}
    for job in JOBS:
        parser = _module(job).build_parser()
        out[job] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.update({f"{job} {name}": sub for name, sub in action.choices.items()})
    return out


def _flags(parser: argparse.ArgumentParser):
    """(long flag name, action) of every visible flag (renamed spellings are hidden)."""
    for action in parser._actions:
        if action.help is argparse.SUPPRESS:
            continue
        for name in action.option_strings:
            if name.startswith("--"):
                yield name, action


@pytest.fixture(scope="module")
def parsers():
    return _parsers()


def test_each_flag_name_has_one_meaning_across_jobs(parsers):
    users: dict[str, list[str]] = {}
    for job, parser in parsers.items():
        for name, action in _flags(parser):
            users.setdefault(name, []).append(job)
            flag = VOCABULARY.get(name)
            if flag is None:
                continue
            where = f"{job}: {name}"
            assert action.dest == (flag.dest or name[2:].replace("-", "_")), where
            assert action.type is flag.type, f"{where}: type {action.type}, the vocabulary says {flag.type}"
            if flag.metavar:
                assert action.metavar == flag.metavar, f"{where}: metavar {action.metavar!r} != {flag.metavar!r}"
            assert flag.says in (action.help or ""), f"{where}: its help must say {flag.says!r} ({flag.meaning})"
    shared = {name: jobs for name, jobs in users.items() if len(jobs) > 1}
    missing = sorted(set(shared) - set(VOCABULARY))
    assert not missing, f"flags of several jobs missing from coreecg.cli.VOCABULARY: {missing}"
    # the decisions of issue 30: the training seed is --seed, a count of replicates --seeds, the
    # model read --model, the variants file --variants; the sweep's own names are its own
    assert {"finetune", "figures reconstruction"} <= set(users["--seed"])
    assert {"ablate", "sweep_mask_rates"} <= set(users["--seeds"])
    assert {"predict", "export", "figures reconstruction"} <= set(users["--model"])
    assert users["--encoder"] == ["finetune"]
    assert set(users["--variants"]) == {"ablate", "report"}
    assert set(users["--space"]) == {"sweep", "sweep_mask_rates"}
    assert users["--search-seed"] == ["sweep"]


def test_every_argument_has_help(parsers):
    for job, parser in parsers.items():
        for action in parser._actions:
            if action.help is argparse.SUPPRESS:
                continue
            label = "/".join(action.option_strings) or action.metavar or action.dest
            assert (action.help or "").strip(), f"{job}: {label} has no help"


def test_help_shows_no_absolute_path(parsers, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)            # shown relative to the package, not to where it runs
    for job, parser in parsers.items():
        text = parser.format_help()
        for default in re.findall(r"\(default:\s+([^)]*)\)", text):
            assert not default.strip().startswith(("/", "~")), f"{job}: default shown as {default}"
        assert str(REPO) not in text, f"{job}: --help shows this machine's folder {REPO}"
    assert "(default: configs/quickstart.yaml)" in parsers["pretrain"].format_help()
    assert "(default: tune_spaces/ablations.yaml)" in re.sub(r"\s+", " ", parsers["ablate"].format_help())


@pytest.mark.parametrize("job", JOBS)
def test_help_keeps_the_docstrings_line_continuations(job, parsers):
    """A docstring line ending in a backslash must be written `\\\\`: a lone one joins the lines."""
    source = (REPO / "jobs" / f"{job}.py").read_text()
    raw = ast.get_source_segment(source, ast.parse(source).body[0].value)
    continued = [line for line in raw.splitlines() if line.endswith("\\")]
    for line in continued:
        assert line.endswith("\\\\"), f"jobs/{job}.py: this docstring line loses its continuation: {line!r}"
    text = parsers[job].format_help()
    assert all(line[:-1] in text for line in continued), f"jobs/{job}.py --help lacks a continued line"


def _run_main(job: str, argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """A job's main(argv) in this process, its console set-up left out -> (exit code, stdout, stderr)."""
    monkeypatch.setattr("coreecg.cli.console", lambda verbose=False: None)
    monkeypatch.setenv(COMMAND_ENV, "")        # parse_args sets it; restored afterwards
    try:
        code = _module(job).main(argv)
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_print_config_needs_no_required_argument(parsers, monkeypatch, capsys):
    """Every config-driven job prints its config and exits 0 given only --print-config (a study,
    whose file is its config, needs that file: below)."""
    jobs = [j for j in JOBS if "--print-config" in parsers[j]._option_string_actions and j != "study"]
    assert {"pretrain", "finetune", "preprocess", "report", "sweep", "sweep_mask_rates", "ablate"} <= set(jobs)
    for job in jobs:
        code, out, err = _run_main(job, ["--print-config"], monkeypatch, capsys)
        assert code == 0, f"jobs/{job}.py --print-config: exit {code}: {err}"
        assert "train" in yaml.safe_load(out), job


def test_print_config_applies_the_flags_given(monkeypatch, capsys):
    code, out, err = _run_main("finetune", ["--seed", "7", "--encoder", "none", "--print-config"], monkeypatch, capsys)
    assert code == 0, err
    cfg = yaml.safe_load(out)
    assert cfg["train"]["seed"] == 7 and cfg["finetune"]["mode"] == "scratch"
    code, out, err = _run_main("study", [str(REPO / "studies" / "tiny.yaml"), "--print-config"], monkeypatch, capsys)
    assert code == 0 and "train" in yaml.safe_load(out), err
    code, _, err = _run_main("finetune", ["--corpus", "x"], monkeypatch, capsys)     # still required without it
    assert code == 2 and "--encoder" in err and "--output" in err


@pytest.mark.parametrize("job, argv, message", [
    ("figures", ["reconstruction", "--encoder", "run", "--corpus", "c", "--output", "o.png"],
     "--encoder was renamed --model"),
    ("export", ["runs/x", "--output", "out"], "RUN_OR_CHECKPOINT was renamed --model"),
    ("sweep", ["--seed", "3"], "--seed was renamed --search-seed"),
    ("ablate", ["--space", "tune_spaces/ablations.yaml"], "--space was renamed --variants"),
])
def test_an_old_spelling_is_an_error_naming_the_new_one(job, argv, message, monkeypatch, capsys):
    code, _, err = _run_main(job, argv, monkeypatch, capsys)
    assert code == 2 and message in err, err


def test_seeds_counts_replicates_from_the_training_seed():
    parser = _module("ablate").build_parser()
    args = parser.parse_args(["--set", "train.seed=5", "--seeds", "3"])
    assert replicate_seeds(parser, args, args.seeds) == [5, 6, 7]


def test_the_docs_table_names_every_flag_of_the_vocabulary():
    table = (REPO / "docs" / "cli.md").read_text()
    missing = [name for name in VOCABULARY if f"| `{name}" not in table]
    assert not missing, f"docs/cli.md's vocabulary table lacks {missing}"
