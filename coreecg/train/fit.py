"""Running a plan on Ray Train: the driver's side of every training run, pretraining and
fine-tuning alike.

    from coreecg.train.fit import fit, plan_run
    result = fit(plan_run(load_config("configs/quickstart.yaml"), "pretrain"))

`plan_run` chooses the run's devices (`coreecg.cluster.plan_devices`: train.use_gpu and
train.num_workers, "auto" by default, made concrete and said on the console), starts (or joins)
Ray once, pulls a mirrored run folder back where it is missing and plans the run
(`coreecg.train.plan`); `fit` trains the plan with a TorchTrainer whose workers run
`coreecg.train.loop.train_worker` (on `coreecg.train.worker.worker_context`), and returns where
everything went. The corpora the planner opened (`RunPlan.open`) feed the run record and the
ingest: one pretraining reads each manifest once. From a job to the loss:
main -> plan_run -> fit -> (Ray) _train_loop, or _fit_here in this process -> train_worker ->
train_epoch (coreecg.train.loop) -> TrainStep -> method.forward -> loss.

Outputs go to `<train.storage_path>/<train.name>/`: `checkpoint_step<N>/checkpoint.pt` (rank 0
writes them, the last `train.keep_checkpoints` kept), `config.yaml`, `run.json`,
`metrics.jsonl`, `tensorboard/`, `figures/` and, at the end, `encoder.pt` (pretraining) or
`best.pt`, `metrics.json`, `predictions.csv` (fine-tuning). Re-running with the same storage
path and name resumes from the newest checkpoint; a worker that dies is replaced up to
`train.max_failures` times and resumes the same way. With `train.mirror_uri` the folder is also
pushed to object storage after every epoch and at the end (`coreecg.train.mirror`). While Ray
Train runs, the driver's console follows metrics.jsonl (`coreecg.train.follower`), and on the
job's own cluster the split is materialised beside the workers' start (`coreecg.train.data_handoff`).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import logging
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.train.torch
import torch
from ray.train import UserCallback
from ray.train.torch import TorchTrainer

from coreecg.checkpoints import BEST_FILE, ENCODER_FILE, latest_checkpoint
from coreecg.cluster import check_gpus, find_devices, init_ray, quiet_data, resolve_devices
from coreecg.config import Config
from coreecg.devices import trial_device
from coreecg.run_record import end_session
from coreecg.train.failures import (RunFailed, clear_failures, deterministic_cause, record_failure,
                                     recorded_failure)
from coreecg.train.finetuning import plan_finetune
from coreecg.train.console import progress_log
from coreecg.train.data_handoff import DatasetHandoff, beside_workers, start_handoff
from coreecg.train.follower import RunFollower
from coreecg.train.ingest import ShardFiles, local_source, training_dataset
from coreecg.train.loop import train_worker
from coreecg.train.mirror import mirrored, pull_if_missing
from coreecg.train.mixture import mixture_files
from coreecg.train.plan import RunPlan, write_run_folder
from coreecg.train.run_speed import MATERIALISED, mark
from coreecg.train.pretraining import plan_pretrain
from coreecg.train.worker import worker_context

try:        # Ray Train v2's logger of every report (_quiet_worker_logs); other Ray versions lack it
    from ray.train.v2._internal.execution import context as _train_context
except ImportError:
    _train_context = None

log = logging.getLogger(__name__)
PLANNERS = {"pretrain": plan_pretrain, "finetune": plan_finetune}
FINISHED_FILE = {"pretrain": ENCODER_FILE, "finetune": "metrics.json"}


@dataclass
class RunResult:
    """Where a run's outputs are. metrics: the last epoch's (pretraining) or metrics.json
    (fine-tuning); checkpoint: the newest checkpoint file; model: encoder.pt or best.pt."""

    run_dir: Path
    task: str
    metrics: dict[str, Any]
    checkpoint: Path | None
    model: Path


def start_ray(config: Config, gpus: int | None = None) -> None:
    """Connect to (or start) the cluster with CPUs for the workers plus Ray Data's own (and, on
    this job's own local cluster, `gpus`: the GPUs the devices were planned on), and quiet Ray
    Data's per-epoch progress output. `config`: its devices resolved (plan_devices)."""
    t = config.train
    init_ray(t.num_workers * t.cpus_per_worker, gpus=gpus)
    quiet_data()


