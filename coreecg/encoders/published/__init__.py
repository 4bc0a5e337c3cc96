"""The published families' declarations and options sections (torch-free, one module each): the
config reads `encoders.<family>` without importing torch. Each module declares its EncoderSpec
(published=True) and names its torch module under coreecg.model.published."""
from coreecg.encoders.published import merl  # noqa: F401
from coreecg.encoders.published import ecgfounder  # noqa: F401
