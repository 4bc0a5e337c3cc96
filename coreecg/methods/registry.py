"""The method registry: `pretrain.method` name -> the method's class, label, options section,
structural keys and defining keys (built-ins and plugins), kept in `coreecg.config.METHODS`."""
from __future__ import annotations

import dataclasses
from typing import Callable

from coreecg.config import Config, ConfigError, MethodSpec, import_plugins, method_specs, register_method_spec
from coreecg.methods.base import PretrainMethod
from coreecg.typed import field_type


def register_method(name: str, label: str | None = None, options: type | None = None,
                    structural: tuple[str, ...] = (), defining: tuple[str, ...] = ()
                    ) -> Callable[[type[PretrainMethod]], type[PretrainMethod]]:
    """Class decorator: `pretrain.method=<name>` builds this class; `label` names it in tables;
    `options` (a dataclass) becomes the typed config section `methods.<name>` (its
    `__post_init__` checks its keys, an optional `check(self, config)` the rest of the config);
    `structural`: the config keys that decide the modules and shapes of its checkpoints
    ("a.b" or "a.b>0"; a resume across a change of one is refused); `defining`: the config keys
    outside `methods.<name>` that define the method, so rows of a table may differ in them
    (coreecg/eval/fairness.py): "a.b", or a prefix "a.*" / "a.b_*" (its own section and
    `pretrain.*` always define it)."""
    def register(cls: type[PretrainMethod]) -> type[PretrainMethod]:
        if not (isinstance(cls, type) and issubclass(cls, PretrainMethod)):
            raise TypeError(f"@register_method({name!r}) needs a PretrainMethod subclass, got {cls!r}")
        bad = [key for key in defining if not _names_config_keys(key)]
        if bad:
            raise ConfigError(f"method {name!r}: defining key(s) {bad} name no config key")
        losses = cls.reported_losses
        if isinstance(losses, str) or not all(k.startswith("loss_") and len(k) > 5 for k in losses):
            raise ConfigError(f"method {name!r}: reported_losses must be a tuple of 'loss_<label>' names, "
                              f"got {cls.reported_losses!r}")
        register_method_spec(MethodSpec(name, label or cls.__name__, options, tuple(structural), cls,
                                        tuple(defining)))
        return cls
    return register


def _names_config_keys(entry: str) -> bool:
    """Whether "a.b" is a config key, or "a.*" / "a.b_*" the prefix of one."""
    if not entry.endswith("*"):
        return field_type(Config, entry) is not None
    section, _, head = entry[:-1].rpartition(".")
    schema = field_type(Config, section) if section else Config
    if not head:                                   # "a.*": any section of the config
        return schema is not None
    return dataclasses.is_dataclass(schema) and any(f.name.startswith(head) for f in dataclasses.fields(schema))


def method_class(name: str) -> type[PretrainMethod]:
    spec = method_specs().get(name)
    if spec is None or spec.cls is None:
        known = sorted(n for n, s in method_specs().items() if s.cls is not None)
        raise ConfigError(f"pretrain.method={name!r} has no registered class; known: {', '.join(known)}")
    return spec.cls


def build_method(config: Config) -> PretrainMethod:
    """The pretraining model of `config.pretrain.method` (plugins imported first)."""
    import_plugins(config.pretrain.plugins)
    return method_class(config.pretrain.method)(config)
