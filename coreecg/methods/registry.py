"""The method registry: `pretrain.method` name -> the method's class, label, options section and
structural keys (built-ins and plugins), kept in `coreecg.config.METHODS`."""
from __future__ import annotations

from typing import Callable

from coreecg.config import Config, ConfigError, MethodSpec, import_plugins, method_specs, register_method_spec
from coreecg.methods.base import PretrainMethod


def register_method(name: str, label: str | None = None, options: type | None = None,
                    structural: tuple[str, ...] = ()) -> Callable[[type[PretrainMethod]], type[PretrainMethod]]:
    """Class decorator: `pretrain.method=<name>` builds this class; `label` names it in tables;
    `options` (a dataclass) becomes the typed config section `methods.<name>` (its
    `__post_init__` checks its keys, an optional `check(self, config)` the rest of the config);
    `structural`: the config keys that decide the modules and shapes of its checkpoints
    ("a.b" or "a.b>0"; a resume across a change of one is refused)."""
    def register(cls: type[PretrainMethod]) -> type[PretrainMethod]:
        if not (isinstance(cls, type) and issubclass(cls, PretrainMethod)):
            raise TypeError(f"@register_method({name!r}) needs a PretrainMethod subclass, got {cls!r}")
        register_method_spec(MethodSpec(name, label or cls.__name__, options, tuple(structural), cls))
        return cls
    return register


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
