"""Training on Ray Train: a TorchTrainer whose workers run the shared loop (`train_worker`) on Ray
Data shards, for any run plan (`coreecg.train.plan`): pretraining and fine-tuning.

    from coreecg.train.distributed import pretrain, finetune
    result = pretrain(load_config("configs/quickstart.yaml"))   # -> run folder, metrics, encoder

Outputs go to `<train.storage_path>/<train.name>/`: Ray's checkpoint folders
(`checkpoint_step<N>/checkpoint.pt`, the last `train.keep_checkpoints` kept), and rank 0's
`config.yaml`, `metrics.jsonl`, `tensorboard/`, `figures/` and, at the end, `encoder.pt`
(pretraining) or `best.pt`, `metrics.json`, `predictions.csv` (fine-tuning).
Re-running with the same storage path and name resumes from the latest checkpoint; a worker
that dies is replaced up to `train.max_failures` times and resumes the same way. With
`train.mirror_uri` the folder is also pushed to object storage after every epoch and at the
end, and pulled back when a run starts without it (`coreecg.train.mirror`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreecg.config import Config, load_config
from coreecg.train.checkpoint import load_checkpoint, save_checkpoint
from coreecg.train.finetuning import BEST_FILE, FinetuneTask, plan_finetune
from coreecg.train.ingest import ShardFiles, epoch_batches, training_dataset
from coreecg.train.loop import WorkerContext, progress_line, progress_log, progress_text, train_worker
from coreecg.train.mirror import pull_if_missing
from coreecg.train.plan import CHECKPOINT_FILE, RunPlan, checkpoint_dirs, step_of, write_run_folder
from coreecg.train.pretraining import plan_pretrain, task_from_plan

log = logging.getLogger(__name__)


def _failure_callback():
    """A Ray Train UserCallback (runs in the Train controller) that logs a failed worker's error
    where the controller's output goes (the console with --verbose, Ray's logs otherwise)."""
    from ray.train import UserCallback

    class Failures(UserCallback):
        def after_exception(self, run_context, worker_exceptions):
            for rank, exc in worker_exceptions.items():
                logging.getLogger(__name__).warning("worker %s failed: %s: %s", rank, type(exc).__name__, exc)

    return Failures()


@contextlib.contextmanager
def _failed_session(run_dir: Path):
    """A fit that raises closes the run record's session as failed, with the cause."""
    from coreecg.record import end_session

    try:
        yield
    except BaseException as e:
        cause = getattr(e, "__cause__", None) or e
        end_session(run_dir, "failed", f"{type(cause).__name__}: {cause}")
        raise


@contextlib.contextmanager
def _mirrored(plan: RunPlan):
    """`train.mirror_uri`: a push callable for every epoch (None without a mirror), and a last
    push when the fit ends, finished or failed (coreecg.train.mirror)."""
    from coreecg.train.mirror import RunMirror, push_quietly

    mirror = RunMirror(plan.run_dir, plan.config.train.mirror_uri) if plan.config.train.mirror_uri else None
    try:
        yield (lambda: push_quietly(mirror)) if mirror else None
    finally:
        push_quietly(mirror)


class RunFollower:
    """The driver's console during a Ray Train fit: prints the epoch and progress records that
    rank 0 appends to the run's metrics.jsonl, once each, as they arrive.

    The run folder is on storage the driver sees (a shared filesystem on a cluster), so this
    works wherever the workers run, and the console needs none of Ray's log forwarding (off
    without --verbose: coreecg.cluster.console_options). Only records appended after it starts
    are printed: a resumed run does not repeat its history."""

    def __init__(self, metrics: Path, epochs: int, poll_s: float = 0.5, on_epoch=None):
        import threading

        self.path, self.epochs, self.poll_s, self.on_epoch = Path(metrics), epochs, poll_s, on_epoch
        self._offset = self.path.stat().st_size if self.path.is_file() else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="coreecg-run-follower", daemon=True)

    def __enter__(self) -> "RunFollower":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()                     # what the last epoch wrote just before fit() returned

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._drain()

    def _drain(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path) as f:
            f.seek(self._offset)
            text = f.read()
        complete = text[:text.rfind("\n") + 1]          # a line still being written waits
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "epoch":
                progress_log.info("%s", progress_line(record, self.epochs))
                if self.on_epoch is not None:
                    self.on_epoch()
            elif record.get("kind") == "progress":
                progress_log.info("%s", progress_text(record))


@dataclass
class PretrainResult:
    run_dir: Path
    metrics: dict[str, Any]
    checkpoint: str | None
    encoder: Path


@dataclass
class FinetuneResult:
    run_dir: Path
    metrics: dict[str, Any]         # metrics.json
    best: Path


