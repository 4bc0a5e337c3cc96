"""Self-supervised pretraining methods on the one encoder, and their registry.

    from coreecg.methods import build_method
    model = build_method(load_config(overrides=["pretrain.method=moco_v3"]))

Built in: `core` (CoRe-ECG, the paper), `moco_v3` (MoCo v3), `cmsc` (CLOCS's CMSC), `cpc`
(contrastive predictive coding, on any encoder: docs/encoders.md). Each is a
package: `options.py` (torch-free: its config section `methods.<name>` and its registry entry)
and `method.py` (the PretrainMethod subclass). A method of your own is one module: a
`PretrainMethod` subclass decorated with `@register_method(...)`, imported through
`plugins` (docs/methods.md); every job then runs it.

Importing this package declares the built-ins (their options modules, no torch); the classes
and builders load on first use (the names below), so the config reads `methods.<name>` without
building a model.
"""
from __future__ import annotations

from typing import Any

# The built-ins declare themselves (registry order: the order listed here).
from coreecg.methods.core_ecg import options as _core_options  # noqa: F401
from coreecg.methods.moco_v3 import options as _moco_v3_options  # noqa: F401
from coreecg.methods.cmsc import options as _cmsc_options  # noqa: F401
from coreecg.methods.cpc import options as _cpc_options  # noqa: F401
from coreecg.config.method_registry import MethodSpec, declare_method, method_specs

# Lazy imports: the torch side (build_method & co.), on first use: the config reads this package torch-free.


def __getattr__(name: str) -> Any:
    """The torch side, imported on first use."""
    if name == "PretrainMethod":
        from coreecg.methods.base import PretrainMethod
        return PretrainMethod
    if name == "register_method":
        from coreecg.methods.classes import register_method
        return register_method
    if name in ("build_method", "method_class", "CoReECG", "MoCoV3", "CMSC", "CPC"):
        from coreecg.methods import build
        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["MethodSpec", "declare_method", "method_specs", "PretrainMethod", "register_method", "build_method",
           "method_class", "CoReECG", "MoCoV3", "CMSC", "CPC"]
