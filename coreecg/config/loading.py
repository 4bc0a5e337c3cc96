"""Loading a config: defaults < YAML file < `a.b=c` overrides; saved configs (checkpoints, run
folders), with plugins imported first and moved keys mapped."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterable

from coreecg.typed import TypedError, load, override, read_yaml
from coreecg.config.base import ConfigError
from coreecg.config.plugins import import_plugins_in, import_plugins_of
from coreecg.config.schema import Config


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `a.b=c` overrides. Plugins named in
    the file or the overrides are imported first, so the file may set their sections."""
    overrides = list(overrides)
    import_plugins_of(overrides)
    cfg = Config()
    if path is not None:
        data = _moved_keys(read_yaml(path, ConfigError), str(path))
        import_plugins_in(data, str(path))
        cfg = load(cfg, data, origin=str(path), error=ConfigError)
    return apply_overrides(cfg, overrides).validate()


def apply_overrides(cfg: Config, overrides: Iterable[str], origin: str = "overrides",
                    error: type[TypedError] = ConfigError) -> Config:
    """`cfg` with each `a.b=c` applied in order (not validated across sections: `validate()`);
    `error` "<origin>: <key>: <reason>" for an unknown key or a wrong value."""
    overrides = [_moved_override(item) for item in overrides]
    import_plugins_of(overrides)
    for item in overrides:
        cfg = load(cfg, override(Config, item, error, origin), origin=origin, error=error)
    return cfg


# Keys that moved: old dotted key -> its place now. Files, saved configs and overrides that use the
# old key still load, at the new place; one that gives both is an error naming them.
MOVED_KEYS = {"data.sources.synthetic_seed": "data.sources.synthetic.seed"}


def _moved_override(item: str) -> str:
    key, sep, raw = item.partition("=")
    new = MOVED_KEYS.get(key.strip())
    return f"{new}={raw}" if sep and new else item


def _moved_keys(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """`data` (a nested mapping) with every MOVED_KEYS key at its new place (a copy, if any moved)."""
    for old, new in MOVED_KEYS.items():
        *path, leaf = old.split(".")
        parent = _section_at(data, path)
        if parent is None or leaf not in parent:
            continue
        data = copy.deepcopy(data)
        value = _section_at(data, path).pop(leaf)
        *new_path, new_leaf = new.split(".")
        target = _section_at(data, new_path, create=True)
        if target is None:
            raise ConfigError(f"{origin}: {old} moved to {new}, and {'.'.join(new_path)} is not a section")
        if new_leaf in target and target[new_leaf] != value:
            raise ConfigError(f"{origin}: {old} (moved to {new}) and {new} are both given: keep {new}")
        target[new_leaf] = value
    return data


def _section_at(data: Any, path: list[str], create: bool = False) -> dict | None:
    for part in path:
        if create and isinstance(data, dict) and data.get(part) is None:
            data[part] = {}
        data = data.get(part) if isinstance(data, dict) else None
    return data if isinstance(data, dict) else None


def config_from_dict(data: dict[str, Any], origin: str = "config") -> Config:
    """Rebuild a config saved with `to_dict` (checkpoints, run folders); keys that moved since are
    read at their new place, and the plugins it names are imported first."""
    ft = data.get("finetune")
    if isinstance(ft, dict) and ft.get("mode") == "full":   # coreecg <= 0.1.0 called finetune "full"
        data = {**data, "finetune": {**ft, "mode": "finetune"}}
    data = _moved_keys(data, origin)
    import_plugins_in(data, origin)
    return load(Config, data, origin=origin, error=ConfigError).validate()
