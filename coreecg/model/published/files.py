"""Reading another project's weights as data: nothing a file names is imported or called.

`read_published(path)` -> `Payload` (the file's top-level entries, where the weights came from):

    a .pt/.pth/.ckpt file     `torch.load(weights_only=True)`; where a real release pickles other
                              objects beside its tensors (ECGFounder's numpy scalar, a Lightning
                              checkpoint's omegaconf hyper-parameters and loop state), `inert_load`:
                              an unpickler that rebuilds tensors and plain containers and turns every
                              other global into an `Inert` placeholder (its name and arguments kept as
                              data, never called)
    a folder                  a Hugging Face folder: config.json (read as JSON) + model.safetensors
                              (or pytorch_model.bin, read with weights_only=True); `trust_remote_code`
                              never: no code from a hub repository is run
    a Hugging Face id         "org/name" that is no local path: `huggingface_hub.snapshot_download`
                              (online only) then the folder
    a sidecar config          a YAML file beside the checkpoint (ECG-CPC's hydra `config_<name>.yaml`)
                              is read as data (yaml.safe_load) into `Payload.sidecar`

Every failure is a CheckpointError naming the file and the reason.
"""
from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml
from huggingface_hub import snapshot_download
from safetensors import SafetensorError
from safetensors.torch import load_file

from coreecg.checkpoints import CheckpointError

HF_CONFIG, HF_WEIGHTS, HF_BIN = "config.json", "model.safetensors", "pytorch_model.bin"
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class Payload:
    """What one published file (or folder) holds.

    path: the file or folder read; weights: the file the tensors came from.
    entries: the top-level entries (a bare state dict: its keys -> tensors); config: a folder's
    config.json (None for a file); sidecar: a YAML config found beside the file (None if none);
    inert: the names of the globals that became placeholders (empty when weights_only read it).
    """

    path: Path
    weights: Path
    entries: dict[str, Any]
    config: dict[str, Any] | None = None
    sidecar: dict[str, Any] | None = None
    inert: list[str] = field(default_factory=list)


class Inert:
    """A global a file names that is not a tensor or a plain container: kept as data (`name`, the
    arguments it would have been called with, its pickled state), never imported, never called."""

    name = "?"

    def __init__(self, *args: Any, **kwargs: Any):
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<inert {self.name}>"

    # containers pickled by REDUCE + SETITEMS / APPENDS (OrderedDict subclasses, lists) land here
    def __setitem__(self, key: Any, value: Any) -> None:
        self.kwargs[key] = value

    def append(self, value: Any) -> None:
        self.args = (*self.args, value)

    def extend(self, values: Any) -> None:
        self.args = (*self.args, *values)


# What a tensor and a plain container need; everything else becomes an Inert.
_ALLOWED = {
    ("collections", "OrderedDict"), ("collections", "defaultdict"),
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "slice"), ("builtins", "complex"),
    ("builtins", "bytearray"), ("builtins", "tuple"), ("builtins", "list"), ("builtins", "dict"),
    ("builtins", "bool"), ("builtins", "int"), ("builtins", "float"), ("builtins", "str"), ("builtins", "bytes"),
    ("_codecs", "encode"),                 # how protocol 2 pickles bytes (a numpy scalar's payload)
    ("torch._utils", "_rebuild_tensor_v2"), ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_parameter"), ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch._utils", "_rebuild_device_tensor_from_numpy"), ("torch", "Size"), ("torch", "device"),
    ("torch.nn.parameter", "Parameter"),
}


# protocol-2 pickles name Python 2's builtins (what the C unpickler's own find_class maps)
_PY2 = {("__builtin__", n): ("builtins", n) for n in ("bool", "int", "float", "str", "dict", "list", "tuple", "set",
                                                      "frozenset", "slice", "complex", "bytearray", "bytes")}
_PY2.update({("__builtin__", "long"): ("builtins", "int"), ("__builtin__", "unicode"): ("builtins", "str")})


def _inert_class(module: str, name: str) -> type:
    return type(name, (Inert,), {"name": f"{module}.{name}"})


class _Unpickler(pickle.Unpickler):
    """find_class: the allow-list above, torch dtypes, else an Inert placeholder (recorded)."""

    seen: list[str] = []

    def find_class(self, module: str, name: str) -> Any:
        module, name = _PY2.get((module, name), (module, name))
        if (module, name) in _ALLOWED:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        type(self).seen.append(f"{module}.{name}")
        return _inert_class(module, name)


class _InertPickle:
    """A pickle module for torch.load(pickle_module=...): its Unpickler is `_Unpickler`."""

    Unpickler = _Unpickler
    load = staticmethod(lambda f, **kw: _Unpickler(f, **kw).load())
    __name__ = "coreecg_inert_pickle"


