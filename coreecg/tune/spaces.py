"""Search spaces and ablation variants (`tune_spaces/*.yaml`), validated against the typed config.

Three kinds of file, told apart by their top-level key:

    grid:      {config.key: [v1, v2, ...], ...}          every combination is a trial (mask_rates.yaml)
    params:    {config.key: {type: uniform|loguniform|int|choice, low, high[, step] | values}}
                                                         Optuna distributions (core.yaml)
    variants:  {Name: [a.b=c, ...] | scratch | random    named override lists (ablations.yaml);
                | {not_available: reason}}               `scratch`: the supervised baseline, no pretraining;
                                                         `random`: no pretraining either, a seeded randomly
                                                         initialised encoder fine-tuned in the grid's modes
                                                         (finetune.encoder=random, "Random init");
    tables:    {table name: [variant names]}             not_available: a table row that says why it is empty
    allow:     [{variants: [names], keys: [a.b | a.*],   a declared protocol difference between table
                 reason: text}]                          rows (coreecg/eval/fairness.py): a footnote

The file is read by the typed loader (`coreecg.typed`, the schema `SpaceFile`). Every key must be
a config key and every value (both ends of a range, every grid value, every variant) must make a
valid config on top of the base config: SpaceError "<file>: <section>: <key>: <reason>"
otherwise. A method's own key (`methods.<name>.<key>`) must be swept where that method is
selected (`--set pretrain.method=<name>`, or in the variant's own overrides), else it would
change nothing.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml

from coreecg.config import Config, ConfigError, apply_overrides, load_config, moved_key, moved_override
from coreecg.eval.fairness import Allowance, flatten, is_compared
from coreecg.typed import Check, TypedError, load, read_yaml

# Lazy imports: optuna (the `ray` extra): a space file is read and checked without it.

SCRATCH = "scratch"
RANDOM = "random"
NO_PRETRAINING = (SCRATCH, RANDOM)
NOT_AVAILABLE = "not_available"
DISTRIBUTIONS = ("uniform", "loguniform", "int", "choice")


class SpaceError(TypedError):
    """A search space or variant table that cannot be used; the message names file and key."""


# ---------------------------------------------------------------------------- the file's schema


@dataclass
class Distribution:
    """params.<key>: uniform, loguniform or int (low, high[, step]), or choice (values)."""

    type: Literal[DISTRIBUTIONS]
    low: int | float | None = None
    high: int | float | None = None
    step: int | None = None
    values: Annotated[tuple[Any, ...], Check(bool, "must not be empty")] | None = None


@dataclass
class Unavailable:
    """variants.<name>: {not_available: reason}, a table row that says why it has no run."""

    not_available: Annotated[str, Check(lambda s: bool(s.strip()), "must give the reason")]


Overrides = Annotated[tuple[str, ...], Check(lambda v: all("=" in o for o in v), "must be a list of 'a.b=c' overrides")]


@dataclass
class AllowEntry:
    """allow[i]: rows `variants` may differ from the other rows of a table in `keys`, for `reason`."""

    variants: Annotated[tuple[str, ...], Check(bool, "must not be empty")]
    keys: Annotated[tuple[str, ...], Check(bool, "must not be empty")]
    reason: Annotated[str, Check(lambda s: bool(s.strip()), "must give the reason")]


@dataclass
class SpaceFile:
    grid: dict[str, Annotated[tuple[Any, ...], Check(bool, "must not be empty")]] = field(default_factory=dict)
    params: dict[str, Distribution] = field(default_factory=dict)
    variants: dict[str, Overrides | Literal[SCRATCH, RANDOM] | Unavailable] = field(default_factory=dict)
    tables: dict[str, tuple[str, ...]] = field(default_factory=dict)
    allow: tuple[AllowEntry, ...] = ()


@dataclass
class Space:
    path: Path
    grid: dict[str, list] = field(default_factory=dict)
    params: dict[str, dict[str, Any]] = field(default_factory=dict)
    variants: dict[str, list[str] | str] = field(default_factory=dict)
    tables: dict[str, list[str]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)     # variant name -> why it has no run
    allow: list[Allowance] = field(default_factory=list)          # declared protocol differences

    @property
    def keys(self) -> list[str]:
        return list(self.grid or self.params)


# ---------------------------------------------------------------------------- loading


def load_space(path: str | Path, config_file: str | None = None, base: list[str] = ()) -> Space:
    """Read and validate a space file against the config (`config_file` + `base` overrides)."""
    path = Path(path)
    spec = load(SpaceFile, read_yaml(path, SpaceError), origin=str(path), error=SpaceError)
    if not (spec.grid or spec.params or spec.variants):
        raise SpaceError(f"{path}: expected grid, params or variants (+ tables)")
    try:
        cfg = load_config(config_file, base)
    except ConfigError as e:
        raise SpaceError(f"{path}: the base config: {e}") from None
    space = Space(path)
    choice = spec.params.get("pretrain.method")
    swept = {str(v) for v in [*spec.grid.get("pretrain.method", ()), *((choice and choice.values) or ())]}
    # keys that moved since the file was written (CoRe-ECG's masking.* -> methods.core.masking.*, ...)
    # are read at their places now: trials, results.csv and the plots name them so
    for key, values in ((moved_key(k), v) for k, v in spec.grid.items()):
        for v in values:
            _checked(path, "grid", cfg, [f"{key}={_yaml(v)}"], swept)
        space.grid[key] = list(values)
    for key, dist in ((moved_key(k), d) for k, d in spec.params.items()):
        space.params[key], ends = _distribution(path, key, dist)
        for v in ends:                          # both ends of a range make a valid config
            _checked(path, "params", cfg, [f"{key}={_yaml(v)}"], swept)
    for name, overrides in spec.variants.items():
        if isinstance(overrides, Unavailable):
            space.unavailable[name] = overrides.not_available.strip()
            space.variants[name] = NOT_AVAILABLE
        else:
            if overrides not in NO_PRETRAINING:
                overrides = [moved_override(o, f"{path}: variants.{name}", SpaceError) for o in overrides]
            space.variants[name] = overrides if overrides in NO_PRETRAINING else list(overrides)
            if overrides not in NO_PRETRAINING:
                _checked(path, f"variants.{name}", cfg, list(overrides))
    for table, names in spec.tables.items():
        missing = [n for n in names if n not in space.variants]
        if missing:
            raise SpaceError(f"{path}: tables.{table}: unknown variants {missing}")
        space.tables[table] = list(names)
    space.allow = [_allowance(path, i, entry, space, cfg) for i, entry in enumerate(spec.allow)]
    return space


def _allowance(path: Path, i: int, entry: AllowEntry, space: Space, cfg: Config) -> Allowance:
    """allow[i], checked: its variants exist, each key is a config key (or `section.*` prefix)
    on which rows must agree (declaring a method's own key would allow nothing)."""
    where = f"{path}: allow[{i}]"
    missing = [v for v in entry.variants if v not in space.variants]
    if missing:
        raise SpaceError(f"{where}: variants: unknown variants {missing}")
    known = flatten(cfg.to_dict())
    for key in map(moved_key, entry.keys):
        matches = [k for k in known if k == key or (key.endswith(".*") and k.startswith(key[:-1]))]
        if not matches:
            raise SpaceError(f"{where}: keys: {key!r} is not a config key (nor a 'section.*' prefix of one)")
        if not any(is_compared(k) for k in matches):
            raise SpaceError(f"{where}: keys: {key!r} defines a method or only bookkeeps a run: rows may "
                             "differ in it without a declaration")
    return Allowance(tuple(entry.variants), tuple(moved_key(k) for k in entry.keys), entry.reason.strip())


def _yaml(value: Any) -> str:
    """A value as one line of YAML (what `--set a.b=<value>` reads back)."""
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("\n...").strip()


def _distribution(path: Path, key: str, d: Distribution) -> tuple[dict[str, Any], list]:
    """The distribution as `optuna_space` reads it, and the values whose configs must be valid."""
    where = f"{path}: params.{key}"
    if d.type == "choice":
        if not d.values:
            raise SpaceError(f"{where}: choice needs a non-empty 'values' list")
        ends = list(d.values)
    else:
        if d.low is None or d.high is None:
            raise SpaceError(f"{where}: {d.type} needs low and high")
        if not d.low < d.high:
            raise SpaceError(f"{where}: need low < high, got low={d.low!r} high={d.high!r}")
        if d.type == "loguniform" and d.low <= 0:
            raise SpaceError(f"{where}: loguniform needs low > 0, got {d.low}")
        if d.type == "int" and not (float(d.low).is_integer() and float(d.high).is_integer()):
            raise SpaceError(f"{where}: int needs integer bounds")
        ends = [int(d.low), int(d.high)] if d.type == "int" else [float(d.low), float(d.high)]
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(d).items() if v is not None}, ends


def _checked(path: Path, where: str, cfg: Config, overrides: list[str], swept: set[str] = frozenset()) -> Config:
    """`cfg` with `overrides`, validated; SpaceError "<path>: <where>: <reason>" otherwise, also
    for a `methods.<name>.*` key whose method is not the one that trains (it would change nothing)."""
    try:
        cfg = apply_overrides(cfg, overrides, origin=f"{path}: {where}", error=SpaceError).validate()
    except ConfigError as e:
        raise SpaceError(f"{path}: {where}: {e}") from None
    for key in (o.partition("=")[0].strip() for o in overrides):
        parts = key.split(".")
        if len(parts) > 2 and parts[0] == "methods" and parts[1] != cfg.pretrain.method and parts[1] not in swept:
            raise SpaceError(f"{path}: {where}: {key} has no effect: pretrain.method is {cfg.pretrain.method!r}; "
                             f"select it with --set pretrain.method={parts[1]} (or in the variant)")
    return cfg


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
