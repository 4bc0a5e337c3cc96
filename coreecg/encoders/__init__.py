"""Encoders as plugins: `model.arch` names one, `build_encoder(config)` is the one place one is
built (methods, classifier, loading, ONNX export and the optimiser all go through it).

    from coreecg.encoders import build_encoder
    encoder = build_encoder(load_config(overrides=["model.arch=xresnet1d"]))

Importing this package declares the built-ins (`options.py`, no torch); the classes load on first
build. An encoder of your own is one module: an `nn.Module` subclass decorated with
`@register_encoder(...)`, imported through `plugins` (docs/encoders.md).
"""
from __future__ import annotations

from typing import Any

from coreecg.encoders import options as _options  # noqa: F401  (declares the built-ins)
from coreecg.encoders import published as _published  # noqa: F401  (declares the published families)
from coreecg.config.encoder_registry import (ANY, GRID, SEQUENCE, EncoderSpec, declare_encoder, encoder_spec,
                                             encoder_specs)

# Lazy imports: the torch side (build_encoder & co.), on first use: the config reads this package torch-free.


def __getattr__(name: str) -> Any:
    """The torch side, imported on first use."""
    if name in ("build_encoder", "register_encoder", "encoder_class"):
        from coreecg.encoders import build
        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["ANY", "GRID", "SEQUENCE", "EncoderSpec", "declare_encoder", "encoder_spec", "encoder_specs",
           "build_encoder", "register_encoder", "encoder_class"]
