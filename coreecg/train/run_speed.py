"""A finished run's speed as its user saw it, from its metrics.jsonl (issue 41): samples/s over
the whole run and after the first epoch (which carries compilation, the first Ray Data reads and
warm caches), and the seconds from the command to the first optimiser step.

A median step time hides what a user waits for (a 6 s recompilation among 0.1 s steps), so these
are totals: samples over seconds of the epochs this session trained.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


def command_started() -> float:
    """When this process started (s since the epoch): the command's start, imports included."""
    try:
        import psutil
    except ImportError:            # a light install without psutil: this module's import, early in every job
        return _IMPORTED
    return float(psutil.Process().create_time())


_IMPORTED = time.time()


def run_speed(run_dir: Path | str, since: float) -> dict[str, Any]:
    """The epochs and first step recorded in <run_dir>/metrics.jsonl at or after `since` (this
    command's start) -> {"epochs", "samples", "seconds", "samples_per_s", "samples_per_s_after_first_epoch"
    (None with one epoch), "first_step_s" (None when no first step was recorded)}."""
    epochs, first_step = [], None
    path = Path(run_dir) / "metrics.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:           # a line cut by a kill: the rest still counts
                continue
            if r.get("time", 0.0) < since:
                continue
            if r.get("kind") == "epoch" and r.get("seconds"):
                epochs.append((float(r["samples_per_s"]) * float(r["seconds"]), float(r["seconds"])))
            elif r.get("event") == "first_step" and first_step is None:
                first_step = float(r["time"]) - since

    def rate(part: list[tuple[float, float]]) -> float | None:
        seconds = sum(s for _, s in part)
        return sum(n for n, _ in part) / seconds if seconds > 0 else None

    return {"epochs": len(epochs), "samples": round(sum(n for n, _ in epochs)), "seconds": sum(s for _, s in epochs),
            "samples_per_s": rate(epochs), "samples_per_s_after_first_epoch": rate(epochs[1:]) if len(epochs) > 1 else None,
            "first_step_s": first_step}


def speed_line(speed: dict[str, Any]) -> str:
    """One line for a job's closing summary."""
    if not speed["epochs"]:
        return "speed: no epoch trained in this command"
    parts = [f"speed: {speed['samples_per_s']:.1f} samples/s over {speed['epochs']} epoch(s) of this command"]
    if speed["samples_per_s_after_first_epoch"] is not None:
        parts.append(f"{speed['samples_per_s_after_first_epoch']:.1f} after the first")
    if speed["first_step_s"] is not None:
        parts.append(f"first step {speed['first_step_s']:.1f} s after the command")
    return ", ".join(parts)