# ---------------------------------------------------------------------------- the worker


def _ray_worker(config: dict[str, Any]) -> None:
    """train_loop_per_worker: the shared loop with Ray's data, DDP and reporting. config:
    {"plan": RunPlan.to_dict() (its task is built here, on the worker), "files": the split's
    ShardFiles when it streams, else None (the materialised dataset is Ray Train's "train")}."""
    import ray.train
    import ray.train.torch

    _quiet_worker_logs()
    rc = ray.train.get_context()
    device = ray.train.torch.get_device()

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        # Buffers (positions, a fixed FDA map) are constants: no per-step broadcast.
        return ray.train.torch.prepare_model(model, move_to_device=False,
                                             parallel_strategy_kwargs={"forward_sync_buffers": False})

    source = config["files"] or ray.train.get_dataset_shard("train")
    run_task(RunPlan.from_dict(config["plan"]), source, rc.get_world_rank(),
             rc.get_world_size(), device, report_fn=ray.train.report, get_checkpoint=ray.train.get_checkpoint,
             wrap=wrap)


def _quiet_worker_logs() -> None:
    import warnings

    # Ray hands read-only Arrow buffers to torch; the batch is never written in place.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    # The driver prints each epoch's line from metrics.jsonl (RunFollower); the worker's would repeat it.
    progress_log.setLevel(logging.WARNING)
    # Train logs every report (the whole metrics dict) at INFO under a logger named after its
    # file, outside LoggingConfig's reach; the driver prints one line instead (RunFollower).
    try:
        from ray.train.v2._internal.execution import context as _train_context
        logging.getLogger(_train_context.__file__).setLevel(logging.WARNING)
    except ImportError:
        pass


def build_task(plan: RunPlan, rank: int, device: torch.device):
    """The plan's task on this worker."""
    return FinetuneTask(plan, device) if plan.task == "finetune" else task_from_plan(plan, rank)


def run_task(plan: RunPlan, source, rank: int, world: int, device: torch.device, *,
             report_fn, get_checkpoint, wrap=lambda m: m, checkpoint_cls=None) -> dict[str, float]:
    """One worker of a run: the plan's task on its data (`ingest.epoch_batches`' source: a Ray
    Data shard, a materialised dataset's iterator, or ShardFiles), reporting through
    `report_fn(metrics, checkpoint=..., [checkpoint_dir_name=...])` and resuming from `get_checkpoint()`: ray.train's inside a TorchTrainer, ray.tune's inside
    a single-process Tune trial (coreecg.tune.trial)."""
    import inspect

    from ray.train import Checkpoint

    Checkpoint = checkpoint_cls or Checkpoint      # ray.tune.Checkpoint for tune.report
    cfg, run_dir = plan.config, plan.run_dir
    if device.type == "cpu":
        torch.set_num_threads(max(1, cfg.train.cpus_per_worker))
    task = build_task(plan, rank, device)
    per_worker = task.global_batch // world
    named = "checkpoint_dir_name" in inspect.signature(report_fn).parameters

    def report(metrics: dict[str, float], payload: dict[str, Any] | None) -> None:
        name = {"checkpoint_dir_name": f"checkpoint_step{int(metrics['step']):09d}"} if named else {}
        if payload is None:
            report_fn(metrics, **name)
            return
        with tempfile.TemporaryDirectory() as tmp:
            save_checkpoint(Path(tmp) / CHECKPOINT_FILE, payload.pop("model"), cfg, **payload)
            report_fn(metrics, checkpoint=Checkpoint.from_directory(tmp), **name)

    def latest() -> tuple[dict, Config, Path] | None:
        # Ray's snapshot of its checkpoints is written after a checkpoint folder lands, so a
        # driver killed in between leaves a newer folder than Ray knows of: take the newer.
        ckpt = get_checkpoint()
        on_disk = checkpoint_dirs(run_dir)
        ckpt_step = _checkpoint_step(ckpt) if ckpt is not None else -1
        if on_disk and step_of(on_disk[-1]) > ckpt_step:
            path = on_disk[-1] / CHECKPOINT_FILE
            return (*load_checkpoint(path, device), path)
        if ckpt is None:
            return None
        with ckpt.as_directory() as d:
            payload, saved = load_checkpoint(Path(d) / CHECKPOINT_FILE, device)
        return payload, saved, Path(ckpt.path) / CHECKPOINT_FILE

    ctx = WorkerContext(
        rank=rank, world_size=world, device=device, steps_per_epoch=plan.steps_per_epoch, run_dir=run_dir,
        epoch_batches=lambda epoch: epoch_batches(source, per_worker, epoch, cfg.train.seed, rank,
                                                  cfg.data.shuffle_buffer, device, world),
        report=report, latest=latest, wrap=wrap)
    return train_worker(task, cfg, ctx)


