"""The training console's lines: a mid-epoch progress record and its text, and an epoch record as
one line. Rank 0 writes both records to metrics.jsonl (coreecg.train.loop) and prints them in a
process without Ray Train; under Ray Train the driver prints them from the file
(coreecg.train.follower.RunFollower).
"""
from __future__ import annotations

import logging
import math
from typing import Any, Iterable

# Epoch and progress lines have their own logger: under Ray Train the driver prints them (one line
# per epoch on its console), so the workers turn this one off (coreecg.train.fit).
progress_log = logging.getLogger(f"{__name__}.progress")


def progress_record(epoch_number: int, epochs: int, batch: int, steps_per_epoch: int, step: int, global_batch: int,
                    seconds_per_step: float) -> dict[str, Any]:
    """A mid-epoch progress record (metrics.jsonl `"kind": "progress"`): where the run is, its
    speed over this epoch's steps so far, and the time left in the epoch and in the run
    (steps only: evaluations come on top)."""
    left_epoch = (steps_per_epoch - batch) * seconds_per_step
    return {"kind": "progress", "epoch": epoch_number, "epochs": epochs, "batch": batch, "batches": steps_per_epoch,
            "step": step, "samples_per_s": global_batch / seconds_per_step,
            "eta_epoch_s": left_epoch,
            "eta_run_s": left_epoch + (epochs - epoch_number) * steps_per_epoch * seconds_per_step}


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds} s" if seconds < 120 else f"{seconds // 60} min {seconds % 60:02d} s"


def progress_text(r: dict[str, Any]) -> str:
    """A progress record as one console line."""
    return (f"  epoch {r['epoch']}/{r['epochs']} | batch {r['batch']}/{r['batches']} | step {r['step']} | "
            f"{r['samples_per_s']:.1f} samples/s | ETA epoch {_duration(r['eta_epoch_s'])}, "
            f"run {_duration(r['eta_run_s'])}")


def progress_line(s: dict[str, float], epochs: int, losses: Iterable[str] | None = None) -> str:
    """An epoch record as one console line. losses: the loss terms the method reports
    (`PretrainMethod.reported_losses`, each "loss_<label>", shown as "<label> value"); None: every
    "loss_*" key of the record (the driver's follower reads records, not the method)."""
    parts = [f"epoch {int(s['epoch'])}/{epochs}", f"step {int(s['step'])}"]
    losses = [k for k in s if k.startswith("loss_")] if losses is None else list(losses)
    for key, label in (("loss", "loss"), *((k, k.removeprefix("loss_")) for k in losses),
                       ("probe_auroc", "probe_auroc"), ("probe_auroc_init", "at init"), ("val_auroc", "val_auroc"),
                       ("val_acc", "val_acc"), ("best_val_auroc", "best")):
        if isinstance(s.get(key), float) and not math.isnan(s[key]):
            parts.append(f"{label} {s[key]:.4f}")
    parts.append(f"{s['samples_per_s']:.1f} samples/s")
    parts.append(f"{s['seconds']:.1f} s")
    return " | ".join(parts)
