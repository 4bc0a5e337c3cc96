"""Layering, enforced: every module of coreecg/ and jobs/ sits in one layer (LAYERS, lowest
first) and imports nothing from a higher one, lazily or not; no module imports itself back through
others. And data knows no training: importing the data package pulls in neither the model nor the
training code (nor torch)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _modules_after(code: str) -> list[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_data_pulls_in_no_model_training_or_torch():
    mods = _modules_after("import coreecg.data, coreecg.data.pipeline, coreecg.data.sources.wfdb_io\n"
                          "from coreecg.data.sources import get_source\nget_source('wfdb')")
    assert "coreecg.data.pipeline" in mods          # the probe did import what it claims
    leaked = [m for m in mods if m.startswith(("coreecg.model", "coreecg.train", "torch"))]
    assert leaked == []


def test_version_is_shared_and_the_top_level_api_stays_lazy():
    mods = _modules_after("import coreecg\nfrom coreecg.version import __version__ as v\n"
                          "assert coreecg.__version__ == v and callable(coreecg.load_encoder)")
    assert "coreecg.version" in mods
    assert not [m for m in mods if m.startswith(("coreecg.train", "coreecg.model", "torch"))]


# ---------------------------------------------------------------------------- every package

# The layers, lowest first. A module may import (at the top or inside a function) only from its
# own layer or a lower one; `coreecg` names the package's own __init__ only (its lazy top-level API).
# A module that is in no layer fails the test: place it when you add it. The registries and the
# built-in methods' options sit in the config's layer: the config reads `data.sources.<name>` and
# `methods.<name>` through them (only plugins, named in the config, are imported by name).
LAYERS = [
    ("base", {"coreecg.version", "coreecg.log", "coreecg.files", "coreecg.extras"}),
    ("typed loader", {"coreecg.typed"}),
    ("config", {"coreecg.config", "coreecg.override_paths",
                "coreecg.data.sources.registry",       # the config reads data.sources.<name> through it
                "coreecg.methods.registry", "coreecg.methods.view_options",     # ... and methods.<name>
                "coreecg.methods.core_ecg.options", "coreecg.methods.moco_v3.options",
                "coreecg.methods.cmsc.options", "coreecg.methods.cpc.options",
                # ... and model.arch, encoders.<name> (the encoder registry and the built-ins' options)
                "coreecg.encoders.registry", "coreecg.encoders.options",
                "coreecg.encoders.published"}),        # ... and the published families' options
    # a recording, its leads and a published family's input contract: below the model layer, where each
    # family declares its contract (coreecg.model.published.<family>.CONTRACT)
    # ... and the task registry (coreecg.data.tasks): a task reads its target from a record; the model builds its head
    ("recordings and input contracts", {"coreecg.data.record", "coreecg.data.leads", "coreecg.data.contract",
                                        "coreecg.data.tasks"}),
    ("devices", {"coreecg.devices"}),
    ("checkpoint store", {"coreecg.checkpoints"}),
    ("weights in", {"coreecg.weights"}),      # the loader's part from_pretrained (model) uses
    ("model", {"coreecg.model", "coreecg.encoders"}),     # build_encoder, the one build path; cost
    ("models in", {"coreecg.loading"}),
    ("runtime", {"coreecg.run_record", "coreecg.cluster"}),
    ("data", {"coreecg.data"}),
    ("eval", {"coreecg.eval"}),
    ("methods", {"coreecg.methods"}),
    ("train", {"coreecg.train"}),
    ("models in and out", {"coreecg.hub", "coreecg.inference"}),
    ("tune", {"coreecg.tune"}),
    ("study", {"coreecg.study"}),
    ("cli", {"coreecg.cli", "coreecg"}),
    ("jobs", {"jobs"}),
]


def _layer_of(module: str) -> int:
    best = None
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "coreecg" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (i, len(prefix))
    if best is None:
        raise AssertionError(f"{module} is in no layer of tests/test_data_layering.py: place it")
    return best[0]


def _all_imports() -> dict[str, set[tuple[str, int]]]:
    """module -> {(imported coreecg/jobs module, line)}: every import statement, lazy ones too."""
    out = {}
    for root in ("coreecg", "jobs"):
        for path in (REPO / root).rglob("*.py"):
            module = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
            out[module] = _imports_in(path.read_text())
    return out


def _imports_in(source: str) -> set[tuple[str, int]]:
    """{(imported coreecg/jobs module, line)} of one file's text (coreecg.jobs.x read as jobs.x)."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(source)):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
        found |= {(n.replace("coreecg.jobs", "jobs", 1), node.lineno) for n in names
                  if n.split(".")[0] in ("coreecg", "jobs")}
    return found


def _jobs_importing_jobs(imports: dict[str, set[tuple[str, int]]]) -> list[str]:
    return [f"{m} imports {d} at line {line}" for m, deps in sorted(imports.items()) if m.startswith("jobs.")
            for d, line in sorted(deps) if d == "jobs" or d.startswith("jobs.")]


def test_no_job_imports_another_job():
    """Jobs are thin command lines over coreecg: what two jobs share lives in coreecg (the study
    presets in coreecg.study.presets), never in a job that another job imports."""
    imports = _all_imports()
    assert sum(m.startswith("jobs.") for m in imports) >= 10        # the probe read the jobs
    assert _jobs_importing_jobs(imports) == []
    # the rule has teeth: either spelling of a job is caught, a coreecg module is not
    probe = _imports_in("from coreecg.jobs.study import run_study_job\nimport jobs.sweep\n"
                        "from coreecg.study.presets import run_study_job\n")
    assert _jobs_importing_jobs({"jobs.ablate": probe}) == ["jobs.ablate imports jobs.study at line 1",
                                                            "jobs.ablate imports jobs.sweep at line 2"]


def test_no_import_climbs_a_layer_lazy_or_not():
    climbs = [f"{m} (layer {LAYERS[_layer_of(m)][0]}) imports {d} (layer {LAYERS[_layer_of(d)][0]}) at line {line}"
              for m, deps in _all_imports().items() for d, line in sorted(deps)
              if _layer_of(d) > _layer_of(m)]
    assert climbs == []


def test_no_import_cycle_between_modules():
    """Module to module, lazy imports included: a cycle would make its modules one (and, across
    packages, two layers one)."""
    graph = {m: {d for d, _ in deps if d != m} for m, deps in _all_imports().items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:       # depth-first; a grey module reached again is a cycle
        state[m] = 1
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycle = " -> ".join(path[path.index(d):] + [m, d]) if d in path else f"{m} -> {d}"
                pytest.fail(f"import cycle: {cycle}")
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])


def test_the_layering_test_catches_a_climb():
    """The rule has teeth: a train module importing the tune layer is a climb."""
    assert _layer_of("coreecg.train.fit") < _layer_of("coreecg.tune.trials") < _layer_of("coreecg.study.runner")
    assert _layer_of("coreecg.data.corpus") < _layer_of("coreecg.train.ingest")
    with pytest.raises(AssertionError, match="in no layer"):
        _layer_of("coreecg.nowhere")