def check_run_gpus(config: Config) -> None:
    """coreecg.cluster.check_gpus for a run's Train workers (one GPU each with train.use_gpu)."""
    t = config.train
    if t.use_gpu:
        check_gpus(t.num_workers, f"train.use_gpu=true with train.num_workers={t.num_workers}")


def plan_run(config: Config, task: str) -> RunPlan:
    """The devices (the console's first lines; what the run folder records), then Ray (a first
    build of the embedded synthetic corpus runs on it), the run folder pulled from its mirror
    where it is missing here, then the task's planner."""
    devices = find_devices()                # joins a shared cluster; else before this job's own starts
    config, lines = resolve_devices(config, devices)
    for line in lines:
        log.info("%s", line)
    start_ray(config, gpus=devices.gpus)
    mark("ray")
    check_run_gpus(config)                  # before a corpus is built for a run that cannot start
    pull_if_missing(config.train.run_dir, config.train.mirror_uri)
    return PLANNERS[task](config)


def fit(plan: RunPlan, *, callbacks: list | None = None, report_fn=None) -> RunResult:
    """Train `plan` to its end, resuming from its newest checkpoint; a finished fine-tuning with
    the same config is returned as it is.

    On Ray Train (a TorchTrainer of `train.num_workers` workers) by default; callbacks: its
    callbacks (a Tune trial forwards the reports with TuneReportCallback). With `report_fn`,
    in this process instead (one worker, no Train worker group to start: a single-worker Tune
    trial), every report going to report_fn(metrics)."""
    if plan.finished:                       # found by the planner's one check of the run folder
        log.info("%s: already finished (metrics.json); nothing to do", plan.run_dir)
        return _result(plan, {})
    _open_run(plan, in_process=report_fn is not None)
    handoff = None
    try:
        # a split that cannot be read fails the session too
        with mirrored(plan.run_dir, plan.config.train.mirror_uri) as mirror, _failed_session(plan.run_dir):
            dataset, handoff = _training_data(plan, in_process=report_fn is not None)
            mark("data")
            if report_fn is not None:
                last = _fit_here(plan, dataset, report_fn, mirror)
            else:
                last = _fit_on_ray(plan, dataset, handoff, callbacks, mirror)
    finally:
        if handoff is not None:
            handoff.close()
            mark(MATERIALISED, handoff.ready_at)
    if not (plan.run_dir / FINISHED_FILE[plan.task]).is_file():
        raise RuntimeError(f"{plan.run_dir}: training ended without {FINISHED_FILE[plan.task]}")
    return _result(plan, last)


def _open_run(plan: RunPlan, in_process: bool) -> None:
    """Ray (once), the GPUs a worker group needs, the plan on the console, and the run folder
    written (a finished fine-tuning resumed with more epochs loses its final outputs)."""
    if not ray.is_initialized():            # plan_run (or the Tune trial) started it: once
        start_ray(plan.config)
    if not in_process:                      # a Train worker group would wait for absent GPUs forever
        check_run_gpus(plan.config)
    for line in plan.describe():
        (log.warning if line.startswith("warning:") else log.info)("%s", line)
    write_run_folder(plan)
    for stale in ("metrics.json", "predictions.csv"):
        (plan.run_dir / stale).unlink(missing_ok=True)


