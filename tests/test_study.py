"""Studies: the YAML file validated before Ray, and a killed study resumed without re-running
a finished run, ending in every table it names."""
from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from coreecg.study.spec import StudyError, load_study
from tests.helpers import TINY, kill_after_first

REPO = Path(__file__).resolve().parents[1]


def _study(tmp_path: Path, ecg_data: Path, **changes) -> Path:
    data = {
        "name": "smallest",
        "config": str(REPO / "configs" / "quickstart.yaml"),
        "set": [*TINY, "methods.core.time_decoder.depth=2", "data.synthetic_records=64", "train.num_workers=1",
                "train.eval_every_epochs=0", "train.figures=false", "report.bootstrap_resamples=50",
                f"data.cache_dir={tmp_path / 'cache'}"],
        "variants": str(REPO / "tune_spaces" / "ablations.yaml"),
        "pretrain": {"methods": ["CoRe-ECG", "ST-MEM-like"], "seeds": [0],
                     "set": ["optim.epochs=1", "optim.batch_size=16", "optim.warmup_epochs=0"]},
        "downstream": {"corpora": {"ptbxl": {"source": "ptbxl", "input": str(ecg_data / "ptbxl")},
                                   "icbeb2018": {"source": "cpsc2018", "input": str(ecg_data / "cpsc2018-cinc2020")}},
                       "methods": ["ST-MEM-like", "CoRe-ECG"], "leads": ["12", "1"],
                       "set": ["finetune.epochs=1", "finetune.batch_size=16", "finetune.bootstrap_resamples=50",
                               "finetune.tsne_max_points=0", "finetune.warmup_epochs=0"]},
        "mask_rates": {"space": str(tmp_path / "grid.yaml"), "corpora": ["ptbxl"]},
        "report": {"tables": ["comparison", "lead_reduction"], "figures": ["reconstruction", "tsne", "mask_rates"]},
    }
    (tmp_path / "grid.yaml").write_text("grid:\n"
                                        "  methods.core.masking.p_time: [0.3, 0.7]\n"
                                        "  methods.core.masking.p_lead: [0.2]\n")
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section] = {**data[section], field: value}
        else:
            data[section] = value
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_the_shipped_studies_are_valid_and_tiny_is_the_paper_at_cpu_scale():
    tiny, paper = load_study(REPO / "studies" / "tiny.yaml"), load_study(REPO / "studies" / "paper.yaml")
    assert tiny.tables == paper.tables and tiny.figures == paper.figures
    assert set(tiny.methods) == set(paper.methods) and set(tiny.pretrain_methods) == set(paper.pretrain_methods)
    assert {g.name for g in tiny.grids} == {g.name for g in paper.grids}
    assert len(paper.finetune_runs()) > len(tiny.finetune_runs())     # more seeds and corpora


