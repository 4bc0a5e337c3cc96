"""Training on Ray Train: a TorchTrainer whose workers run the shared loop (`train_worker`) on Ray
Data shards, for pretraining (here) and fine-tuning (`coreecg.train.finetuning`).

    from coreecg.train.distributed import pretrain
    result = pretrain(load_config("configs/quickstart.yaml"))   # -> run folder, metrics, encoder

Outputs go to `<train.storage_path>/<train.name>/`: Ray's checkpoint folders
(`checkpoint_step<N>/checkpoint.pt`, the last `train.keep_checkpoints` kept), and rank 0's
`config.yaml`, `metrics.jsonl`, `tensorboard/`, `figures/` and, at the end, `encoder.pt`.
Re-running with the same storage path and name resumes from the latest checkpoint; a worker
that dies is replaced up to `train.max_failures` times and resumes the same way.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from coreecg.config import Config, ConfigError, config_from_dict, load_config
from coreecg.train.checkpoint import (
    CheckpointError, changed_keys, check_compatible, load_checkpoint, save_checkpoint, verify_checkpoint,
)
from coreecg.train.ingest import epoch_batches, train_windows, training_dataset
from coreecg.train.loop import CHECKPOINT_FILE, WorkerContext, checkpoint_dirs, step_of, train_worker

FIGURE_WINDOWS = 2


def _progress_callback(epochs: int):
    """A Ray Train UserCallback (runs in the Train controller) that prints one line per epoch
    from rank 0's report, so the console shows progress once, not once per worker."""
    from ray.train import UserCallback

    from coreecg.train.loop import progress_line

    class Progress(UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            m = metrics[0] if metrics else {}
            if "seconds" in m:              # epoch reports; mid-epoch checkpoints carry no timing
                print(progress_line(m, epochs), flush=True)

        def after_exception(self, run_context, worker_exceptions):
            for rank, exc in worker_exceptions.items():
                print(f"worker {rank} failed: {type(exc).__name__}: {exc}", flush=True)

    return Progress()


@dataclass
class PretrainResult:
    run_dir: Path
    metrics: dict[str, Any]
    checkpoint: str | None
    encoder: Path


# ---------------------------------------------------------------------------- corpora


def synthetic_corpus(config: Config) -> Path:
    """The embedded synthetic corpus as Parquet under `data.cache_dir`, built on first use
    (a re-run skips finished shards, so this is cheap once built)."""
    from coreecg.data.pipeline import build_corpus

    d = config.data
    path = (Path(d.cache_dir) / f"synthetic-n{d.synthetic_records}-seed{d.sources.synthetic_seed}").resolve()
    options = d.sources.for_source("synthetic", d.synthetic_records)
    manifest = path / "manifest.json"
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        wanted = json.loads(json.dumps([options, dataclasses.asdict(d.preprocess), d.split_ratios, d.shard_records]))
        if [m.get("source_options"), m.get("preprocess"), m.get("split_ratios"), m.get("shard_records")] == wanted:
            return path
    print(f"building the embedded synthetic corpus ({d.synthetic_records} records) at {path}")
    build_corpus("synthetic", None, path, d, source_options=options)
    return path


def training_corpus(config: Config) -> Path:
    return Path(config.data.corpus).resolve() if config.data.corpus else synthetic_corpus(config)


def probe_corpus(config: Config, corpus: Path) -> Path | None:
    """data.probe_corpus, else the training corpus when it is labelled, else None."""
    from coreecg.data.corpus import load_manifest

    if config.data.probe_corpus:
        path = Path(config.data.probe_corpus).resolve()
        if not load_manifest(path)["class_names"]:
            raise ValueError(f"data.probe_corpus={path} has no labels")
        return path
    return corpus if load_manifest(corpus)["class_names"] else None


# ---------------------------------------------------------------------------- pre-flight


def preflight(run_dir: Path, config: Config) -> list[str]:
    """Before any worker starts: an existing run folder must hold this model's config and
    intact checkpoints (CheckpointError naming the file otherwise). Returns the config keys
    that differ from the saved run (allowed: schedule, logging, data; reported on resume)."""
    notes: list[str] = []
    saved_yaml = run_dir / "config.yaml"
    if saved_yaml.is_file():
        try:
            saved = load_config(saved_yaml)
        except ConfigError as e:
            raise CheckpointError(f"{saved_yaml}: the run folder's config is not valid here: {e}") from e
        check_compatible(saved_yaml, saved, config)
        notes = changed_keys(saved, config)
    dirs = checkpoint_dirs(run_dir)
    for d in dirs[:-1]:
        verify_checkpoint(d / CHECKPOINT_FILE)
    if dirs:
        _, saved = load_checkpoint(dirs[-1] / CHECKPOINT_FILE)
        check_compatible(dirs[-1] / CHECKPOINT_FILE, saved, config)
    return notes


# ---------------------------------------------------------------------------- the worker


def _ray_worker(loop_config: dict[str, Any]) -> None:
    """train_loop_per_worker: the shared loop with Ray's data, DDP and reporting; the task
    (loop_config["task"]: pretrain | finetune) is built here, on the worker."""
    import ray.train
    import ray.train.torch

    _quiet_worker_logs()
    rc = ray.train.get_context()
    device = ray.train.torch.get_device()

    def wrap(model: torch.nn.Module) -> torch.nn.Module:
        # Buffers (positions, a fixed FDA map) are constants: no per-step broadcast.
        return ray.train.torch.prepare_model(model, move_to_device=False,
                                             parallel_strategy_kwargs={"forward_sync_buffers": False})

    run_task(loop_config, ray.train.get_dataset_shard("train"), rc.get_world_rank(), rc.get_world_size(),
             device, report_fn=ray.train.report, get_checkpoint=ray.train.get_checkpoint, wrap=wrap)


def _quiet_worker_logs() -> None:
    import warnings

    # Ray hands read-only Arrow buffers to torch; the batch is never written in place.
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
    # Train logs every report (the whole metrics dict) at INFO under a logger named after its
    # file, outside LoggingConfig's reach; the controller callback prints one line instead.
    try:
        from ray.train.v2._internal.execution import context as _train_context
        logging.getLogger(_train_context.__file__).setLevel(logging.WARNING)
    except ImportError:
        pass


def run_task(loop_config: dict[str, Any], shard, rank: int, world: int, device: torch.device, *,
             report_fn, get_checkpoint, wrap=lambda m: m, checkpoint_cls=None) -> dict[str, float]:
    """One worker of a run: the task from loop_config on a Ray Data shard (or a whole-dataset
    iterator), reporting through `report_fn(metrics, checkpoint=..., [checkpoint_dir_name=...])`
    and resuming from `get_checkpoint()`: ray.train's inside a TorchTrainer, ray.tune's inside
    a single-process Tune trial (coreecg.tune.trial)."""
    import inspect

    from ray.train import Checkpoint

    Checkpoint = checkpoint_cls or Checkpoint      # ray.tune.Checkpoint for tune.report
    cfg = config_from_dict(loop_config["config"])
    if device.type == "cpu":
        torch.set_num_threads(max(1, cfg.train.cpus_per_worker))
    task = _make_task(cfg, loop_config, rank, device)
    per_worker = task.global_batch // world
    run_dir = Path(loop_config["run_dir"])
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
        rank=rank, world_size=world, device=device, steps_per_epoch=loop_config["steps_per_epoch"],
        run_dir=run_dir,
        epoch_batches=lambda epoch: epoch_batches(shard, per_worker, epoch, cfg.train.seed, rank,
                                                  cfg.data.shuffle_buffer, device),
        report=report, latest=latest, wrap=wrap, quiet=True)
    return train_worker(task, cfg, ctx)


