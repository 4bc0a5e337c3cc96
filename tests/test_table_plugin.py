"""A table is one module (issue 42, must-have 3): the test plugin (tests/plugin_table.py, named in
the config's plugins) is a table a study may ask for, and its report writes it and indexes it,
with nothing in coreecg naming it; coreecg/study names no table either. jobs/report.py writes it
through --tables, and refuses a name no module registered, listing the registered ones."""
from __future__ import annotations

import ast
import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "plugins=[tests.plugin_table]"


def _study_file(tmp_path: Path, plugin: bool = True) -> Path:
    """A study of two methods x two seeds on one (given, not built) corpus asking for the plugin's table."""
    data = {"name": "plugin", "config": str(REPO / "configs" / "quickstart.yaml"),
            "set": [*TINY, "report.bootstrap_resamples=0", *([PLUGIN] if plugin else [])],
            "variants": str(REPO / "tune_spaces" / "ablations.yaml"),
            "pretrain": {"methods": ["CoRe-ECG"], "seeds": [0, 1]},
            "downstream": {"corpora": {"ptbxl": {"path": str(tmp_path / "corpora" / "ptbxl")}},
                           "methods": ["Supervised", "CoRe-ECG"], "seeds": [0, 1]},
            "report": {"tables": ["comparison", "best_auroc"]}}
    path = tmp_path / ("study.yaml" if plugin else "no_plugin.yaml")
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _finish(run_dir: Path, method: str, mode: str, seed: int, auroc: float) -> None:
    """A finished fine-tuning run folder as the runner leaves one (metrics.json, done.json)."""
    test = {"acc": 0.8, "f1": 0.6, "f1_argmax": 0.6, "auroc": auroc, "n": 100}
    record = {"method": method, "dataset": "ptbxl", "mode": mode, "leads": "12", "train_fraction": 1.0,
              "seed": seed, "multilabel": False, "class_names": ["a", "b"], "test": test, "val": test}
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps(record))
    (run_dir / "done.json").write_text("{}\n")


def test_a_study_imports_the_plugin_before_checking_its_tables(tmp_path):
    code = ("import sys\nfrom coreecg.study.reader import load_study\nfrom coreecg.study.schema import StudyError\n"
            "try:\n    print(list(load_study(sys.argv[1]).tables))\nexcept StudyError as e:\n    print(e)\n")
    runs = [subprocess.run([sys.executable, "-c", code, str(_study_file(tmp_path, plugin))], cwd=REPO,
                           capture_output=True, text=True, timeout=300) for plugin in (True, False)]
    assert [r.returncode for r in runs] == [0, 0], runs[0].stderr[-2000:] + runs[1].stderr[-2000:]
    assert runs[0].stdout.strip() == "['comparison', 'best_auroc']"
    assert "report.tables: unknown table(s) ['best_auroc']" in runs[1].stdout       # no plugin, no table


def test_the_plugins_table_is_written_and_indexed_in_the_study_report(tmp_path):
    from coreecg.study.reader import load_study
    from coreecg.study.summary import write_study_report
    from coreecg.study.runner import run_dir

    study = load_study(_study_file(tmp_path))
    out = tmp_path / "out"
    auroc = {("Supervised", 0): 0.8, ("Supervised", 1): 0.84, ("CoRe-ECG", 0): 0.9, ("CoRe-ECG", 1): 0.93}
    for r in study.finetune_runs():
        _finish(run_dir(out, "finetune", r.name), r.method, r.mode, r.seed, auroc[r.method, r.seed])
    index = write_study_report(study, out).read_text()
    table = (out / "report" / "tables" / "best_auroc.md").read_text()
    assert "| Supervised | 2 | 84.0 | 82.0 |" in table and "| CoRe-ECG | 2 | 93.0 | 91.5 |" in table
    names = sorted(r.name for r in study.finetune_runs())
    line = next(x for x in index.splitlines() if x.startswith("- **best_auroc**"))
    assert line == ("- **best_auroc**: [`tables/best_auroc.md`](tables/best_auroc.md); 4 run(s): "
                    + ", ".join(f"`{n}`" for n in names))
    assert any(x.startswith("- **comparison**: [`tables/comparison.md`]") for x in index.splitlines())
    rows = list(csv.DictReader(open(out / "report" / "tables" / "all_runs.csv")))
    assert len(rows) == 4 and all(r["tables"].split(";") == ["comparison", "best_auroc"] for r in rows)


