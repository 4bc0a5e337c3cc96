"""Encoder classes into the registry, and the one place an encoder is built.

A built-in declared its entry in coreecg/encoders/options.py and names its module there; its class
is bound here on first build. A plugin declares and binds in the one call (tests/plugin_encoder.py,
docs/encoders.md):

    @register_encoder("resnet_tiny", "A tiny ResNet", output="sequence", options=TinyOptions)
    class TinyResNet(SequenceEncoder):
        @classmethod
        def from_config(cls, config): ...

Every encoder class has `from_config(config)` (the whole Config: `model.n_leads`,
`model.input_samples` and its own section `encoders.<name>`), `dim`, `n_leads`, `patch_size`
(samples per token along time), `pooled(x, lead_idx)` and `forward(x, lead_idx, visible=None)`
returning `coreecg.model.encoder.Encoded`.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable

from torch import nn

from coreecg.config import Config, ConfigError, ModelConfig
from coreecg.config.encoder_registry import ENCODERS, EncoderSpec, declare_encoder, encoder_spec


def register_encoder(name: str, title: str | None = None, output: str | None = None, options: type | None = None,
                     input: str | None = None) -> Callable[[type[nn.Module]], type[nn.Module]]:
    """Class decorator: `model.arch=<name>` builds this class. With only the name, it binds to the
    built-in entry of that name; otherwise it declares the entry: `output` "grid" or "sequence"
    (what methods can train it: coreecg.encoders.registry), `options` (a dataclass) its typed
    section `encoders.<name>`, `input` its input contract in words."""
    def register(cls: type[nn.Module]) -> type[nn.Module]:
        known = ENCODERS.get(name)
        if output is None and title is None and options is None:
            if known is None:
                raise ConfigError(f"register_encoder({name!r}): no declared encoder of that name; give its "
                                  "title, output and options to declare it")
            spec = dataclasses.replace(known, cls=cls)
        else:
            if output is None:
                raise ConfigError(f"register_encoder({name!r}): say its output, 'grid' or 'sequence'")
            spec = EncoderSpec(name, title or name, output, options, module=cls.__module__,
                               input=input or EncoderSpec.input, cls=cls)
        if known is not None and known.cls is not None and known.cls is not cls:
            raise ConfigError(f"encoder {name!r} is already registered by {known.cls.__module__}")
        declare_encoder(spec)
        cls.encoder_name = name
        return cls
    return register


def encoder_class(name: str) -> type[nn.Module]:
    """The class of registered encoder `name` (its module imported on first use)."""
    spec = encoder_spec(name)
    if spec.cls is None and spec.module:
        importlib.import_module(spec.module)
        spec = encoder_spec(name)
    if spec.cls is None:
        raise ConfigError(f"model.arch={name!r}: declared, but {spec.module or 'no module'} registers no class")
    return spec.cls


def build_encoder(config: Config) -> nn.Module:
    """The encoder `config.model.arch` names, randomly initialised (weights are loaded after).
    `config`: the whole Config: its sizes are the encoder's own section `encoders.<arch>`."""
    if isinstance(config, ModelConfig):        # it would build the default sizes, not the run's
        raise TypeError("build_encoder takes the whole Config (its sizes are encoders.<model.arch>), "
                        "not its model section")
    return encoder_class(config.model.arch).from_config(config)
