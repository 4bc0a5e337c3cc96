"""Inference at corpus scale (coreecg.inference.distributed, jobs/predict.py --workers): Ray Data actors
give one process's outputs bit for bit, on raw records and on a Parquet corpus, and a record
that fails in an actor is a failed.csv row, not a crash.

Tiny random models (tests.helpers.tiny_models) on real records from ../shared/ecg-data; the
actors run on the session's Ray cluster (conftest.ray_session).
"""
from __future__ import annotations

import csv
import dataclasses
import importlib.util
import logging
from pathlib import Path

import numpy as np
import pytest

from coreecg.config import load_config
from tests.helpers import InProcessDataset, tiny_models

REPO = Path(__file__).resolve().parents[1]
CPSC = [f"A{i:04d}" for i in range(1, 13)]      # 500 Hz, 6-60 s: 1 to several windows each


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return tiny_models(tmp_path_factory.mktemp("scale-models"))


@pytest.fixture(scope="module")
def raw_inputs(ecg_data, tmp_path_factory) -> list[str]:
    """12 CPSC records, a header whose data file is missing, a path that does not exist."""
    import wfdb

    bad = tmp_path_factory.mktemp("scale-bad")
    rec = wfdb.rdrecord(str(ecg_data / "cpsc2018-cinc2020" / "A0001"), physical=False)
    wfdb.wrsamp("nodata", fs=rec.fs, units=rec.units, sig_name=rec.sig_name, d_signal=rec.d_signal, fmt=rec.fmt,
                adc_gain=rec.adc_gain, baseline=rec.baseline, write_dir=str(bad))
    (bad / "nodata.dat").unlink()
    files = [str(ecg_data / "cpsc2018-cinc2020" / f"{r}.hea") for r in CPSC]
    return [*files[:5], str(bad / "nodata.hea"), *files[5:], str(bad / "absent.hea")]


@pytest.fixture(scope="module")
def corpus(ecg_data, tmp_path_factory) -> Path:
    """The first 12 PTB-XL records as a corpus (the real pipeline, its map run in-process), in
    shards of 4 records: several shards per split."""
    import ray.data

    from coreecg.data.pipeline import build_corpus
    from coreecg.data.sources import get_source

    refs = get_source("ptbxl", label_view="single", rate=500).list_records(ecg_data / "ptbxl")[:12]
    out = tmp_path_factory.mktemp("scale-corpus") / "ptbxl"
    cfg = load_config(overrides=["data.shard_records=4"]).data
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        build_corpus("ptbxl", ecg_data / "ptbxl", out, cfg, source_options=cfg.sources.for_source("ptbxl", 0),
                     refs=refs, log_warnings=False)
    return out


def _same(a, b) -> None:
    """Two InferenceResults equal bit for bit, listing order and failures included."""
    assert a.record_id == b.record_id and a.path == b.path and a.failures == b.failures
    np.testing.assert_array_equal(a.windows, b.windows)
    np.testing.assert_array_equal(a.item, b.item)
    for x, y in ((a.probs, b.probs), (a.embeddings, b.embeddings)):
        assert (x is None) == (y is None)
        if x is not None:
            assert x.dtype == y.dtype and x.tobytes() == y.tobytes()


