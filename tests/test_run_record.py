"""What a run leaves behind besides its weights: run.json (command, commit, versions, host,
times), progress records within an epoch, epochs counted from 1, TensorBoard HParams, the
MLflow run (a real local file store) and the pretraining leaderboard."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from coreecg.eval.leaderboard import find_pretraining_runs, leaderboard_rows, write_leaderboard
from coreecg.train import console, loop
from coreecg.train.pretraining import pretrain_local
from coreecg.run_record import COMMAND_ENV, hparams, sessions, wall_seconds
from tests.helpers import crash_on_save, tiny_config

REPO = Path(__file__).resolve().parents[1]


def _windows(n: int = 16) -> np.ndarray:
    return np.random.default_rng(0).standard_normal((n, 12, 2500)).astype(np.float32)


def _lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A tiny no-Ray pretraining with MLflow tracking into a file store, and progress every step."""
    root = tmp_path_factory.mktemp("tracked")
    store = root / "mlruns"
    cfg = tiny_config("optim.batch_size=8", "optim.epochs=2", "optim.warmup_epochs=1", "train.eval_every_epochs=0",
                      "train.progress_every_s=1e-9", "train.tracking=mlflow", f"train.tracking_uri={store.as_uri()}",
                      "train.tracking_experiment=tests", f"train.storage_path={root}", "train.name=tracked")
    command = os.environ.get(COMMAND_ENV)
    os.environ[COMMAND_ENV] = "coreecg-pretrain --set a.b=c"          # what coreecg.cli sets for a job
    try:
        summary = pretrain_local(cfg, _windows(32), root / "tracked")     # 4 steps per epoch
    finally:
        os.environ.pop(COMMAND_ENV) if command is None else os.environ.update({COMMAND_ENV: command})
    return cfg, root / "tracked", store, summary


def test_run_json_records_the_session(tracked_run):
    _, run, _, _ = tracked_run
    (s,) = sessions(run)
    assert s["status"] == "completed" and s["ended"] >= s["started"]
    assert s["command"] == "coreecg-pretrain --set a.b=c" and s["cwd"] == os.getcwd()
    assert {"coreecg", "torch", "ray", "numpy", "python"} <= set(s["versions"])
    assert s["host"]["cpus"] >= 1 and s["host"]["name"]
    assert s["git"] is None or len(s["git"]["commit"]) == 40          # a checkout: its commit
    assert wall_seconds(run) >= 0


def test_a_resumed_run_adds_a_session_and_a_killed_one_stays_running(tmp_path, monkeypatch):
    cfg = tiny_config("optim.batch_size=8", "optim.epochs=2", "train.eval_every_epochs=0",
                      "train.checkpoint_every_steps=1")
    real_save = loop.save_step
    crash_on_save(monkeypatch, 1, "simulated kill")
    with pytest.raises(KeyboardInterrupt):
        pretrain_local(cfg, _windows(), tmp_path / "r")
    assert [s["status"] for s in sessions(tmp_path / "r")] == ["running"]     # killed: never ended
    monkeypatch.setattr(loop, "save_step", real_save)
    pretrain_local(cfg, _windows(), tmp_path / "r")
    assert [s["status"] for s in sessions(tmp_path / "r")] == ["running", "completed"]


def test_epochs_count_from_one_and_progress_lines_say_where_the_run_is(tracked_run):
    cfg, run, _, summary = tracked_run
    lines = _lines(run)
    epochs = [x for x in lines if x.get("kind") == "epoch"]
    assert [x["epoch"] for x in epochs] == [1, 2] and summary["epoch"] == 2
    assert {x["epoch"] for x in lines if x.get("kind") == "step"} <= {1, 2}
    progress = [x for x in lines if x.get("kind") == "progress"]
    spe = epochs[0]["step"]
    assert progress and all(1 <= p["batch"] < p["batches"] == spe and p["epochs"] == 2 for p in progress)
    assert all(p["samples_per_s"] > 0 and 0 <= p["eta_epoch_s"] <= p["eta_run_s"] for p in progress)
    last_of_run = [p for p in progress if p["epoch"] == 2][-1]
    assert last_of_run["eta_run_s"] == pytest.approx(last_of_run["eta_epoch_s"])   # nothing after epoch 2
    assert console.progress_text(progress[0]).startswith(f"  epoch {progress[0]['epoch']}/2 | batch ")
    assert console.progress_line(epochs[0], 2).startswith("epoch 1/2 | step ")


