"""Method classes into the registry: `register_method`, the class decorator every method's
module uses (coreecg.methods.registry holds the entries).

A built-in method declared its entry in its options.py; its class binds to it by name:

    @register_method("core")
    class CoReECG(PretrainMethod): ...

A plugin declares and binds in the one call (tests/plugin_method.py, docs/methods.md):

    @register_method("my_method", "My method", options=MyOptions,
                     structural=("methods.my_method.hidden_dim",))
    class MyMethod(PretrainMethod):
        reported_losses = ("loss_mine",)
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from coreecg.config import Config, ConfigError
from coreecg.methods.base import PretrainMethod
from coreecg.config.method_registry import METHODS, MethodSpec, declare_method
from coreecg.typed import field_type


def register_method(name: str, label: str | None = None, options: type | None = None,
                    structural: tuple[str, ...] = (), defining: tuple[str, ...] = (), needs: str = "any"
                    ) -> Callable[[type[PretrainMethod]], type[PretrainMethod]]:
    """Class decorator: `pretrain.method=<name>` builds this class. With only the name, it binds
    to the entry the method's options.py declared (the class then reports that entry's losses).
    Otherwise it declares the entry: `label` names it in tables; `options` (a dataclass) becomes
    the typed config section `methods.<name>` (its `__post_init__` checks its keys, an optional
    `check(self, config)` the rest of the config); `structural`: the config keys that decide the
    modules and shapes of its checkpoints ("a.b" or "a.b>0"; a resume across a change of one is
    refused); `defining`: the config keys outside `methods.<name>` that define the method, so rows
    of a table may differ in them (coreecg/eval/fairness.py): "a.b", or a prefix "a.*" / "a.b_*"
    (its own section and `pretrain.*` always define it); the class's `reported_losses`: the loss
    terms its forward returns besides `loss`; `needs`: what it needs of the encoder, "grid" (token
    masks on the (lead, time) grid), "sequence" or "any" (pooled features; coreecg.encoders)."""
    def register(cls: type[PretrainMethod]) -> type[PretrainMethod]:
        if not (isinstance(cls, type) and issubclass(cls, PretrainMethod)):
            raise TypeError(f"@register_method({name!r}) needs a PretrainMethod subclass, got {cls!r}")
        declared = METHODS.get(name)
        binds = declared is not None and declared.cls is None and label is None and options is None \
            and not structural and not defining
        if binds:
            own = cls.__dict__.get("reported_losses")
            if own is not None and tuple(own) != declared.reported_losses:
                raise ConfigError(f"method {name!r}: the class reports {own!r}, its declaration "
                                  f"{declared.reported_losses!r}")
            cls.reported_losses = declared.reported_losses
            spec = dataclasses.replace(declared, cls=cls)
        else:
            spec = MethodSpec(name, label or cls.__name__, options, tuple(structural), tuple(defining),
                              tuple(cls.reported_losses) if isinstance(cls.reported_losses, (tuple, list))
                              else cls.reported_losses, cls=cls, needs=needs)
        _check_keys(spec)
        declare_method(spec)
        return cls
    return register


def _check_keys(spec: MethodSpec) -> None:
    """ConfigError unless every structural and defining key names a config key (its own section's
    keys resolve through the registry: checked with the entry in place, then restored)."""
    before = METHODS.get(spec.name)
    METHODS[spec.name] = spec
    try:
        bad = [e for e in spec.structural if field_type(Config, e.removesuffix(">0")) is None]
        if bad:
            raise ConfigError(f"method {spec.name!r}: structural key(s) {bad} are not config keys")
        bad = [key for key in spec.defining if not _names_config_keys(key)]
        if bad:
            raise ConfigError(f"method {spec.name!r}: defining key(s) {bad} name no config key")
    finally:
        if before is None:
            del METHODS[spec.name]
        else:
            METHODS[spec.name] = before


def _names_config_keys(entry: str) -> bool:
    """Whether "a.b" is a config key, or "a.*" / "a.b_*" the prefix of one."""
    if not entry.endswith("*"):
        return field_type(Config, entry) is not None
    section, _, head = entry[:-1].rpartition(".")
    schema = field_type(Config, section) if section else Config
    if not head:                                   # "a.*": any section of the config
        return schema is not None
    return dataclasses.is_dataclass(schema) and any(f.name.startswith(head) for f in dataclasses.fields(schema))