def _checkpoint_step(ckpt) -> int:
    """The step of a Ray checkpoint: from its folder name (checkpoint_step<N>) or its payload."""
    try:
        return step_of(Path(ckpt.path))
    except ValueError:
        with ckpt.as_directory() as d:
            payload, _ = load_checkpoint(Path(d) / CHECKPOINT_FILE)
        return int(payload["trainer"]["step"])


def _make_task(cfg: Config, loop_config: dict[str, Any], rank: int, device: torch.device):
    if loop_config["task"] == "finetune":
        from coreecg.train.finetuning import FinetuneTask

        return FinetuneTask(cfg, loop_config["spec"], rank, device)
    from coreecg.methods import method_class
    from coreecg.train.pretraining import PretrainTask

    probe, figures = _rank0_eval_data(cfg, loop_config) if rank == 0 else (None, None)
    record_of = record_ids(loop_config["corpus"]) if method_class(cfg.pretrain.method).needs_record_ids else None
    return PretrainTask(cfg, probe, figures if cfg.train.figures else None, record_of)


def record_ids(corpus: str | Path) -> torch.Tensor:
    """(N,) int64 over the train split's uids: windows of one recording share an id."""
    import numpy as np

    from coreecg.train.ingest import split_uids

    _, ids = np.unique(split_uids(corpus)["record_id"], return_inverse=True)
    return torch.from_numpy(ids.astype(np.int64))


