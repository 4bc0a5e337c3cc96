"""Loading a config: defaults < YAML file < `a.b=c` overrides; saved configs (checkpoints, run
folders), with plugins imported first and moved keys mapped."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Any, Iterable

from coreecg.typed import TypedError, load, override, read_yaml
from coreecg.config.base import ConfigError
from coreecg.config.plugins import import_plugins_in, import_plugins_of
from coreecg.config.schema import Config
from coreecg.config.encoder_registry import ENCODERS
from coreecg.config.method_registry import moved_keys as method_moved_keys


def load_config(path: str | Path | None = None, overrides: Iterable[str] = ()) -> Config:
    """Defaults, then the YAML file at `path` (if any), then `a.b=c` overrides. Plugins named in
    the file or the overrides are imported first, so the file may set their sections."""
    overrides = list(overrides)
    import_plugins_of(overrides)
    cfg = Config()
    if path is not None:
        data = read_yaml(path, ConfigError)
        import_plugins_in(data, str(path))         # first: a plugin method's moved keys are then known
        data = moved_to_new_places(data, str(path))
        cfg = load(cfg, data, origin=str(path), error=ConfigError)
    return apply_overrides(cfg, overrides).validate()


def apply_overrides(cfg: Config, overrides: Iterable[str], origin: str = "overrides",
                    error: type[TypedError] = ConfigError) -> Config:
    """`cfg` with each `a.b=c` applied in order (not validated across sections: `validate()`);
    `error` "<origin>: <key>: <reason>" for an unknown key or a wrong value."""
    import_plugins_of(overrides)
    for item in overrides:        # each mapped against the arch the overrides before it set
        item = moved_override(item, origin, error, arch=cfg.model.arch)
        cfg = load(cfg, override(Config, item, error, origin), origin=origin, error=error)
    return cfg


# Keys that moved: old dotted key -> its place now, here and in each method's registry entry
# (`MethodSpec.moved_keys`: CoRe-ECG's masking, augment and loss sections, decoder, projection and
# EMA keys moved under methods.core). Files, saved configs and overrides that use an old key
# still load, at the new place; one that gives both differently is an error naming them; a key
# of a section that moved away entirely and that has no new place is an error naming where the
# section's keys went (never silently dropped).
# The ViT's sizes left `model` for the encoder's own section (the encoder registry); a saved config
# of a published ViT family (model.arch=st_mem) moves them to encoders.<arch> (_vit_sizes_moved).
VIT_SIZES = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "dropout")
MOVED_KEYS = {"data.sources.synthetic_seed": "data.sources.synthetic.seed",
              "loss.gather_negatives": "optim.gather_negatives",
              "pretrain.plugins": "plugins",
              **{f"model.{k}": f"encoders.coreecg.{k}" for k in VIT_SIZES}}
# Moved keys whose lists are merged with the new key's (one plugins key, not two: both are imported)
MERGED_KEYS = {"pretrain.plugins"}


def all_moved_keys() -> dict[str, str]:
    """MOVED_KEYS and every registered method's moved keys."""
    return {**MOVED_KEYS, **method_moved_keys()}


def _gone_sections(moved: dict[str, str]) -> dict[str, list[str]]:
    """Top-level sections that exist no more -> where their keys went (new parent sections)."""
    here = {f.name for f in dataclasses.fields(Config)}
    out: dict[str, list[str]] = {}
    for old, new in moved.items():
        section = old.split(".")[0]
        if section not in here:
            out.setdefault(section, [])
            parent = new.rpartition(".")[0]
            if parent not in out[section]:
                out[section].append(parent)
    return out


def _gone_error(origin: str, key: str, gone: dict[str, list[str]]) -> str:
    section = key.split(".")[0]
    return (f"{origin}: {key}: the {section} section moved (its keys are now "
            f"{', '.join(p + '.*' for p in gone[section])}); {key} has no place there")


def moved_key(key: str) -> str:
    """`key` at its place now (itself if it never moved)."""
    return all_moved_keys().get(key, key)


def moved_override(item: str, origin: str = "overrides", error: type[Exception] = ConfigError,
                   arch: str | None = None) -> str:
    """An `a.b=c` override with its key at its place now (a ViT size `model.<size>` under the
    section of `arch`, the config's model.arch, where that encoder has the key: st_mem's; else
    the paper ViT's); `error` for a key of a section that moved away and has no new place."""
    key, sep, raw = item.partition("=")
    moved = all_moved_keys()
    new = moved.get(key.strip())
    size = key.strip().removeprefix("model.")
    if new and arch and arch != "coreecg" and size in VIT_SIZES and size in _option_fields(arch):
        new = f"encoders.{arch}.{size}"
    if sep and new:
        return f"{new}={raw}"
    gone = _gone_sections(moved)
    if sep and key.strip().split(".")[0] in gone:
        raise error(_gone_error(origin, key.strip(), gone))
    return item


def moved_to_new_places(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """`data` (a nested mapping: a file, a saved config) with every moved key at its new place (a
    copy, if any moved); ConfigError for a key left in a section that moved away."""
    data = _vit_sizes_moved(data, origin)
    moved = all_moved_keys()
    for old, new in moved.items():
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
        if old in MERGED_KEYS and isinstance(value, list) and isinstance(target.get(new_leaf, []), list):
            value = list(dict.fromkeys([*target.get(new_leaf, []), *value]))
        elif new_leaf in target and target[new_leaf] != value:
            raise ConfigError(f"{origin}: {old} (moved to {new}) and {new} are both given: keep {new}")
        target[new_leaf] = value
    for section, places in _gone_sections(moved).items():
        if section in data:
            left = data[section]
            if isinstance(left, dict) and left:
                raise ConfigError(_gone_error(origin, f"{section}.{next(iter(left))}", {section: places}))
            data = {k: v for k, v in data.items() if k != section}
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
    import_plugins_in(data, origin)
    data = moved_to_new_places(data, origin)
    return load(Config, data, origin=origin, error=ConfigError).validate()


def _option_fields(arch: str) -> set[str]:
    """The keys of encoder `arch`'s options section (empty: unknown here, or none)."""
    spec = ENCODERS.get(arch)
    return {f.name for f in dataclasses.fields(spec.options)} if spec is not None and spec.options else set()


def _vit_sizes_moved(data: dict[str, Any], origin: str) -> dict[str, Any]:
    """A saved config whose model.arch is a published ViT family with the same size keys (st_mem):
    its `model.<size>` keys moved to `encoders.<arch>` (a copy); any other `data` as it is (the
    generic MOVED_KEYS then take `model.<size>` to `encoders.coreecg`)."""
    model = data.get("model") if isinstance(data, dict) else None
    arch = model.get("arch") if isinstance(model, dict) else None
    if not arch or arch == "coreecg" or not any(k in model for k in VIT_SIZES):
        return data
    if not set(VIT_SIZES) <= _option_fields(arch):
        return data
    data = copy.deepcopy(data)
    sizes = {k: data["model"].pop(k) for k in VIT_SIZES if k in data["model"]}
    section = _section_at(data, ["encoders", arch], create=True)
    for k, v in sizes.items():
        if k in section and section[k] != v:
            raise ConfigError(f"{origin}: model.{k} (moved to encoders.{arch}.{k}) and encoders.{arch}.{k} are both "
                              f"given: keep encoders.{arch}.{k}")
        section[k] = v
    return data
