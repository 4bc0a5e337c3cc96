"""One worker of a run, wherever it runs: a Ray Train worker (`coreecg.train.fit`), or the process
of a single-worker Tune trial (`coreecg.tune.trials`). Both hand `worker_context` the plan, their
data and their way of reporting, and run `coreecg.train.loop.train_worker` on what it returns;
everything else is the same code:

- checkpoints: rank 0 writes them into the run folder itself, atomically with their sha256
  (the store, `coreecg.checkpoints`), keeps the newest `train.keep_checkpoints`, and every start
  resumes from the newest one there. Ray's own checkpoint copies are not used: the run folder
  already is on storage every node sees, so a retried Train worker group, a retried Tune trial
  and a rerun job all resume the same way, from the same files.
- reports: `report_fn(metrics)` after every checkpoint and epoch: `ray.train.report` (a barrier
  on every rank), `ray.tune.report` (ASHA reads it), or nothing.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable

import torch

from coreecg.checkpoints import load_latest, prune_checkpoints, save_step
from coreecg.train.finetuning import FinetuneTask
from coreecg.train.ingest import epoch_batches
from coreecg.train.loop import WorkerContext
from coreecg.train.plan import RunPlan
from coreecg.train.pretraining import task_from_plan

log = logging.getLogger(__name__)


def build_task(plan: RunPlan, rank: int, device: torch.device):
    """The plan's task on this worker."""
    return FinetuneTask(plan, device) if plan.task == "finetune" else task_from_plan(plan, rank)


def worker_context(plan: RunPlan, source, rank: int, world: int, device: torch.device, *,
                   report_fn: Callable[[dict[str, float]], None] = lambda metrics: None,
                   wrap: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m) -> tuple[Any, WorkerContext]:
    """(task, context) of this worker's share of `plan`, for `train_worker`: batches from `source`
    (what `ingest.epoch_batches` reads: a Ray Data shard, a materialised dataset's iterator, or
    ShardFiles), checkpoints in the run folder, reports to `report_fn`, the model wrapped by `wrap`."""
    started = time.time()           # the worker group is up: the start-up phase "workers" ends here
    cfg, run_dir = plan.config, plan.run_dir
    if device.type == "cpu":
        torch.set_num_threads(max(1, cfg.train.cpus_per_worker))
    task = build_task(plan, rank, device)
    per_worker = task.global_batch // world

    def report(metrics: dict[str, float], payload: dict[str, Any] | None,
               saved: Callable[[], None] | None = None) -> None:
        if payload is not None:                  # rank 0 only: the others wait in report_fn
            save_step(run_dir, int(payload["trainer"]["step"]), payload.pop("model"), cfg, **payload)
            prune_checkpoints(run_dir, cfg.train.keep_checkpoints)
        if saved is not None:                    # after the checkpoint, before a report Tune may stop in
            saved()
        report_fn(metrics)

    return task, WorkerContext(
        rank=rank, world_size=world, device=device, steps_per_epoch=plan.steps_per_epoch, run_dir=run_dir,
        epoch_batches=lambda epoch: epoch_batches(source, per_worker, epoch, cfg.train.seed, rank,
                                                  cfg.data.shuffle_buffer, device, world),
        report=report, latest=lambda: load_latest(run_dir, device), wrap=wrap, started=started)
