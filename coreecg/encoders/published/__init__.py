"""The published families' declarations and options sections (torch-free, one module each): the
config reads `encoders.<family>` without importing torch. Each module declares its EncoderSpec
(published=True) and names its torch module under coreecg.model.published. Imported by
coreecg/encoders/__init__.py, so `import coreecg` declares them (ST-MEM's is in ../options.py)."""
from coreecg.encoders.published import ecgfounder  # noqa: F401
from coreecg.encoders.published import merl  # noqa: F401
from coreecg.encoders.published import ecgfm_ked  # noqa: F401
from coreecg.encoders.published import hubert_ecg  # noqa: F401
from coreecg.encoders.published import xecg  # noqa: F401
from coreecg.encoders.published import ecg_fm  # noqa: F401
from coreecg.encoders.published import ecg_jepa  # noqa: F401
from coreecg.encoders.published import ecg_cpc  # noqa: F401
