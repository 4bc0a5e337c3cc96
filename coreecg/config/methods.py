"""The config's side of the method registry (coreecg.config.method_registry): `pretrain`, and the open
`methods` section (one typed section per registered method, `methods.<name>`)."""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.typed import OpenSection
from coreecg.config.base import ConfigError
from coreecg.config.method_registry import METHODS, MethodSpec, method_specs

__all__ = ["METHODS", "MethodSpec", "method_specs", "PretrainConfig", "MethodOptions"]


@dataclass
class PretrainConfig:
    """Which self-supervised method trains the encoder (coreecg/methods; docs/methods.md).

    method: a registered method (`core` is the paper's CoRe-ECG; docs/methods.md lists the others).
    A method of your own is a module named in the config's one plugins key, `plugins` (the
    `pretrain.plugins` of older configs is read there).
    """

    method: str = "core"

    def __post_init__(self) -> None:
        if self.method not in method_specs():
            raise ConfigError(f"pretrain.method={self.method!r} is not a registered method; known: "
                              f"{', '.join(sorted(METHODS))} (a plugin's module goes in plugins)")


class MethodOptions(OpenSection):
    """The `methods` section: one typed options section per registered method that has one
    (`methods.<name>.<key>`). A section not set holds its dataclass's defaults."""

    unknown_reason = "no registered method with options of that name; a plugin's module goes in plugins"

    @classmethod
    def section_type(cls, name: str) -> type | None:
        spec = method_specs().get(name)
        return spec.options if spec is not None else None

    @classmethod
    def known(cls) -> list[str]:
        return sorted(n for n, s in method_specs().items() if s.options is not None)

    def names(self, selected: str | None = None) -> list[str]:
        """The sections a saved config holds: the built-in methods', those set explicitly and the
        selected method's, never a section only because some plugin was imported in this
        process (a config must reload where that plugin is not)."""
        specs = method_specs()
        keep = [*(n for n, s in specs.items() if s.built_in), *self._sections, *([selected] if selected else [])]
        return [n for n in dict.fromkeys(keep) if n in specs and specs[n].options is not None]
