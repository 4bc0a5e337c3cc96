"""save_pretrained / from_pretrained / push_to_hub for coreecg's models (huggingface_hub.ModelHubMixin).

    encoder = Encoder.from_pretrained("exports/pretrain")   # a folder with config.json or a Hub id ("user/repo")
    encoder.save_pretrained("exports/copy")                  # model.safetensors + config.json + README.md
    classifier = Classifier.from_pretrained("exports/ft-ptbxl")
    classifier.push_to_hub("user/ecg-classifier")            # the mixin's (needs a Hub token)

A save of a loaded model's unchanged weights carries its folder's card and fingerprint file
(`carry_source_files`); a whole export is published with coreecg.hub.push_export.

config.json is a Hugging Face config, flat (model_type, architectures, the constructor's
arguments, id2label for a classifier), that also carries coreecg's sections: format and
format_version, kind, weights (file, sha256, ...), the full coreecg config (the model is rebuilt
from it), and where known the input contract and provenance (docs/export.md). An export folder
(coreecg.hub.export_model) is this plus the input contract and coreecg's model card.

Loading goes through the one loader: `from_pretrained` reads the folder (`read_folder`: format,
version, the weights' sha256) and restores the weights into its class's model (`restore`) with
`coreecg.weights`, the format's home; `coreecg.loading` reads every other source (run
folders, .pt files, published families' weights). Those names stay importable from here.
"""
from __future__ import annotations

import copy
import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import huggingface_hub
import torch
from huggingface_hub import ModelHubMixin
from huggingface_hub.errors import HFValidationError
from safetensors.torch import save_file
from torch import nn

from coreecg.config.encoder_registry import is_published
from coreecg.checkpoints import CheckpointError
from coreecg.config import Config, ModelConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.encoders.options import ViTOptions
from coreecg.files import sha256_file, write_atomic, write_json
# the export folder's format and reading: the loader's (re-exported here, where they were)
from coreecg.weights import (  # noqa: F401
    CONFIG_FILE, FORMAT, FORMAT_VERSION, WEIGHTS_FILE, SavedFolder, kept_sections, load_weights, read_folder, restore,
)
from coreecg.version import __version__

CARD_FILE = "README.md"
MODEL_TYPE = "coreecg"
HUB_TAGS = ("ecg", "electrocardiogram", "time-series", "self-supervised", "coreecg")


@dataclass
class PretrainedInfo:
    """What config.json needs beyond the weights; `coreecg.loading` sets it on every model it builds.

    config: the full coreecg Config the model was built from; class_names: a classifier's, in
    logit order; sections: further config.json sections kept on a save (input, provenance);
    source, source_sha256: the folder it was loaded from and its weights' sha256 (a save of the
    same weights copies that folder's card and fingerprint file).
    """

    config: Config
    class_names: list[str] | None = None
    sections: dict[str, Any] = field(default_factory=dict)
    source: Path | None = None
    source_sha256: str | None = None


