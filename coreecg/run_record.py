"""The run record: who ran what, from which code, where and when; and the run's hyperparameters
for TensorBoard's HParams and MLflow.

`run.json` in every run folder holds one session per invocation (a resumed run adds one):

    {"sessions": [{"command": "python jobs/pretrain.py --set optim.lr=2e-3", "cwd": "...",
                   "git": {"commit": "a806fd5...", "dirty": false} | null,
                   "versions": {"coreecg": ..., "torch": ..., "ray": ..., "python": ..., "numpy": ...},
                   "host": {"name": ..., "platform": ..., "cpus": 2, "cuda": null | "NVIDIA H100 ..."},
                   "ray": {"address": "127.0.0.1:61234", "nodes": 1, "node": "<id>"} | null
                          (the cluster it ran on, its live nodes, the node of the process writing it),
                   "pid": 4242 (that process: a job's driver, or the Tune trial running the run),
                   "data": {"corpus", "manifest_sha256", "fingerprints", "fingerprints_sha256"} (pretraining:
                            its corpus and the fingerprint file the leakage guard compares),
                   "started": "2026-11-23T20:41:07+00:00", "ended": ... | absent while running or killed,
                   "status": "running" | "completed" | "failed", "error": "..." (failed only)}]}

The session starts when the run folder is written (coreecg.train.plan.write_run_folder) and ends
when rank 0 finishes the task (completed) or the driver sees the run fail (failed); a session
left "running" was killed.
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from coreecg.files import write_json
from coreecg.version import __version__

# Lazy imports: torch and numpy (every job's --help imports this module through coreecg.cli: torch-free);
# ray, the `ray` extra (the light install).

RECORD_FILE = "run.json"
COMMAND_ENV = "COREECG_COMMAND"       # the job's command line, for processes Ray starts (trials)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def command_line() -> str:
    """The command that started this run: the job's (set by coreecg.cli, inherited by Ray's
    local workers), else this process's."""
    return os.environ.get(COMMAND_ENV) or shlex.join([Path(sys.executable).name, *sys.argv])


def git_state(folder: Path | None = None) -> dict[str, Any] | None:
    """The commit of the checkout coreecg runs from, and whether it has uncommitted changes;
    None outside a git checkout (an installed package)."""
    folder = folder or Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                                timeout=5)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                                capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}


def versions() -> dict[str, str]:
    import numpy
    import torch


    out = {"coreecg": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
           "python": platform.python_version()}
    try:
        import ray

        out["ray"] = ray.__version__
    except ImportError:
        pass
    return out


def host() -> dict[str, Any]:
    import torch

    return {"name": socket.gethostname(), "platform": platform.platform(), "cpus": os.cpu_count(),
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def ray_cluster() -> dict[str, Any] | None:
    """The Ray cluster this process is connected to: its GCS address, live node count and the
    node this process runs on (a sweep trial's own node)."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        return {"address": ray.get_runtime_context().gcs_address,
                "nodes": sum(1 for n in ray.nodes() if n.get("Alive")),
                "node": ray.get_runtime_context().get_node_id()}
    except Exception:                 # provenance only: never fail a run over it
        return None


def _read(run_dir: Path) -> dict[str, Any]:
    """The record, or an empty one for a folder without it. Writes are atomic (coreecg.files), so
    an unreadable run.json was damaged outside coreecg: an error naming it, never a silent reset."""
    path = run_dir / RECORD_FILE
    if not path.is_file():
        return {"sessions": []}
    try:
        return json.loads(path.read_text())
    except ValueError as e:
        raise ValueError(f"{path}: not a readable run record ({e}); move it aside to start a new one") from e


def start_session(run_dir: Path, data: dict[str, Any] | None = None) -> None:
    """A new session; `data`: what a pretraining trains on (its corpus and fingerprint file, for
    the leakage guard: coreecg.data.fingerprints.corpus_record), kept as the session's "data"."""
    record = _read(run_dir)
    record["sessions"].append({"command": command_line(), "cwd": os.getcwd(), "git": git_state(),
                               "versions": versions(), "host": host(),
                               "ray": ray_cluster(), "pid": os.getpid(), "started": _now(), "status": "running",
                               **({"data": data} if data else {})})
    write_json(run_dir / RECORD_FILE, record)


def end_session(run_dir: Path, status: str, error: str | None = None) -> None:
    """Close the latest session (a no-op without one: a run folder from before run records)."""
    record = _read(run_dir)
    if not record["sessions"]:
        return
    last = record["sessions"][-1]
    if last.get("status") != "running":
        return
    last.update(ended=_now(), status=status, **({"error": error[:2000]} if error else {}))
    write_json(run_dir / RECORD_FILE, record)


def sessions(run_dir: Path) -> list[dict[str, Any]]:
    return _read(Path(run_dir))["sessions"]


def wall_seconds(run_dir: Path) -> float | None:
    """Seconds across the run's finished sessions (None when none ended)."""
    total, any_ended = 0.0, False
    for s in sessions(run_dir):
        if s.get("ended"):
            total += (datetime.fromisoformat(s["ended"]) - datetime.fromisoformat(s["started"])).total_seconds()
            any_ended = True
    return total if any_ended else None


# ---------------------------------------------------------------------------- hyperparameters


def flat_params(config) -> dict[str, Any]:
    """The config as `section.key -> value` scalars (lists as text): what HParams and MLflow hold."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (bool, int, float, str)) or value is None:
            out[prefix] = "" if value is None else value
        else:
            out[prefix] = json.dumps(value)

    walk("", config.to_dict())
    return out


# The knobs a pretraining table compares (TensorBoard's HParams view shows these columns), and
# every scalar of the training method's own section (methods.<name>.*: CoRe-ECG's masking rates,
# loss weights, decoder depths, ...) and of the encoder's (encoders.<arch>.*: its sizes).
HPARAM_KEYS = ("pretrain.method", "train.variant", "model.arch", "optim.lr", "optim.batch_size", "optim.epochs",
               "optim.warmup_epochs", "data.corpus", "train.seed", "train.num_workers")


def hparams(config) -> dict[str, Any]:
    flat = flat_params(config)
    own = (f"methods.{config.pretrain.method}.", f"encoders.{config.model.arch}.")
    return {**{k: flat[k] for k in HPARAM_KEYS if k in flat}, **{k: v for k, v in flat.items() if k.startswith(own)}}