def _events(folder: Path) -> list:
    """Every Event of a TensorBoard folder's event files (TFRecord framing: length, crc, data, crc)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out = []
    for path in sorted(folder.rglob("events.out.tfevents*")):
        data, i = path.read_bytes(), 0
        while i < len(data):
            (n,) = struct.unpack("<Q", data[i:i + 8])
            out.append(Event.FromString(data[i + 12:i + 12 + n]))
            i += 12 + n + 4
    return out


def test_tensorboard_hparams_hold_the_knobs_and_final_metrics(tracked_run):
    cfg, run, _, summary = tracked_run
    values = [v for e in _events(run / "tensorboard" / "hparams") for v in e.summary.value]
    plugin = [v for v in values if v.metadata.plugin_data.plugin_name == "hparams"]
    assert plugin, "no HParams summary"
    scalars = {v.tag: v.simple_value for v in values if v.HasField("simple_value")}
    assert scalars["hparam/loss_rec"] == pytest.approx(summary["loss_rec"], rel=1e-5)
    assert "hparam/loss_con" in scalars
    knobs = b"".join(v.metadata.plugin_data.content for v in plugin)
    assert b"optim.lr" in knobs and b"methods.core.masking.p_time" in knobs
    assert hparams(cfg)["optim.lr"] == cfg.optim.lr
    assert hparams(cfg)["methods.core.masking.p_time"] == cfg.methods.core.masking.p_time


def test_mlflow_run_holds_the_params_and_every_epoch(tracked_run):
    mlflow = pytest.importorskip("mlflow")
    cfg, run, store, summary = tracked_run
    client = mlflow.tracking.MlflowClient(tracking_uri=store.as_uri())
    exp = client.get_experiment_by_name("tests")
    (mrun,) = client.search_runs([exp.experiment_id])
    assert mrun.info.run_name == "tracked" and mrun.data.tags["coreecg.run_dir"] == str(run)
    params = mrun.data.params
    assert float(params["optim.lr"]) == cfg.optim.lr and params["pretrain.method"] == "core"
    assert int(params["encoders.coreecg.embed_dim"]) == 32
    history = client.get_metric_history(mrun.info.run_id, "loss_rec")
    epochs = [x for x in _lines(run) if x.get("kind") == "epoch"]
    assert [h.step for h in history] == [e["step"] for e in epochs]
    assert [h.value for h in history] == pytest.approx([e["loss_rec"] for e in epochs])
    assert mrun.info.status == "FINISHED"


def test_leaderboard_ranks_pretraining_runs_and_skips_finetuning_ones(tracked_run, tmp_path):
    _, run, _, summary = tracked_run
    # a second run with a probe, and a fine-tuning-like folder that must not be listed
    probe_run = tmp_path / "probe"
    probe_run.mkdir()
    (probe_run / "config.yaml").write_text((run / "config.yaml").read_text())
    (probe_run / "metrics.jsonl").write_text(
        json.dumps({"event": "probe_init", "probe_auroc": 0.8}) + "\n"
        + json.dumps({"kind": "epoch", "epoch": 2, "step": 4, "loss": 3.0, "probe_auroc": 0.9, "seconds": 1.5}) + "\n")
    ft = tmp_path / "ft"
    ft.mkdir()
    for name in ("config.yaml", "metrics.jsonl"):
        (ft / name).write_text((run / name).read_text())
    (ft / "metrics.json").write_text("{}")
    folders = [run, *find_pretraining_runs(tmp_path)]
    assert ft not in folders
    rows = leaderboard_rows(folders)
    assert [r["run"] for r in rows] == ["probe", "tracked"]                 # the probe ranks first
    assert rows[0]["probe_gain"] == pytest.approx(0.1) and rows[0]["wall_s"] == 1.5
    assert rows[1]["status"] == "completed" and rows[1]["loss_rec"] == pytest.approx(summary["loss_rec"])
    assert rows[1]["epochs"] == "2/2" and math.isnan(rows[1]["probe_auroc"])
    csv_path, md = write_leaderboard(rows, tmp_path / "board")
    assert md.read_text().count("\n| ") == 2 + 1                           # header + two rows
    assert str(run.resolve()) in md.read_text()                             # the run folder is shown
    done = subprocess.run([sys.executable, "jobs/leaderboard.py", str(tmp_path), "--output", str(tmp_path / "b2")],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and (tmp_path / "b2" / "leaderboard.csv").is_file(), done.stderr
    empty = subprocess.run([sys.executable, "jobs/leaderboard.py", str(tmp_path / "board")], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and "no pretraining run" in empty.stderr