def test_ray_data_inference_equals_one_process(ray_session, models, raw_inputs, corpus, tmp_path):
    import pyarrow.parquet as pq

    from coreecg.hub import load_model
    from coreecg.inference import Failure, list_inputs, run_inference
    from coreecg.inference.distributed import run_inference_ray

    loaded = load_model(models["classifier"])
    items, failures = list_inputs([*raw_inputs, corpus], loaded.config)    # raw records and corpus shards
    # a shard without rows (coreecg writes none: a damaged or foreign file) fails alike in both
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(items[-1].path).slice(0, 0), str(empty))
    items.insert(len(raw_inputs), dataclasses.replace(items[-1], path=str(empty)))
    one = run_inference(loaded, items, embeddings=True, failures=failures)
    # 2 actors, each task one item: other records share each forward pass than in one process
    many = run_inference_ray(loaded, items, workers=2, embeddings=True, failures=failures)
    _same(many, one)
    assert one.record_id[:12] == CPSC and one.windows.max() > 1 and len(one.record_id) > 12
    assert [f.record_id for f in one.failures] == [raw_inputs[-1], "nodata", str(empty)]
    assert one.failures[1].reason == "missing data file: nodata.dat"
    assert one.failures[2] == Failure(str(empty), str(empty), "empty shard: no records")
    assert one.probs.std(axis=0).max() > 1e-3, "records score alike: the comparison would prove nothing"
    none = run_inference_ray(loaded, [], workers=2, embeddings=True, failures=failures)     # nothing listed
    _same(none, run_inference(loaded, [], embeddings=True, failures=failures))
    assert none.probs.shape == (0, one.probs.shape[1]) and none.failures == list(failures)


def test_ray_actors_score_in_the_precision_asked_for(ray_session, models, raw_inputs):
    """The precision paths on the actors: int8 (no units needed, so the actors' processor says
    nothing) as in one process, within its bound (its activation scale is per pass: other records
    share an actor's passes), and unlike fp32; a path the processor cannot take refused before any
    actor starts (the suite runs as a processor without bf16 units: tests/conftest.py)."""
    from coreecg.hub import load_model
    from coreecg.inference import InferenceError, list_inputs, run_inference
    from coreecg.inference.distributed import run_inference_ray

    loaded = load_model(models["classifier"])
    # its random head's large logits move by up to ~0.02 under int8: a looser bound for this test
    loaded.config = dataclasses.replace(loaded.config, inference=dataclasses.replace(
        loaded.config.inference, max_probability_diff=0.1))
    items, failures = list_inputs(raw_inputs[:5], loaded.config)
    one = run_inference(loaded, items, precision="int8")
    many = run_inference_ray(loaded, items, workers=2, precision="int8", records_per_task=2)
    fp32 = run_inference(loaded, items, precision="fp32")
    assert many.precision == "int8" and many.record_id == one.record_id
    assert np.abs(many.probs - one.probs).max() <= loaded.config.inference.max_probability_diff
    assert np.abs(many.probs - fp32.probs).max() > 0
    with pytest.raises(InferenceError, match="no bf16 matrix units"):
        run_inference_ray(loaded, items, workers=2, precision="bf16")


def test_a_corpus_scores_from_its_stored_windows_as_its_raw_records(models, corpus, ecg_data):
    from coreecg.data.reading import read_split, splits_of
    from coreecg.data.sources import get_source
    from coreecg.hub import load_model
    from coreecg.inference import InputRecord, list_inputs, run_inference

    loaded = load_model(models["encoder"])
    items, failures = list_inputs([corpus], loaded.config)
    assert not failures and len(items) >= 3
    one = run_inference(loaded, items)
    # every record of every split, once, with its windows
    ids = [r for s in splits_of(corpus) for r in dict.fromkeys(read_split(corpus, s, ["record_id"])["record_id"])]
    assert sorted(one.record_id) == sorted(ids) and len(set(one.record_id)) == len(ids)
    # a stored record's embedding is the one of its raw file (the corpus holds the same windows)
    src = get_source("ptbxl", label_view="none", rate=500)
    refs = {r.record_id: r for r in src.list_records(ecg_data / "ptbxl")}
    raw = run_inference(loaded, [InputRecord(refs[r], src) for r in one.record_id])
    assert raw.embeddings.tobytes() == one.embeddings.tobytes()
    # --split narrows it; a corpus made with other settings is refused, naming the shard
    test_items, _ = list_inputs([corpus], loaded.config, splits=["test"])
    assert {it.split for it in test_items} == {"test"} and len(test_items) < len(items)
    other = dataclasses.replace(test_items[0], preprocess=(("sampling_rate", 500),))
    bad = run_inference(loaded, [other])
    assert not bad.record_id and bad.failures[0].path == other.path
    assert bad.failures[0].reason.startswith("corpus preprocessed otherwise than the model's input: sampling_rate 500")