def inert_load(file: Path) -> tuple[Any, list[str]]:
    """torch.load of a file that pickles more than tensors, with `_Unpickler`: -> (payload, the
    names of the globals made inert). Nothing named in the file is imported or called."""
    _Unpickler.seen = []
    with open(file, "rb") as f:
        data = f.read()
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=False,  # noqa: S614 (inert unpickler)
                         pickle_module=_InertPickle)
    return payload, sorted(set(_Unpickler.seen))


def is_published_folder(path: Path) -> bool:
    """A folder with a config.json that is not a coreecg export's (a Hugging Face model folder)."""
    cfg = Path(path) / HF_CONFIG
    if not cfg.is_file():
        return False
    try:
        meta = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "format" not in meta and (
        (Path(path) / HF_WEIGHTS).is_file() or (Path(path) / HF_BIN).is_file())


def is_hub_id(path: str | Path) -> bool:
    """"org/name" that is no local path: a Hugging Face model id."""
    return not Path(path).exists() and bool(_HF_ID.match(str(path)))


def read_published(path: str | Path) -> Payload:
    """A published file, folder or Hugging Face id -> Payload (module docstring)."""
    p = Path(path).expanduser()
    if not p.exists() and _HF_ID.match(str(path)):
        p = _download(str(path))
    if p.is_dir():
        return _read_folder(p)
    if not p.is_file():
        raise CheckpointError(f"{p}: no such file or folder")
    entries, inert = _read_file(p)
    return Payload(p, p, entries, None, _sidecar(p), inert)


def _read_file(file: Path) -> tuple[dict[str, Any], list[str]]:
    try:
        payload = torch.load(file, map_location="cpu", weights_only=True)
        inert: list[str] = []
    except pickle.UnpicklingError:
        try:
            payload, inert = inert_load(file)
        except Exception as e:  # a truncated or garbled file: every reader error is the file's fault
            raise CheckpointError(f"{file}: unreadable checkpoint (truncated or corrupted): "
                                  f"{type(e).__name__}: {e}") from e
    except Exception as e:  # torch raises several types for truncated zips and bad pickles
        raise CheckpointError(f"{file}: unreadable checkpoint (truncated or corrupted): {type(e).__name__}: {e}") from e
    if not isinstance(payload, dict):
        raise CheckpointError(f"{file}: holds a {type(payload).__name__}, not a dict of weights")
    return payload, inert


def _read_folder(folder: Path) -> Payload:
    cfg_path = folder / HF_CONFIG
    try:
        config = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{cfg_path}: unreadable Hugging Face config: {e}") from e
    if not isinstance(config, dict):
        raise CheckpointError(f"{cfg_path}: not a JSON object")
    if (folder / HF_WEIGHTS).is_file():
        weights = folder / HF_WEIGHTS
        try:
            state = load_file(str(weights), device="cpu")
        except (SafetensorError, OSError, ValueError) as e:
            raise CheckpointError(f"{weights}: unreadable safetensors file: {e}") from e
    elif (folder / HF_BIN).is_file():
        weights = folder / HF_BIN
        state, _ = _read_file(weights)
    else:
        raise CheckpointError(f"{folder}: a Hugging Face folder without {HF_WEIGHTS} or {HF_BIN}")
    return Payload(folder, weights, dict(state), config, None, [])


def _sidecar(file: Path) -> dict[str, Any] | None:
    """ECG-CPC's hydra config beside its checkpoint: config_<stem>_<suffix>.yaml (or <stem>.yaml)."""
    stem, suffix = file.stem, file.suffix.lstrip(".")
    for name in (f"config_{stem}_{suffix}.yaml", f"config_{stem}.yaml", f"{stem}.yaml"):
        side = file.with_name(name)
        if side.is_file():
            try:
                data = yaml.safe_load(side.read_text())
            except (OSError, yaml.YAMLError) as e:
                raise CheckpointError(f"{side}: unreadable config beside {file.name}: {e}") from e
            if not isinstance(data, dict):
                raise CheckpointError(f"{side}: the config beside {file.name} is not a mapping "
                                      f"({type(data).__name__}); remove it or restore the released file")
            return data
    return None


def _download(repo_id: str) -> Path:
    """A Hugging Face id -> its local snapshot folder (huggingface_hub; needs the network)."""
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.bin"]))
    except Exception as e:
        raise CheckpointError(f"{repo_id}: not a local path, and the Hugging Face download failed ({e}); "
                              "download the folder and pass its path") from e
