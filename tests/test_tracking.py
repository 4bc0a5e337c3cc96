"""Tracking everywhere (coreecg.train.tracking): a single run logs to Weights & Biases offline
(its params, every epoch, its group and kind, no network), and every trial of a two-trial sweep
is one tracked run grouped under the sweep, in MLflow (a file store) and in W&B (offline).
A single run in an MLflow file store is tested in test_run_record.py."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coreecg.config import load_config
from coreecg.train.plan import PlanError, preflight
from coreecg.train.tracking import track_trials
from tests.helpers import TINY, tiny_config

REPO = Path(__file__).resolve().parents[1]


def _epochs(run: Path) -> list[dict]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if x.get("kind") == "epoch"]


def _wandb_records(run: Path) -> dict[str, list]:
    """The records of the run folder's one offline W&B run, by kind (its .wandb file: a
    LevelDB-style log of protobuf Records in 32 KiB blocks, each chunk behind a 7-byte header
    of checksum, length and type; the file opens with a 7-byte ':W&B' header)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run.glob("wandb/offline-run-*/run-*.wandb")
    data, block, pos, part = path.read_bytes(), 32768, 7, b""
    assert data[:4] == b":W&B"
    out: dict[str, list] = {}
    while pos + 7 <= len(data):
        room = block - pos % block
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if room < 7 or kind == 0:                 # a block's zero padding
            pos += room
            continue
        part, pos = part + data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):                        # a full record, or a record's last chunk
            record = pb.Record()
            record.ParseFromString(part)
            kind = record.WhichOneof("record_type")
            out.setdefault(kind, []).append(getattr(record, kind))
            part = b""
    return out


def _items(items) -> dict:
    """A W&B record's items as key -> value (a key is `key` or a path in `nested_key`)."""
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items}


def _history(records: dict[str, list], key: str) -> list[tuple[int, float]]:
    rows = [_items(r.item) for r in records.get("history", [])]
    return [(r["_step"], r[key]) for r in rows if key in r]


def _config(records: dict[str, list]) -> dict:
    (run,) = records["run"]
    return _items(run.config.update)


