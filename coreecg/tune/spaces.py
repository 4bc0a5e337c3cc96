"""Search spaces and ablation variants (`tune_spaces/*.yaml`), validated against the typed config.

Three kinds of file, told apart by their top-level key:

    grid:      {config.key: [v1, v2, ...], ...}          every combination is a trial (mask_rates.yaml)
    params:    {config.key: {type: uniform|loguniform|int|choice, low, high[, step] | values}}
                                                         Optuna distributions (core.yaml)
    variants:  {Name: [a.b=c, ...] | scratch             named override lists (ablations.yaml);
                | {not_available: reason}}               `scratch`: the supervised baseline, no pretraining;
    tables:    {table name: [variant names]}             not_available: a table row that says why it is empty

Every key must be a config key and every value (both ends of a range, every grid value, every
variant) must make a valid config on top of the base config: SpaceError names the file, the key
and the reason otherwise. A method's own key (`methods.<name>.<key>`) must be swept where that
method is selected (`--set pretrain.method=<name>`, or in the variant's own overrides), else
it would change nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from coreecg.config import Config, ConfigError, load_config

SCRATCH = "scratch"
NOT_AVAILABLE = "not_available"
DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")


class SpaceError(ValueError):
    """A search space or variant table that cannot be used; the message names file and key."""


@dataclass
class Space:
    path: Path
    grid: dict[str, list] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    variants: dict[str, list[str] | str] = field(default_factory=dict)
    tables: dict[str, list[str]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)     # variant name -> why it has no run

    @property
    def keys(self) -> list[str]:
        return list(self.grid or self.params)


def _yaml(value: Any) -> str:
    """A value as one line of YAML (what `--set a.b=<value>` reads back)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


def _check_value(path: Path, key: str, value: Any, base: list[str], config_file: str | None,
                 swept_methods: set[str] = frozenset()) -> None:
    try:
        cfg = load_config(config_file, [*base, f"{key}={_yaml(value)}"])
    except ConfigError as e:
        raise SpaceError(f"{path}: {key}={value!r}: {e}") from None
    except yaml.YAMLError as e:
        raise SpaceError(f"{path}: {key}={value!r}: {e}") from None
    _check_method_keys(path, [key], cfg, swept_methods)


def _check_method_keys(path: Path, keys: list[str], cfg: Config, swept_methods: set[str] = frozenset(),
                       where: str = "") -> None:
    """A `methods.<name>.*` key whose method is not the one that trains would change nothing."""
    for key in keys:
        parts = key.split(".")
        if len(parts) > 2 and parts[0] == "methods" and parts[1] != cfg.pretrain.method \
                and parts[1] not in swept_methods:
            raise SpaceError(f"{path}: {where}{key} has no effect: pretrain.method is {cfg.pretrain.method!r}; "
                             f"select it with --set pretrain.method={parts[1]} (or in the variant)")


def _swept_methods(data: dict) -> set[str]:
    """Methods a space itself selects (a grid or choice over pretrain.method)."""
    grid = (data.get("grid") or {}).get("pretrain.method") or []
    choice = ((data.get("params") or {}).get("pretrain.method") or {}).get("values") or []
    return {str(v) for v in [*grid, *choice]}