def _string_constants(path: Path) -> set[str]:
    return {n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant)
            and isinstance(n.value, str)}


def test_no_core_file_names_the_plugin_and_the_study_names_no_table():
    import coreecg.eval.tables as tables

    assert not [p for p in (REPO / "coreecg").rglob("*.py") if "best_auroc" in p.read_text()]
    names = set(tables.known_tables())
    assert {"comparison", "lead_reduction", "train_fraction", "label_efficiency", "benchmark"} <= names
    hits = {f"{p.relative_to(REPO)}: {s}" for p in (REPO / "coreecg" / "study").glob("*.py")
            for s in _string_constants(p) & names}
    assert hits == set()
    # a plugin cannot take a built-in's name; the registry is left as it was
    with pytest.raises(ValueError, match="'comparison' is already registered by coreecg.eval.tables.methods"):
        tables.register_table("comparison", build=_string_constants, write=_string_constants, runs=set)
    assert tables.table_for("comparison").build.__module__ == "coreecg.eval.tables.methods"


def _report_runs(tmp_path: Path) -> list[Path]:
    """Four finished fine-tuning runs of two methods x two seeds (no predictions: no differences)."""
    runs = []
    for method, aurocs in (("Supervised", (0.8, 0.84)), ("CoRe-ECG", (0.9, 0.93))):
        for seed, auroc in enumerate(aurocs):
            runs.append(tmp_path / "runs" / f"{method}-{seed}")
            _finish(runs[-1], method, "finetune" if method == "CoRe-ECG" else "scratch", seed, auroc)
    return runs


def test_the_report_job_writes_a_plugins_table_asked_for_with_tables(tmp_path):
    """In a fresh process the table exists only through --set plugins=[...]; --tables writes just
    the tables it names (and all_runs.csv)."""
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "jobs/report.py", *map(str, _report_runs(tmp_path)), "--output", str(out),
                           "--set", PLUGIN, "--set", "report.bootstrap_resamples=0",
                           "--tables", "best_auroc", "comparison"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (out / "best_auroc.md").read_text()
    assert "| Supervised | 2 | 84.0 | 82.0 |" in table and "| CoRe-ECG | 2 | 93.0 | 91.5 |" in table
    assert {p.stem for p in out.iterdir()} == {"best_auroc", "comparison", "all_runs"}   # no lead_reduction
    assert done.stdout.splitlines()[0] == str(out / "best_auroc.md")                    # in the order asked
    with open(out / "all_runs.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 and all(r["tables"] == "best_auroc;comparison" for r in rows)


def test_the_report_job_refuses_an_unknown_table_naming_the_registered_ones(tmp_path, capsys):
    # this checkout's job by path: an editable install may map coreecg.jobs to another checkout's
    spec = importlib.util.spec_from_file_location("table_plugin_report_job", REPO / "jobs" / "report.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    with pytest.raises(SystemExit) as e:
        job.main([*map(str, _report_runs(tmp_path)), "--output", str(tmp_path / "out"),
                  "--tables", "comparison", "best_aurco"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "report.tables (--tables): unknown table(s) ['best_aurco']; registered: [" in err
    assert all(f"'{name}'" in err for name in ("comparison", "lead_reduction", "train_fraction", "label_efficiency"))
    assert not (tmp_path / "out").exists()             # refused before anything is written
    # --tables is the typed key report.tables: the resolved config says it
    with pytest.raises(SystemExit) as e:
        job.main(["--print-config", "--tables", "comparison", "lead_reduction"])
    assert e.value.code == 0 and "  tables:\n  - comparison\n  - lead_reduction\n" in capsys.readouterr().out
