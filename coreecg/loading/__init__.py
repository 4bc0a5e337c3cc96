"""Models in: any coreecg model source -> a ready `Encoder`, `Classifier` or pretraining method, the
same way for all.

    from coreecg.loading import load_classifier, load_encoder
    encoder = load_encoder("runs/pretrain")            # or encoder.pt, a checkpoint, best.pt, an export
    classifier = load_classifier("runs/ft-ptbxl")      # or best.pt, a classifier export
    tuned = load_finetuned("runs/ft-ptbxl")            # the classifier + its config, class names, multilabel
    method = load_method("runs/pretrain", build_method)   # the full pretraining method + its config

A source is one of:

    an export folder      config.json + model.safetensors (written by `coreecg.hub.export_model`;
                          the weights' sha256 is recorded in config.json and checked on every load)
    a pretraining run     its encoder.pt
    a fine-tuning run     its best.pt (+ metrics.json: class names of a best.pt from before they
                          travelled with it)
    a .pt file            encoder.pt, best.pt, or a step checkpoint (checkpoint_step*/checkpoint.pt),
                          verified against its sha256 sidecar (`coreecg.checkpoints`)
    a published encoder   another project's checkpoint (e.g. ST-MEM's encoder.pth or full.pth),
                          recognised by its keys (`coreecg.model.published`), its architecture read
                          from the weights and its input contract (data.preprocess) the family's

A full pretraining method (encoder, decoders, projections, teachers) is only in a pretraining
run's step checkpoints (checkpoint_step*/checkpoint.pt; a run folder stands for its latest).
`load_method` builds it with the builder it is given, `coreecg.methods.build_method`: the methods
sit a layer above the loader (tests/test_data_layering.py), so the caller passes their builder in.

This package is the one place a path becomes a model (tests/test_single_loader.py), in two parts:
this module, and `coreecg.weights` below the model layer (the export folder's format and
reading, and `restore`), through which `Encoder.from_pretrained` loads with its own class as the
builder. The .pt bytes are read by the checkpoint store (`coreecg.checkpoints`).

Loading never draws from the caller's random generators: building a model initialises weights
that are then overwritten, so it happens under a forked RNG (`restore`). Fine-tuning from a run
folder, its encoder.pt or an export of the same weights therefore starts from the same RNG state
and draws the same classifier head. Every error is a `CheckpointError` (a ValueError) naming the file.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from torch import nn

from coreecg.config.encoder_registry import is_published
from coreecg.checkpoints import (
    BEST_FILE, ENCODER_FILE, STEP_PREFIX, CheckpointError, checkpoint_config, is_coreecg_payload, latest_checkpoint,
    read_payload, verify_checkpoint,
)
from coreecg.config import Config, ConfigError, DataConfig, PreprocessConfig, TrainConfig, config_from_dict
from coreecg.config.loading import apply_overrides
from coreecg.encoders.build import build_encoder
from coreecg.model.classifier import Classifier
from coreecg.data.tasks import is_regression_task
from coreecg.model.encoder import Encoder
from coreecg.model.pretrained import PretrainedInfo
from coreecg.model.published import FAMILIES, recognise
from coreecg.model.published.registry import contract_preprocess
from coreecg.model.published.files import Payload, is_hub_id, is_published_folder, read_published
# The export folder's format (the writers: coreecg.model.pretrained and coreecg.hub.export).
from coreecg.weights import (
    CONFIG_FILE, FORMAT, FORMAT_VERSION, WEIGHTS_FILE, kept_sections, read_folder, restore,
)

METRICS_FILE = "metrics.json"        # a fine-tuning run's (coreecg.eval.report's contract)
MANIFEST_FILE = "manifest.json"      # a preprocessed corpus's

Kind = Literal["encoder", "classifier", "method"]


@dataclass
class ModelSource:
    """A resolved, verified model source, before any model is built.

    path: what was asked for (a folder or a file); weights: the file the weights came from.
    state: the model's state dict (an Encoder's, a Classifier's: encoder.* and head.*, or a
    pretraining method's: `open_method`).
    config: the full Config, data.preprocess as the weights' corpus was built (`manifest`); a
    method's: its checkpoint's own, as the run trained it.
    class_names, multilabel: a classifier's task (None otherwise).
    export: an export's config.json (None for a checkpoint); entries: a checkpoint's own
    entries besides config and model (epoch, step, ...); metrics: its run's metrics.json;
    manifest: its corpus's manifest.json (None when not on this machine).
    """

    path: Path
    weights: Path
    kind: Kind
    config: Config
    state: dict[str, torch.Tensor]
    class_names: list[str] | None = None
    multilabel: bool | None = None
    export: dict[str, Any] | None = None
    entries: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] | None = None
    manifest: dict[str, Any] | None = None


def open_source(path: str | Path, kind: Kind | None = None) -> ModelSource:
    """Resolve, verify and read a model source (module docstring); no model is built.

    kind="encoder": a classifier source is opened as its encoder (its task is not needed);
    None: the source's own kind. CheckpointError naming the file for anything missing,
    corrupted or foreign.
    """
    path = Path(path).expanduser()
    if is_published_folder(path) or is_hub_id(path):      # a Hugging Face folder (or id) of a published model
        return _open_published(path, read_published(path))
    file = _checkpoint_file(path)
    if file is None:
        src = _open_export(path if path.is_dir() else path.parent)
    else:
        src = _open_checkpoint(file, path, kind)
    if kind == "encoder" and src.kind == "classifier":
        src = dataclasses.replace(src, kind="encoder", state=_strip(src.state, "encoder."),
                                  class_names=None, multilabel=None)
    if is_published(src.config.model.arch) and not src.entries.get("published"):
        # an export or a fine-tuned run of published weights is still that family's encoder
        src = dataclasses.replace(src, entries={**src.entries, "published": src.config.model.arch})
    return src


def build_model(src: ModelSource) -> Encoder | Classifier:
    """The source's model with its weights, on the CPU, in eval mode; the caller's RNG untouched."""
    cfg = src.config
    if src.kind == "method":
        raise CheckpointError(f"{src.weights}: a pretraining method's checkpoint: load it with load_method")

    def build() -> nn.Module:
        encoder = build_encoder(cfg)
        if src.kind == "encoder":
            return encoder
        return Classifier.for_mode(encoder, len(src.class_names), cfg.finetune.leads, bool(src.multilabel),
                                   cfg.finetune.mode, cfg.finetune.head,
                                   regression=is_regression_task(cfg.finetune.task))

    # what save_pretrained records again: the config and task, an export's contract and provenance
    kept = kept_sections(src.export) if src.export and src.export.get("kind") == src.kind else {}
    model = restore(build, src.state, src.weights, PretrainedInfo(cfg, src.class_names, kept))
    encoder = model if src.kind == "encoder" else model.encoder
    if hasattr(encoder, "source"):                # a published encoder names its file in its errors
        encoder.source = str(src.weights)
    return model


def load_encoder(path: str | Path, map_location: str | torch.device = "cpu") -> Encoder:
    """The encoder of any model source (a classifier's own encoder for a classifier), in eval
    mode on `map_location`; outputs are bit-identical to the model that was saved."""
    return build_model(open_source(path, kind="encoder")).to(map_location)


def load_classifier(path: str | Path, map_location: str | torch.device = "cpu") -> Classifier:
    """A fine-tuned `Classifier` (eval mode) from a classifier export folder, a best.pt or a
    fine-tuning run folder. CheckpointError when the source holds only an encoder."""
    return build_model(_classifier_source(path)).to(map_location)


@dataclass
class Loaded:
    """A model and what its source says of it (`load_finetuned`, `load_method`).

    model: in eval mode on the device asked for; config: the Config it was built from; weights:
    the file its weights came from; class_names, multilabel: a classifier's task (None for a
    method); entries: a checkpoint's own entries besides config and model (epoch, trainer, ...).
    """

    model: nn.Module
    config: Config
    weights: Path
    class_names: list[str] | None = None
    multilabel: bool | None = None
    entries: dict[str, Any] = field(default_factory=dict)


def load_finetuned(path: str | Path, map_location: str | torch.device = "cpu") -> Loaded:
    """`load_classifier`'s classifier with its config and task (class names in logit order,
    multi-label or not), from the same sources."""
    src = _classifier_source(path)
    return Loaded(build_model(src).to(map_location), src.config, src.weights, src.class_names, src.multilabel,
                  src.entries)


def _classifier_source(path: str | Path) -> ModelSource:
    src = open_source(path)
    if src.kind != "classifier":
        raise CheckpointError(f"{src.weights}: holds an encoder, not a fine-tuned classifier "
                              "(use load_encoder, or export a fine-tuning run's best.pt)")
    return src


# ---------------------------------------------------------------------------- a pretraining method


def open_method(path: str | Path) -> ModelSource:
    """A pretraining method's checkpoint, resolved and verified, before any model is built
    (`load_method` builds it): a step checkpoint (checkpoint_step*/checkpoint.pt) or a pretraining
    run folder (its latest). Its config is the checkpoint's own, as the run trained it.
    CheckpointError naming the file or folder when it is missing, corrupted or not coreecg's."""
    path = Path(path).expanduser()
    file = latest_checkpoint(path) if path.is_dir() else path
    if file is None:
        raise CheckpointError(f"{path}: no {STEP_PREFIX}*/ in this folder; a full pretraining method (its "
                              "decoders too, e.g. the Time Decoder) is only in a pretraining run's step checkpoints, "
                              "which encoder.pt, best.pt and export folders leave out: pass a pretraining run "
                              "folder or its checkpoint.pt")
    payload, config = checkpoint_config(file, read_payload(file))
    entries = {k: v for k, v in payload.items() if k not in ("config", "model")}
    return ModelSource(path, file, "method", config, payload["model"], entries=entries)


