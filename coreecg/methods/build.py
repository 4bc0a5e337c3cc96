"""A pretraining method from a config: its class (the built-ins' modules imported here, a
plugin's through `plugins`) and the built model."""
from __future__ import annotations

from coreecg.config import Config, ConfigError, import_plugins, method_specs
from coreecg.config.encoders import check_encoder_for_method
from coreecg.methods.base import PretrainMethod
# The built-in classes bind to their declarations (coreecg/methods/*/options.py) on import.
from coreecg.methods.core_ecg.method import CoReECG
from coreecg.methods.moco_v3.method import MoCoV3
from coreecg.methods.cmsc.method import CMSC
from coreecg.methods.cpc.method import CPC

BUILT_IN_CLASSES = (CoReECG, MoCoV3, CMSC, CPC)


def method_class(name: str) -> type[PretrainMethod]:
    spec = method_specs().get(name)
    if spec is None or spec.cls is None:
        known = sorted(n for n, s in method_specs().items() if s.cls is not None)
        raise ConfigError(f"pretrain.method={name!r} has no registered class; known: {', '.join(known)}")
    return spec.cls


def build_method(config: Config) -> PretrainMethod:
    """The pretraining model of `config.pretrain.method` (plugins imported first)."""
    import_plugins(config.plugins, "plugins")
    check_encoder_for_method(config)
    return method_class(config.pretrain.method)(config)
