"""Published encoders of other projects, read as data and run by coreecg's own modules: an
adapter registry (docs/published_encoders.md).

A family is one module here that calls `register(PublishedFamily(...))` with:

    recognise(state)            a checkpoint's state dict -> the encoder's state (prefixes removed)
                                or None when the keys are not this family's
    read_architecture(state, recorded)
                                -> a Config with model.arch=<name> and every size read from the
                                weights in encoders.<name> (`recorded`: the checkpoint's own
                                "config" entry, if any)
    build(config)               -> an nn.Module with coreecg's Encoder interface: pooled(x,
                                lead_idx) (B, C, T) -> (B, D), forward(x, lead_idx, visible) ->
                                Encoded, attributes n_leads, patch_size, dim
    preprocess                  the family's input contract as a PreprocessConfig (a corpus built
                                with it feeds the encoder what it was pretrained on)

and is imported at the bottom of this file. `model.arch` in a coreecg config names the family
(coreecg: coreecg's own Encoder), so fine-tuned checkpoints and exports rebuild the same module.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from torch import nn

from coreecg.config import Config, PreprocessConfig

COREECG = "coreecg"


@dataclass(frozen=True)
class PublishedFamily:
    name: str                                                    # model.arch
    title: str                                                   # for messages and model cards
    label: str                                                   # the method name in report tables
    recognise: Callable[[dict[str, Any]], dict[str, Any] | None]
    read_architecture: Callable[[dict[str, Any], dict[str, Any] | None], Config]
    build: Callable[[Config], nn.Module]
    preprocess: PreprocessConfig
    module: str                                                  # the class, as export config.json names it
    licence: str = ""
    pooling: str = ""
    normalisation: str = ""
    pretraining: str = ""


FAMILIES: dict[str, PublishedFamily] = {}


def register(family: PublishedFamily) -> PublishedFamily:
    if family.name == COREECG or family.name in FAMILIES:
        raise ValueError(f"published encoder family {family.name!r} is already registered")
    FAMILIES[family.name] = family
    return family


def family(name: str) -> PublishedFamily:
    """The registered family `name`; KeyError naming the known ones."""
    if name not in FAMILIES:
        raise KeyError(f"unknown model.arch {name!r}: no published family of that name; known: "
                       f"{', '.join([COREECG, *FAMILIES])} (an encoder of your own: its module in `plugins`, "
                       "docs/encoders.md)")
    return FAMILIES[name]


def recognise(payload: Any) -> tuple[PublishedFamily, dict[str, Any], Config] | None:
    """A torch.load'ed checkpoint (a dict with a "model" state dict, or a bare state dict) ->
    (its family, the encoder's state, its config: model and encoders.<family>); None when no family knows its keys.
    ValueError when a family knows the keys but the shapes do not fit together."""
    if not isinstance(payload, dict):
        return None
    state = payload.get("model", payload)
    if not isinstance(state, dict):
        return None
    recorded = payload.get("config") if isinstance(payload.get("config"), dict) else None
    for fam in FAMILIES.values():
        sub = fam.recognise(state)
        if sub is not None:
            return fam, sub, fam.read_architecture(sub, recorded)
    return None


def build_encoder(config) -> nn.Module:
    """The encoder `model.arch` names, randomly initialised: coreecg.encoders.build_encoder (the
    one place an encoder is built), kept here for callers of this module."""
    from coreecg.encoders.build import build_encoder as build

    return build(config)


from coreecg.model.published import st_mem  # noqa: E402,F401  (registers the family)