@pytest.mark.parametrize("change, message", [
    ({"pretrain__epochs": 3}, "pretrain.epochs"),                                  # unknown section key
    ({"set": ["optim.learning_rate=1"]}, "optim.learning_rate"),                   # unknown config key
    ({"pretrain__methods": ["CoRe-ECG", "Core-ECG"]}, "Core-ECG"),                 # unknown variant
    ({"downstream__leads": ["12", "V9"]}, "V9"),                                   # unknown lead
    ({"downstream__modes": ["finetune", "probe"]}, "probe"),                       # unknown mode
    ({"downstream__methods": ["MLAE-like"]}, "not pretrained here"),              # method never pretrained
    ({"report__tables": ["comparison", "table9"]}, "table9"),                      # unknown table
])
def test_a_bad_study_fails_before_ray_naming_the_entry(tmp_path, ecg_data, change, message):
    path = _study(tmp_path, ecg_data, **change)
    with pytest.raises(StudyError, match=message) as err:
        load_study(path)
    assert str(path) in str(err.value)
    done = subprocess.run([sys.executable, "jobs/study.py", str(path), "--output", str(tmp_path / "out")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and not (tmp_path / "out").exists()
    assert "Ray" not in done.stdout + done.stderr.replace(message, "")     # no cluster was started


def test_an_unknown_corpus_source_or_missing_input_is_named(tmp_path, ecg_data):
    corpora = {"ptbxl": {"source": "ptb-xl", "input": str(ecg_data / "ptbxl")}}
    with pytest.raises(StudyError, match="unknown source 'ptb-xl'"):
        load_study(_study(tmp_path, ecg_data, downstream__corpora=corpora))
    corpora = {"ptbxl": {"source": "ptbxl", "input": str(tmp_path / "nowhere")}}
    with pytest.raises(StudyError, match="nowhere"):
        load_study(_study(tmp_path, ecg_data, downstream__corpora=corpora))


def test_data_paths_expand_environment_variables_and_an_unset_one_is_named(tmp_path, ecg_data, monkeypatch):
    # On a cluster (ray job submit uploads the repository elsewhere) paths point at shared storage.
    monkeypatch.setenv("ECG_DATA", str(ecg_data))
    corpora = {"ptbxl": {"source": "ptbxl", "input": "$ECG_DATA/ptbxl"}}
    study = load_study(_study(tmp_path, ecg_data, downstream__corpora=corpora,
                              downstream__methods=["CoRe-ECG"], mask_rates__corpora=["ptbxl"]))
    assert [c.input for c in study.corpora] == [str(ecg_data / "ptbxl")]
    monkeypatch.delenv("ECG_DATA")
    with pytest.raises(StudyError, match=r"\$ECG_DATA/ptbxl.*environment variable not set"):
        load_study(_study(tmp_path, ecg_data, downstream__corpora=corpora))


def test_override_paths_are_made_absolute_once_for_every_caller(tmp_path, monkeypatch):
    """coreecg.override_paths: what the study file's `set`, the command line and a sweep share."""
    from coreecg.override_paths import PathError, absolute_overrides

    monkeypatch.setenv("CORPORA", "/mnt/shared")
    monkeypatch.chdir(tmp_path)
    given = ["data.corpus=corpora/a", "optim.lr=1e-3", "data.cache_dir = $CORPORA/cache",
             "data.probe_corpus=[x, /abs/y]", "data.corpus="]
    assert absolute_overrides(given, tmp_path / "studies") == [
        f"data.corpus={tmp_path / 'studies' / 'corpora' / 'a'}", "optim.lr=1e-3", "data.cache_dir=/mnt/shared/cache",
        f'data.probe_corpus=["{tmp_path / "studies" / "x"}", "/abs/y"]', "data.corpus="]
    assert absolute_overrides(["data.corpus=../b"]) == [f"data.corpus={tmp_path.parent / 'b'}"]   # from the cwd
    monkeypatch.delenv("CORPORA")
    with pytest.raises(PathError, match=r"'\$CORPORA/c': environment variable not set"):
        absolute_overrides(["data.corpus=$CORPORA/c"])


@pytest.mark.slow
def test_a_killed_study_resumes_without_rerunning_a_finished_run(ray_session, ecg_data, tmp_path):
    path = _study(tmp_path, ecg_data)
    study = load_study(path)
    assert len(study.pretrain_runs()) == 2 + 2 and len(study.finetune_runs()) == 8   # 2 methods x 2 corpora x 2 leads
    assert len(study.mask_rate_runs()) == 2                                          # 2 cells x 1 corpus (CI time)
    out = tmp_path / "out"
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    args = [sys.executable, "jobs/study.py", str(path), "--output", str(out), "--concurrency", "1"]
    before = kill_after_first(args, env, REPO, str(out / "runs/pretrain/*/done.json"), 600)

    again = subprocess.run([*args, "--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=1200)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    for d, text in before.items():                     # a finished run trained no further step
        assert (d / "metrics.jsonl").read_text() == text
    rows = list(csv.DictReader(open(out / "runs.csv")))
    assert len(rows) == 4 + 8 + 2 and all(r["status"] == "done" for r in rows)
    for name in ("comparison", "lead_reduction"):
        for ext in ("md", "csv", "tex"):
            assert (out / "report" / "tables" / f"{name}.{ext}").stat().st_size > 100
    index = (out / "report" / "README.md").read_text()
    assert "**comparison**" in index and "core-ecg-icbeb2018-finetune-l1-f100-s0" in index
    for figure in ("reconstruction", "tsne_ptbxl", "tsne_icbeb2018"):      # the paired figures, with their runs
        assert (out / "report" / "figures" / f"{figure}.png").stat().st_size > 10_000
    assert "[`figures/reconstruction.png`](figures/reconstruction.png): `st-mem-like-s0`, `core-ecg-s0`" in index
    for metric in ("f1", "auroc"):                        # the paper's mask-rate heatmaps, fine-tuned
        assert (out / "report" / "figures" / "mask_rates" / f"heatmap_ptbxl_{metric}.png").stat().st_size > 5_000
    corr = list(csv.DictReader(open(out / "report" / "figures" / "mask_rates" / "rank_correlation.csv")))
    # 2 cells: rho is undefined, and the table says so (rho itself: tests/test_eval_metrics.py)
    assert [r["cells"] for r in corr] == ["2"] and corr[0]["note"].startswith("undefined")
    comparison = (out / "report" / "tables" / "comparison.md").read_text()
    assert "ST-MEM-like" in comparison and "ICBEB2018" in comparison and "PTB-XL" in comparison
    # A fresh start on the same folder is refused (it would mix two studies).
    fresh = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert fresh.returncode == 2 and "--resume" in fresh.stderr
