"""Docs that run (issue 57): every YAML block of README.md and docs/*.md parses, and loads with the
project's own reader where it is a whole config, variants/space file or study; every job command of
a shell example (```bash blocks, inline `python jobs/...`) parses with its job's parser, its --set
values load on the job's config (the --config it names, else the job's default; a study's on the
study), their plugins import, and each example with --print-config runs and prints them. Nothing
trains. A YAML block that is deliberately partial says so with `<!-- fragment -->` just above it."""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import json
import io
import re
import shlex
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
import yaml

from coreecg.cli import _parse
from coreecg.config import Config, ConfigError, load_config, moved_key
from coreecg.study.spec import StudyError, load_study
from coreecg.tune.spaces import SpaceError, SpaceFile, load_space

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRAGMENT = "<!-- fragment -->"
SHELL = {"bash", "sh", "shell", ""}          # an unlabelled block may hold commands too
OPEN = re.compile(r"^(\s*)```\s*([\w+-]*)\s*$")
JOB = re.compile(r"^jobs/(\w+)\.py$")
INLINE = re.compile(r"`([^`]*\bpython jobs/[^`]*)`")
OPERATORS = {"&&", "||", ";", "|", "(", ")", "&"}
CONFIG_SECTIONS = {f.name for f in dataclasses.fields(Config)}
SPACE_KEYS = {f.name for f in dataclasses.fields(SpaceFile)}


@dataclasses.dataclass(frozen=True)
class Block:
    where: str           # page:line of the opening fence
    lang: str
    text: str
    fragment: bool


@dataclasses.dataclass(frozen=True)
class Command:
    where: str
    job: str
    argv: tuple[str, ...]

    @property
    def abbreviated(self) -> bool:
        """`...` stands for arguments left out: only its --set values are checked, not its flags."""
        return "..." in self.argv

    @property
    def sets(self) -> list[str]:
        out, argv = [], list(self.argv)
        for i, token in enumerate(argv):
            if token == "--set" and i + 1 < len(argv):
                out.append(argv[i + 1])
            elif token.startswith("--set="):
                out.append(token[len("--set="):])
        return out


def _where(page: Path, line: int) -> str:
    return f"{page.relative_to(ROOT)}:{line}"


@cache
def blocks() -> tuple[Block, ...]:
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            m = OPEN.match(lines[i])
            if not m:
                i += 1
                continue
            start, indent, body = i, len(m.group(1)), []
            i += 1
            while i < len(lines) and not re.match(r"^\s*```\s*$", lines[i]):
                body.append(lines[i][indent:])
                i += 1
            above = next((ln.strip() for ln in reversed(lines[:start]) if ln.strip()), "")
            out.append(Block(_where(page, start + 1), m.group(2), "\n".join(body) + "\n", above == FRAGMENT))
            i += 1
    return tuple(out)


def _commands_in(where: str, line: str) -> list[Command]:
    """Every `python jobs/<job>.py ...` of one logical shell line, up to the next shell operator."""
    if "python jobs/" not in line:                   # prose in an unlabelled block: not shell
        return []
    line = re.sub(r"<(\w+)>", r"\1", line)           # <output>: a placeholder, not a redirection
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as e:                          # the parse test names it
        return [Command(where, "", (f"not shell: {e}",))]
    out = []
    for i, token in enumerate(tokens[:-1]):
        m = JOB.match(tokens[i + 1])
        if token == "python" and m:
            argv = []
            for t in tokens[i + 2:]:
                if t in OPERATORS:
                    break
                argv.append(t)
            out.append(Command(where, m.group(1), tuple(argv)))
    return out


@cache
def commands() -> tuple[Command, ...]:
    out = []
    for block in blocks():
        if block.lang not in SHELL:
            continue
        page, first = block.where.rsplit(":", 1)
        logical, start = "", None
        for n, line in enumerate(block.text.splitlines(), start=int(first) + 1):
            start = n if start is None else start
            if line.rstrip().endswith("\\"):            # a continuation: one command over lines
                logical += line.rstrip()[:-1] + " "
                continue
            out += _commands_in(f"{page}:{start}", logical + line)
            logical, start = "", None
    for page in PAGES:
        fenced = False
        for n, line in enumerate(page.read_text().splitlines(), start=1):
            if OPEN.match(line) or re.match(r"^\s*```\s*$", line):
                fenced = not fenced
            elif not fenced:
                for span in INLINE.findall(line):
                    out += _commands_in(_where(page, n), span)
    return tuple(out)


