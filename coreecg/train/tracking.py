"""Experiment tracking beside the run folder: `train.tracking=mlflow|wandb` logs a run's config
(as params) and each epoch's metrics (and a fine-tuning's test metrics) to MLflow or Weights &
Biases, through Ray's integrations (`ray.air.integrations.mlflow.setup_mlflow`,
`ray.air.integrations.wandb.setup_wandb`); only rank 0 writes a run folder, so only rank 0 logs.

    python jobs/pretrain.py --set train.tracking=mlflow          # -> runs/mlruns (a file store)
    mlflow ui --backend-store-uri runs/mlruns                    # (pip install 'coreecg[mlflow]')
    python jobs/pretrain.py --set train.tracking=wandb           # -> runs/pretrain/wandb/offline-run-*
    wandb sync runs/pretrain/wandb/offline-run-*                 # (pip install 'coreecg[wandb]')

`train.tracking_uri` names a store or server; "" needs none:
- MLflow: "" is a file store at `<train.storage_path>/mlruns` (MLflow 3 calls file stores
  "maintenance mode": we set MLFLOW_ALLOW_FILE_STORE=true for them); sqlite:// or http:// as given.
- W&B: "" is offline mode, the run's files in `<run folder>/wandb/` (no network, no API key);
  a server's address (https://api.wandb.ai, a W&B server) logs online with the usual API key.
`train.tracking_experiment` is the MLflow experiment or the W&B project. A run is named after its
run folder; each session (a resumed run is a new session) is one tracked run.

Sweeps, ablations and studies track every trial (its run folder's name) as one run, grouped by
`train.tracking_group` (set by `track_trials` to the sweep's or study's name): the W&B group
(job_type pretrain|finetune), an MLflow tag `coreecg.group` in the one experiment. Their MLflow
file store is one for all trials, in the sweep's or study's folder.
"""
from __future__ import annotations

import importlib.util
import logging
import math
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Protocol

from coreecg.config import Config
from coreecg.run_record import flat_params

# Lazy imports: mlflow and wandb (optional extras) and Ray's integrations for them (the `ray` extra).

log = logging.getLogger(__name__)
MLRUNS = "mlruns"


