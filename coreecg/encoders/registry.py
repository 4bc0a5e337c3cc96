"""The encoder registry, at its documented place: it lives in the config package
(`coreecg.config.encoder_registry`), so the config reads it without importing this package."""
from coreecg.config.encoder_registry import (ANY, ENCODERS, GRID, OUTPUT_KINDS, SEQUENCE, EncoderSpec, declare_encoder,
                                             encoder_spec, encoder_specs, is_published)

__all__ = ["ANY", "ENCODERS", "GRID", "OUTPUT_KINDS", "SEQUENCE", "EncoderSpec", "declare_encoder", "encoder_spec",
           "encoder_specs", "is_published"]