def _checkpoint_step(ckpt) -> int:
    """The step of a Ray checkpoint: from its folder name (checkpoint_step<N>) or its payload."""
    try:
        return step_of(Path(ckpt.path))
    except ValueError:
        with ckpt.as_directory() as d:
            payload, _ = load_checkpoint(Path(d) / CHECKPOINT_FILE)
        return int(payload["trainer"]["step"])


# ---------------------------------------------------------------------------- the driver


def start_ray(config: Config) -> None:
    """Connect to (or start) the cluster with CPUs for the workers plus Ray Data's own, and quiet
    Ray Data's per-epoch progress output."""
    from coreecg.cluster import init_ray, quiet_data

    t = config.train
    init_ray(t.num_workers * t.cpus_per_worker)
    quiet_data()


def make_trainer(plan: RunPlan, dataset, callbacks: list | None = None):
    """The TorchTrainer of a plan: workers, failures, checkpoints, logging. dataset: what
    `training_dataset` returned (a materialised Ray Dataset, or ShardFiles to stream)."""
    import ray.train
    from ray.train.torch import TorchTrainer

    t, run_dir = plan.config.train, plan.run_dir
    return TorchTrainer(
        _ray_worker,
        train_loop_config={"plan": plan.to_dict(), "files": dataset if isinstance(dataset, ShardFiles) else None},
        scaling_config=ray.train.ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu,
                                               resources_per_worker={"CPU": t.cpus_per_worker}),
        run_config=ray.train.RunConfig(
            name=run_dir.name, storage_path=str(run_dir.parent),
            failure_config=ray.train.FailureConfig(max_failures=t.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=t.keep_checkpoints),
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
            callbacks=[*(callbacks or []), _failure_callback()]),
        datasets={} if isinstance(dataset, ShardFiles) else {"train": dataset},
    )


def build_trainer(plan: RunPlan, callbacks: list | None = None):
    """Everything up to `fit()` of a plan: Ray, the run folder, the dataset, the TorchTrainer.
    Tune trials call this and `fit()` themselves."""
    start_ray(plan.config)
    for line in plan.describe():
        (log.warning if line.startswith("warning:") else log.info)("%s", line)
    write_run_folder(plan)
    dataset = training_dataset(plan.corpus, plan.config.train.seed, plan.config.data.cache_in_memory_gb,
                               keep=plan.keep)
    return make_trainer(plan, dataset, callbacks)


def pretrain(config: Config) -> PretrainResult:
    """Run (or resume) a pretraining on the Ray cluster; returns where everything went."""
    start_ray(config)           # before planning: a first build of the synthetic corpus runs on Ray
    pull_if_missing(config.train.run_dir, config.train.mirror_uri)
    plan = plan_pretrain(config)
    trainer = build_trainer(plan)
    with _mirrored(plan) as mirror, RunFollower(plan.run_dir / "metrics.jsonl", plan.epochs, on_epoch=mirror), \
            _failed_session(plan.run_dir):
        result = trainer.fit()
    return PretrainResult(run_dir=plan.run_dir, metrics=dict(result.metrics or {}),
                          checkpoint=result.checkpoint.path if result.checkpoint else None,
                          encoder=plan.run_dir / "encoder.pt")


def finetune(config: Config) -> FinetuneResult:
    """Run (or resume) one fine-tuning; a finished run folder with the same config is returned as is."""
    start_ray(config)           # before planning, as pretrain()
    pull_if_missing(config.train.run_dir, config.train.mirror_uri)
    plan = plan_finetune(config)
    run_dir = plan.run_dir
    done = run_dir / "metrics.json"
    if done.is_file() and (run_dir / "config.yaml").is_file() and load_config(run_dir / "config.yaml") == plan.config:
        log.info("%s: already finished (metrics.json); nothing to do", run_dir)
        return FinetuneResult(run_dir, json.loads(done.read_text()), run_dir / BEST_FILE)
    trainer = build_trainer(plan)
    for stale in ("metrics.json", "predictions.csv"):   # a finished run resumed with more epochs
        (run_dir / stale).unlink(missing_ok=True)
    with _mirrored(plan) as mirror, RunFollower(run_dir / "metrics.jsonl", plan.epochs, on_epoch=mirror), \
            _failed_session(run_dir):
        trainer.fit()
    if not done.is_file():
        raise RuntimeError(f"{run_dir}: training ended without metrics.json")
    return FinetuneResult(run_dir, json.loads(done.read_text()), run_dir / BEST_FILE)