def load_method(path: str | Path | ModelSource, build: Callable[[Config], nn.Module],
                map_location: str | torch.device = "cpu") -> Loaded:
    """The full pretraining method of a step checkpoint or run folder (`open_method`, or a source
    it opened), built by `build(config)` (coreecg.methods.build_method) with its weights, in eval
    mode on `map_location`; the caller's RNG untouched. CheckpointError naming the file when it
    holds an encoder alone (encoder.pt), a classifier, or weights of another method or size."""
    src = path if isinstance(path, ModelSource) else open_method(path)
    if src.kind != "method":
        raise CheckpointError(f"{src.weights}: opened as a model of kind {src.kind!r}, not as a pretraining "
                              "method (open_method)")
    if src.entries.get("task", "pretrain") != "pretrain":
        raise CheckpointError(f"{src.weights}: a {src.entries['task']} checkpoint, not a pretraining method's "
                              "(a classifier: load_finetuned)")
    if "trainer" not in src.entries and all(k.startswith("encoder.") for k in src.state):
        raise CheckpointError(f"{src.weights}: holds the encoder alone (encoder.pt), not a full pretraining "
                              f"method: pass its run's {STEP_PREFIX}*/checkpoint.pt or the run folder")
    model = restore(lambda: build(src.config), src.state, src.weights, what="pretraining method")
    return Loaded(model.to(map_location), src.config, src.weights, entries=src.entries)


