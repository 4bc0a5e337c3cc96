"""Pretraining on Ray Train + Ray Data, end to end at tiny scale on the session's Ray cluster:
outputs, resume after a killed driver, ingest randomness, and the checkpoint errors that must
stop a run before it starts. Workers that die (a whole node of them) and the run going on from
its last checkpoint: tests/test_multinode.py."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import coreecg
from coreecg.config import load_config
from coreecg.data.pipeline import build_corpus
from coreecg.checkpoints import CheckpointError
from coreecg.train.fit import fit, plan_run
from coreecg.train.plan import preflight
from coreecg.train.ingest import crop_offsets, epoch_batches, to_model_input, training_dataset
from coreecg.checkpoints import CHECKPOINT_FILE, checkpoint_dirs
from tests.helpers import TINY, once_settled

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _config(tmp: Path, name: str, *extra: str):
    return load_config(overrides=[*TINY, "optim.batch_size=8", "optim.warmup_epochs=1", "optim.lr=1e-3",
                                  "train.num_workers=2", "train.use_gpu=false", f"train.storage_path={tmp}",
                                  f"train.name={name}", "train.log_every=1", *extra])


@pytest.fixture(scope="module")
def corpora(fresh_ray, ecg_data, tmp_path_factory):
    """The real MIMIC-IV-ECG-layout records (pretraining) and PTB-XL (probe), preprocessed here."""
    root = tmp_path_factory.mktemp("corpora")
    cfg = load_config(overrides=["data.shard_records=16"]).data
    build_corpus("mimic-iv-ecg", ecg_data / "mimic-iv-ecg-layout", root / "mimic", cfg)
    build_corpus("ptbxl", ecg_data / "ptbxl", root / "ptbxl", cfg,
                 source_options=cfg.sources.for_source("ptbxl", 0))
    return root


@pytest.fixture(scope="module")
def finished_run(corpora, tmp_path_factory):
    """One complete 2-worker pretraining on the real MIMIC-layout records, mirrored to a
    file:// "bucket" (train.mirror_uri)."""
    tmp = tmp_path_factory.mktemp("runs")
    cfg = _config(tmp, "mimic", *_FINISHED, f"data.corpus={corpora / 'mimic'}",
                  f"data.probe_corpus={corpora / 'ptbxl'}", f"train.mirror_uri={(tmp / 'bucket').as_uri()}")
    return cfg, fit(plan_run(cfg, "pretrain"))


_FINISHED = ("optim.epochs=3", "train.checkpoint_every_steps=4", "data.probe_max_windows=64")


def test_end_to_end_on_real_records(finished_run):
    cfg, result = finished_run
    run = result.run_dir
    epochs = [x for x in _lines(run) if x.get("kind") == "epoch"]
    steps = [x for x in _lines(run) if x.get("kind") == "step"]
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert epochs[-1]["loss"] < epochs[0]["loss"]                    # it learns
    for key in ("loss_rec", "loss_con", "lr", "ema_momentum", "grad_norm", "visible_frac", "masked_frac",
                "dropped_frac", "fda_rel_perturbation", "teacher_student_cos", "samples_per_s"):
        assert all(key in s for s in steps), key
    assert 0.0 <= epochs[-1]["probe_auroc"] <= 1.0 and "probe_auroc_init" in epochs[-1]
    assert result.metrics["step"] == epochs[-1]["step"] and "probe_auroc" in result.metrics
    assert (run / "config.yaml").read_text() == cfg.to_yaml()
    assert any(f.name.startswith("events.out.tfevents") for f in (run / "tensorboard").iterdir())
    assert (run / "figures" / "reconstruction_epoch2.png").stat().st_size > 10_000
    kept = checkpoint_dirs(run)
    assert 1 <= len(kept) <= cfg.train.keep_checkpoints
    assert (kept[-1] / f"{CHECKPOINT_FILE}.sha256").is_file()
    enc = coreecg.load_encoder(result.model)
    assert enc.pooled(torch.randn(2, 12, 2250)).shape == (2, 32)


