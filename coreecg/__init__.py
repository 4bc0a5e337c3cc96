"""coreecg: CoRe-ECG self-supervised pretraining of 12-lead ECG models."""
from __future__ import annotations

from coreecg.version import __version__  # a module of its own: data reads it without this file's API


def load_encoder(path, map_location="cpu"):
    """Rebuild a ready `Encoder` from a checkpoint that carries its config (weights_only load)."""
    from coreecg.train.checkpoint import load_encoder as _load

    return _load(path, map_location=map_location)


__all__ = ["__version__", "load_encoder"]
