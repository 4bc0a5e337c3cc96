"""A source is one module (issue 42, must-have 1): the test plugin (tests/plugin_source.py, named in
the config's plugins) brings its reader, its typed options section, its index file, its label-free
view and its dataset label; jobs/preprocess.py builds a corpus with it, a fine-tuning trains on that
corpus and the report lists its dataset, with no file in coreecg naming it."""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coreecg.config import ConfigError, load_config
from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "plugins=[tests.plugin_source]"
NAME, LABEL = "npz_folder", "NPZ folder"


def _raw_folder(root: Path, n: int = 40, gain: float = 2000.0) -> Path:
    """n synthetic 12-lead recordings as the plugin reads them: <id>.npz in ADC counts, one patient
    each, labelled normal (the three sinus rhythms) or abnormal, and the index file."""
    from coreecg.data.sources.synthetic import CLASS_NAMES, synthesize_record

    root.mkdir(parents=True)
    rows = ["record,label,patient"]
    for i in range(n):
        rec = synthesize_record(11, 3 * i)                     # 3 * i: a new patient, classes in turn
        label = "normal" if CLASS_NAMES.index(rec.labels[0]) < 3 else "abnormal"
        np.savez(root / f"r{i:03d}.npz", signal=np.round(rec.signal * gain).astype(np.int16), fs=rec.fs,
                 leads=np.array(rec.lead_names))
        rows.append(f"r{i:03d},{label},p{i:03d}")
    (root / "npz_index.csv").write_text("\n".join(rows) + "\n")
    return root


def test_the_plugins_section_is_typed_and_a_file_naming_it_loads_in_a_fresh_process(tmp_path):
    cfg = load_config(overrides=[PLUGIN, f"data.sources.{NAME}.gain=250"])
    assert cfg.data.sources.npz_folder.gain == 250 and cfg.plugins == ("tests.plugin_source",)
    with pytest.raises(ConfigError, match=rf"^overrides: data\.sources\.{NAME}: gain=-1.0 must be > 0"):
        load_config(overrides=[PLUGIN, f"data.sources.{NAME}.gain=-1"])
    # the file sets the section below its plugins key: the plugin is imported before data is read
    f = tmp_path / "run.yaml"
    f.write_text(f"data:\n  sources:\n    {NAME}: {{gain: 5}}\nplugins: [tests.plugin_source]\n")
    code = ("import sys; from coreecg.config import load_config; c = load_config(sys.argv[1]); "
            "print(c.data.sources.npz_folder.gain, sorted(c.to_dict()['data']['sources']))")
    done = subprocess.run([sys.executable, "-c", code, str(f)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == ("5.0 ['aecg', 'arrays', 'auto', 'cinc2021', 'code15', 'cpsc2018', 'dicom', 'edf', "
                                   "'muse', 'npz_folder', 'ptbxl', 'synthetic']"), \
        done.stderr[-2000:]
    assert NAME not in load_config().to_yaml()          # a plain config holds no section of it


def test_the_plugins_index_file_and_label_free_view_reach_wfdb_and_inference(tmp_path):
    from coreecg.data.sources import dataset_labels, get_source, label_free_options

    load_config(overrides=[PLUGIN])
    raw = _raw_folder(tmp_path / "raw", n=2)
    (raw / "stray.hea").write_text("stray 1 500 5000\nstray.dat 16 200 16 0 0 0 0 I\n")
    with pytest.raises(ValueError, match=f"marks a {NAME} folder: read it with --source {NAME}.*patient ids would"):
        get_source("wfdb").list_records(raw)
    assert label_free_options()[NAME] == {"label_view": "none"}
    assert get_source(NAME, **label_free_options()[NAME]).class_names == ()
    assert dataset_labels()[NAME] == LABEL and list(dataset_labels())[:3] == ["ptbxl", "icbeb2018", "ningbo"]


def test_the_documented_plugin_is_the_tested_one():
    doc = (REPO / "docs" / "data_sources.md").read_text()
    block = re.search(r"```python\n# tests/plugin_source.py\n(.*?)```", doc, re.S).group(1)
    assert block == (REPO / "tests" / "plugin_source.py").read_text()


def test_no_core_file_names_the_plugin():
    named = [p for p in (REPO / "coreecg").rglob("*.py") if NAME in p.read_text() or "plugin_source" in p.read_text()]
    assert named == []
    assert not [p for p in (REPO / "jobs").rglob("*.py") if NAME in p.read_text()]


@pytest.mark.slow
def test_a_plugin_source_builds_a_corpus_fine_tunes_and_shows_in_the_report(ray_session, tmp_path):
    from coreecg.data.corpus import load_manifest
    from coreecg.eval.report import write_report
    from coreecg.train.fit import fit, plan_run

    raw = _raw_folder(tmp_path / "raw")
    corpus = tmp_path / "corpus"
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    sets = [PLUGIN, f"data.sources.{NAME}.gain=2000", "data.shard_records=16", "data.split_ratios=[0.5,0.25,0.25]"]
    job = subprocess.run([sys.executable, "jobs/preprocess.py", "--source", NAME, "--input", str(raw),
                          "--output", str(corpus), *sum((["--set", s] for s in sets), [])],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert job.returncode == 0, job.stderr[-3000:]
    summary = json.loads(job.stdout[job.stdout.index("{"):])
    assert (summary["source"], summary["dataset_key"], summary["records_written"]) == (NAME, NAME, 40)
    manifest = load_manifest(corpus)
    assert manifest["source_options"] == {"gain": 2000.0, "label_view": "single"}
    assert (manifest["dataset_key"], manifest["dataset_label"]) == (NAME, LABEL)     # recorded at build time
    assert manifest["class_names"] == ["normal", "abnormal"] and all(manifest["counts"]["windows"].values())

    # fine-tuning reads the corpus (and its recorded key) without the plugin in its config
    cfg = load_config(overrides=[
        *TINY, f"data.corpus={corpus}", "finetune.mode=scratch", "finetune.batch_size=8", "finetune.lr=1e-3",
        "finetune.epochs=1", "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0", "train.num_workers=1",
        "train.checkpoint_every_steps=0", "data.cache_in_memory_gb=0", f"train.storage_path={tmp_path}",
        "train.name=ft"])
    result = fit(plan_run(cfg, "finetune"), report_fn=lambda metrics: None)      # in this process
    assert (result.metrics["dataset"], result.metrics["class_names"]) == (NAME, ["normal", "abnormal"])

    written = write_report([result.run_dir], tmp_path / "report")
    rows = list(csv.DictReader(open(tmp_path / "report" / "all_runs.csv")))
    assert [r["dataset"] for r in rows] == [NAME]
    (comparison,) = [p for p in written if p.name == "comparison.md"]
    # its column: the plugin's label, read from the registry
    assert f"| Method | {LABEL} ACC | " in comparison.read_text(), comparison.read_text()
