"""coreecg: CoRe-ECG self-supervised pretraining of 12-lead ECG models."""
from __future__ import annotations

from coreecg.version import __version__  # a module of its own: data reads it without this file's API

# The loaders import torch on first call, not here: `import coreecg` stays light.


def load_encoder(path, map_location="cpu"):
    """A ready `Encoder` (eval mode) from an export folder (coreecg.hub), a pretraining or
    fine-tuning run folder, encoder.pt, best.pt or a checkpoint that carries its config
    (weights_only load)."""
    from coreecg.hub import load_encoder as _load

    return _load(path, map_location=map_location)


def load_classifier(path, map_location="cpu"):
    """A fine-tuned `Classifier` (eval mode) from a classifier export folder, best.pt or a
    fine-tuning run folder."""
    from coreecg.hub import load_classifier as _load

    return _load(path, map_location=map_location)


def load_model(path, map_location="cpu"):
    """`coreecg.hub.LoadedModel` (model, kind, config, contract, source) of any model source."""
    from coreecg.hub import load_model as _load

    return _load(path, map_location=map_location)


__all__ = ["__version__", "load_encoder", "load_classifier", "load_model"]
