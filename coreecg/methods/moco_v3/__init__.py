"""MoCo v3 on the one encoder: its options and registry entry (options.py, torch-free) and the
method (method.py: MoCoV3, moco_contrastive, mlp)."""
from __future__ import annotations

from typing import Any

# Lazy imports: the model, on first use: options.py needs no torch.


def __getattr__(name: str) -> Any:          # the model loads on first use: options.py needs no torch
    if name in ("MoCoV3", "moco_contrastive", "mlp"):
        from coreecg.methods.moco_v3 import method
        return getattr(method, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
