"""The method registry: `pretrain.method` name -> PretrainMethod class (built-ins and plugins)."""
from __future__ import annotations

from typing import Callable

from coreecg.config import Config, ConfigError, import_plugins, register_method_config
from coreecg.methods.base import PretrainMethod

_CLASSES: dict[str, type[PretrainMethod]] = {}


def register_method(name: str, label: str | None = None, options: type | None = None
                    ) -> Callable[[type[PretrainMethod]], type[PretrainMethod]]:
    """Class decorator: `pretrain.method=<name>` builds this class; `label` names it in tables;
    `options` (a dataclass) becomes the typed config section `methods.<name>`."""
    def register(cls: type[PretrainMethod]) -> type[PretrainMethod]:
        if not (isinstance(cls, type) and issubclass(cls, PretrainMethod)):
            raise TypeError(f"@register_method({name!r}) needs a PretrainMethod subclass, got {cls!r}")
        if name in _CLASSES and _CLASSES[name] is not cls:
            raise ConfigError(f"method {name!r} is already registered by {_CLASSES[name].__module__}")
        register_method_config(name, label or cls.__name__, options)
        _CLASSES[name] = cls
        return cls
    return register


def method_class(name: str) -> type[PretrainMethod]:
    if name not in _CLASSES:
        raise ConfigError(f"pretrain.method={name!r} has no registered class; known: {', '.join(sorted(_CLASSES))}")
    return _CLASSES[name]


def build_method(config: Config) -> PretrainMethod:
    """The pretraining model of `config.pretrain.method` (plugins imported first)."""
    import_plugins(config.pretrain.plugins)
    return method_class(config.pretrain.method)(config)