class Tracker(Protocol):
    def metrics(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


def tracking_uri(config: Config) -> str:
    """train.tracking_uri, or (MLflow) a file store under train.storage_path."""
    if config.train.tracking_uri:
        return config.train.tracking_uri
    return (Path(config.train.storage_path).expanduser().resolve() / MLRUNS).as_uri()


def _numbers(record: dict[str, Any]) -> dict[str, float]:
    """A record's finite numbers, `step` and `time` left out; a test record's as test_<metric>."""
    prefix = "test_" if record.get("event") == "test" else ""
    return {prefix + k: float(v) for k, v in record.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")
            and math.isfinite(float(v))}


def _tags(config: Config, run_dir: Path, job: str) -> dict[str, str]:
    tags = {"coreecg.run_dir": str(run_dir), "coreecg.task": job or config.train.name}
    if config.train.tracking_group:
        tags["coreecg.group"] = config.train.tracking_group
    return tags


def _allow_file_store(uri: str) -> None:
    # MLflow 3 keeps file stores in maintenance mode and refuses them unless asked; a folder
    # beside the runs is what needs no server, so we ask.
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


class MlflowTracker:
    """One MLflow run for one session of a run folder (rank 0)."""

    def __init__(self, config: Config, run_dir: Path, job: str = ""):
        try:
            from ray.air.integrations.mlflow import setup_mlflow
        except ImportError as e:          # ray[train] without mlflow
            raise RuntimeError("train.tracking=mlflow needs MLflow: pip install 'coreecg[mlflow]'") from e

        uri = tracking_uri(config)
        _allow_file_store(uri)
        self._mlflow = setup_mlflow(
            flat_params(config), tracking_uri=uri,
            experiment_name=config.train.tracking_experiment, create_experiment_if_not_exists=True,
            run_name=run_dir.name, tags=_tags(config, run_dir, job))
        log.info("tracking to MLflow: %s (experiment %s, run %s)", uri, config.train.tracking_experiment, run_dir.name)

    def metrics(self, record: dict[str, Any]) -> None:
        """An epoch record's numbers at its step; a test record's as test_<metric>."""
        self._mlflow.log_metrics(_numbers(record), step=int(record.get("step", 0)))

    def close(self) -> None:
        self._mlflow.end_run()


@contextmanager
def _environ(**values: str) -> Iterator[None]:
    """os.environ with `values` set, restored after (Ray's setup_wandb reads WANDB_MODE to skip
    the API key; the process keeps no trace of it)."""
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            os.environ.pop(k) if v is None else os.environ.update({k: v})


class WandbTracker:
    """One W&B run for one session of a run folder (rank 0): offline files in the run folder
    unless train.tracking_uri names a server."""

    def __init__(self, config: Config, run_dir: Path, job: str = ""):
        try:
            import wandb
            from ray.air.integrations.wandb import setup_wandb
        except ImportError as e:
            raise RuntimeError("train.tracking=wandb needs Weights & Biases: pip install 'coreecg[wandb]'") from e

        uri = config.train.tracking_uri
        mode = "online" if uri else "offline"
        run_dir.mkdir(parents=True, exist_ok=True)
        with _environ(WANDB_MODE=mode):
            # id/resume None: a new W&B run per session, as MLflow (Ray would reuse a Tune trial's id)
            self._run = setup_wandb(
                flat_params(config), project=config.train.tracking_experiment,
                group=config.train.tracking_group or None, job_type=job or None, name=run_dir.name,
                tags=[job] if job else None, notes=str(run_dir), dir=str(run_dir), mode=mode, id=None,
                resume=None, settings=wandb.Settings(base_url=uri) if uri else None)
        self._wandb = wandb
        log.info("tracking to W&B (%s): project %s, run %s%s", uri or f"offline in {run_dir / 'wandb'}",
                 config.train.tracking_experiment, run_dir.name,
                 f", group {config.train.tracking_group}" if config.train.tracking_group else "")

    def metrics(self, record: dict[str, Any]) -> None:
        """An epoch record's numbers at its step; a test record's (no step: it comes after the
        last epoch) into the run's summary as test_<metric>."""
        if record.get("event") == "test":
            self._run.summary.update(_numbers(record))
        else:
            self._run.log(_numbers(record), step=int(record.get("step", 0)))

    def close(self) -> None:
        # finish() can return before W&B's service has written the last records; teardown waits
        # for it, so the run folder (mirrored, synced, read) is complete when the run ends
        self._run.finish()
        self._wandb.teardown()


BACKENDS = {"mlflow": MlflowTracker, "wandb": WandbTracker}


def start_tracking(config: Config, run_dir: Path, job: str = "") -> Tracker:
    """The tracker of config.train.tracking (not "none") for this session; job: pretrain | finetune."""
    return BACKENDS[config.train.tracking](config, run_dir, job)


def track_trials(config: Config, root: Path, group: str) -> list[str]:
    """The overrides that make every trial of a sweep or study (`config`: any of its trials')
    one tracked run in `group`: train.tracking_group and, for MLflow with no URI, one file store
    at <root>/mlruns (trials' storage paths differ). The MLflow experiment is created here, once,
    so that trials starting together do not race to create it. [] without tracking."""
    if config.train.tracking == "none":
        return []
    overrides = [f"train.tracking_group={group}"]
    if config.train.tracking == "wandb" and importlib.util.find_spec("wandb") is None:
        # refused here, before any trial starts, not once in every trial
        raise RuntimeError("train.tracking=wandb needs Weights & Biases: pip install 'coreecg[wandb]'")
    if config.train.tracking == "mlflow":
        uri = config.train.tracking_uri or (Path(root).resolve() / MLRUNS).as_uri()
        overrides.append(f"train.tracking_uri={uri}")
        try:
            from mlflow.tracking import MlflowClient
        except ImportError as e:
            raise RuntimeError("train.tracking=mlflow needs MLflow: pip install 'coreecg[mlflow]'") from e
        _allow_file_store(uri)
        client = MlflowClient(tracking_uri=uri)
        if client.get_experiment_by_name(config.train.tracking_experiment) is None:
            client.create_experiment(config.train.tracking_experiment)
    return overrides
