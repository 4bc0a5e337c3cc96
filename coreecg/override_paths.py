"""Data paths in `a.b=c` overrides made absolute, once for every caller: a study's `set` (relative
to the study file), a command line's --set and a config's own paths (relative to the current
folder), a sweep's base. Trials run in working folders of their own and, on a cluster, on other
nodes, so a relative path would name another place there.

    absolute_overrides(["data.corpus=corpora/ptbxl", "optim.lr=1e-3"], folder)
    -> ["data.corpus=/abs/folder/corpora/ptbxl", "optim.lr=1e-3"]
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

import yaml

PATH_KEYS = ("data.corpus", "data.probe_corpus", "data.cache_dir")   # the config keys that hold paths


class PathError(ValueError):
    """A path that cannot be made absolute (an unset environment variable); names the value."""


def absolute_path(value: str, folder: str | Path | None = None) -> str:
    """`value` absolute: ~ and $VARS expanded (the driver's environment: shared storage on a
    cluster), a relative path from `folder` (default: the current one); PathError for an unset
    variable."""
    expanded = os.path.expandvars(str(value))
    if "$" in expanded:
        raise PathError(f"{value!r}: environment variable not set")
    path = Path(expanded).expanduser()
    return str(path if path.is_absolute() else (Path(folder or Path.cwd()) / path).resolve())


def absolute_overrides(overrides: Iterable[str], folder: str | Path | None = None) -> list[str]:
    """The overrides with the values of PATH_KEYS absolute (`absolute_path`; a mixture's YAML list
    of corpora becomes a JSON list of absolute paths); every other override as given."""
    out = []
    for item in overrides:
        key, _, value = (part.strip() for part in item.partition("="))
        out.append(f"{key}={_absolute_value(value, folder)}" if key in PATH_KEYS and value else item)
    return out


def _absolute_value(value: str, folder: str | Path | None) -> str:
    if value.startswith("["):           # a mixture: data.corpus=[a, b]
        try:
            paths = yaml.safe_load(value)
        except yaml.YAMLError:
            paths = None
        if isinstance(paths, list):
            return json.dumps([absolute_path(str(p), folder) for p in paths])
    return absolute_path(value, folder)
