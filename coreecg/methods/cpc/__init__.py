"""Contrastive predictive coding (CPC) on any registered encoder: its options and registry entry
(options.py, torch-free) and the method (method.py: CPC, cpc_infonce)."""
from __future__ import annotations

from typing import Any

# Lazy imports: the model, on first use: options.py needs no torch.


def __getattr__(name: str) -> Any:          # the model loads on first use: options.py needs no torch
    if name in ("CPC", "cpc_infonce"):
        from coreecg.methods.cpc import method
        return getattr(method, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