@pytest.fixture(autouse=True)
def _no_api_key(monkeypatch):
    """Offline W&B needs no key (online without one would fail at wandb.init); a WANDB_MODE or
    WANDB_DIR of the machine running the tests must not decide where runs go."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)


def test_a_single_run_logs_its_params_and_every_epoch_to_wandb_offline(tmp_path):
    pytest.importorskip("wandb")
    from coreecg.train.pretraining import pretrain_local

    cfg = tiny_config("optim.batch_size=8", "optim.epochs=2", "optim.warmup_epochs=1", "train.eval_every_epochs=0",
                      "train.tracking=wandb", "train.tracking_experiment=tests", f"train.storage_path={tmp_path}")
    windows = np.random.default_rng(0).standard_normal((32, 12, 2500)).astype(np.float32)
    pretrain_local(cfg, windows, tmp_path / "tracked")                # 4 steps per epoch
    records = _wandb_records(tmp_path / "tracked")
    (run,) = records["run"]
    assert run.display_name == "tracked" and run.project == "tests" and run.job_type == "pretrain"
    assert run.run_group == "" and run.notes == str(tmp_path / "tracked")
    epochs = _epochs(tmp_path / "tracked")
    assert _history(records, "loss_rec") == [(e["step"], pytest.approx(e["loss_rec"])) for e in epochs]
    config = _config(records)
    assert config["optim.lr"] == cfg.optim.lr and config["encoders.coreecg.embed_dim"] == 32
    assert "exit" in records and "WANDB_MODE" not in os.environ        # finished; the process keeps no mode


def test_trials_get_the_group_and_one_mlflow_store_and_a_missing_backend_is_refused(tmp_path, monkeypatch):
    assert track_trials(load_config(), tmp_path, "g") == []
    assert track_trials(load_config(overrides=["train.tracking=wandb"]), tmp_path, "g") == ["train.tracking_group=g"]
    mlflow = pytest.importorskip("mlflow")
    cfg = load_config(overrides=["train.tracking=mlflow", "train.tracking_experiment=e"])
    for _ in range(2):                                 # idempotent: a study's phases both call it
        assert track_trials(cfg, tmp_path, "g") == ["train.tracking_group=g",
                                                     f"train.tracking_uri={(tmp_path / 'mlruns').as_uri()}"]
    client = mlflow.tracking.MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    assert len(client.search_experiments(filter_string="name = 'e'")) == 1
    given = load_config(overrides=["train.tracking=mlflow", f"train.tracking_uri={(tmp_path / 'x').as_uri()}"])
    assert track_trials(given, tmp_path, "g")[1] == f"train.tracking_uri={(tmp_path / 'x').as_uri()}"
    with pytest.raises(PlanError, match=r"train.tracking_uri=file:///x: W&B logs to a server"):
        preflight(tmp_path / "run", load_config(overrides=["train.tracking=wandb", "train.tracking_uri=file:///x"]))
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(PlanError, match=r"train.tracking=wandb needs Weights & Biases.*coreecg\[wandb\]"):
        preflight(tmp_path / "run", load_config(overrides=["train.tracking=wandb"]))
    with pytest.raises(RuntimeError, match=r"train.tracking=wandb needs Weights & Biases.*coreecg\[wandb\]"):
        track_trials(load_config(overrides=["train.tracking=wandb"]), tmp_path, "g")     # before any trial


def test_a_study_phase_gives_every_run_the_tracking_group(tmp_path, monkeypatch):
    from coreecg.study import runner

    seen = {}
    monkeypatch.setattr(runner, "run_trials", lambda space, **kw: seen.update(space=space) or [])
    runs = [(name, ["train.tracking=wandb"]) for name in ("a", "b")]
    runner.run_phase(tmp_path / "out", "finetune", None, runs, concurrency=1, group="my-study")
    specs = seen["space"]["run"]["grid_search"]
    assert [s["overrides"] for s in specs] == [("train.tracking=wandb", "train.tracking_group=my-study")] * 2
    runner.run_phase(tmp_path / "out", "finetune", None, runs[:1], concurrency=1)          # default: the folder
    assert seen["space"]["run"]["grid_search"][0]["overrides"][-1] == "train.tracking_group=out"


def test_the_training_and_trial_code_imports_no_tracking_library():
    code = ("import sys, coreecg.train.loop, coreecg.train.tracking, coreecg.train.fit, coreecg.tune.sweep, "
            "coreecg.study.runner; print(sorted({'wandb', 'mlflow'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "[]"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["mlflow", "wandb"])
def test_every_trial_of_a_sweep_is_one_tracked_run_in_the_sweeps_group(ray_session, tmp_path, backend):
    pytest.importorskip(backend)
    from ray import tune

    from coreecg.tune.sweep import SweepSettings, run_sweep

    out = tmp_path / "mask-sweep"
    sets = [*TINY, "data.synthetic_records=64", "data.probe_max_windows=32", "optim.epochs=1", "optim.batch_size=16",
            "train.num_workers=1",                     # each trial trains in its own process (no Train group)
            f"train.tracking={backend}", "train.tracking_experiment=tests"]
    grid = run_sweep(SweepSettings(output=out, config_file=None, base=sets, concurrency=2),
                     {"methods.core.masking.p_time": tune.grid_search([0.4, 0.6])})
    assert not grid.errors
    trials = sorted(p for p in (out / "trials").iterdir() if (p / "done.json").is_file())
    assert len(trials) == 2
    if backend == "mlflow":
        import mlflow

        client = mlflow.tracking.MlflowClient(tracking_uri=(out / "mlruns").as_uri())   # one store for the sweep
        runs = client.search_runs([client.get_experiment_by_name("tests").experiment_id])
        assert sorted(r.info.run_name for r in runs) == [t.name for t in trials]
        assert {r.data.tags["coreecg.group"] for r in runs} == {"mask-sweep"}
        assert {r.data.tags["coreecg.task"] for r in runs} == {"pretrain"}
        assert sorted(float(r.data.params["methods.core.masking.p_time"]) for r in runs) == [0.4, 0.6]
        for r in runs:
            (epoch,) = _epochs(Path(r.data.tags["coreecg.run_dir"]))
            (h,) = client.get_metric_history(r.info.run_id, "probe_auroc")
            assert (h.step, h.value) == (epoch["step"], pytest.approx(epoch["probe_auroc"]))
            assert r.info.status == "FINISHED"
    else:
        p_times = []
        for trial in trials:
            records = _wandb_records(trial)
            (run,) = records["run"]
            assert (run.display_name, run.run_group, run.job_type) == (trial.name, "mask-sweep", "pretrain")
            (epoch,) = _epochs(trial)
            assert _history(records, "probe_auroc") == [(epoch["step"], pytest.approx(epoch["probe_auroc"]))]
            p_times.append(_config(records)["methods.core.masking.p_time"])
        assert sorted(p_times) == [0.4, 0.6]
