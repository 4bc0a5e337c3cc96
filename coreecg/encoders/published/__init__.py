"""The published families' declarations and options sections (torch-free, one module each): the
config reads `encoders.<family>` without importing torch. Each module declares its EncoderSpec
(published=True) and names its torch module under coreecg.model.published."""
from coreecg.encoders.published import ecg_cpc  # noqa: F401