def _training_data(plan: RunPlan, in_process: bool) -> tuple[Any, DatasetHandoff | None]:
    """The training split -> (what the fit trains on, the handoff materialising it beside the worker
    group's start or None). Several corpora are always streamed (coreecg.train.mixture); one is
    ShardFiles to stream or a Ray Dataset, materialised here unless beside the workers
    (coreecg.train.data_handoff)."""
    if plan.mixture is not None:
        return mixture_files(plan.mixture, [plan.open(c) for c in plan.mixture.corpora]), None
    beside = not in_process and beside_workers(plan.config)
    dataset = training_dataset(plan.open(plan.corpus), plan.config.train.seed, plan.config.data.cache_in_memory_gb,
                               keep=plan.keep, materialise=not beside)
    if beside and not isinstance(dataset, ShardFiles):
        return dataset, start_handoff(dataset, plan.config, str(plan.run_dir))
    return dataset, None


def _fit_on_ray(plan: RunPlan, dataset, handoff: DatasetHandoff | None, callbacks: list | None,
                mirror) -> dict[str, Any]:
    """The TorchTrainer's fit, its console lines followed from metrics.jsonl -> the last epoch's
    record (Ray's Result holds metrics only beside its own checkpoints).

    A failed worker group is restarted here, not by Ray Train: up to `train.max_failures` times
    (-1: without limit) when a restart can mend it (a process or node lost), each from the newest
    checkpoint (a rerun with the same storage path and name); never when a rank recorded a
    deterministic error (coreecg.train.failures): the run then ends after this one try with
    RunFailed naming it. Preemptions stay Ray Train's own (`max_preemption_failures`)."""
    limit = plan.config.train.max_failures
    source = handoff.source() if handoff is not None else dataset
    clear_failures(plan.run_dir)
    for attempt in itertools.count(1):
        token = uuid.uuid4().hex[:12]
        trainer = _trainer(plan, source, callbacks, token)
        try:
            with RunFollower(plan.run_dir / "metrics.jsonl", plan.epochs, on_epoch=mirror):
                trainer.fit()
            break
        except Exception as e:
            if handoff is not None:     # a failed read: its own error (the file, the reason), not Train's
                handoff.raise_if_failed()
            cause = recorded_failure(plan.run_dir, token)
            if cause is not None:
                raise RunFailed(cause) from e
            if not isinstance(e, ray.train.TrainingFailedError) or 0 <= limit < attempt:
                raise
            log.warning("the worker group failed (attempt %d of %s): %s; restarting from the newest checkpoint",
                        attempt, limit + 1 if limit >= 0 else "unlimited", _first_line(e))
    return last_epoch(plan.run_dir)


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1] if text else ''}"[:500]


