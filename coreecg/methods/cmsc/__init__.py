"""CLOCS's CMSC on the one encoder: its options and registry entry (options.py, torch-free) and
the method (method.py: CMSC, cmsc_contrastive, segment_masks)."""
from __future__ import annotations

from typing import Any

# Lazy imports: the model, on first use: options.py needs no torch.


def __getattr__(name: str) -> Any:          # the model loads on first use: options.py needs no torch
    if name in ("CMSC", "cmsc_contrastive", "segment_masks"):
        from coreecg.methods.cmsc import method
        return getattr(method, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
