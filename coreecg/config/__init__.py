"""One typed configuration for every hyperparameter of coreecg.

Defaults are the CoRe-ECG paper's values (Implementation Details; Datasets and
Preprocessing). Layers on top, in order: a YAML file, then `--set a.b=c` overrides, each read
by the typed loader (`coreecg.typed`): unknown keys and wrongly typed values are errors that
name the file (or "overrides") and the dotted key.

    cfg = load_config("run.yaml", overrides=["methods.core.masking.p_time=0.6", "optim.lr=3e-4"])
    cfg.to_yaml("out/config.yaml")

A pretraining method's own section (`methods.<name>`: CoRe-ECG's masking, FDA, losses, decoders
and EMA among them), its checks and its structural keys are declared with the method
(`coreecg.config.method_registry`, filled by `coreecg.methods`, which `coreecg/__init__.py`
imports); this package names no method (docs/methods.md). A data source's section
(`data.sources.<name>`) is declared beside its reader with `coreecg.data.sources.register_source`
and read through that registry; this package names no source (docs/data_sources.md).

    base        ConfigError, STANDARD_LEADS
    plugins     import_plugins: the modules `plugins` names, imported first
    data        data.preprocess, the open data.sources section, data
    sections    model, optim, train
    downstream  finetune, report
    method_registry, encoder_registry
                the registries of methods and encoders (leaves; re-exported at their documented
                places coreecg.methods.registry and coreecg.encoders.registry)
    methods     pretrain, the open methods section
    schema      Config: the sections together, checks across them, to_dict / to_yaml
    loading     load_config, apply_overrides, config_from_dict (moved keys mapped, plugins first)
"""
from __future__ import annotations

from typing import Any

from coreecg.config.base import STANDARD_LEADS, ConfigError
from coreecg.config.data import DataConfig, PreprocessConfig, SourceOptions, _source_specs
from coreecg.config.downstream import FINETUNE_AUGMENT_OPS, FinetuneConfig, ReportConfig
from coreecg.config.loading import (MOVED_KEYS, apply_overrides, config_from_dict, load_config, moved_key,
                                    moved_override, moved_to_new_places)
from coreecg.config.methods import METHODS, MethodOptions, MethodSpec, PretrainConfig, method_specs
from coreecg.config.plugins import PLUGIN_KEYS, import_plugins
from coreecg.config.schema import Config
from coreecg.config.sections import InferenceConfig, ModelConfig, OptimConfig, TrainConfig

__all__ = [
    "STANDARD_LEADS", "ConfigError", "DataConfig", "PreprocessConfig", "SourceOptions", "FINETUNE_AUGMENT_OPS",
    "FinetuneConfig", "ReportConfig", "MOVED_KEYS", "moved_key", "moved_override", "moved_to_new_places", "PLUGIN_KEYS",
    "apply_overrides", "config_from_dict",
    "load_config", "METHODS", "MethodOptions", "MethodSpec", "PretrainConfig", "import_plugins", "method_specs",
    "Config", "InferenceConfig", "ModelConfig", "OptimConfig", "TrainConfig",
]


def __getattr__(name: str) -> Any:
    """PTBXLOptions and the other readers' options classes live beside their readers; still
    importable from here."""
    for spec in _source_specs().values() if name.endswith("Options") else ():   # never "__path__" & co.
        if spec.options is not None and spec.options.__name__ == name:
            return spec.options
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