# ---------------------------------------------------------------------------- resolving a path


def _checkpoint_file(path: Path) -> Path | None:
    """The .pt file a run folder or .pt path stands for; None for an export (its folder or one of
    its files). CheckpointError naming `path` when it is none of these."""
    if path.is_dir():
        if (path / CONFIG_FILE).is_file():
            return None
        for name in (BEST_FILE, ENCODER_FILE):
            if (path / name).is_file():
                return path / name
        raise CheckpointError(f"{path}: not a coreecg model folder: no {CONFIG_FILE} (an export), {BEST_FILE} "
                              f"(a fine-tuning run) or {ENCODER_FILE} (a finished pretraining run)")
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    if path.name in (CONFIG_FILE, WEIGHTS_FILE):      # a file of an export: the folder is meant
        return None
    return path


# ---------------------------------------------------------------------------- an export folder


def _open_export(folder: Path) -> ModelSource:
    """A folder save_pretrained or export_model wrote (coreecg.model.pretrained reads and verifies it)."""
    f = read_folder(folder)
    return ModelSource(folder, f.weights, f.kind, f.config, f.state, f.class_names, f.multilabel, export=f.meta)


# ---------------------------------------------------------------------------- a checkpoint


def _open_checkpoint(file: Path, shown: Path, kind: Kind | None) -> ModelSource:
    """A coreecg .pt (sha256 sidecar checked) or a published encoder's checkpoint -> ModelSource."""
    verify_checkpoint(file)
    read = read_published(file)      # weights_only; the inert unpickler only for a file that pickles more
    if read.inert or not is_coreecg_payload(read.entries):
        return _open_published(shown, read)
    payload, config = checkpoint_config(file, read.entries)
    entries = {k: v for k, v in payload.items() if k not in ("config", "model")}
    manifest = corpus_manifest(config)
    config = _with_corpus_preprocess(config, manifest)
    if _is_classifier(payload):
        src = ModelSource(shown, file, "classifier", config, payload["model"], entries=entries, manifest=manifest)
        return src if kind == "encoder" else _with_task(src)
    state = _strip(payload["model"], "encoder.")
    if not state:
        raise CheckpointError(f"{file}: checkpoint holds no encoder weights")
    return ModelSource(shown, file, "encoder", config, state, entries=entries, manifest=manifest)


