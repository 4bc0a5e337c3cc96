"""Checkpoints that rebuild themselves: weights + the full config, loadable with weights_only=True.

Every file gets a `<file>.sha256` sidecar written after it, so a truncated or bit-flipped
checkpoint is a `CheckpointError` naming the file, never silently different weights.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from coreecg.version import __version__
from coreecg.config import Config, ConfigError, config_from_dict
from coreecg.model.encoder import Encoder

# Config keys that decide which modules exist and their shapes: a checkpoint written under
# other values cannot be loaded into this run's model. Beside these two, each method declares its
# own (`register_method(structural=...)`, read through `config.method.structural`).
STRUCTURAL = ("model", "pretrain.method")


class CheckpointError(ValueError):
    """A checkpoint that is unreadable, corrupted, or belongs to another model."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(path: str | Path, model: torch.nn.Module | dict, config: Config, **extra: Any) -> Path:
    """Write atomically (tmp + rename), then the sha256 sidecar.

    model: a module or a state dict. `extra` holds plain values or state dicts
    (trainer state, epoch, generator states, metrics).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = model if isinstance(model, dict) else model.state_dict()
    payload = {"config": config.to_dict(), "model": state, "coreecg_version": __version__, **extra}
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    digest = _sha256(tmp)
    os.replace(tmp, path)
    Path(f"{path}.sha256").write_text(digest + "\n")
    return path


def verify_checkpoint(path: str | Path) -> Path:
    """CheckpointError naming the file if it is missing or differs from its sha256 sidecar."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint file not found")
    sidecar = Path(f"{path}.sha256")
    if sidecar.is_file() and sidecar.read_text().strip() != _sha256(path):
        raise CheckpointError(f"{path}: corrupted checkpoint (sha256 differs from {sidecar.name}); "
                              "delete its folder to fall back to an earlier checkpoint")
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict, Config]:
    """-> (payload, config). Only tensors and plain containers are unpickled (weights_only).

    CheckpointError naming the file when it is missing, fails its sha256 sidecar, cannot be
    unpickled (truncated), or is not a coreecg checkpoint.
    """
    path = verify_checkpoint(path)
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as e:  # torch raises several types for truncated zips and bad pickles
        raise CheckpointError(f"{path}: unreadable checkpoint (truncated or corrupted): {e}") from e
    if not isinstance(payload, dict) or "config" not in payload or "model" not in payload:
        raise CheckpointError(f"{path}: not a coreecg checkpoint (no 'config'/'model' entry)")
    try:
        config = config_from_dict(payload["config"])
    except ConfigError as e:
        raise CheckpointError(f"{path}: its stored config is not valid here: {e}") from e
    return payload, config


def structural_differences(saved: Config, current: Config) -> list[str]:
    """Config keys (dotted) whose values change the model's modules or shapes: `STRUCTURAL` and
    the saved method's own structural keys (when both configs train that method)."""
    a, b = saved.to_dict(), current.to_dict()
    diffs = [f"model.{k}" for k in a["model"] if a["model"][k] != b["model"].get(k)]
    if saved.pretrain.method != current.pretrain.method:
        return diffs + ["pretrain.method"]
    spec = saved.method
    before, after = spec.structural_values(a), spec.structural_values(b)
    return diffs + [k for k in before if before[k] != after[k]]


def changed_keys(saved: Config, current: Config) -> list[str]:
    """Every dotted key whose value differs (for notices on resume)."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out
    a, b = flat(saved.to_dict()), flat(current.to_dict())
    return sorted(k for k in a if a[k] != b.get(k))


def check_compatible(path: str | Path, saved: Config, current: Config) -> None:
    """CheckpointError naming `path` if it was written under another model configuration."""
    diffs = structural_differences(saved, current)
    if diffs:
        a, b = saved.to_dict(), current.to_dict()
        shown = ", ".join(f"{k}: {_get(a, k)} -> {_get(b, k)}" for k in diffs[:6])
        raise CheckpointError(f"{path}: written under a different model config ({shown}); "
                              "use another train.name (or storage_path) for a new run")


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d


def export_encoder(path: str | Path, model: torch.nn.Module, config: Config, **extra: Any) -> Path:
    """Only the student encoder's weights (prefix `encoder.`) + the config: what downstream needs."""
    state = {k: v for k, v in model.state_dict().items() if k.startswith("encoder.")}
    return save_checkpoint(path, state, config, **extra)


def load_encoder(path: str | Path, map_location: str | torch.device = "cpu") -> Encoder:
    """The student encoder of a pretraining (or fine-tuning) checkpoint, ready in eval mode."""
    payload, config = load_checkpoint(path, map_location)
    prefix = "encoder."
    state = {k[len(prefix):]: v for k, v in payload["model"].items() if k.startswith(prefix)}
    if not state:
        raise CheckpointError(f"{path}: checkpoint holds no encoder weights")
    encoder = Encoder.from_config(config.model)
    try:
        encoder.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{path}: encoder weights do not match its own config: {e}") from e
    return encoder.to(map_location).eval()