def test_the_run_folder_is_mirrored_and_a_fresh_machine_pulls_it_to_resume(finished_run, tmp_path):
    cfg, result = finished_run
    run = result.run_dir
    mirror = run.parent / "bucket" / run.name
    local = {p.relative_to(run) for p in run.rglob("*") if p.is_file() and not p.name.startswith(".")}
    mirrored = {p.relative_to(mirror) for p in mirror.rglob("*") if p.is_file()}
    assert local == mirrored and Path("encoder.pt") in local                  # pruned checkpoints gone too
    assert all((mirror / f).read_bytes() == (run / f).read_bytes() for f in local)
    # A fresh machine: another storage path, the same name and mirror, one more epoch. plan_run()
    # pulls the mirror before it plans (stopped there: resuming a folder is tested above), and
    # the plan resumes the pulled run.
    import coreecg.train.fit as fit_module
    from coreecg.train.pretraining import plan_pretrain

    more = _config(tmp_path, "mimic", *_FINISHED[1:], "optim.epochs=4", *[
        f"{k}={v}" for k, v in (("data.corpus", cfg.data.corpus), ("data.probe_corpus", cfg.data.probe_corpus),
                                ("train.mirror_uri", cfg.train.mirror_uri))])

    class Planned(Exception):
        pass

    def plan_here(config):
        raise Planned([p.name for p in checkpoint_dirs(config.train.run_dir)])

    real_plan, fit_module.PLANNERS["pretrain"] = fit_module.PLANNERS["pretrain"], plan_here
    try:
        with pytest.raises(Planned) as planned:
            plan_run(more, "pretrain")
    finally:
        fit_module.PLANNERS["pretrain"] = real_plan
    assert planned.value.args[0] == [p.name for p in checkpoint_dirs(run)]   # pulled before planning
    assert _files_equal(more.train.run_dir, run)
    plan = plan_pretrain(more)                                             # pre-flight passes on the pulled folder
    assert plan.resume_notes and "optim.epochs" in " ".join(plan.resume_notes)


def _files_equal(a: Path, b: Path) -> bool:
    files = {p.relative_to(b) for p in b.rglob("*") if p.is_file() and not p.name.startswith(".")}
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in files)