class PretrainedMixin(ModelHubMixin, library_name="coreecg", tags=list(HUB_TAGS)):   # a copy: the mixin appends
    """Hugging Face save/load for `Encoder` and `Classifier` (module docstring).

    The model saves from `pretrained_info` when it has one (every loaded model does); a freshly
    built Encoder without it saves with coreecg's default config, its model section from the
    constructor's arguments; a Classifier needs `config=` and `class_names=` once.
    """

    pretrained_kind = "encoder"
    pretrained_info: PretrainedInfo | None = None

    def save_pretrained(self, save_directory: str | Path, *, config: Config | dict | None = None,
                        class_names: list[str] | None = None, **kwargs: Any) -> str | None:
        """Write model.safetensors and config.json to `save_directory`, and README.md: the card
        and fingerprint file of the folder the model was loaded from when the weights are
        unchanged (same sha256), else the mixin's generic card; `push_to_hub=True, repo_id=...`
        uploads them too. A whole export folder publishes with coreecg.hub.push_export.

        config, class_names: the coreecg Config (and a classifier's class names) to record, kept
        on the model for later saves. ValueError when the config does not describe this model
        (leads, pooling, class count, encoder sizes): it would load as another model."""
        if isinstance(config, dict):
            # the mixin's push_to_hub passes its constructor arguments back: those only (the model's own)
            if config != (getattr(self, "_hub_mixin_config", None) or {}):
                raise TypeError("save_pretrained: config must be a coreecg Config, not a dict of other values")
            config = None
        if isinstance(config, Config):
            info = PretrainedInfo(config, list(class_names) if class_names is not None else None)
            check_describes(self, info)
            self.pretrained_info = info
        elif config is not None or class_names is not None:
            raise TypeError("save_pretrained: config must be a coreecg Config (class_names with it)")
        return super().save_pretrained(save_directory, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        info = self.pretrained_info or _default_info(self)
        check_describes(self, info)                 # a loaded model may have been changed since
        weights = write_weights(self, save_directory, self.pretrained_kind)
        sections = carry_source_files(info, weights["sha256"], save_directory)
        write_json(save_directory / CONFIG_FILE, hub_config(self, info, weights, sections), indent=2)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, **kwargs: Any) -> nn.Module:
        """A model from a local folder (an export or a save_pretrained folder) or a Hub id
        ("user/repo"; kwargs: revision, token, cache_dir, local_files_only, map_location...)."""
        name = str(pretrained_model_name_or_path)
        path = Path(name).expanduser()
        if path.is_dir():
            if not (path / CONFIG_FILE).is_file():
                raise CheckpointError(f"{path}: no {CONFIG_FILE}, so not an export or a save_pretrained folder; "
                                      "a run folder or a .pt file loads with coreecg.load_encoder / load_classifier")
            return super().from_pretrained(path, **kwargs)
        # "exports/core-mimic" also reads as the Hub id "user/repo": a path is refused here when
        # it cannot be one, or its first folder exists here; else the Hub is tried, and its
        # failure names the local folder looked for too
        parts = Path(name).parts
        under_local = len(parts) > 1 and Path(parts[0]).is_dir()
        if path.exists() or path.is_absolute() or name.startswith((".", "~")) or under_local:
            raise FileNotFoundError(f"{path.absolute()}: no such folder (an export or a save_pretrained folder; "
                                    "a .pt file loads with coreecg.load_encoder / load_classifier)"
                                    + (f"; not tried as the Hub id {name!r}, {parts[0]}/ being a local folder"
                                       if under_local else ""))

        try:
            return super().from_pretrained(name, **kwargs)
        except (OSError, HFValidationError) as e:    # not found, no network, offline cache miss
            raise FileNotFoundError(f"{name}: neither a local folder ({path.absolute()} does not exist) nor a "
                                    f"Hub model that could be fetched ({type(e).__name__}: {e})") from e

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None = None, cache_dir: str | Path | None = None,
                         force_download: bool = False, local_files_only: bool = False,
                         token: str | bool | None = None, map_location: str | torch.device = "cpu",
                         **_init_kwargs: Any) -> nn.Module:
        """A local folder as is, else a Hub id, downloaded (config.json, the weights, the card, the
        fingerprints); in eval mode on `map_location`. The constructor arguments the mixin read
        from config.json are ignored: the model is rebuilt from the full coreecg config. An
        Encoder from a classifier's folder is that classifier's encoder. (Run folders and .pt
        files: coreecg.load_encoder / load_classifier.)"""
        folder = Path(model_id).expanduser()
        if not folder.is_dir():
            # looked up at the call (not bound at import), as a test's stand-in for the Hub replaces it
            folder = Path(huggingface_hub.snapshot_download(
                repo_id=model_id, revision=revision, cache_dir=cache_dir, force_download=force_download,
                local_files_only=local_files_only, token=token,
                allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, "*.md", "*.parquet"]))
        f = read_folder(folder)
        if cls.pretrained_kind == "classifier" and f.kind != "classifier":
            raise CheckpointError(f"{f.weights}: holds an encoder, not a fine-tuned classifier "
                                  "(Encoder.from_pretrained)")
        if is_published(f.config.model.arch):
            raise CheckpointError(f"{f.weights}: a published {f.config.model.arch} encoder, not coreecg's own; "
                                  "load it with coreecg.load_encoder / load_classifier")
        state = f.state
        info = PretrainedInfo(f.config, f.class_names, kept_sections(f.meta), folder, f.meta["weights"]["sha256"])
        if f.kind == "classifier" and cls.pretrained_kind == "encoder":     # a classifier's encoder
            state = {k[len("encoder."):]: v for k, v in state.items() if k.startswith("encoder.")}
            info = PretrainedInfo(f.config)
        model = restore(lambda: cls._build_for(f.config, f.class_names, f.multilabel), state, f.weights, info)
        return model.to(map_location)

    @classmethod
    def _build_for(cls, config: Config, class_names: list[str] | None, multilabel: bool | None) -> nn.Module:
        """The randomly initialised model `config` (and a classifier's task) describes."""
        raise NotImplementedError


