"""Inference (coreecg.inference, jobs/predict.py) on real records, without Ray.

A tiny pretraining and two linear fine-tunes (12 leads; the 6 limb leads) run in this process on
a PTB-XL corpus (the real pipeline, its Ray Data map run in-process), so each run folder holds
best.pt and predictions.csv. Predicting the same raw records from ../shared/ecg-data must give
those probabilities; bad files fail with their reason while the rest are written; a 6-lead model
takes its leads by name; an encoder writes one embedding per record.
"""
from __future__ import annotations

import csv
import importlib.util
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config import STANDARD_LEADS, load_config
from tests.helpers import TINY, InProcessDataset

REPO = Path(__file__).resolve().parents[1]
LIMB = STANDARD_LEADS[:6]
# Smaller than tests.helpers.TINY's inputs: 1,500-sample crops of 150-sample patches (120 tokens
# for 12 leads, not 360), so every forward pass here is cheap on 2 CPU cores.
SMALL = [*TINY, "model.input_samples=1500", "data.crop_samples=1500", "encoders.coreecg.patch_size=150"]
N_RECORDS = 100        # the first PTB-XL records: ~85 single-label, enough for labelled val and test splits


@pytest.fixture(scope="module")
def ptbxl_refs(ecg_data):
    from coreecg.data.sources import get_source

    return get_source("ptbxl", label_view="single", rate=500).list_records(ecg_data / "ptbxl")[:N_RECORDS]


@pytest.fixture(scope="module")
def corpus(ecg_data, ptbxl_refs, tmp_path_factory) -> Path:
    """The single-label PTB-XL corpus of the first records, built by coreecg.data.pipeline."""
    import ray.data

    from coreecg.data.pipeline import build_corpus

    out = tmp_path_factory.mktemp("predict-corpus") / "ptbxl"
    cfg = load_config(overrides=["data.shard_records=50"]).data
    with pytest.MonkeyPatch.context() as mp:          # no cluster: the shards run here, one by one
        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        build_corpus("ptbxl", ecg_data / "ptbxl", out, cfg, source_options=cfg.sources.for_source("ptbxl", 0),
                     refs=ptbxl_refs, log_warnings=False)
    return out


@pytest.fixture(scope="module")
def runs(corpus, tmp_path_factory) -> dict[str, Path]:
    """A pretraining run folder (encoder.pt) and linear fine-tunes on 12 and on the 6 limb leads."""
    from coreecg.data.reading import read_split
    from coreecg.train.finetuning import FinetuneTask, plan_finetune
    from coreecg.train.loop import run_local
    from coreecg.train.pretraining import pretrain_local

    tmp = tmp_path_factory.mktemp("predict-runs")
    train = read_split(corpus, "train", ["signal"], as_stored=True)["signal"]
    pre = load_config(overrides=[*SMALL, "optim.batch_size=8", "optim.epochs=1", "optim.warmup_epochs=0",
                                 "train.eval_every_epochs=0", "train.figures=false", "train.device=cpu",
                                 "train.checkpoint_every_steps=0", "train.variant=TinyCoRe"])
    pretrain_local(pre, train[:16], tmp / "pre")
    out = {"encoder": tmp / "pre"}
    for name, leads in (("ft12", STANDARD_LEADS), ("ft6", LIMB)):
        cfg = load_config(overrides=[
            *SMALL, f"data.corpus={corpus}", f"finetune.encoder={tmp / 'pre' / 'encoder.pt'}", "finetune.mode=linear",
            f"finetune.leads=[{','.join(leads)}]", "finetune.epochs=1", "finetune.batch_size=16",
            "finetune.linear_lr=0.05",
            "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0", "train.num_workers=1",
            "train.device=cpu", "train.checkpoint_every_steps=0", f"train.storage_path={tmp}", f"train.name={name}"])
        plan = plan_finetune(cfg)
        run_local(plan, FinetuneTask(plan, torch.device("cpu")), train)
        out[name] = plan.run_dir
    return out


@pytest.fixture(autouse=True)
def _console_restored(monkeypatch):
    """The job's main() turns the console on (a stdout handler, env for Ray): undone after each test."""
    logger = logging.getLogger("coreecg")
    handlers, level = list(logger.handlers), logger.level
    monkeypatch.setenv("COREECG_VERBOSE", "0")
    monkeypatch.setenv("RAY_DEDUP_LOGS", "1")
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


