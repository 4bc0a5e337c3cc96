"""Experiment tracking beside the run folder: `train.tracking=mlflow` logs a run's config (as
params) and each epoch's metrics (and a fine-tuning's test metrics) to MLflow, through Ray's
MLflow integration (`ray.air.integrations.mlflow.setup_mlflow`: on a Ray Train worker it logs from
rank 0 only; outside Ray it is plain MLflow).

    python jobs/pretrain.py --set train.tracking=mlflow          # -> runs/mlruns (a file store)
    mlflow ui --backend-store-uri runs/mlruns                    # (pip install mlflow)

`train.tracking_uri` names another store or server; "" is a local file store at
`<train.storage_path>/mlruns`, so nothing needs a server (MLflow 3 calls file stores "maintenance
mode": we set MLFLOW_ALLOW_FILE_STORE=true for them; an sqlite:// or http:// URI is used as
given). The MLflow run is named after the run
folder and tagged with its path; each session (a resumed run is a new session) is one MLflow run.
Sweeps and studies do not track per trial here (Ray Tune's MLflowLoggerCallback does that).
"""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path
from typing import Any

from coreecg.config import Config

log = logging.getLogger(__name__)


def tracking_uri(config: Config) -> str:
    """train.tracking_uri, or a file store under train.storage_path."""
    if config.train.tracking_uri:
        return config.train.tracking_uri
    return (Path(config.train.storage_path).expanduser().resolve() / "mlruns").as_uri()


class MlflowTracker:
    """One MLflow run for one session of a run folder (rank 0)."""

    def __init__(self, config: Config, run_dir: Path):
        try:
            from ray.air.integrations.mlflow import setup_mlflow
        except ImportError as e:          # ray[train] without mlflow
            raise RuntimeError("train.tracking=mlflow needs MLflow: pip install 'coreecg[mlflow]'") from e
        from coreecg.run_record import flat_params

        uri = tracking_uri(config)
        if uri.startswith("file:"):
            # MLflow 3 keeps file stores in maintenance mode and refuses them unless asked; a
            # folder beside the runs is what needs no server, so we ask.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._mlflow = setup_mlflow(
            flat_params(config), tracking_uri=uri,
            experiment_name=config.train.tracking_experiment, create_experiment_if_not_exists=True,
            run_name=run_dir.name, tags={"coreecg.run_dir": str(run_dir), "coreecg.task": config.train.name})
        log.info("tracking to MLflow: %s (experiment %s, run %s)", tracking_uri(config),
                 config.train.tracking_experiment, run_dir.name)

    def metrics(self, record: dict[str, Any]) -> None:
        """An epoch record's numbers at its step; a test record's as test_<metric>."""
        prefix = "test_" if record.get("event") == "test" else ""
        values = {prefix + k: float(v) for k, v in record.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in ("step", "time")
                  and math.isfinite(float(v))}
        self._mlflow.log_metrics(values, step=int(record.get("step", 0)))

    def close(self) -> None:
        self._mlflow.end_run()


def start_tracking(config: Config, run_dir: Path) -> MlflowTracker:
    return MlflowTracker(config, run_dir)
