"""The checkpoint store: checkpoints that rebuild themselves, written whole, checked on every read.

A checkpoint file holds {"config": Config.to_dict(), "model": a state dict, "coreecg_version",
plus the writer's own entries (trainer state, epoch, metrics, ...)} and loads with
weights_only=True (tensors and plain containers only). Each gets a `<file>.sha256` sidecar,
written after it, so a truncated or bit-flipped checkpoint is a `CheckpointError` naming the
file, never silently different weights. Both are written atomically (`coreecg.files`).

A run folder holds, by name:

    checkpoint_step<N:09d>/checkpoint.pt (+ .sha256)   resume points, the newest kept (`prune_checkpoints`)
    encoder.pt (+ .sha256)                             a pretraining's student encoder (`save_encoder`)
    best.pt (+ .sha256)                                a fine-tuning's selected classifier

Every writer goes through here: the in-process loop, the Ray Train workers (rank 0 writes its
step folders straight into the run folder and reports no checkpoint to Ray, which keeps no copy:
`coreecg.train.worker`), fine-tuning's best epoch and pretraining's encoder.pt. Loading a model
from any of them: `coreecg.loading`.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from coreecg.config import Config, ConfigError, config_from_dict
from coreecg.files import sha256_file, write_atomic, write_text
from coreecg.version import __version__

CHECKPOINT_FILE = "checkpoint.pt"     # inside a step folder
STEP_PREFIX = "checkpoint_step"       # step folders: checkpoint_step000000042
ENCODER_FILE = "encoder.pt"
BEST_FILE = "best.pt"
SIDECAR_SUFFIX = ".sha256"


class CheckpointError(ValueError):
    """A checkpoint that is unreadable, corrupted, or belongs to another model."""


# ---------------------------------------------------------------------------- one file


def save_checkpoint(path: str | Path, model: torch.nn.Module | dict, config: Config, **extra: Any) -> Path:
    """Write `path` atomically, then its sha256 sidecar. -> path.

    model: a module or a state dict. `extra`: plain values or state dicts (trainer state,
    epoch, generator states, metrics), stored beside "config" and "model".
    """
    path = Path(path)
    state = model if isinstance(model, dict) else model.state_dict()
    payload = {"config": config.to_dict(), "model": state, "coreecg_version": __version__, **extra}
    write_atomic(path, lambda tmp: torch.save(payload, tmp))
    # The sidecar comes second: a checkpoint without one is unverified, never wrongly verified.
    write_text(_sidecar(path), sha256_file(path) + "\n")
    return path


def save_encoder(path: str | Path, model: torch.nn.Module, config: Config, **extra: Any) -> Path:
    """Only the student encoder's weights (keys `encoder.*`) + the config: what downstream needs."""
    state = {k: v for k, v in model.state_dict().items() if k.startswith("encoder.")}
    return save_checkpoint(path, state, config, **extra)


def verify_checkpoint(path: str | Path) -> Path:
    """CheckpointError naming the file if it is missing or differs from its sha256 sidecar
    (a file without a sidecar passes: it was written before sidecars, or by hand)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    sidecar = _sidecar(path)
    if sidecar.is_file() and sidecar.read_text().strip() != sha256_file(path):
        raise CheckpointError(f"{path}: corrupted checkpoint (sha256 differs from {sidecar.name}); "
                              "delete its folder to fall back to an earlier checkpoint")
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict, Config]:
    """-> (payload, config). Only tensors and plain containers are unpickled (weights_only).

    CheckpointError naming the file when it is missing, fails its sha256 sidecar, cannot be
    unpickled (truncated), or is not a coreecg checkpoint.
    """
    path = Path(path)
    return checkpoint_config(path, read_payload(path, map_location))


def read_payload(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """The unpickled contents of a .pt/.pth file (weights_only: tensors and plain containers,
    never code), its sha256 sidecar checked when it has one. CheckpointError naming the file."""
    path = verify_checkpoint(path)
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated zips and bad pickles
        raise CheckpointError(f"{path}: unreadable checkpoint (truncated or corrupted, or not weights-only "
                              f"data): {e}") from e


def is_coreecg_payload(payload: Any) -> bool:
    """A coreecg checkpoint's payload: a dict with "model" and a coreecg config (its "model" a section)."""
    return (isinstance(payload, dict) and "model" in payload and isinstance(payload.get("config"), dict)
            and isinstance(payload["config"].get("model"), dict))


def checkpoint_config(path: Path, payload: Any) -> tuple[dict, Config]:
    """(payload, its Config) of a read coreecg checkpoint; CheckpointError naming the file."""
    if not isinstance(payload, dict) or "config" not in payload or "model" not in payload:
        raise CheckpointError(f"{path}: not a coreecg checkpoint (no 'config'/'model' entry)")
    try:
        config = config_from_dict(payload["config"])
    except ConfigError as e:
        raise CheckpointError(f"{path}: its stored config is not valid here: {e}") from e
    return payload, config


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + SIDECAR_SUFFIX)


# ---------------------------------------------------------------------------- step folders


def step_folder_name(step: int) -> str:
    """`checkpoint_step000000042`: zero-padded, so names sort by step."""
    return f"{STEP_PREFIX}{int(step):09d}"


def save_step(folder: str | Path, step: int, model: torch.nn.Module | dict, config: Config,
              **extra: Any) -> Path:
    """`<folder>/checkpoint_step<step:09d>/checkpoint.pt` (`save_checkpoint`). `folder` is the
    run folder, for every writer (the in-process loop and rank 0 of a Ray Train run alike: no
    temporary folder, nothing handed to Ray). -> the checkpoint file."""
    return save_checkpoint(Path(folder) / step_folder_name(step) / CHECKPOINT_FILE, model, config, **extra)


def step_of(checkpoint_dir: str | Path) -> int:
    """The step a `checkpoint_step<N>` folder was written at."""
    return int(Path(checkpoint_dir).name.rsplit("step", 1)[-1])


def checkpoint_dirs(run_dir: str | Path) -> list[Path]:
    """The run's step folders that hold a checkpoint file, oldest first."""
    found = (p for p in Path(run_dir).glob(f"{STEP_PREFIX}*") if (p / CHECKPOINT_FILE).is_file())
    return sorted(found, key=step_of)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest step folder's checkpoint file; None when the run has none."""
    dirs = checkpoint_dirs(run_dir)
    return dirs[-1] / CHECKPOINT_FILE if dirs else None


def load_latest(run_dir: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict, Config, Path] | None:
    """(payload, config, file) of the newest checkpoint (`load_checkpoint`), or None."""
    path = latest_checkpoint(run_dir)
    return None if path is None else (*load_checkpoint(path, map_location), path)


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` (>= 1) step folders. -> the folders deleted."""
    if keep < 1:
        raise ValueError(f"keep={keep}: at least the newest checkpoint is kept")
    old = checkpoint_dirs(run_dir)[:-keep]
    for folder in old:
        shutil.rmtree(folder)
    return old