@cache
def _parser(job: str):
    # this checkout's jobs/ by path: an editable install may map coreecg.jobs to another checkout's
    spec = importlib.util.spec_from_file_location(f"docs_examples_job_{job}", ROOT / "jobs" / f"{job}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    parser = module.build_parser()
    parser.prog = f"jobs/{job}.py"        # its messages name the job, not pytest's __main__.py
    return parser


def _parse_quietly(parser, argv: list[str]):
    """The job's own parsing -> (args, None), or (None, argparse's message) where it refuses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return _parse(parser, argv), None
    except SystemExit:
        return None, err.getvalue().strip().splitlines()[-1]


def _at(config: dict, key: str):
    for part in key.split("."):
        config = config[part]
    return config


# ---------------------------------------------------------------------------- YAML blocks


def test_every_yaml_block_parses_and_loads_with_its_reader(tmp_path):
    yamls = [b for b in blocks() if b.lang in ("yaml", "yml")]
    assert len(yamls) >= 4, "the block finder found too few YAML blocks: it is broken"
    failures = []
    for n, block in enumerate(yamls):
        try:
            data = yaml.safe_load(block.text)
        except yaml.YAMLError as e:        # named at the line of the page where it fails
            mark, (page, fence) = getattr(e, "problem_mark", None), block.where.rsplit(":", 1)
            failures.append(f"{page}:{int(fence) + 1 + mark.line if mark else fence}: not YAML: {e}")
            continue
        if block.fragment:
            continue
        keys = set(data) if isinstance(data, dict) else set()
        path = tmp_path / f"block{n}.yaml"
        path.write_text(block.text)
        try:
            if keys and keys <= CONFIG_SECTIONS:
                load_config(path)
            elif keys & {"grid", "params", "variants"} and keys <= SPACE_KEYS:
                load_space(path)
            elif "name" in keys and keys & {"pretrain", "downstream"}:
                load_study(path)
            else:
                failures.append(f"{block.where}: neither a config, a space/variants file nor a study (top-level "
                                f"keys {sorted(keys)}): make it whole, or mark it {FRAGMENT} above its fence")
        except (ConfigError, SpaceError, StudyError) as e:
            failures.append(f"{block.where}: {e}")
    assert not failures, "\n".join(failures)


# ---------------------------------------------------------------------------- shell examples


def test_every_job_command_parses_with_its_jobs_parser():
    found = commands()
    assert len(found) >= 40, "the command finder found too few job commands: it is broken"
    failures = []
    for c in found:
        if not c.job:
            failures.append(f"{c.where}: {c.argv[0]}")
        elif not (ROOT / "jobs" / f"{c.job}.py").is_file():
            failures.append(f"{c.where}: jobs/{c.job}.py does not exist")
        elif not c.abbreviated:
            _, error = _parse_quietly(_parser(c.job), list(c.argv))
            if error:
                failures.append(f"{c.where}: python jobs/{c.job}.py {shlex.join(c.argv)}: {error}")
    assert not failures, "\n".join(failures)


def test_every_set_value_is_a_valid_override_of_its_jobs_config():
    """Each command's --set list applied as the job applies it: on its --config (else the job's
    default) for a config-driven job, after the study's own settings for jobs/study.py; plugins
    (plugins=[tests.plugin_method]) are imported on the way."""
    with_sets = [c for c in commands() if c.sets]
    assert len(with_sets) >= 10, "the command finder found too few --set examples: it is broken"
    failures, checked = [], set()
    for c in with_sets:
        parser = _parser(c.job)
        if "--set" not in parser._option_string_actions:
            failures.append(f"{c.where}: jobs/{c.job}.py takes no --set")
            continue
        argv = [t for t in c.argv if t != "..."]
        args, error = _parse_quietly(parser, [*argv, "--print-config"])   # required arguments relaxed
        if error:
            failures.append(f"{c.where}: {error}")
            continue
        config = getattr(args, "config", None)
        key = (c.job, config, getattr(args, "study", None), tuple(c.sets))
        if key in checked:
            continue
        checked.add(key)
        try:
            if c.job == "study":
                load_study(ROOT / (args.study or "STUDY missing"), c.sets)
            else:
                load_config(config and ROOT / config, c.sets)
        except (ConfigError, StudyError) as e:
            failures.append(f"{c.where}: --set {' --set '.join(c.sets)}: {e}")
    assert not failures, "\n".join(failures)


def _print_config_examples() -> list[Command]:
    unique = {(c.job, c.argv): c for c in commands() if "--print-config" in c.argv}
    return list(unique.values())


def test_the_docs_show_print_config():
    assert len(_print_config_examples()) >= 2


@pytest.mark.parametrize("command", _print_config_examples(), ids=lambda c: c.where)
def test_every_print_config_example_runs_and_prints_its_sets(command):
    done = subprocess.run([sys.executable, f"jobs/{command.job}.py", *command.argv], cwd=ROOT,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{command.where}: exit {done.returncode}: {done.stderr[-2000:]}"
    printed = yaml.safe_load(done.stdout)
    assert isinstance(printed, dict) and CONFIG_SECTIONS <= set(printed), f"{command.where}: {done.stdout[:500]}"
    for item in command.sets:
        key, _, raw = item.partition("=")
        value = yaml.safe_load(raw)
        if isinstance(value, (bool, int, float)):      # paths are made absolute; numbers print as given
            assert _at(printed, moved_key(key.strip())) == value, f"{command.where}: --set {item}"


# A python block whose first line names a plugin file of the tests (`# tests/plugin_encoder.py`) shows
# that file whole: the docs' plugin examples are complete files, not sketches (issue 61). (Excerpts of
# the package's own files, `# coreecg/...`, stay excerpts.)
FILE_HEADER = re.compile(r"^# (tests/plugin_\w+\.py)\n")
EXERCISE = r"""
import importlib, json, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[1])
from coreecg.config import load_config
from coreecg.config.encoder_registry import ENCODERS
from coreecg.config.method_registry import METHODS
from coreecg.eval.objectives import OBJECTIVES, Embeddings, compute_objectives
from coreecg.eval.probe import ProbeData, ProbeSplit
from tests.helpers import TINY