def _fit_here(plan: RunPlan, dataset, report_fn, mirror) -> dict[str, Any]:
    """The one worker in this process; -> the last report's numbers."""
    last: dict[str, Any] = {}

    def report(metrics: dict[str, float]) -> None:
        last.clear()
        last.update({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        report_fn(metrics)
        if mirror is not None:
            mirror()

    threads = torch.get_num_threads()
    try:
        task, ctx = worker_context(plan, local_source(dataset), 0, 1, trial_device(plan.config.train.use_gpu),
                                   report_fn=report)
        train_worker(task, plan.config, ctx)
    except Exception as e:
        cause = deterministic_cause(e)
        if cause is None:
            raise
        raise RunFailed(cause) from e
    finally:
        # the worker takes train.cpus_per_worker threads, as a Train worker's process does; this
        # process is the caller's (a notebook, a Tune trial's), whose own count comes back after
        torch.set_num_threads(threads)
    return last


def last_epoch(run_dir: Path) -> dict[str, Any]:
    """The run's last epoch record in metrics.jsonl (what its last report held), or {}."""
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:         # a line cut off when an earlier session's writer was lost
            continue
        if record.get("kind") == "epoch":
            return {k: v for k, v in record.items() if k not in ("kind", "time")}
    return {}


def _result(plan: RunPlan, last: dict[str, Any]) -> RunResult:
    run_dir = plan.run_dir
    if plan.task == "finetune":
        return RunResult(run_dir, "finetune", json.loads((run_dir / "metrics.json").read_text()),
                         latest_checkpoint(run_dir), run_dir / BEST_FILE)
    return RunResult(run_dir, "pretrain", last, latest_checkpoint(run_dir), run_dir / ENCODER_FILE)


# ---------------------------------------------------------------------------- Ray Train


def _train_loop(config: dict[str, Any]) -> None:
    """train_loop_per_worker: the loop with Ray's data, DDP and reporting. config: {"plan":
    RunPlan.to_dict() (its task is built on the worker), "files": the split's ShardFiles when it
    streams, else None (the materialised dataset is Ray Train's "train")}."""
    _quiet_worker_logs()
    rc = ray.train.get_context()

    def wrap(model):
        # Buffers (positions, a fixed FDA map) are constants: no per-step broadcast.
        return ray.train.torch.prepare_model(model, move_to_device=False,
                                             parallel_strategy_kwargs={"forward_sync_buffers": False})

    plan = RunPlan.from_dict(config["plan"])
    try:
        task, ctx = worker_context(plan, config["files"] or ray.train.get_dataset_shard("train"), rc.get_world_rank(),
                                   rc.get_world_size(), ray.train.torch.get_device(), report_fn=ray.train.report,
                                   wrap=wrap)
        train_worker(task, plan.config, ctx)
    except Exception as e:
        cause = deterministic_cause(e)
        if cause is not None:           # the driver reads it and ends the run instead of restarting it
            record_failure(plan.run_dir, config["attempt"], rc.get_world_rank(), cause)
        raise


def _quiet_worker_logs() -> None:
    # Ray hands read-only Arrow buffers to torch; the batch is never written in place.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    # The driver prints each epoch's line from metrics.jsonl (RunFollower); the worker's would repeat it.
    progress_log.setLevel(logging.WARNING)
    # Train logs every report (the whole metrics dict) at INFO under a logger named after its
    # file, outside LoggingConfig's reach; the driver prints one line instead (RunFollower).
    if _train_context is not None:
        logging.getLogger(_train_context.__file__).setLevel(logging.WARNING)


def _failure_callback():
    """A Ray Train UserCallback (runs in the Train controller) that logs a failed worker's error
    where the controller's output goes (the console with --verbose, Ray's logs otherwise)."""
    class Failures(UserCallback):
        def after_exception(self, run_context, worker_exceptions):
            for rank, exc in worker_exceptions.items():
                logging.getLogger(__name__).warning("worker %s failed: %s: %s", rank, type(exc).__name__, exc)

    return Failures()


def _trainer(plan: RunPlan, dataset, callbacks: list | None, attempt: str):
    """The TorchTrainer of a plan. dataset: ShardFiles to stream, or what Ray Train takes as the
    "train" dataset (a materialised Ray Dataset, or the callable that waits for one:
    coreecg.train.data_handoff). Checkpoints are the workers' own (coreecg.train.worker), so Ray
    keeps none. `attempt`: this try's id (the name of a deterministic failure's record); restarts
    are the driver's (_fit_on_ray), so Ray Train's own max_failures is 0."""
    t, run_dir = plan.config.train, plan.run_dir
    files = dataset if isinstance(dataset, ShardFiles) else None
    return TorchTrainer(
        _train_loop,
        train_loop_config={"plan": plan.to_dict(), "files": files, "attempt": attempt},
        scaling_config=ray.train.ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu,
                                               resources_per_worker={"CPU": t.cpus_per_worker}),
        run_config=ray.train.RunConfig(
            name=run_dir.name, storage_path=str(run_dir.parent),
            failure_config=ray.train.FailureConfig(max_failures=0),
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
            callbacks=[*(callbacks or []), _failure_callback()]),
        datasets={} if files is not None else {"train": dataset},
    )


# ---------------------------------------------------------------------------- the run record


@contextlib.contextmanager
def _failed_session(run_dir: Path):
    """A fit that raises closes the run record's session as failed, with the cause."""
    try:
        yield
    except BaseException as e:
        cause = getattr(e, "__cause__", None) or e
        end_session(run_dir, "failed", f"{type(cause).__name__}: {cause}")
        raise
