"""The one training loop. `train_worker` runs on every data-parallel worker for every task
(pretraining, fine-tuning); a `Task` supplies the model, the step, the batch -> step inputs
mapping and the rank-0 evaluation, and a `WorkerContext` supplies the environment: where
batches come from, how the model is wrapped (DDP or not), and how metrics and checkpoints are
persisted (`ray.train.report` or files in the run folder). Tune trials reuse it unchanged.

Per epoch: steps (log every `train.log_every`, a progress line every `train.progress_every_s`
seconds, checkpoint every `train.checkpoint_every_steps`), then on rank 0 the task's evaluation
when it asks for one, then one report with a checkpoint (a barrier on all ranks under Ray). After
the last epoch, rank 0 runs the task's `finish` (pretraining: export encoder.pt; fine-tuning:
test metrics with the selected weights). Rank 0 writes through a `RunWriter`
(coreecg.train.writer); the console's lines are coreecg.train.console's. `run_local` runs the
same loop in one process, without Ray.

Epochs are numbered from 1 wherever a person reads them: the console ("epoch 2/6"), every record
of metrics.jsonl and every report (`"epoch": 2`: the epoch the record belongs to), TensorBoard
and file names (`reconstruction_epoch2.png`), a task's `should_evaluate` / `evaluate`. Only the
loop's own position (the checkpoint payload's "epoch", `Task.inputs`' crop seed) counts from 0.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Protocol

import numpy as np
import torch

from coreecg.checkpoints import CheckpointError, load_latest, prune_checkpoints, save_step
from coreecg.config import Config
from coreecg.devices import resolve_device
from coreecg.run_record import end_session
from coreecg.train.resume_check import check_compatible
from coreecg.train.run_speed import startup_record
from coreecg.train.console import progress_line, progress_log, progress_record, progress_text
from coreecg.train.ingest import memory_epoch_batches, seed_for
from coreecg.train.plan import RunPlan, write_run_folder
from coreecg.train.speed import graphs_compiled, release_freed_memory, uncompiled
from coreecg.train.step import TrainStep
from coreecg.train.writer import RunWriter

log = logging.getLogger(__name__)


@dataclass
class WorkerContext:
    """What a worker's environment provides to `train_worker`.

    epoch_batches(epoch) -> iterable of (signal (b, C, T_stored) on device, uid (b,)); every rank
        yields at least `steps_per_epoch` batches.
    report(metrics, checkpoint, saved=None) persists metrics and, when `checkpoint` (a payload
        dict, rank 0 only) is given, a checkpoint; then calls `saved()` (if given), then reports
        (under Ray every rank must call it: a barrier; a Tune trial may be stopped inside it).
    latest() -> (payload, its config, path) of the checkpoint to resume from, or None.
    """

    rank: int
    world_size: int
    device: torch.device
    steps_per_epoch: int
    run_dir: Path
    epoch_batches: Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]
    report: Callable[..., None]       # (metrics, checkpoint payload | None, saved=None)
    latest: Callable[[], tuple[dict, Config, Path] | None]
    wrap: Callable[[torch.nn.Module], torch.nn.Module] = lambda m: m
    started: float = 0.0      # when the worker's training function began (s since the epoch; 0: not known)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _floats(metrics: dict[str, torch.Tensor]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def _mean_over_ranks(sums: dict[str, torch.Tensor], count: int, world_size: int,
                     device: torch.device) -> dict[str, float]:
    """Epoch means over every rank's steps: one all-reduce of a stacked vector on `device`
    (some sums live on the host: lr, mask fractions)."""
    keys = sorted(sums)
    vec = torch.stack([sums[k].float().to(device) for k in keys]) / max(count, 1)
    if world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(vec)
        vec /= world_size
    return dict(zip(keys, vec.tolist()))


class Task(Protocol):
    """What a training task supplies to `train_worker` (coreecg.train.pretraining.PretrainTask,
    coreecg.train.finetuning.FinetuneTask).

    name: the checkpoint payload's "task" and the TensorBoard prefix of step scalars.
    epochs, global_batch: the run's length and its batch over all ranks.
    build(ctx) -> (bare, step): the bare model on ctx.device and its TrainStep (which holds the
        wrapped model); called after seeding, so every rank builds identical weights.
    inputs(signal, uid, epoch, generator) -> (args, kwargs) of one step, from a stored batch.
    start(bare, ctx, writer) -> state entries of a fresh run (rank 0; e.g. the probe at init).
    should_evaluate(epoch) -> whether rank 0 evaluates after this epoch.
    evaluate(bare, ctx, writer, epoch, step, state) -> epoch metrics (rank 0; may update state).
    finish(bare, ctx, writer, summary, state): rank 0, once the last epoch is done.
    """

    name: str
    epochs: int
    global_batch: int

    def build(self, ctx: "WorkerContext") -> tuple[torch.nn.Module, TrainStep]: ...
    def inputs(self, signal: torch.Tensor, uid: torch.Tensor, epoch: int,
               generator: torch.Generator) -> tuple[tuple, dict]: ...
    def start(self, bare: torch.nn.Module, ctx: "WorkerContext", writer: "RunWriter") -> dict[str, Any]: ...
    def should_evaluate(self, epoch_number: int) -> bool: ...     # the epoch, from 1
    def evaluate(self, bare: torch.nn.Module, ctx: "WorkerContext", writer: "RunWriter", epoch: int, step: int,
                 state: dict[str, Any]) -> dict[str, float]: ...
    def finish(self, bare: torch.nn.Module, ctx: "WorkerContext", writer: "RunWriter", summary: dict[str, float],
               state: dict[str, Any]) -> None: ...


def train_worker(task: Task, config: Config, ctx: WorkerContext) -> dict[str, float]:
    """Train `task` from the latest checkpoint (or from scratch) to task.epochs, then finish.

    Returns the last epoch's metrics (rank 0's view; evaluation metrics only on rank 0).
    """
    writer = RunWriter(ctx.run_dir, ctx.is_main, config, task.name)
    if ctx.started:                                                # start-up phases: coreecg.train.run_speed
        writer.line({**startup_record("workers"), "time": round(ctx.started, 3)})
    writer.line(startup_record("task"))                            # the task's data (probe, figures) read
    torch.manual_seed(seed_for("init", config.train.seed))        # identical init on every rank
    bare, step = task.build(ctx)
    writer.line(startup_record("model"))
    run = _Run(task, config, ctx, bare, step, writer)
    done_in_epoch = run.resume_or_start()
    writer.line(startup_record("start"))                           # the checkpoint loaded, or the probe at init
    summary: dict[str, float] = {}
    while run.epoch < task.epochs:
        sums, count, seconds = run.train_epoch(done_in_epoch)
        done_in_epoch = 0
        summary = run.end_epoch(sums, count, seconds)
        run.epoch += 1
    if ctx.is_main:
        with uncompiled(bare):                                     # evaluation runs eager (speed.uncompiled)
            task.finish(bare, ctx, run.writer, summary, run.state)
        end_session(ctx.run_dir, "completed")
    run.writer.close()
    return summary


@dataclass
class _EpochClock:
    """One epoch's time marks (time.perf_counter s): its start, the last step log and the steps
    since, the last progress line, and its first step (first: None until it ran; first_i: its index)."""

    started: float
    log: float
    progress: float
    log_steps: int = 0
    first: float | None = None
    first_i: int = 0

    @classmethod
    def start_now(cls) -> "_EpochClock":
        now = time.perf_counter()
        return cls(started=now, log=now, progress=now)


class _Run:
    """One worker's training state between the loop's parts: the task, its model and step, the
    epoch (counted from 0), the task's state and rank 0's writer."""

    def __init__(self, task: Task, config: Config, ctx: WorkerContext, bare: torch.nn.Module, step: TrainStep,
                 writer: RunWriter):
        self.task, self.cfg, self.ctx, self.bare, self.step, self.writer = task, config, ctx, bare, step, writer
        self.step_gen = torch.Generator()   # on the host: masks need no device sync (CoReECG._masks)
        self.epoch, self.state, self.first_step = 0, {}, True
        self.recompiled = 0       # graphs compiled in training steps after this session's first (the goal: 0)
        self.graphs_before = graphs_compiled()     # dynamo's counters are per process, not per run

    def resume_or_start(self) -> int:
        """Load the newest checkpoint (-> batches of its epoch already done), or start fresh (-> 0)."""
        ctx, task, epoch_steps = self.ctx, self.task, self.ctx.steps_per_epoch
        resumed = ctx.latest()
        if resumed is None:
            torch.manual_seed(seed_for("torch", self.cfg.train.seed, ctx.rank))
            if ctx.is_main:
                with uncompiled(self.bare):         # the probe at init builds no graphs (speed.uncompiled)
                    self.state.update(task.start(self.bare, ctx, self.writer))
            return 0
        payload, saved, path = resumed
        if payload.get("task", "pretrain") != task.name:
            raise CheckpointError(f"{path}: a {payload.get('task', 'pretrain')} checkpoint, not {task.name}; "
                                  "use another run folder")
        check_compatible(path, saved, self.cfg)
        self.bare.load_state_dict(payload["model"])
        self.step.load_state_dict(payload["trainer"])
        self.epoch, done, self.state = int(payload["epoch"]), int(payload["batches_done"]), dict(payload["state"])
        if ctx.is_main and "torch_rng" in payload:
            torch.set_rng_state(payload["torch_rng"])
        if done >= epoch_steps:
            self._restore_epoch_line(payload, path)
            self.epoch, done = self.epoch + 1, 0
        self.writer.line({"event": "resume", "step": self.step.step, "epoch": self.epoch + 1, "batches_done": done,
                          "checkpoint": str(path)})
        if ctx.is_main:
            log.info("resumed from %s: step %d, epoch %d, %d batches into it", path, self.step.step, self.epoch + 1,
                     done)
        return done

    def payload(self, batches_done: int, metrics: dict[str, float]) -> dict[str, Any] | None:
        """The checkpoint of this moment (rank 0; None elsewhere)."""
        if not self.ctx.is_main:
            return None
        return {"model": self.bare.state_dict(), "trainer": self.step.state_dict(), "task": self.task.name,
                "epoch": self.epoch, "batches_done": batches_done, "state": self.state, "metrics": metrics,
                "torch_rng": torch.get_rng_state()}

    def train_epoch(self, done_in_epoch: int) -> tuple[dict[str, torch.Tensor], int, float]:
        """The epoch's steps (skipping the `done_in_epoch` a resumed checkpoint had done), with
        step logs, progress lines and mid-epoch checkpoints -> (metric sums, steps, seconds)."""
        clock = _EpochClock.start_now()
        sums: dict[str, torch.Tensor] = {}
        count = 0
        graphs0 = graphs_compiled()         # evaluation runs eager (uncompiled); counted apart all the same
        for i, signal, uid in self._batches(done_in_epoch):
            metrics = self._one_step(signal, uid)
            for k, v in metrics.items():     # summed on the device: no host sync per step
                sums[k] = sums.get(k, 0) + v.detach().float()
            count += 1
            clock.log_steps += 1
            if self.first_step:
                graphs0 = self._first_step_done()
            self._progress(clock, i)
            self._log_step(clock, metrics)
            self._mid_epoch_checkpoint(i, metrics)
        self.recompiled += graphs_compiled() - graphs0
        return sums, count, time.perf_counter() - clock.started

    def _batches(self, done_in_epoch: int) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
        """This epoch's batches still to train on: (index in the epoch, signal (b, C, T_stored), uid (b,)),
        after the `done_in_epoch` a resumed checkpoint had done (read and dropped)."""
        ctx, epoch_steps = self.ctx, self.ctx.steps_per_epoch
        batches = iter(ctx.epoch_batches(self.epoch))
        for i in range(epoch_steps):
            try:
                signal, uid = next(batches)
            except StopIteration:
                raise RuntimeError(f"rank {ctx.rank}: epoch {self.epoch} ended after {i} of {epoch_steps} batches; "
                                   "every rank must get the same number of full batches") from None
            if i >= done_in_epoch:
                yield i, signal, uid

    def _one_step(self, signal: torch.Tensor, uid: torch.Tensor) -> dict[str, torch.Tensor]:
        """One training step on a stored batch, seeded by (seed, rank, step) -> its scalar metrics
        (on the device)."""
        if self.first_step and self.ctx.is_main:
            self.writer.line(startup_record("batch"))
        self.step_gen.manual_seed(seed_for("step", self.cfg.train.seed, self.ctx.rank, self.step.step))
        args, kwargs = self.task.inputs(signal, uid, self.epoch, self.step_gen)
        return {k: v for k, v in self.step(*args, **kwargs).items() if v.ndim == 0}

    def _first_step_done(self) -> int:
        """The session's first step line (start-up cost: bench/study.py, coreecg.train.run_speed)
        -> the graphs compiled so far, from which the epoch counts recompilations."""
        graphs = graphs_compiled()
        self.writer.line({"event": "first_step", "step": self.step.step, "epoch": self.epoch + 1,
                          "compiled": bool(getattr(self.bare, "compiled", False)),
                          "graphs": graphs - self.graphs_before})    # this session's, up to here
        self.first_step = False
        return graphs

    def _progress(self, clock: "_EpochClock", i: int) -> None:
        """A progress line every `train.progress_every_s` seconds (rank 0; none after the epoch's
        last step), its speed timed from the epoch's first step (start-up apart)."""
        every_s, epoch_steps, task = self.cfg.train.progress_every_s, self.ctx.steps_per_epoch, self.task
        if clock.first is None:
            clock.first, clock.first_i = time.perf_counter(), i
            return
        if not (every_s and self.ctx.is_main and time.perf_counter() - clock.progress >= every_s
                and i + 1 < epoch_steps):
            return
        clock.progress = time.perf_counter()
        record = progress_record(self.epoch + 1, task.epochs, i + 1, epoch_steps, self.step.step, task.global_batch,
                                 (clock.progress - clock.first) / (i - clock.first_i))
        self.writer.line(record)
        progress_log.info("%s", progress_text(record))

    def _log_step(self, clock: "_EpochClock", metrics: dict[str, torch.Tensor]) -> None:
        """Every `train.log_every` steps (rank 0): the step's metrics and the samples/s since the
        last log, as TensorBoard scalars and a metrics.jsonl line."""
        if self.step.step % self.cfg.train.log_every != 0 or not self.ctx.is_main:
            return
        now = time.perf_counter()
        values = {**_floats(metrics), "samples_per_s": clock.log_steps * self.task.global_batch / (now - clock.log)}
        self.writer.scalars(self.task.name, values, self.step.step)
        self.writer.line({"kind": "step", "step": self.step.step, "epoch": self.epoch + 1, **values})
        clock.log, clock.log_steps = now, 0

    def _mid_epoch_checkpoint(self, i: int, metrics: dict[str, torch.Tensor]) -> None:
        """Every `train.checkpoint_every_steps` steps, but the epoch's last (its end reports it): a
        report with a checkpoint after batch `i` (a barrier under Ray)."""
        every = self.cfg.train.checkpoint_every_steps
        if every and self.step.step % every == 0 and i + 1 < self.ctx.steps_per_epoch:
            self.ctx.report({"step": self.step.step, "epoch": self.epoch + 1, **_floats(metrics)},
                            self.payload(i + 1, {}))

    def end_epoch(self, sums: dict[str, torch.Tensor], count: int, seconds: float) -> dict[str, float]:
        """Epoch means over every rank, rank 0's evaluation, the epoch line and the report with
        its checkpoint (a barrier under Ray) -> the epoch's summary."""
        ctx, task, epoch_number = self.ctx, self.task, self.epoch + 1
        release_freed_memory()
        summary = _mean_over_ranks(sums, count, ctx.world_size, ctx.device) if sums else {}
        summary.update(epoch=epoch_number, step=self.step.step, seconds=seconds,
                       samples_per_s=count * task.global_batch / seconds if count else 0.0)
        if ctx.is_main and task.should_evaluate(epoch_number):
            with uncompiled(self.bare):
                summary.update(task.evaluate(self.bare, ctx, self.writer, epoch_number, self.step.step, self.state))
        summary.update({k: v for k, v in self.state.items() if isinstance(v, float)})
        extra = task.epoch_record(ctx) if hasattr(task, "epoch_record") else {}   # every rank (collective)
        record = {"kind": "epoch", **summary, **extra, "graphs_compiled_after_first_step": self.recompiled}
        payload = self.payload(ctx.steps_per_epoch, summary)
        if payload is not None:
            payload["epoch_record"] = record
        # The epoch's line follows its checkpoint (a worker lost between the two would otherwise leave
        # the line of an epoch the resumed run trains again) and precedes the report (where Tune may
        # stop the trial); a checkpoint whose line is missing gets it back on resume (resume_or_start).
        ctx.report(summary, payload, saved=lambda: self._write_epoch(record, summary))
        return summary

    def _write_epoch(self, record: dict[str, Any], summary: dict[str, float]) -> None:
        """The epoch's line in metrics.jsonl, its summary's TensorBoard scalars and its console line
        (rank 0)."""
        self.writer.line(record)
        self.writer.scalars("epoch", {k: v for k, v in summary.items() if k not in ("epoch", "step")}, self.step.step)
        if self.ctx.is_main:
            progress_log.info("%s", progress_line(record, self.task.epochs,
                                                  getattr(self.bare, "reported_losses", ())))

    def _restore_epoch_line(self, payload: dict[str, Any], path: Path) -> None:
        """Resumed from an epoch's last checkpoint whose line never reached metrics.jsonl (the worker
        was lost between the two): write that line now, from the checkpoint, so that every epoch has
        exactly one (rank 0)."""
        record = payload.get("epoch_record")
        if not self.ctx.is_main or record is None:
            return
        log_path = self.ctx.run_dir / "metrics.jsonl"
        number = record.get("epoch")
        for line in (log_path.read_text().splitlines() if log_path.is_file() else ()):
            try:
                old = json.loads(line)
            except ValueError:             # a line cut off by the loss of its writer
                continue
            if old.get("kind") == "epoch" and old.get("epoch") == number:
                return
        self._write_epoch({**record, "restored_from": str(path)}, payload.get("metrics") or {})


