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

(`registry.py`) and is imported here. `model.arch` in a coreecg config names the family
(coreecg: coreecg's own Encoder), so fine-tuned checkpoints and exports rebuild the same module.
"""
from __future__ import annotations

from coreecg.encoders.build import build_encoder  # noqa: F401  (kept here for callers of this package)
from coreecg.model.published import st_mem  # noqa: F401  (registers the family)
from coreecg.model.published import ecgfounder  # noqa: F401  (registers the family)
from coreecg.model.published import merl  # noqa: F401  (registers the family)
from coreecg.model.published import ecgfm_ked  # noqa: F401  (registers the family)
from coreecg.model.published import hubert_ecg  # noqa: F401  (registers the family)
from coreecg.model.published import xecg  # noqa: F401  (registers the family)
from coreecg.model.published import ecg_fm  # noqa: F401  (registers the family)
from coreecg.model.published import ecg_jepa  # noqa: F401  (registers the family)
from coreecg.model.published import ecg_cpc  # noqa: F401  (registers the family)
from coreecg.model.published.registry import (COREECG, FAMILIES, PublishedFamily, contract_of, contract_preprocess,
                                              family, recognise, register)

__all__ = ["COREECG", "FAMILIES", "PublishedFamily", "contract_of", "contract_preprocess", "family", "recognise",
           "register", "build_encoder"]
