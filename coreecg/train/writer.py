"""Rank 0's outputs in the run folder while it trains: metrics.jsonl, TensorBoard, figures and,
with `train.tracking`, the tracker (coreecg.train.tracking). The loop (coreecg.train.loop) writes
through one `RunWriter`; on other ranks it is switched off and writes nothing.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from coreecg.config import Config
from coreecg.eval.figures import save_figure
from coreecg.train.tracking import start_tracking

# Lazy imports: tensorboardX (the `ray` extra): the training modules import without it, so the plan's
# preflight (coreecg.train.plan) names the extra to install.


class RunWriter:
    """Rank 0's outputs in the run folder: metrics.jsonl (appended), TensorBoard, figures, and,
    with `train.tracking=mlflow|wandb`, the same epoch metrics there (coreecg.train.tracking);
    job (pretrain | finetune) names the tracked run's kind."""


    def __init__(self, run_dir: Path, enabled: bool, config: Config | None = None, job: str = ""):
        self.enabled, self.run_dir = enabled, run_dir
        self._log = self._tb = self._tracker = None
        if enabled:
            from tensorboardX import SummaryWriter

            run_dir.mkdir(parents=True, exist_ok=True)
            self._log = open(run_dir / "metrics.jsonl", "a")
            self._tb = SummaryWriter(str(run_dir / "tensorboard"))
            if config is not None and config.train.tracking != "none":
                self._tracker = start_tracking(config, run_dir, job)

    def line(self, record: dict[str, Any]) -> None:
        """One JSON line in metrics.jsonl, stamped with the wall-clock `time` (s since the epoch);
        epoch and test records also go to the tracker."""
        if self.enabled:
            self._log.write(json.dumps({"time": round(time.time(), 3), **record}) + "\n")   # a record's own time wins
            self._log.flush()
            if self._tracker is not None and (record.get("kind") == "epoch" or record.get("event") == "test"):
                self._tracker.metrics(record)

    def hparams(self, params: dict[str, Any], metrics: dict[str, float], step: int) -> None:
        """TensorBoard's HParams view: this run's knobs beside its final metrics."""
        if self.enabled:
            metrics = {f"hparam/{k}": float(v) for k, v in metrics.items()
                       if isinstance(v, (int, float)) and math.isfinite(v)}
            self._tb.add_hparams(params, metrics, name="hparams", global_step=step)

    def scalars(self, prefix: str, values: dict[str, float], step: int) -> None:
        if self.enabled:
            for k, v in values.items():
                self._tb.add_scalar(f"{prefix}/{k}", v, step)

    def figure(self, fig, name: str, epoch: int, step: int) -> Path | None:
        if not self.enabled:
            return None
        self._tb.add_figure(f"figures/{name}", fig, step, close=False)
        return save_figure(fig, self.run_dir / "figures" / f"{name}_epoch{epoch}.png")

    def close(self) -> None:
        if self.enabled:
            self._log.close()
            self._tb.close()
            if self._tracker is not None:
                self._tracker.close()