def check_describes(model: nn.Module, info: PretrainedInfo) -> None:
    """ValueError unless `info` rebuilds `model` as it is (from_pretrained builds from the config):
    its constructor arguments (leads, pooling, frozen encoder, class count; an encoder's sizes;
    dropout aside, no weight depends on it). The model `info.config` describes is built on the
    meta device: no memory, no draw from the RNG."""
    kind = type(model).__name__
    names = info.class_names
    if model.pretrained_kind == "classifier":
        if names is None or len(names) != model.head.out_features:
            raise ValueError(f"{kind}.save_pretrained: {'no' if names is None else len(names)} class_names for "
                             f"a head of {model.head.out_features} outputs")
        contract = info.sections.get("input") or {}       # a loaded export's task, kept for the next save
        for key, value in (("multilabel", model.multilabel), ("class_names", names)):
            if contract.get(key) is not None and _plain(contract[key]) != _plain(value):
                raise ValueError(f"{kind}.save_pretrained: the kept input contract gives {key}="
                                 f"{_shown(contract[key])} but the model has {_shown(value)}")
    with torch.device("meta"), torch.random.fork_rng(devices=[]):
        built = model._build_for(info.config, names, getattr(model, "multilabel", None))
    pairs = [(built, model)]
    if hasattr(model, "encoder") and not is_published(info.config.model.arch):   # a published family's: its own sizes
        pairs.append((built.encoder, model.encoder))
    for want, have in pairs:
        for arg, value in (getattr(have, "_hub_mixin_config", None) or {}).items():
            expected = (getattr(want, "_hub_mixin_config", None) or {}).get(arg)
            if arg != "dropout" and _plain(expected) != _plain(value):
                raise ValueError(f"{kind}.save_pretrained: the config gives {arg}={_shown(expected)} "
                                 f"({CONFIG_KEYS.get(arg, arg).replace('<arch>', info.config.model.arch)}) "
                                 f"but the model has {_shown(value)}; it would "
                                 "load as another model: pass the config it was built from")


# constructor argument -> the config keys that set it (check_describes's messages)
CONFIG_KEYS = {"leads": "finetune.leads", "pooling": "finetune.head / finetune.mode",
               "frozen_encoder": "finetune.mode", "n_classes": "class_names", "n_leads": "model.n_leads",
               "n_patches": "model.input_samples / encoders.<arch>.patch_size",
               "patch_size": "encoders.<arch>.patch_size", "dim": "encoders.<arch>.embed_dim",
               "depth": "encoders.<arch>.depth", "num_heads": "encoders.<arch>.num_heads",
               "mlp_ratio": "encoders.<arch>.mlp_ratio"}


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value      # leads: a list or a tuple


def _shown(value: Any) -> str:
    return f"[{', '.join(map(str, value))}]" if isinstance(value, (list, tuple)) else repr(value)


