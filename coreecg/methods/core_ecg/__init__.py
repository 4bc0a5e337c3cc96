"""CoRe-ECG (the paper's method) as a plugin like the others: its options and registry entry
(options.py, torch-free), the method (method.py), its masking (STDM and the ablation masks,
masking.py), its teacher's Frequency Dynamic Augmentation (fda.py) and its objectives (losses.py)."""
from __future__ import annotations

from typing import Any

# Lazy imports: the model, on first use: options.py needs no torch.


def __getattr__(name: str) -> Any:          # the model loads on first use: options.py needs no torch
    if name == "CoReECG":
        from coreecg.methods.core_ecg.method import CoReECG
        return CoReECG
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CoReECG"]