def load_space(path: str | Path, config_file: str | None = None, base: list[str] = ()) -> Space:
    """Read and validate a space file against the config (`config_file` + `base` overrides)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise SpaceError(f"{path}: cannot read: {e}") from None
    if not isinstance(data, dict) or not data:
        raise SpaceError(f"{path}: expected a mapping with 'grid', 'params' or 'variants'")
    unknown = set(data) - {"grid", "params", "variants", "tables"}
    if unknown or not ({"grid", "params", "variants"} & set(data)):
        raise SpaceError(f"{path}: top-level keys must be grid, params or variants (+ tables); got {sorted(data)}")
    space = Space(path)
    base = list(base)
    swept = _swept_methods(data)
    for key, values in (data.get("grid") or {}).items():
        if not isinstance(values, list) or not values:
            raise SpaceError(f"{path}: grid.{key} must be a non-empty list of values")
        for v in values:
            _check_value(path, key, v, base, config_file, swept)
        space.grid[key] = values
    for key, dist in (data.get("params") or {}).items():
        if not isinstance(dist, dict) or dist.get("type") not in DISTRIBUTIONS:
            raise SpaceError(f"{path}: params.{key} needs type one of {DISTRIBUTIONS}, got {dist!r}")
        if dist["type"] == "choice":
            if not isinstance(dist.get("values"), list) or not dist["values"]:
                raise SpaceError(f"{path}: params.{key}: choice needs a non-empty 'values' list")
            ends = dist["values"]
        else:
            if "low" not in dist or "high" not in dist:
                raise SpaceError(f"{path}: params.{key}: {dist['type']} needs low and high")
            low, high = dist["low"], dist["high"]
            if not (isinstance(low, (int, float)) and isinstance(high, (int, float))) or not low < high:
                raise SpaceError(f"{path}: params.{key}: need numbers low < high, got low={low!r} high={high!r}")
            if dist["type"] == "loguniform" and low <= 0:
                raise SpaceError(f"{path}: params.{key}: loguniform needs low > 0, got {low}")
            if dist["type"] == "int" and not (float(low).is_integer() and float(high).is_integer()):
                raise SpaceError(f"{path}: params.{key}: int needs integer bounds")
            ends = [int(low), int(high)] if dist["type"] == "int" else [float(low), float(high)]
        for v in ends:                          # both ends of a range make a valid config
            _check_value(path, key, v, base, config_file, swept)
        space.params[key] = dict(dist)
    for name, overrides in (data.get("variants") or {}).items():
        if overrides == SCRATCH:
            space.variants[str(name)] = SCRATCH
            continue
        if isinstance(overrides, dict):
            reason = overrides.get(NOT_AVAILABLE)
            if set(overrides) != {NOT_AVAILABLE} or not isinstance(reason, str) or not reason.strip():
                raise SpaceError(f"{path}: variants.{name}: a mapping must be {{{NOT_AVAILABLE}: <the reason>}}")
            space.unavailable[str(name)] = reason.strip()
            space.variants[str(name)] = NOT_AVAILABLE
            continue
        if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
            raise SpaceError(f"{path}: variants.{name} must be a list of 'a.b=c' overrides, '{SCRATCH}' "
                             f"or {{{NOT_AVAILABLE}: reason}}")
        try:
            cfg = load_config(config_file, [*base, *overrides])
        except ConfigError as e:
            raise SpaceError(f"{path}: variant {name!r}: {e}") from None
        _check_method_keys(path, [o.partition("=")[0].strip() for o in overrides], cfg, where=f"variant {name!r}: ")
        space.variants[str(name)] = list(overrides)
    for table, names in (data.get("tables") or {}).items():
        missing = [n for n in names if n not in space.variants]
        if missing:
            raise SpaceError(f"{path}: table {table!r} names unknown variants {missing}")
        space.tables[str(table)] = list(names)
    return space


def optuna_space(space: Space):
    """Optuna distributions for OptunaSearch (a dict: key -> BaseDistribution)."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    out = {}
    for key, d in space.params.items():
        if d["type"] == "choice":
            out[key] = CategoricalDistribution(d["values"])
        elif d["type"] == "int":
            out[key] = IntDistribution(int(d["low"]), int(d["high"]), step=int(d.get("step", 1)))
        else:
            out[key] = FloatDistribution(float(d["low"]), float(d["high"]), log=d["type"] == "loguniform")
    return out


def overrides_for(params: dict[str, Any]) -> list[str]:
    """{key: value} -> ["key=value", ...] in YAML syntax (what load_config's overrides read)."""
    out = []
    for key, value in params.items():
        if isinstance(value, float) and math.isfinite(value):
            value = float(f"{value:.6g}")      # trial values print as written, not 0.30000000000000004
        out.append(f"{key}={_yaml(value)}")
    return out


def trial_config(config_file: str | None, base: list[str], params: dict[str, Any]) -> Config:
    return load_config(config_file, [*base, *overrides_for(params)])
