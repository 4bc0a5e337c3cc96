"""Plugins: the modules named in `plugins` (older configs' `pretrain.plugins` is read there too),
imported before anything is looked up, so that the sources, methods, encoders and tables they
register are known when a file, a saved config or an override sets their sections."""
from __future__ import annotations

import importlib
from typing import Any, Iterable
import os
import sys

import yaml

from coreecg.config.base import ConfigError


def import_plugins(modules: Iterable[str], key: str = "plugins") -> None:
    """Import the modules that register sources, methods, encoders or tables (`plugins`),
    once each. Module names resolve as with `python -m`: from the current directory first, then
    the installed packages (a job script's own folder, which Python puts on the path instead, does
    not hold them). `key`: the config key that named them (for the error)."""
    modules = list(modules)
    if modules and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"{key}: cannot import {module!r}: {e}. {_importable_hint(module, e)}") from e


def _importable_hint(module: str, error: ImportError) -> str:
    """How to make `module` importable (or, where the module was found, whose import failed)."""
    missing = getattr(error, "name", None) or ""
    if missing and not module.startswith(missing) and not missing.startswith(module):
        return (f"{module!r} itself was found, but it imports {missing!r}, which is not installed here "
                f"(pip install it, in every environment the job's Ray workers run in)")
    return (f"A plugin is imported by its module path, as `python -m` would: put {module.replace('.', '/')}.py "
            f"(or the package holding it) in the folder the job runs from ({os.getcwd()}), on PYTHONPATH, or in a "
            "package installed with pip install -e; the same must hold on every Ray worker (on a cluster: ray job "
            "submit --working-dir .) and where a run or export made with it is loaded (docs/encoders.md, "
            "\"Importable where it runs\")")


# The config keys that name plugins: the one key, and where older configs named method plugins.
PLUGIN_KEYS = ("plugins", "pretrain.plugins")


def import_plugins_of(overrides: list[str]) -> None:
    """The plugins `a.b=c` overrides name (`plugins=[...]`, `pretrain.plugins=[...]`), imported
    before any override is read, so the others may set their sections."""
    for item in overrides:
        key, _, raw = item.partition("=")
        if key.strip() in PLUGIN_KEYS:
            try:
                plugins = yaml.safe_load(raw)
            except yaml.YAMLError:
                continue                      # the override itself reports it
            if isinstance(plugins, list):
                import_plugins((str(p) for p in plugins), key.strip())


def import_plugins_in(data: dict[str, Any], origin: str) -> None:
    """The plugins a file or saved config names, imported before its sections are read (the
    typed loader reads `data` before the sections that name them are built)."""
    for key in PLUGIN_KEYS:
        value: Any = data
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if isinstance(value, list):
            try:
                import_plugins((str(p) for p in value), key)
            except ConfigError as e:
                raise ConfigError(f"{origin}: {e}") from e.__cause__