def _job():
    """jobs/predict.py as a module (jobs/ is not on sys.path under pytest)."""
    spec = importlib.util.spec_from_file_location("predict_job", REPO / "jobs" / "predict.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(path: Path, key: str = "record_id") -> dict[str, dict[str, str]]:
    with open(path, newline="") as f:
        return {row[key]: row for row in csv.DictReader(f)}


def _probs(rows: dict[str, dict[str, str]], ids, classes) -> np.ndarray:
    return np.array([[float(rows[i][f"p_{c}"]) for c in classes] for i in ids])


def _write_record(src: Path, out_dir: Path, name: str, leads: list[str] | None = None,
                  spelled: list[str] | None = None) -> Path:
    """A real record re-written with wfdb (same digital samples, gains, baselines): `leads` (the
    source's leads, any case, in this order; default all), named `spelled` in the new header."""
    import wfdb

    rec = wfdb.rdrecord(str(src), physical=False)
    names = [x.lower() for x in rec.sig_name]
    idx = [names.index(x.lower()) for x in (leads or rec.sig_name)]
    wfdb.wrsamp(name, fs=rec.fs, units=[rec.units[i] for i in idx], sig_name=spelled or [rec.sig_name[i] for i in idx],
                d_signal=rec.d_signal[:, idx], fmt=[rec.fmt[i] for i in idx], adc_gain=[rec.adc_gain[i] for i in idx],
                baseline=[rec.baseline[i] for i in idx], write_dir=str(out_dir))
    return out_dir / name


# ---------------------------------------------------------------------------- (a) the headline


def test_predicting_the_raw_test_records_reproduces_the_runs_predictions_csv(runs, ptbxl_refs, tmp_path, ecg_data):
    run = runs["ft12"]
    saved = _table(run / "predictions.csv")
    classes = [c[2:] for c in next(iter(saved.values())) if c.startswith("p_")]
    path_of = {r.record_id: r.path for r in ptbxl_refs}
    files = [path_of[i] + ".hea" for i in saved]             # the raw records, as plain WFDB files
    assert _job().main(["--model", str(run), "--input", *files, "--output", str(tmp_path)]) == 0
    assert not (tmp_path / "failed.csv").exists()
    with open(tmp_path / "predictions.csv", newline="") as f:
        header = next(csv.reader(f))
    assert header == ["record_id", "path", *(f"p_{c}" for c in classes)]
    got = _table(tmp_path / "predictions.csv", key="path")
    assert len(got) == len(saved) >= 5
    want = _probs(saved, saved, classes)
    pred = _probs(got, [path_of[i] for i in saved], classes)
    np.testing.assert_allclose(pred, want, atol=1e-5, rtol=0)
    assert np.allclose(pred.sum(1), 1.0, atol=1e-6)                       # single-label: softmax
    assert want.std(axis=0).max() > 1e-3, "records score alike: the comparison would prove nothing"


# ---------------------------------------------------------------------------- (b) failures


def test_bad_records_are_listed_with_their_reason_and_the_rest_are_written(runs, ptbxl_refs, tmp_path, capsys):
    bad = tmp_path / "in"
    bad.mkdir()
    src = Path(ptbxl_refs[0].path)
    _write_record(src, bad, "nodata")
    (bad / "nodata.dat").unlink()                                         # header naming a missing .dat
    _write_record(src, bad, "short")
    with open(bad / "short.dat", "r+b") as f:                             # cut mid-record
        f.truncate(5000)
    (bad / "orphan.mat").write_bytes(b"\0" * 64)                          # data file without header
    good = [ptbxl_refs[1].path + ".hea", ptbxl_refs[2].path + ".hea"]
    out = tmp_path / "out"
    job = subprocess.run([sys.executable, "jobs/predict.py", "--model", str(runs["ft12"] / "best.pt"), "--input",
                          str(bad), *good, str(tmp_path / "absent"), "--output", str(out), "--device", "cpu"],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert job.returncode == 1, job.stderr
    failed = _table(out / "failed.csv")
    assert set(failed) == {"nodata", "short", "orphan.mat", str(tmp_path / "absent")}
    assert failed["nodata"]["reason"] == "missing data file: nodata.dat"
    assert failed["short"]["reason"].startswith("truncated data file: short.dat has 5000 bytes")
    assert failed["orphan.mat"]["reason"].startswith("no header")
    assert failed[str(tmp_path / "absent")]["reason"] == "no such file or folder"
    for row in failed.values():                                           # the console names each
        assert f"failed: {row['record_id']} ({row['path']}): {row['reason']}" in job.stderr
    written = _table(out / "predictions.csv", key="path")
    assert sorted(written) == sorted(p[:-4] for p in good)
    assert all(0 < float(v) < 1 for row in written.values() for k, v in row.items() if k.startswith("p_"))

    # Nothing readable at all: exit 2, and the reasons are still written.
    assert _job().main(["--model", str(runs["ft12"]), "--input", str(bad / "nodata.hea"), "--output",
                        str(tmp_path / "none")]) == 2
    assert "error: no readable input" in capsys.readouterr().err
    assert set(_table(tmp_path / "none" / "failed.csv")) == {"nodata"}
    assert not (tmp_path / "none" / "predictions.csv").exists()


# ---------------------------------------------------------------------------- (c) lead subsets


def test_a_six_lead_model_takes_its_leads_by_name(runs, ecg_data, ptbxl_refs, tmp_path):
    from coreecg.hub import load_model
    from coreecg.inference import input_spec, list_inputs, run_inference

    six, twelve = load_model(runs["ft6"]), load_model(runs["ft12"])
    spec = input_spec(six)
    assert spec.leads == LIMB and spec.preprocess.leads == LIMB and spec.crop == 1500 and spec.n_crops == 3

    # The PTB-XL folder goes through its own reader (the corpus's record ids); the run's test records
    # score as its predictions.csv, whose windows were picked from the 12 stored rows by position.
    saved = _table(runs["ft6"] / "predictions.csv")
    items, failures = list_inputs([ecg_data / "ptbxl"], six.config)
    assert not failures and len(items) == 250 and {it.ref.source for it in items} == {"ptbxl"}
    result = run_inference(six, [it for it in items if it.record_id in saved])
    np.testing.assert_allclose(result.probs, _probs(saved, result.record_id, spec.class_names), atol=1e-5, rtol=0)

    # One record as a file of only the 6 limb leads, in another order and spelling: the same scores.
    src = Path(ptbxl_refs[0].path)
    order = ["aVF", "III", "aVL", "I", "aVR", "II"]
    limb = _write_record(src, tmp_path, "limb", order, ["AVF", "iii", "avl", "I", "AVR", "ii"])
    full_items, _ = list_inputs([str(src) + ".hea", str(limb) + ".hea"], six.config)
    by_six = run_inference(six, full_items)
    assert by_six.record_id == [src.name, "limb"] and not by_six.failures
    np.testing.assert_allclose(by_six.probs[1], by_six.probs[0], atol=1e-6, rtol=0)
    # The 12-lead model cannot score it, and says which leads are missing; the full record goes on.
    by_twelve = run_inference(twelve, full_items)
    assert by_twelve.record_id == [src.name]
    assert [f.record_id for f in by_twelve.failures] == ["limb"]
    assert by_twelve.failures[0].reason.startswith("missing lead(s) V1, V2, V3, V4, V5, V6")


# ---------------------------------------------------------------------------- (d) embeddings


def test_an_encoder_writes_one_embedding_per_record(runs, ecg_data, tmp_path):
    import pyarrow.parquet as pq

    from coreecg.data.preprocess import preprocess_record
    from coreecg.hub import load_model
    from coreecg.inference import input_spec, list_inputs

    cpsc = ecg_data / "cpsc2018-cinc2020"
    files = [str(cpsc / f"{r}.hea") for r in ("A0002", "A0005", "A0011")]    # 10, 25 and 36 s: 1, 2, 3 windows
    assert _job().main(["--model", str(runs["encoder"]), "--input", *files, "--output", str(tmp_path / "e")]) == 0
    table = pq.read_table(tmp_path / "e" / "embeddings.parquet")
    assert table.column_names == ["record_id", "path", "embedding"]
    assert table.column("record_id").to_pylist() == ["A0002", "A0005", "A0011"]
    emb = np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)
    loaded = load_model(runs["encoder"])
    assert loaded.kind == "encoder" and emb.shape == (3, loaded.config.encoders.coreecg.embed_dim) == (3, 32)

    # The oracle: mean over the record's windows of the mean over 3 crops of Encoder.pooled.
    spec = input_spec(loaded)
    items, _ = list_inputs(files[2:], loaded.config)
    w = preprocess_record(items[0].source.read(items[0].ref), spec.preprocess).astype(np.float16)
    assert len(w) == 3
    x = torch.from_numpy(w).float()
    with torch.no_grad():
        crops = [loaded.model.pooled(x[..., o:o + 1500]) for o in (0, 500, 1000)]
    np.testing.assert_allclose(emb[2], torch.stack(crops).mean(0).mean(0).numpy(), atol=1e-5, rtol=0)

    # A linear probe's classifier keeps the pretrained encoder: --embeddings gives the same vectors.
    assert _job().main(["--model", str(runs["ft12"]), "--input", *files, "--output",
                        str(tmp_path / "c" / "emb.parquet"), "--embeddings", "--batch-size", "2"]) == 0
    again = np.asarray(pq.read_table(tmp_path / "c" / "emb.parquet").column("embedding").to_pylist())
    np.testing.assert_allclose(again, emb, atol=1e-5, rtol=0)