def _job():
    spec = importlib.util.spec_from_file_location("predict_job", REPO / "jobs" / "predict.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_job_with_workers_writes_what_one_process_writes(ray_session, models, raw_inputs, tmp_path, monkeypatch,
                                                              capsys):
    import ray.data

    logger = logging.getLogger("coreecg")                # main() turns the console on: undone after
    monkeypatch.setattr(logger, "handlers", list(logger.handlers))
    monkeypatch.setenv("COREECG_VERBOSE", "0")
    pools, blocks = [], []                                # what the job asked Ray Data for
    monkeypatch.setattr(ray.data, "ActorPoolStrategy",
                        lambda real=ray.data.ActorPoolStrategy, **kw: pools.append(kw["size"]) or real(**kw))
    monkeypatch.setattr(ray.data, "from_items",
                        lambda rows, real=ray.data.from_items, **kw: blocks.append(kw["override_num_blocks"])
                        or real(rows, **kw))
    job = _job()
    base = ["--model", str(models["classifier"]), "--input", *raw_inputs, "--device", "cpu"]
    assert job.main([*base, "--output", str(tmp_path / "one")]) == 1            # some failed
    # 14 inputs in tasks of 3: 5 tasks over 2 actors, each forward pass shared otherwise than in one process
    assert job.main([*base, "--output", str(tmp_path / "two"), "--workers", "2", "--records-per-task", "3"]) == 1
    assert pools == [2] and blocks == [5]
    for name in ("predictions.csv", "failed.csv"):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()
    with open(tmp_path / "two" / "failed.csv", newline="") as f:
        assert {row["record_id"] for row in csv.DictReader(f)} == {"nodata", raw_inputs[-1]}
    assert job.main([*base, "--output", str(tmp_path / "x"), "--workers", "-1"]) == 2
    assert job.main([*base, "--output", str(tmp_path / "x"), "--workers", "2", "--records-per-task", "0"]) == 2
    not_corpus = str(Path(raw_inputs[0]).parent)
    assert job.main(["--model", str(models["classifier"]), "--corpus", not_corpus,
                     "--output", str(tmp_path / "x")]) == 2
    assert "not a coreecg corpus (no manifest.json)" in capsys.readouterr().err


def test_cuda_workers_need_a_gpu_each(monkeypatch, models, raw_inputs):
    """An actor pool larger than the cluster's GPUs would wait forever: refused before any actor
    starts, naming both counts and the fix, on a private cluster and on a joined one alike
    (--workers is cheap to lower)."""
    import ray
    import ray.data

    import coreecg.cluster as cluster
    from coreecg.hub import load_model
    from coreecg.inference import list_inputs
    from coreecg.inference.distributed import run_inference_ray

    loaded = load_model(models["classifier"])
    items, _ = list_inputs(raw_inputs, loaded.config)
    assert len(items) >= 4
    monkeypatch.setattr(ray.data, "from_items", lambda *a, **k: pytest.fail("an actor pool was started"))
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16.0, "GPU": 2.0})
    for private in (True, False):
        monkeypatch.setattr(cluster, "_PRIVATE", private)
        with pytest.raises(cluster.ClusterError, match=r"--device cuda with 4 workers \(one GPU each\) asks for "
                                                       r"4 GPU\(s\) and the Ray cluster has 2: .*lower --workers"):
            run_inference_ray(loaded, items, workers=4, device="cuda", records_per_task=1)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16.0})
    with pytest.raises(cluster.ClusterError, match="1 workers .* the Ray cluster has 0"):
        run_inference_ray(loaded, items, workers=1, device="cuda")
    # enough GPUs: no refusal, the pool is built (here: the stand-in above fails instead)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 16.0, "GPU": 4.0})
    with pytest.raises(pytest.fail.Exception, match="an actor pool was started"):
        run_inference_ray(loaded, items, workers=4, device="cuda", records_per_task=1)
