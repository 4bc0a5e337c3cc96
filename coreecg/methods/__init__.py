"""Self-supervised pretraining methods on the one encoder, and their registry.

    from coreecg.methods import build_method
    model = build_method(load_config(overrides=["pretrain.method=moco_v3"]))

Built in: `core` (CoRe-ECG, the paper), `moco_v3` (MoCo v3), `cmsc` (CLOCS's CMSC). A method of
your own is one module: a `PretrainMethod` subclass decorated with `@register_method(...)`,
imported through `pretrain.plugins` (docs/methods.md); every job then runs it.
"""
from __future__ import annotations

from coreecg.methods.base import PretrainMethod
from coreecg.methods.registry import build_method, method_class, register_method
from coreecg.methods.core_ecg import CoReECG  # the built-ins register themselves
from coreecg.methods.moco_v3 import MoCoV3
from coreecg.methods.cmsc import CMSC

__all__ = ["PretrainMethod", "register_method", "build_method", "method_class", "CoReECG", "MoCoV3", "CMSC"]