# ---------------------------------------------------------------------------- plain (no Ray)


def run_local(plan: RunPlan, task: Task, windows: np.ndarray) -> dict[str, float]:
    """The no-Ray reference: one process, in-memory train windows (n, C, T_stored) float32/16 whose
    row index is the uid (`plan` from `coreecg.train.plan.plan_local`), the same loop. Checkpoints
    go to the run folder's checkpoint_step<N>/ through the store (`coreecg.checkpoints`; the last
    `train.keep_checkpoints` kept); re-running with the same run folder resumes.

    It lives beside the loop because it is the loop in one process: only its `WorkerContext` (one
    rank, batches from memory, checkpoints straight to the store) is its own, with no Ray to drive."""
    config, run_dir = plan.config, write_run_folder(plan)
    device = resolve_device(config.train.device)
    data = torch.from_numpy(np.ascontiguousarray(windows))
    if len(data) != plan.train_windows:
        raise ValueError(f"{len(data)} windows for a plan of {plan.train_windows}")
    bs = task.global_batch

    def report(metrics: dict[str, float], payload: dict[str, Any] | None,
               saved: Callable[[], None] | None = None) -> None:
        if payload is not None:
            save_step(run_dir, payload["trainer"]["step"], payload.pop("model"), config, **payload)
            prune_checkpoints(run_dir, config.train.keep_checkpoints)
        if saved is not None:
            saved()

    ctx = WorkerContext(
        rank=0, world_size=1, device=device, steps_per_epoch=plan.steps_per_epoch, run_dir=run_dir,
        epoch_batches=lambda epoch: memory_epoch_batches(data, bs, epoch, config.train.seed, device),
        report=report, latest=lambda: load_latest(run_dir, device))
    return train_worker(task, config, ctx)
