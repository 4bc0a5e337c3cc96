"""save_pretrained / from_pretrained / push_to_hub for coreecg's models (huggingface_hub.ModelHubMixin).

    encoder = Encoder.from_pretrained("exports/pretrain")   # a folder, a run, or a Hub id ("user/repo")
    encoder.save_pretrained("exports/copy")                  # model.safetensors + config.json (+ README.md)
    classifier = Classifier.from_pretrained("exports/ft-ptbxl")
    classifier.push_to_hub("user/ecg-classifier")            # the mixin's (needs a Hub token)

config.json is a Hugging Face config, flat (model_type, architectures, the constructor's
arguments, id2label for a classifier), that also carries coreecg's sections: format and
format_version, kind, weights (file, sha256, ...), the full coreecg config (the model is rebuilt
from it), and where known the input contract and provenance (docs/export.md). An export folder
(coreecg.hub.export_model) is this plus the input contract and coreecg's model card.

Loading is coreecg.loading's (one reader for every model source, the sha256 checked); it is
imported on call, since it builds models from this package.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from huggingface_hub import ModelHubMixin
from torch import nn

from coreecg.config import Config, ModelConfig
from coreecg.files import sha256_file, write_atomic, write_json
from coreecg.version import __version__

FORMAT = "coreecg-model"
# 2: Hugging Face keys at the top level (model_type, architectures, constructor arguments,
# id2label); 1: coreecg's sections only. The reader takes both.
FORMAT_VERSION = 2
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
MODEL_TYPE = "coreecg"
HUB_TAGS = ("ecg", "electrocardiogram", "time-series", "self-supervised", "coreecg")


@dataclass
class PretrainedInfo:
    """What config.json needs beyond the weights; `coreecg.loading` sets it on every model it builds.

    config: the full coreecg Config the model was built from; class_names: a classifier's, in
    logit order; sections: further config.json sections kept on a save (input, provenance).
    """

    config: Config
    class_names: list[str] | None = None
    sections: dict[str, Any] = field(default_factory=dict)


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
        """Write model.safetensors and config.json (and the mixin's README.md, unless one is
        there) to `save_directory`; `push_to_hub=True, repo_id=...` uploads them too.

        config, class_names: the coreecg Config (and a classifier's class names) to record,
        kept on the model for later saves."""
        if isinstance(config, Config):
            self.pretrained_info = PretrainedInfo(config, list(class_names) if class_names else None)
        elif config is not None or class_names is not None:
            raise TypeError("save_pretrained: config must be a coreecg Config (class_names with it)")
        return super().save_pretrained(save_directory, **kwargs)

    def _save_pretrained(self, save_directory: Path) -> None:
        info = self.pretrained_info or _default_info(self)
        weights = write_weights(self, save_directory, self.pretrained_kind)
        (save_directory / "README.md").unlink(missing_ok=True)      # an earlier card describes other weights
        write_json(save_directory / CONFIG_FILE, hub_config(self, info, weights), indent=2)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision: str | None = None, cache_dir: str | Path | None = None,
                         force_download: bool = False, local_files_only: bool = False,
                         token: str | bool | None = None, map_location: str | torch.device = "cpu",
                         **_init_kwargs: Any) -> nn.Module:
        """A local folder (or any source coreecg.loading reads) as is; otherwise a Hub id,
        downloaded (config.json, the weights, the card, the fingerprints). The constructor
        arguments the mixin read from config.json are ignored: the model is rebuilt from the
        full coreecg config."""
        from coreecg import loading       # on call: loading builds models from this package

        path = Path(model_id).expanduser()
        if not path.exists():
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(repo_id=model_id, revision=revision, cache_dir=cache_dir,
                                          force_download=force_download, local_files_only=local_files_only,
                                          token=token, allow_patterns=[CONFIG_FILE, WEIGHTS_FILE, "*.md",
                                                                       "*.parquet"]))
        if cls.pretrained_kind == "classifier":
            return loading.load_classifier(path, map_location=map_location)
        return loading.load_encoder(path, map_location=map_location)


def write_weights(model: nn.Module, folder: Path, kind: str) -> dict[str, Any]:
    """model.state_dict() as folder/model.safetensors (float32 as trained, no pickle) ->
    config.json's "weights" entry (file, sha256, bytes, dtypes, tensors, parameters, keys)."""
    from safetensors.torch import save_file

    # clone: safetensors refuses tensors that share storage (views of one buffer) or are not contiguous
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    # one metadata key: safetensors writes a map's keys in random order, and the same weights
    # should give the same file and sha256 (kind and version are in config.json)
    path = write_atomic(Path(folder) / WEIGHTS_FILE, lambda tmp: save_file(state, str(tmp), metadata={"format": "pt"}))
    return {"file": WEIGHTS_FILE, "sha256": sha256_file(path), "bytes": path.stat().st_size,
            "dtypes": sorted({str(v.dtype).removeprefix("torch.") for v in state.values()}),
            "tensors": len(state), "parameters": int(sum(v.numel() for v in state.values())),
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
    m = dataclasses.replace(ModelConfig(), n_leads=a["n_leads"], input_samples=a["n_patches"] * a["patch_size"],
                            patch_size=a["patch_size"], embed_dim=a["dim"], depth=a["depth"],
                            num_heads=a["num_heads"], mlp_ratio=a["mlp_ratio"], dropout=a["dropout"])
    cfg = Config()
    cfg = dataclasses.replace(cfg, model=m, data=dataclasses.replace(cfg.data, crop_samples=m.input_samples))
    return PretrainedInfo(cfg.validate())
