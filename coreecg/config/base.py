"""The config's base: the error type and the 12 standard leads."""
from __future__ import annotations

from coreecg.typed import TypedError


# The conventional 12-lead order (the paper's "I, II, III, aVR, aVL, aVF, V1-V6").
STANDARD_LEADS: tuple[str, ...] = (
    "I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6",
)


class ConfigError(TypedError):
    """A configuration key or value that cannot be accepted."""
