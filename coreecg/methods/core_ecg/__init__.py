"""CoRe-ECG (the paper's method) as a plugin like the others: the method (method.py), its masking
(STDM and the ablation masks, masking.py), its teacher's Frequency Dynamic Augmentation (fda.py)
and its objectives (losses.py)."""
from __future__ import annotations

from coreecg.methods.core_ecg.method import CoReECG

__all__ = ["CoReECG"]