def carry_source_files(info: PretrainedInfo, sha256: str, folder: Path) -> dict[str, Any]:
    """The card and the pretraining fingerprint file of the folder the model was loaded from,
    copied verbatim into `folder` when the weights just written are that folder's (same
    sha256): both describe those weights. Otherwise neither is written (a stale one in `folder`
    is removed; the mixin then writes its generic card) and the provenance's fingerprint entry
    says the file is not carried. -> the sections config.json writes (info.sections, so amended)."""
    fp = (((info.sections.get("provenance") or {}).get("pretraining") or {}).get("corpus") or {}).get("fingerprints")
    fp_file = fp.get("file") if isinstance(fp, dict) else None
    same = info.source is not None and info.source_sha256 == sha256
    carried = set()
    # plain file names only: a folder's files never point outside it
    for name in (n for n in (CARD_FILE, fp_file) if isinstance(n, str) and n and Path(n).name == n):
        source, target = (info.source / name if info.source else None), folder / name
        if same and source.is_file():
            if source.resolve() != target.resolve():
                write_atomic(target, lambda tmp, source=source: shutil.copyfile(source, tmp))
            carried.add(name)
        else:
            target.unlink(missing_ok=True)       # an earlier save's: it describes other weights
    if fp_file is None or fp_file in carried:
        return info.sections
    sections = copy.deepcopy(info.sections)
    sections["provenance"]["pretraining"]["corpus"]["fingerprints"] = {
        "file": None, "note": f"{fp_file} not carried by save_pretrained (the weights differ from the export's "
                              "or its folder lacks it); export with jobs/export.py where the corpus is"}
    return sections


# ---------------------------------------------------------------------------- writing


def write_weights(model: nn.Module, folder: Path, kind: str) -> dict[str, Any]:
    """model.state_dict() as folder/model.safetensors (dtypes as trained, no pickle) ->
    config.json's "weights" entry (file, sha256, bytes, dtypes, tensors, parameters, buffers, keys).

    parameters: the elements of model.parameters(); buffers: those of the state dict's other
    tensors (BatchNorm's running statistics and counters), which no gradient trains."""
    # clone: safetensors refuses tensors that share storage (views of one buffer) or are not contiguous
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    named = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    # one metadata key: safetensors writes a map's keys in random order, and the same weights
    # should give the same file and sha256 (kind and version are in config.json)
    path = write_atomic(Path(folder) / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    return {"file": WEIGHTS_FILE, "sha256": sha256_file(path), "bytes": path.stat().st_size,
            "dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in state.values()}),
            "tensors": len(state), "parameters": sum(p.numel() for p in model.parameters()),
            "buffers": sum(v.numel() for k, v in state.items() if k not in named),
            "keys": "Encoder.state_dict()" if kind == "encoder" else "Classifier.state_dict(): encoder.* and head.*"}


def hub_config(model: nn.Module, info: PretrainedInfo, weights: dict[str, Any],
               sections: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.json: Hugging Face's keys first (model_type, architectures, the constructor's
    arguments, id2label/label2id), then coreecg's sections (docs/export.md)."""
    kind = getattr(model, "pretrained_kind", "encoder")
    meta: dict[str, Any] = {"model_type": MODEL_TYPE, "architectures": [type(model).__name__],
                            **(getattr(model, "_hub_mixin_config", None) or {})}
    if info.class_names is not None:
        meta["id2label"] = {str(i): name for i, name in enumerate(info.class_names)}
        meta["label2id"] = {name: i for i, name in enumerate(info.class_names)}
    meta.update({"format": FORMAT, "format_version": FORMAT_VERSION, "kind": kind, "coreecg_version": __version__,
                 **info.sections, **(sections or {}), "weights": weights, "config": info.config.to_dict()})
    return meta


def _default_info(model: nn.Module) -> PretrainedInfo:
    """A bare Encoder's: coreecg's default config with the model section from its constructor."""
    if model.pretrained_kind != "encoder":
        raise ValueError(f"{type(model).__name__}.save_pretrained: this model has no coreecg config; "
                         "pass config=<its coreecg Config> and class_names=[...] once")
    a = model._hub_mixin_config or {}
    m = ModelConfig(n_leads=a["n_leads"], input_samples=a["n_patches"] * a["patch_size"])
    sizes = ViTOptions(patch_size=a["patch_size"], embed_dim=a["dim"], depth=a["depth"], num_heads=a["num_heads"],
                       mlp_ratio=a["mlp_ratio"], dropout=a["dropout"])
    cfg = Config()
    cfg = dataclasses.replace(cfg, model=m, encoders=EncoderOptions({"coreecg": sizes}),
                              data=dataclasses.replace(cfg.data, crop_samples=m.input_samples))
    return PretrainedInfo(cfg.validate())
