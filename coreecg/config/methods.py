"""The method registry's config side: what the config knows of a registered pretraining method
(`MethodSpec`), the registry, `pretrain` and the open `methods` section."""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from coreecg.typed import OpenSection
from coreecg.config.base import ConfigError
from coreecg.config.plugins import import_plugins


@dataclass(frozen=True)
class MethodSpec:
    """What the config knows of a registered pretraining method; `coreecg.methods.register_method`
    declares it in the method's own module. The config, the checkpoint check and the loop read
    these fields and never name a method.

    options: the dataclass of its section `methods.<name>` (None: no section). Its
        `__post_init__` validates its own keys; an optional `check(self, config)` method
        cross-checks them against the rest of the config (called by `Config.validate` when the
        method trains).
    structural: the config keys that decide which modules a checkpoint of it holds and their
        shapes, in or outside its section: "a.b" (its value) or "a.b>0" (whether it is positive);
        `model.*` and `pretrain.method` are structural for every method.
    """

    name: str
    label: str                          # its name in tables
    options: type | None = None
    structural: tuple[str, ...] = ()
    cls: type | None = None             # the PretrainMethod subclass that builds it
    defining: tuple[str, ...] = ()      # keys table rows may differ in ("a.b", "a.*", "a.b_*"): eval/fairness.py

    def structural_values(self, plain: dict[str, Any]) -> dict[str, Any]:
        """{key: value} of `structural` in a config's `to_dict()` ("a.b>0": whether a.b > 0)."""
        out = {}
        for entry in self.structural:
            key = entry.removesuffix(">0")
            value = plain
            for part in key.split("."):
                value = value[part]
            out[key] = value > 0 if entry.endswith(">0") else value
        return out


# The registry. The built-in methods register themselves when their package is imported, which
# `method_specs()` does on first use: the config reads `methods.<name>` of a built-in without the
# caller importing coreecg.methods, and names none of them here.
METHODS: dict[str, MethodSpec] = {}
BUILT_IN_PACKAGE = "coreecg.methods"
_built_ins_imported = False


def method_specs() -> dict[str, MethodSpec]:
    """Every registered method (the built-in ones' package imported on first use)."""
    global _built_ins_imported
    if not _built_ins_imported:
        _built_ins_imported = True
        importlib.import_module(BUILT_IN_PACKAGE)
    return METHODS


@dataclass
class PretrainConfig:
    """Which self-supervised method trains the encoder (coreecg/methods; docs/methods.md).

    method: a registered method (`core` is the paper's CoRe-ECG; docs/methods.md lists the others).
    plugins: modules imported before the method is looked up (on the driver and on every
    worker), each registering methods with `coreecg.methods.register_method`.
    """

    method: str = "core"
    plugins: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        import_plugins(self.plugins)
        if self.method not in method_specs():
            raise ConfigError(f"pretrain.method={self.method!r} is not a registered method; known: "
                              f"{', '.join(sorted(METHODS))} (a plugin's module goes in pretrain.plugins)")


class MethodOptions(OpenSection):
    """The `methods` section: one typed options section per registered method that has one
    (`methods.<name>.<key>`). A section not set holds its dataclass's defaults."""

    unknown_reason = "no registered method with options of that name; a plugin's module goes in pretrain.plugins"

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
        built_in = [n for n, s in specs.items() if getattr(s.cls, "__module__", "").startswith(BUILT_IN_PACKAGE + ".")]
        keep = [*built_in, *self._sections, *([selected] if selected else [])]
        return [n for n in dict.fromkeys(keep) if n in specs and specs[n].options is not None]
