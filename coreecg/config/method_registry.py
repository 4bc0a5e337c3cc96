"""The method registry: `pretrain.method` name -> `MethodSpec` (its label, options section,
structural and defining keys, reported losses, moved keys and, once its module is imported, its
class). Part of the config package and a leaf of it (it imports nothing of coreecg but the
config's error type), so the config reads it without importing any method; its documented home
`coreecg.methods.registry` re-exports it.

Who fills it: each built-in method declares itself in its torch-free `options.py`
(`declare_method`), which `coreecg/methods/__init__.py` imports; `coreecg/__init__.py` imports that
package, and Python runs it before any `coreecg.*` module, so every lookup sees the built-ins. A
built-in's class binds to the declaration when its `method.py` is imported
(`coreecg.methods.build`). A plugin's one module declares and binds at once (`register_method` in
coreecg.methods.build). Who reads it: the config (`methods.<name>` sections, the moved keys), the
checkpoint check (structural keys), the fairness check (defining keys), the console line, the
sweep objectives and the leaderboard (reported losses).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from coreecg.config.base import ConfigError


@dataclass(frozen=True)
class MethodSpec:
    """What the rest of coreecg knows of a pretraining method, without building it.

    options: the dataclass of its section `methods.<name>` (None: no section). Its
        `__post_init__` validates its own keys; an optional `check(self, config)` cross-checks
        them against the rest of the config (called by `Config.validate` when the method trains).
    structural: the config keys that decide which modules a checkpoint of it holds and their
        shapes: "a.b" (its value; a section's whole value) or "a.b>0" (whether it is positive);
        `model.*`, the encoder's `encoders.<model.arch>.*` and `pretrain.method` are structural
        for every method (coreecg.train.resume_check).
    defining: keys outside `methods.<name>` that table rows may differ in ("a.b", "a.*",
        "a.b_*"; coreecg/eval/fairness.py): its own section and `pretrain.*` always define it.
    reported_losses: the loss terms its forward returns besides `loss`, each "loss_<label>".
    moved_keys: old dotted key -> its place now (configs written before a key moved still load).
    needs: what it needs of the encoder (coreecg.config.encoder_registry): "grid" (tokens on the
        (lead, time) grid: token masks), "sequence" (a sequence over time) or "any" (pooled features).
    loss_scales: loss term ("loss" or one of reported_losses) -> the config keys that change its
        scale (a temperature, a loss weight): a sweep of such a key cannot rank trials by that term
        (coreecg.tune.sweep.check_objective); a term not listed is taken as comparable.
    """

    name: str
    label: str                          # its name in tables
    options: type | None = None
    structural: tuple[str, ...] = ()
    defining: tuple[str, ...] = ()
    reported_losses: tuple[str, ...] = ()
    moved_keys: Mapping[str, str] = field(default_factory=dict)
    cls: type | None = None             # the PretrainMethod subclass (None until its module is imported)
    needs: str = "any"
    loss_scales: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def built_in(self) -> bool:
        """Declared by coreecg itself: its section is in every saved config."""
        return self.options is not None and self.options.__module__.startswith("coreecg.methods.")

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


METHODS: dict[str, MethodSpec] = {}


def declare_method(spec: MethodSpec) -> MethodSpec:
    """Add `spec` (without its class yet, or with it) to the registry; ConfigError for a name that
    is no identifier, options that are no dataclass, badly named losses or a name taken by
    another declaration. Keys are checked against the config where a class binds
    (`coreecg.methods.build.register_method`)."""
    name = spec.name
    if not name.isidentifier():
        raise ConfigError(f"method name {name!r} must be a Python identifier (it is a config key)")
    if spec.options is not None and not dataclasses.is_dataclass(spec.options):
        raise ConfigError(f"method {name!r}: options must be a dataclass, got {spec.options!r}")
    losses = spec.reported_losses
    if isinstance(losses, str) or not all(isinstance(k, str) and k.startswith("loss_") and len(k) > 5 for k in losses):
        raise ConfigError(f"method {name!r}: reported_losses must be a tuple of 'loss_<label>' names, got {losses!r}")
    known = METHODS.get(name)
    if known is not None and known.cls is not None and known.cls is not spec.cls:
        raise ConfigError(f"method {name!r} is already registered by {known.cls.__module__}")
    METHODS[name] = spec
    return spec


def method_specs() -> dict[str, MethodSpec]:
    """Every registered method: the built-ins (declared when coreecg.methods was imported, which
    importing coreecg did) and the plugins imported so far."""
    return METHODS


def moved_keys() -> dict[str, str]:
    """Every registered method's moved keys (old dotted key -> new)."""
    return {old: new for spec in METHODS.values() for old, new in spec.moved_keys.items()}