def _open_published(shown: Path, read: Payload) -> ModelSource:
    """Another project's encoder file or folder (`coreecg.model.published`) -> an encoder ModelSource
    whose config is coreecg's defaults with model (arch, input) and encoders.<arch> (sizes) read from the weights,
    data.preprocess the family's corpus settings and train.variant its name for report tables."""
    file = read.weights
    try:
        found = recognise(read)
    except (ValueError, KeyError, IndexError, AttributeError, TypeError) as e:
        raise CheckpointError(f"{file}: keys of a published encoder, but not a usable one: {e}") from e
    if found is None:
        entries = read.entries
        keys = list(entries.get("model", entries))[:4] if isinstance(entries.get("model", entries), dict) else \
            list(entries)[:4]
        raise CheckpointError(f"{file}: neither a coreecg checkpoint (no 'config'/'model' entry) nor a published "
                              f"encoder coreecg knows ({', '.join(FAMILIES)}); it holds {keys}")
    family, state, arch = found
    try:
        preprocess = contract_preprocess(family, arch.model.n_leads)
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from e
    if family.contract is not None:        # the model's input: one stored window of its contract's corpus
        arch = dataclasses.replace(arch, model=dataclasses.replace(arch.model, input_samples=preprocess.window_samples))
    crop = min(arch.model.input_samples, preprocess.window_samples)
    data = dataclasses.replace(DataConfig(), preprocess=preprocess, crop_samples=crop)
    try:
        config = dataclasses.replace(arch, data=data, train=dataclasses.replace(TrainConfig(), variant=family.label))
        if config.model.n_leads < 2:      # a 1-lead file (ECGFounder's): the config's masking has no lead axis
            config = apply_overrides(config, ["methods.core.masking.strategy=temporal"], f"{file}")
        config = config.validate()
    except ConfigError as e:
        raise CheckpointError(f"{file}: a {family.title} encoder coreecg cannot run as configured: {e}") from e
    entries = {"published": family.name}
    if isinstance(read.entries.get("epoch"), int):
        entries["epoch"] = read.entries["epoch"]
    return ModelSource(shown, file, "encoder", config,
                       {k: v.float() if v.is_floating_point() else v for k, v in state.items()}, entries=entries)