out = {}
for module in sys.argv[2:]:
    before = (set(ENCODERS), set(METHODS), set(OBJECTIVES))
    importlib.import_module(module)
    plugin = f"plugins=[{module}]"
    for arch in set(ENCODERS) - before[0]:
        from coreecg.encoders import build_encoder
        cfg = load_config(overrides=[plugin, f"model.arch={arch}"])
        enc = build_encoder(cfg)
        pooled = enc.pooled(torch.randn(2, 12, cfg.model.input_samples))
        out[f"{module}:encoder:{arch}"] = [list(pooled.shape), enc.dim, bool(torch.isfinite(pooled).all())]
    for name in set(METHODS) - before[1]:
        from coreecg.methods import build_method
        model = build_method(load_config(overrides=[*TINY, plugin, f"pretrain.method={name}"]))
        loss = model(torch.randn(2, 12, model.config.model.input_samples))["loss"]
        loss.backward()
        dead = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        out[f"{module}:method:{name}"] = [bool(torch.isfinite(loss)), dead]
    for name in set(OBJECTIVES) - before[2]:
        rng = np.random.default_rng(0)
        def split(n):
            return ProbeSplit(np.zeros((n, 1, 1), np.float32), np.eye(3, dtype=np.float32)[np.arange(n) % 3],
                              np.arange(n) % 3)
        e = Embeddings(rng.standard_normal((30, 8)).astype(np.float32), rng.standard_normal((12, 8)).astype(np.float32),
                       ProbeData(split(30), split(12), ["a", "b", "c"], False, "mem"), per_class=2, n_subsets=2)
        value = compute_objectives(e)[name]
        out[f"{module}:objective:{name}"] = [bool(np.isfinite(value))]
print(json.dumps(out))
"""


def _file_blocks() -> list[tuple[Block, str]]:
    return [(b, m.group(1)) for b in blocks() if b.lang == "python" and (m := FILE_HEADER.match(b.text))]


def test_every_plugin_example_is_its_whole_file_and_imports_and_runs(tmp_path):
    """Each such block equals its file; copied out of the docs as modules of their own and imported
    in a fresh process, what each registers is exercised: an encoder embeds, a method takes a step
    with a gradient for every parameter, an objective scores embeddings."""
    found = _file_blocks()
    assert {p for _, p in found} >= {"tests/plugin_encoder.py", "tests/plugin_objective.py",
                                     "tests/plugin_method.py"}, [p for _, p in found]
    modules = []
    for block, path in found:
        body = block.text.split("\n", 1)[1]
        assert body.strip() == (ROOT / path).read_text().strip(), f"{block.where}: not the whole of {path}"
        name = f"doc_{Path(path).stem}"
        (tmp_path / f"{name}.py").write_text(body)
        modules.append(name)
    done = subprocess.run([sys.executable, "-c", EXERCISE, str(tmp_path), *modules], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ran = json.loads(done.stdout.strip().splitlines()[-1])
    kinds = {k.split(":")[1] for k in ran}
    assert kinds == {"encoder", "method", "objective"}, ran
    for key, value in ran.items():
        if ":encoder:" in key:
            assert value[0] == [2, value[1]] and value[2], (key, value)
        elif ":method:" in key:
            assert value == [True, []], (key, value)
        else:
            assert value == [True], (key, value)
