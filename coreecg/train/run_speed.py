"""A finished run's speed as its user saw it, from its metrics.jsonl: samples/s over
the whole run and after the first epoch (which carries compilation, the first Ray Data reads and
warm caches), and the seconds from the command to the first optimiser step, phase by phase.

Start-up phases, each stamped when it ends: the driver's in this process (`mark`: "ray" the
cluster up, "data" the run planned and its training data on its way: a split to materialise is
materialised beside the next phase, coreecg.train.data_handoff, and its seconds are shown within
it), rank 0's in metrics.jsonl
(`{"event": "startup", "phase": ...}`: "workers" the Train worker group up and in the training
function, "task" the task's own data read (the probe's windows, the figure's), "model" the model
built on its device, "start" the checkpoint resumed from or the probe at init, "batch" the first
batch in hand), then the first step (compilation included). Where the 100 s before a first GPU
step go is then one line. Rank 0 may run on another node than the driver: two clocks.

A median step time hides what a user waits for (a 6 s recompilation among 0.1 s steps), so these
are totals: samples over seconds of the epochs this session trained.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

# Lazy imports: psutil (the `test` extra): a light install has none.


def command_started() -> float:
    """When this process started (s since the epoch): the command's start, imports included."""
    try:
        import psutil
    except ImportError:            # a light install without psutil: this module's import, early in every job
        return _IMPORTED
    return float(psutil.Process().create_time())


_IMPORTED = time.time()
_MARKS: dict[str, float] = {}
PHASES = ("ray", "data", "workers", "task", "model", "start", "batch", "first step")     # in the order they end
DRIVER_PHASES = PHASES[:2]          # marked in the driver's process; the others by rank 0 in metrics.jsonl
# Not a phase: when the split was materialised, beside the worker group's start
# (coreecg.train.data_handoff); its seconds count from the "data" mark and show within "workers".
MATERIALISED = "materialised"


def mark(phase: str, at: float | None = None) -> None:
    """The driver's start-up phase `phase` ("ray", "data") ended now (or at `at`, a time.time()),
    in this process; "ray" begins a fit's marks (the process's earlier fit's are dropped).
    MATERIALISED (not a phase): when the training split was in the object store, which happens
    beside the worker group's start (coreecg.train.data_handoff); at=None: not marked."""
    if phase == PHASES[0]:
        _MARKS.clear()
    if phase == MATERIALISED and at is None:
        return
    _MARKS[phase] = time.time() if at is None else at


def startup_record(phase: str) -> dict[str, Any]:
    """metrics.jsonl's line for a worker-side phase ("workers", "task", "model", "start", "batch"); RunWriter stamps
    it with the time it is written, unless the record carries its own."""
    return {"event": "startup", "phase": phase}


def run_speed(run_dir: Path | str, since: float) -> dict[str, Any]:
    """The epochs and first step recorded in <run_dir>/metrics.jsonl at or after `since` (this
    command's start) -> {"epochs", "samples", "seconds", "samples_per_s", "samples_per_s_after_first_epoch"
    (None with one epoch), "first_step_s" (None when no first step was recorded), "startup_s" (seconds
    per start-up phase), "graphs_compiled_after_first_step" (None unless the step was compiled)}."""
    epochs, first_step, compiled, sessions = [], None, False, []
    ends = {p: t for p, t in _MARKS.items() if t >= since}
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
                if sessions and "graphs_compiled_after_first_step" in r:
                    sessions[-1] = r["graphs_compiled_after_first_step"]     # cumulative within a session
            elif r.get("event") == "first_step":
                sessions.append(0)       # a worker group restarted after a failure counts afresh
                if first_step is None:
                    first_step, compiled = float(r["time"]) - since, bool(r.get("compiled"))
                    ends.setdefault("first step", float(r["time"]))
            elif r.get("event") == "startup" and r.get("phase") in PHASES:
                ends.setdefault(r["phase"], float(r["time"]))

    def rate(part: list[tuple[float, float]]) -> float | None:
        seconds = sum(s for _, s in part)
        return sum(n for n, _ in part) / seconds if seconds > 0 else None

    return {"epochs": len(epochs), "samples": round(sum(n for n, _ in epochs)), "seconds": sum(s for _, s in epochs),
            "samples_per_s": rate(epochs),
            "samples_per_s_after_first_epoch": rate(epochs[1:]) if len(epochs) > 1 else None,
            "first_step_s": first_step, "startup_s": _phases(ends, since), "beside_s": _beside(ends),
            # torch.compile: graphs built in training steps after the first (the goal: 0); None when eager
            "graphs_compiled_after_first_step": sum(sessions) if compiled else None}


def _phases(ends: dict[str, float], since: float) -> dict[str, float]:
    """Seconds each start-up phase took, from the end of the one before it (the command's start
    first); a phase with no record (no "ray" or "data" mark where the driver is another process)
    counts into the next one recorded."""
    workers = min((t for p, t in ends.items() if p not in (*DRIVER_PHASES, MATERIALISED)), default=float("inf"))
    ends = {p: t for p, t in ends.items() if p not in DRIVER_PHASES or t <= workers}   # another fit's marks
    out, last = {}, since
    for phase in PHASES:
        if phase in ends and ends[phase] >= last:      # out of order: another clock (rank 0 on another node)
            out[phase] = round(ends[phase] - last, 1)
            last = ends[phase]
    return out


def _beside(ends: dict[str, float]) -> dict[str, float]:
    """{MATERIALISED: seconds from the "data" mark} where the split was materialised beside the workers."""
    if MATERIALISED in ends and "data" in ends and ends[MATERIALISED] >= ends["data"]:
        return {MATERIALISED: round(ends[MATERIALISED] - ends["data"], 1)}
    return {}


def speed_line(speed: dict[str, Any]) -> str:
    """One line for a job's closing summary."""
    if not speed["epochs"]:
        return "speed: no epoch trained in this command"
    parts = [f"speed: {speed['samples_per_s']:.1f} samples/s over {speed['epochs']} epoch(s) of this command"]
    if speed["samples_per_s_after_first_epoch"] is not None:
        parts.append(f"{speed['samples_per_s_after_first_epoch']:.1f} after the first")
    if speed["first_step_s"] is not None:
        phases = speed.get("startup_s") or {}
        beside = speed.get("beside_s") or {}
        named = [f"{p} {s:.1f}" + (" (data materialised beside them in %.1f)" % beside[MATERIALISED]
                                   if p == "workers" and MATERIALISED in beside else "")
                 for p, s in phases.items()]
        split = (" (" + ", ".join(named) + ")") if len(phases) > 1 else ""
        parts.append(f"first step {speed['first_step_s']:.1f} s after the command{split}")
    if speed.get("graphs_compiled_after_first_step") is not None:
        parts.append(f"compiled: {speed['graphs_compiled_after_first_step']} graph(s) built after the first step")
    return ", ".join(parts)