def _is_classifier(payload: dict[str, Any]) -> bool:
    """best.pt and fine-tuning checkpoints say task "finetune"; pretraining checkpoints say
    "pretrain" (CMSC's has a head.* too); encoder.pt says nothing and holds encoder.* only."""
    task = payload.get("task")
    if task is not None:
        return task == "finetune"
    keys = payload["model"].keys()
    return "head.weight" in keys and all(k.startswith(("encoder.", "head.")) for k in keys)


def _with_task(src: ModelSource) -> ModelSource:
    """A classifier checkpoint's class names and task: from the checkpoint itself (a best.pt
    written since they travel with it), else its run's metrics.json, else the fine-tuning
    corpus's manifest (a run still training has no metrics.json)."""
    file, config, entries, manifest = src.weights, src.config, src.entries, src.manifest
    n_classes = int(src.state["head.weight"].shape[0])
    # best.pt sits in the run folder, a checkpoint one level down (checkpoint_step*/checkpoint.pt)
    run = file.parent.parent if file.parent.name.startswith(STEP_PREFIX) else file.parent
    metrics = read_json(run / METRICS_FILE)
    own = ({"class_names": entries["class_names"], "multilabel": entries["multilabel"]}
           if entries.get("class_names") and entries.get("multilabel") is not None else None)
    task = own or metrics or manifest
    if task is None or not task.get("class_names"):
        raise CheckpointError(f"{file}: no class names for its {n_classes} outputs: neither {run / METRICS_FILE} "
                              f"nor the fine-tuning corpus's {MANIFEST_FILE} ({config.data.corpus or 'none'}) "
                              "was found")
    names, multilabel = list(task["class_names"]), bool(task["multilabel"])
    if len(names) != n_classes:
        raise CheckpointError(f"{file}: {n_classes} outputs but {len(names)} class names in "
                              f"{'the checkpoint' if own else 'metrics.json' if metrics else 'the corpus manifest'}")
    if metrics and metrics.get("lead_names") and list(metrics["lead_names"]) != list(config.finetune.leads):
        raise CheckpointError(f"{file}: its config's finetune.leads {list(config.finetune.leads)} differ from "
                              f"metrics.json's lead_names {metrics['lead_names']}")
    return dataclasses.replace(src, class_names=names, multilabel=multilabel, metrics=metrics)


def corpus_manifest(config: Config) -> dict[str, Any] | None:
    """The manifest of data.corpus (None: no corpus set, or it is not on this machine); of a
    mixture, its first corpus's (a mixture's corpora are preprocessed alike: coreecg.train.mixture)."""
    if not config.data.corpus:
        return None
    return read_json(Path(config.data.corpora[0]).expanduser() / MANIFEST_FILE)


def _with_corpus_preprocess(config: Config, manifest: dict[str, Any] | None) -> Config:
    """The config with data.preprocess as the corpus was actually built (its manifest), which is
    what the weights saw; the run's own data.preprocess may differ (a corpus is built by another
    job, under its own config). Unchanged when the manifest is absent or its settings do not load."""
    saved = (manifest or {}).get("preprocess")
    if not isinstance(saved, dict):
        return config
    data = config.to_dict()
    data["data"]["preprocess"] = {k: v for k, v in saved.items()
                                  if k in {f.name for f in dataclasses.fields(PreprocessConfig)}}
    try:
        return config_from_dict(data)
    except ConfigError:
        return config


# ---------------------------------------------------------------------------- small helpers


def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}


def read_json(path: Path) -> dict[str, Any] | None:
    """`path` as a JSON object, or None when it is absent, unreadable or not an object."""
    if not path.is_file():
        return None
    try:
        obj = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


__all__ = ["ModelSource", "open_source", "build_model", "load_encoder", "load_classifier", "Loaded", "load_finetuned",
           "open_method", "load_method", "corpus_manifest", "read_json", "FORMAT", "FORMAT_VERSION", "WEIGHTS_FILE",
           "CONFIG_FILE", "Kind"]
