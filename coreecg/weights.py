"""Weights in: the export folder's format and its verified reading, and a built model's weights
restored from a state dict. The part of the loader (`coreecg.loading`) below the model layer.

An export folder is config.json + model.safetensors, written by `coreecg.model.pretrained`
(save_pretrained) and `coreecg.hub.export_model`; config.json records the format, its version and
the weights' sha256, all checked here on every read. `restore` builds a model (under a forked RNG:
the init is overwritten, so the caller's random generators are never drawn from) and loads its
weights strictly.

Why a module apart, outside the `loading` package: `Encoder.from_pretrained` (coreecg.model.pretrained,
the model layer) loads through it, with its own class as the builder, while `coreecg.loading` builds
models of every kind and so sits above the model layer. So this module imports no model code, and
importing it runs no loader.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from safetensors import SafetensorError
from safetensors.torch import load_file

from coreecg.checkpoints import CheckpointError
from coreecg.config import Config, ConfigError, config_from_dict
from coreecg.files import sha256_file
from coreecg.version import __version__

FORMAT = "coreecg-model"
# 2: Hugging Face keys at the top level (model_type, architectures, constructor arguments,
# id2label); 1: coreecg's sections only. The reader takes both.
FORMAT_VERSION = 2
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# A model folder's precision checks (coreecg.inference.precision_check; jobs/export.py writes them)
PRECISION_CHECKS_FILE = "precision_checks.json"


# ---------------------------------------------------------------------------- a built model's weights


def restore(build: Callable[[], nn.Module], state: dict[str, torch.Tensor], weights: Path, info: Any = None,
            what: str | None = None) -> nn.Module:
    """`build()` under a forked RNG (its random init is overwritten: the caller's generators are
    left as they were), then `state` loaded strictly (`load_weights`) -> the model in eval mode."""
    with torch.random.fork_rng(devices=[]):
        model = build()
    return load_weights(model, state, weights, info, what)


def load_weights(model: nn.Module, state: dict[str, torch.Tensor], weights: Path, info: Any = None,
                 what: str | None = None) -> nn.Module:
    """Load `state` strictly (CheckpointError naming `weights` and `what` the model is on a
    mismatch), attach `info` (a coreecg.model.pretrained.PretrainedInfo: what a later
    save_pretrained records) when given; -> the model in eval mode."""
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise CheckpointError(f"{weights}: {what or getattr(model, 'pretrained_kind', 'encoder')} weights do not "
                              f"match its own config: {e}") from e
    if info is not None:
        model.pretrained_info = info
    return model.eval()


# ---------------------------------------------------------------------------- an export folder


def kept_sections(meta: dict[str, Any]) -> dict[str, Any]:
    """The sections of a folder's config.json a later save writes again (contract, provenance)."""
    return {k: v for k, v in meta.items() if k in ("architecture", "input", "provenance")}


@dataclass
class SavedFolder:
    """A verified folder: its config.json (`meta`), the weights file and state, the coreecg
    Config, the kind and a classifier's class_names and multilabel."""

    meta: dict[str, Any]
    weights: Path
    state: dict[str, torch.Tensor]
    config: Config
    kind: str
    class_names: list[str] | None
    multilabel: bool | None


def read_folder(folder: Path) -> SavedFolder:
    """config.json (format and version checked) and the weights it names (sha256 checked).
    CheckpointError naming the file for anything missing, corrupted or foreign."""
    meta_path = Path(folder) / CONFIG_FILE
    meta = _folder_meta(meta_path)
    weights = _folder_weights(Path(folder), meta, meta_path)
    state = _read_safetensors(weights)
    try:
        config = config_from_dict(meta["config"])
    except (ConfigError, KeyError, TypeError) as e:
        raise CheckpointError(f"{meta_path}: its stored config is not valid here: {e}") from e
    kind = meta.get("kind")
    if kind not in ("encoder", "classifier"):
        raise CheckpointError(f"{meta_path}: unknown kind {kind!r} (encoder | classifier)")
    contract = meta.get("input") if isinstance(meta.get("input"), dict) else {}
    names, multilabel = contract.get("class_names"), contract.get("multilabel")
    if kind == "classifier" and names is None and isinstance(meta.get("id2label"), dict):
        # a bare save_pretrained (no input contract): the Hugging Face keys carry the task
        names = [meta["id2label"].get(str(i)) for i in range(len(meta["id2label"]))]
        multilabel = meta.get("multilabel")
    if kind == "classifier" and (not isinstance(names, list) or not all(isinstance(n, str) for n in names)
                                 or not isinstance(multilabel, bool)):
        raise CheckpointError(f"{meta_path}: a classifier export without class_names and multilabel (in its "
                              "input contract or id2label and multilabel)")
    return SavedFolder(meta, weights, state, config, kind, names, multilabel)


def _folder_meta(meta_path: Path) -> dict[str, Any]:
    """config.json of a folder, its format and version checked."""
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{meta_path}: unreadable export config: {e}") from e
    found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
    if found != FORMAT:
        raise CheckpointError(f"{meta_path}: not a coreecg export (format {found!r}, expected {FORMAT!r})")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"{meta_path}: export format version {version!r} is not one this coreecg "
                              f"({__version__}) reads (1..{FORMAT_VERSION}); upgrade coreecg")
    return meta


def _folder_weights(folder: Path, meta: dict[str, Any], meta_path: Path) -> Path:
    """The weights file config.json names, checked against the sha256 it records."""
    recorded = meta.get("weights") if isinstance(meta.get("weights"), dict) else {}
    name = str(recorded.get("file", WEIGHTS_FILE))
    if Path(name).name != name:           # a plain file name: an export never points outside itself
        raise CheckpointError(f"{meta_path}: weights file {name!r} is not a file name in the export folder")
    weights = folder / name
    if not weights.is_file():
        raise CheckpointError(f"{weights}: weights file not found (named in {meta_path})")
    expected = recorded.get("sha256")
    if not expected:
        raise CheckpointError(f"{meta_path}: records no sha256 for {weights.name}; the export is incomplete")
    if sha256_file(weights) != expected:
        raise CheckpointError(f"{weights}: corrupted weights (sha256 differs from the one in {meta_path.name}); "
                              "export it again from its run")
    return weights


def _read_safetensors(weights: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(weights), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(f"{weights}: unreadable safetensors file: {e}") from e