def test_corrupted_and_foreign_checkpoints_stop_before_training(finished_run, tmp_path):
    cfg, result = finished_run
    run = tmp_path / "mimic"
    shutil.copytree(result.run_dir, run)
    cfg = load_config(overrides=[*TINY, "optim.batch_size=8", f"train.storage_path={tmp_path}", "train.name=mimic"])
    latest = checkpoint_dirs(run)[-1] / CHECKPOINT_FILE
    blob = bytearray(latest.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    latest.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match=str(latest)):
        preflight(run, cfg)
    latest.write_bytes(bytes(blob[: len(blob) // 3]))                 # truncated, sidecar removed
    Path(f"{latest}.sha256").unlink()
    with pytest.raises(CheckpointError, match="unreadable|truncated"):
        preflight(run, cfg)
    other = load_config(overrides=[*TINY, "encoders.coreecg.embed_dim=48", "methods.core.latent_decoder.dim=48",
                                   f"train.storage_path={tmp_path}", "train.name=mimic"])
    with pytest.raises(CheckpointError, match=r"config\.yaml.*encoders\.coreecg\.embed_dim: 32 -> 48"):
        fit(plan_run(other, "pretrain"))


def test_training_ingest_is_seeded_per_epoch_and_float16(corpora, fresh_ray):
    ds = training_dataset(corpora / "mimic", seed=0)

    def epoch(e: int):
        it = ds.iterator()
        sig, uid = zip(*epoch_batches(it, 8, e, seed=0, rank=0, shuffle_buffer=32, device=torch.device("cpu")))
        return torch.cat(sig), torch.cat(uid)

    s0, u0 = epoch(0)
    s0b, u0b = epoch(0)
    s1, u1 = epoch(1)
    assert s0.dtype == torch.float16 and s0.shape[1:] == (12, 2500)
    assert torch.equal(u0, u0b) and torch.equal(s0, s0b)              # same seed, same epoch: same stream
    assert not torch.equal(u0, u1)                                    # another epoch: another order
    assert len(set(u0.tolist())) == len(u0) and sorted(u0.tolist()) == sorted(u1.tolist())
    c0, c1 = crop_offsets(u0, 0, 0, 251), crop_offsets(u0, 0, 1, 251)
    assert (c0 != c1).float().mean() > 0.9 and c0.min() >= 0 and c0.max() <= 250
    x = to_model_input(s0, u0, 0, 0, 2250)
    assert x.dtype == torch.float32 and x.shape[-1] == 2250
    first = int(crop_offsets(u0[:1], 0, 0, 251))
    assert torch.equal(x[0], s0[0, :, first:first + 2250].float())


def test_resume_after_the_driver_is_killed(fresh_ray, tmp_path):
    name = "resume"
    args = [sys.executable, "jobs/pretrain.py", *sum((["--set", s] for s in TINY), []),
            "--set", "optim.batch_size=8", "--set", "optim.epochs=4", "--set", "data.synthetic_records=96",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", f"train.storage_path={tmp_path}",
            "--set", f"train.name={name}", "--set", "train.checkpoint_every_steps=2",
            "--set", "train.eval_every_epochs=0"]
    env = {**os.environ, "RAY_ADDRESS": fresh_ray.get_runtime_context().gcs_address}
    run = tmp_path / name
    proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 240
    while not checkpoint_dirs(run) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    newest = once_settled(lambda: [d.name for d in checkpoint_dirs(run)], f"{run}: checkpoints")
    killed_at = int(newest[-1].split("step")[1])          # what a rerun resumes from
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = _lines(run)
    resumes = [x for x in lines if x.get("event") == "resume"]
    assert [r["step"] for r in resumes] == [killed_at]                # continued, not restarted
    epochs = [x for x in lines if x.get("kind") == "epoch"]
    steps_per_epoch = next(x["step"] for x in epochs if x["epoch"] == 1)
    assert killed_at < 4 * steps_per_epoch, "the driver must be killed mid-run"
    assert epochs[-1]["epoch"] == 4 and epochs[-1]["step"] == 4 * steps_per_epoch   # as uninterrupted
    assert "encoder.pt" in done.stdout
    console = done.stdout + done.stderr           # each epoch once: the controller's line, not the worker's too
    assert [sum(f"epoch {e}/4 |" in line for line in console.splitlines()) for e in (3, 4)] == [1, 1], console[-3000:]


def test_a_pretraining_job_reads_each_manifest_once_in_the_driver_and_none_in_its_workers(fresh_ray, tmp_path):
    """jobs/pretrain.py on Ray with two Train workers, the corpus built beforehand: with
    COREECG_TRACE_MANIFEST_READS every manifest read is a line (pid, path); the driver reads the
    corpus's once, and the workers none (they adopt the driver's, RunPlan.to_dict)."""
    trace = tmp_path / "reads.jsonl"
    sets = [*TINY, "optim.batch_size=8", "optim.epochs=1", "data.synthetic_records=96", "train.num_workers=2",
            f"data.cache_dir={tmp_path / 'cache'}", "train.eval_every_epochs=0"]
    from coreecg.data import locate

    locate.synthetic_corpus(load_config(overrides=sets))      # built here: its reads are not the job's
    args = [sys.executable, "jobs/pretrain.py", *sum((["--set", s] for s in sets), [])]
    env = {**os.environ, "RAY_ADDRESS": fresh_ray.get_runtime_context().gcs_address}
    job = subprocess.Popen([*args, "--output", str(tmp_path / "run")], cwd=REPO,
                           env={**env, "COREECG_TRACE_MANIFEST_READS": str(trace)}, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    out, err = job.communicate(timeout=400)
    assert job.returncode == 0, err[-3000:]
    reads = [json.loads(x) for x in trace.read_text().splitlines()]
    by_process: dict[int, list[str]] = {}
    for r in reads:
        by_process.setdefault(r["pid"], []).append(r["path"])
    corpus = next(iter(reads))["path"]
    assert corpus.endswith("manifest.json") and "synthetic" in corpus
    assert by_process == {job.pid: [corpus]}, by_process      # the driver once; no worker at all
    assert json.loads((tmp_path / "run" / "run.json").read_text())["sessions"][-1]["status"] == "completed"
    assert "train:\n" in (tmp_path / "run" / "config.yaml").read_text() and "  num_workers: 2\n" in \
        (tmp_path / "run" / "config.yaml").read_text()          # two Train workers, each a process


def test_the_quickstart_job_prints_progress_and_no_warning(fresh_ray, tmp_path):
    """The default job (quickstart config, 2 Ray Train workers), shortened: its console is
    coreecg's lines only: no Warning line (FutureWarnings, Ray deprecations, hints), no Ray INFO
    line, each epoch once, progress lines within epochs, and the closing summary."""
    args = [sys.executable, "jobs/pretrain.py", "--set", "data.synthetic_records=128", "--set", "optim.epochs=2",
            "--set", f"data.cache_dir={tmp_path / 'cache'}", "--set", "train.progress_every_s=0.5",
            "--output", str(tmp_path / "runs" / "quick")]
    env = {**os.environ, "RAY_ADDRESS": fresh_ray.get_runtime_context().gcs_address}
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=400)
    console = done.stdout + done.stderr
    assert done.returncode == 0, console[-3000:]
    lines = console.splitlines()
    assert not [x for x in lines if "warning" in x.lower()], console
    assert not [x for x in lines if " INFO " in x or x.startswith("(")], console       # Ray's own lines
    assert [sum(x.startswith(f"epoch {e}/2 |") for x in lines) for e in (1, 2)] == [1, 1], console
    assert any(x.startswith("  epoch ") and "ETA epoch" in x for x in lines), console
    assert "done: step" in done.stdout and "leaderboard:" in done.stdout
    # issue 41: the whole run's speed, the first epoch apart, and the command's time to its first step
    # and where the seconds before the first step went, phase by phase (coreecg.train.run_speed)
    assert re.search(r"^speed: [0-9.]+ samples/s over 2 epoch\(s\) of this command, [0-9.]+ after the first, "
                     r"first step [0-9.]+ s after the command \(ray [0-9.]+, data [0-9.]+, workers [0-9.]+"
                     r"( \(data materialised beside them in [0-9.]+\))?, "     # on a job's own cluster
                     r"task [0-9.]+, model [0-9.]+, start [0-9.]+, batch [0-9.]+, first step [0-9.]+\)$",
                     done.stdout, re.M), done.stdout
    run = json.loads((tmp_path / "runs" / "quick" / "run.json").read_text())["sessions"][-1]
    assert run["status"] == "completed" and "jobs/pretrain.py" in run["command"]


def test_synthetic_corpus_is_built_once_and_reused(fresh_ray, tmp_path, monkeypatch):
    from coreecg.data import locate

    cfg = load_config(overrides=["data.synthetic_records=24", f"data.cache_dir={tmp_path}"])
    first = locate.synthetic_corpus(cfg)
    assert (first / "manifest.json").is_file() and first.parent == tmp_path.resolve()
    monkeypatch.setattr("coreecg.data.pipeline.build_corpus",
                        lambda *a, **k: pytest.fail("an up-to-date cache must not be rebuilt"))
    assert locate.synthetic_corpus(cfg) == first
    other = load_config(overrides=["data.synthetic_records=24", f"data.cache_dir={tmp_path}",
                                   "data.preprocess.lowpass_hz=35"])
    with pytest.raises(pytest.fail.Exception):      # another preprocessing: rebuilt, not reused
        locate.synthetic_corpus(other)


def test_cmsc_on_two_workers_with_multi_window_recordings(fresh_ray, ecg_data, tmp_path):
    """CPSC2018 records last 6-60 s, so one recording gives several windows; CPSC2018 has no
    patient ids, so each recording is its own patient: its windows share a patient index on every
    worker (positives, never negatives), and the gathered loss trains under DDP."""
    from coreecg.data.reading import patient_index, read_split

    corpus = tmp_path / "cpsc"
    build_corpus("cpsc2018", ecg_data / "cpsc2018-cinc2020", corpus,
                 load_config(overrides=["data.shard_records=16"]).data)
    meta = read_split(corpus, "train", ["record_id"])
    ids = patient_index(corpus)
    assert len(set(ids)) == len(set(meta["record_id"])) < len(ids)            # several windows per recording
    for rec in set(meta["record_id"]):
        assert len(set(ids[meta["record_id"] == rec])) == 1
    cfg = _config(tmp_path, "cmsc", "pretrain.method=cmsc", "methods.cmsc.dim=16", f"data.corpus={corpus}",
                  "optim.epochs=2", "data.probe_max_windows=64", "train.checkpoint_every_steps=0")
    result = fit(plan_run(cfg, "pretrain"))
    epochs = [x for x in _lines(result.run_dir) if x.get("kind") == "epoch"]
    assert len(epochs) == 2 and all("segment_cos" in e and "loss_rec" not in e for e in epochs)
    assert not list(result.run_dir.glob("figures/*.png"))                    # CMSC reconstructs nothing
    enc = coreecg.load_encoder(result.model)
    assert enc.pooled(torch.randn(2, 12, 2250)).shape == (2, 32)
