"""Checkpoints that rebuild themselves: weights + the full config, loadable with weights_only=True."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from coreecg import __version__
from coreecg.config import Config, config_from_dict
from coreecg.model.encoder import Encoder


def save_checkpoint(path: str | Path, model: torch.nn.Module, config: Config, **extra: Any) -> Path:
    """Write atomically (tmp + rename) so that a crash never leaves a half-written checkpoint.

    `extra` holds plain values or state dicts (optimizer, step, epoch, metrics).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config": config.to_dict(), "model": model.state_dict(), "coreecg_version": __version__, **extra}
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> tuple[dict, Config]:
    """-> (payload, config). Only tensors and plain containers are unpickled (weights_only)."""
    payload = torch.load(Path(path), map_location=map_location, weights_only=True)
    if "config" not in payload or "model" not in payload:
        raise ValueError(f"{path}: not a coreecg checkpoint (no 'config'/'model' entry)")
    return payload, config_from_dict(payload["config"])


def load_encoder(path: str | Path, map_location: str | torch.device = "cpu") -> Encoder:
    """The student encoder of a pretraining (or fine-tuning) checkpoint, ready in eval mode."""
    payload, config = load_checkpoint(path, map_location)
    prefix = "encoder."
    state = {k[len(prefix):]: v for k, v in payload["model"].items() if k.startswith(prefix)}
    if not state:
        raise ValueError(f"{path}: checkpoint holds no encoder weights")
    encoder = Encoder.from_config(config.model)
    encoder.load_state_dict(state)
    return encoder.to(map_location).eval()
