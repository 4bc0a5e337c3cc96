"""Whether a checkpoint fits this run's model: the config keys that decide the model's modules
and shapes (a resume under other values is refused) and the keys a resume merely changes.

Writing, listing, verifying and reading checkpoints is the store's (`coreecg.checkpoints`);
loading a model from one, `coreecg.loading`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from coreecg.checkpoints import CheckpointError
from coreecg.config import Config

# Config keys that decide which modules exist and their shapes: a checkpoint written under
# other values cannot be loaded into this run's model. Beside these, each method declares its
# own (`register_method(structural=...)`, read through `config.method.structural`).
STRUCTURAL = ("model", "encoders.<model.arch>", "pretrain.method")


def structural_differences(saved: Config, current: Config) -> list[str]:
    """Config keys (dotted) whose values change the model's modules or shapes: `STRUCTURAL` (the
    encoder's input, its own sizes section and the grid's patch it reads) and the saved method's
    own structural keys (when both configs train that method)."""
    a, b = saved.to_dict(), current.to_dict()
    diffs = [f"model.{k}" for k in a["model"] if a["model"][k] != b["model"].get(k)]
    arch = saved.model.arch
    if arch == current.model.arch:
        mine, theirs = a["encoders"].get(arch) or {}, b["encoders"].get(arch) or {}
        diffs += [f"encoders.{arch}.{k}" for k in mine if mine[k] != theirs.get(k)]
        if saved.patch_key != f"encoders.{arch}.patch_size" and saved.patch_size != current.patch_size:
            diffs.append(saved.patch_key)          # the grid an encoder without a patch shares (Config.patch_size)
    if saved.pretrain.method != current.pretrain.method:
        return diffs + ["pretrain.method"]
    spec = saved.method
    before, after = spec.structural_values(a), spec.structural_values(b)
    return diffs + [k for k in before if before[k] != after[k]]


def changed_keys(saved: Config, current: Config) -> list[str]:
    """Every dotted key whose value differs (for notices on resume)."""
    def flat(d: dict, prefix: str = "") -> dict:
        out = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out
    a, b = flat(saved.to_dict()), flat(current.to_dict())
    return sorted(k for k in a if a[k] != b.get(k))


def check_compatible(path: str | Path, saved: Config, current: Config) -> None:
    """CheckpointError naming `path` if it was written under another model configuration."""
    diffs = structural_differences(saved, current)
    if diffs:
        a, b = saved.to_dict(), current.to_dict()
        shown = ", ".join(f"{k}: {_get(a, k)} -> {_get(b, k)}" for k in diffs[:6])
        raise CheckpointError(f"{path}: written under a different model config ({shown}); "
                              "use another train.name (or storage_path) for a new run")


def _get(d: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        d = d[part]
    return d