def _rank0_eval_data(cfg: Config, loop_config: dict[str, Any]):
    """The probe's windows and the figure's fixed validation windows (rank 0 only)."""
    from coreecg.data.corpus import load_manifest
    from coreecg.eval.probe import center_crop, load_probe_data, read_spread

    probe = load_probe_data(loop_config["probe_corpus"], cfg.data.probe_max_windows) \
        if loop_config["probe_corpus"] else None
    # The figure shows validation windows; a corpus without a val split shows train windows.
    corpus = loop_config["corpus"]
    splits = {s["split"] for s in load_manifest(corpus)["shards"]}
    split = "val" if "val" in splits else "train"
    windows = read_spread(corpus, split, FIGURE_WINDOWS, labelled_only=False)["signal"]
    return probe, center_crop(torch.from_numpy(windows), cfg.data.crop_samples)


# ---------------------------------------------------------------------------- the driver


def start_ray(config: Config) -> None:
    """Connect to (or start) the cluster with CPUs for the workers plus Ray Data's own, and quiet
    Ray Data's per-epoch progress output (the context propagates to the Train workers)."""
    from ray.data import DataContext

    from coreecg.cluster import init_ray

    t = config.train
    init_ray(t.num_workers * t.cpus_per_worker)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = ctx.enable_operator_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.WARNING)   # per-execution INFO lines, every epoch


def steps_per_epoch(corpus: Path, n_windows: int, global_batch: int, num_workers: int, key: str) -> int:
    """Full batches per epoch on every rank (ValueError when there is not even one)."""
    steps = (n_windows // num_workers) // (global_batch // num_workers)
    if steps == 0:
        raise ValueError(f"{corpus}: {n_windows} training windows give no full batch of {global_batch} "
                         f"over {num_workers} workers; lower {key}")
    return steps


def make_trainer(config: Config, loop_config: dict[str, Any], dataset, epochs: int, *, quiet: bool,
                 callbacks: list | None):
    """The TorchTrainer of a run folder (`train.run_dir`): workers, failures, checkpoints, logging."""
    import ray.train
    from ray.train.torch import TorchTrainer

    t, run_dir = config.train, config.train.run_dir
    return TorchTrainer(
        _ray_worker,
        train_loop_config={"config": config.to_dict(), "run_dir": str(run_dir), **loop_config},
        scaling_config=ray.train.ScalingConfig(num_workers=t.num_workers, use_gpu=t.use_gpu,
                                               resources_per_worker={"CPU": t.cpus_per_worker}),
        run_config=ray.train.RunConfig(
            name=run_dir.name, storage_path=str(run_dir.parent),
            failure_config=ray.train.FailureConfig(max_failures=t.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=t.keep_checkpoints),
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
            callbacks=[*(callbacks or []), *([] if quiet else [_progress_callback(epochs)])]),
        datasets={"train": dataset},
    )


def build_trainer(config: Config, *, quiet: bool = False, callbacks: list | None = None):
    """Everything up to `fit()` of a pretraining: corpus, dataset, pre-flight, the TorchTrainer.

    -> (trainer, run_dir). Tune trials call this and `fit()` themselves.
    """
    t = config.train
    start_ray(config)
    corpus = training_corpus(config)
    n = train_windows(corpus)
    spe = steps_per_epoch(corpus, n, config.optim.batch_size, t.num_workers, "optim.batch_size")
    probe = probe_corpus(config, corpus)
    run_dir = t.run_dir
    notes = preflight(run_dir, config)
    run_dir.mkdir(parents=True, exist_ok=True)
    config.to_yaml(run_dir / "config.yaml")
    if not quiet:
        print(f"run folder: {run_dir}")
        print(f"method: {config.method_label} (pretrain.method={config.pretrain.method})")
        print(f"corpus: {corpus} ({n} training windows, {spe} steps/epoch of "
              f"{config.optim.batch_size} over {t.num_workers} worker(s))")
        print(f"probe: {probe if probe else 'none (the training corpus has no labels; set data.probe_corpus)'}")
        if notes:
            print(f"resuming with changed settings: {', '.join(notes)}")
    loop_config = {"task": "pretrain", "steps_per_epoch": spe, "corpus": str(corpus),
                   "probe_corpus": str(probe) if probe else ""}
    dataset = training_dataset(corpus, t.seed, config.data.cache_in_memory_gb)
    return make_trainer(config, loop_config, dataset, config.optim.epochs, quiet=quiet, callbacks=callbacks), run_dir


def pretrain(config: Config, *, quiet: bool = False) -> PretrainResult:
    """Run (or resume) a pretraining on the Ray cluster; returns where everything went."""
    trainer, run_dir = build_trainer(config, quiet=quiet)
    result = trainer.fit()
    return PretrainResult(run_dir=run_dir, metrics=dict(result.metrics or {}),
                          checkpoint=result.checkpoint.path if result.checkpoint else None,
                          encoder=run_dir / "encoder.pt")
