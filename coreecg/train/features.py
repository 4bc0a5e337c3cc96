"""A linear probe's cached features (finetune.mode=linear, finetune.cache_features): the frozen
encoder embeds each split's windows once under the crop rule (`coreecg.eval.downstream.predict`:
the mean pooled feature over the `eval_crops` evaluation crops), and the head trains and is
scored on them.

Kept with the run, in `<run>/features/`:

    meta.json            what the features are of (below); written last
    <split>.npy          (n, D) float32, one row per labelled window of the split, in uid order
    <split>.uid.npy      (n,) int64, those windows' uids (the training loop's row ids)

meta.json's "key": the encoder (its source and the sha256 of its weights), the corpus (its path
and the sha256 of its manifest, which lists every shard's sha256), the leads, the crop length,
the evaluation crops and offsets, the precision, and "key_hash" over all of them. A run that
finds features whose key is its own reuses them (a resumed run); any other key (another
encoder or corpus) is recomputed and overwritten.

Augmentation (finetune.augment) never reaches these features: they are evaluation-crop
features, and the policy augments training crops only. A probe whose head trains on the cached
train features (probe_crops=eval) has no training crop, so augmentation there is a ConfigError
(FinetuneConfig); with probe_crops=random only val/test are cached and the train crops are
augmented fresh every step.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

log = logging.getLogger(__name__)

FOLDER = "features"


def weights_sha256(module: torch.nn.Module) -> str:
    """sha256 over a module's state (names, shapes, dtypes, bytes), in name order."""
    h = hashlib.sha256()
    for name, t in sorted(module.state_dict().items()):
        # 0-d: a BatchNorm counter
        t = t.detach().cpu().contiguous().reshape(-1) if t.dim() == 0 else t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def feature_key(*, encoder: str, encoder_sha256: str, corpus: str | Path, leads: list[str], crop: int,
                offsets: list[int], precision: str) -> dict[str, Any]:
    corpus = Path(corpus)
    key = {"encoder": encoder, "encoder_sha256": encoder_sha256, "corpus": str(corpus),
           "corpus_manifest_sha256": hashlib.sha256((corpus / "manifest.json").read_bytes()).hexdigest(),
           "leads": list(leads), "crop_samples": int(crop), "eval_crops": len(offsets),
           "offsets": [int(o) for o in offsets], "precision": precision}
    key["key_hash"] = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return key


def load_or_compute(run_dir: Path, key: dict[str, Any], compute: dict[str, Callable[[], tuple[np.ndarray, np.ndarray]]],
                    write: bool = True) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict[str, Any]]:
    """-> ({split: (uid (n,), features (n, D))}, info). Reuses `run_dir/features/` when its
    meta.json holds `key` and every asked split; else calls `compute[split]()` for each and,
    with `write` (rank 0), saves them (each file atomically, meta.json last).
    info: {"reused": bool, "seconds": time to compute or read, "key_hash", "folder"}."""
    folder = Path(run_dir) / FOLDER
    t0 = time.perf_counter()
    meta = _read_meta(folder)
    if meta is not None and meta.get("key") == key and all(
            (folder / f"{s}.npy").is_file() and (folder / f"{s}.uid.npy").is_file() for s in compute):
        out = {s: (np.load(folder / f"{s}.uid.npy"), np.load(folder / f"{s}.npy")) for s in compute}
        if all(len(u) == len(f) == meta.get("splits", {}).get(s, {}).get("rows", -1) for s, (u, f) in out.items()):
            log.info("linear probe: reusing the features in %s", folder)
            return out, {"reused": True, "seconds": time.perf_counter() - t0, "key_hash": key["key_hash"],
                         "folder": str(folder)}
    why = "none cached" if meta is None else "cached for another encoder, corpus or crop rule"
    log.info("linear probe: embedding %s once (%s)", ", ".join(compute), why)
    out = {s: fn() for s, fn in compute.items()}
    seconds = time.perf_counter() - t0
    if write:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "meta.json").unlink(missing_ok=True)      # what is there is not (yet) the new key's
        for s, (uid, feats) in out.items():
            _save(folder / f"{s}.uid.npy", np.asarray(uid, dtype=np.int64))
            _save(folder / f"{s}.npy", np.asarray(feats, dtype=np.float32))
        meta = {"key": key, "splits": {s: {"rows": int(len(u)), "dim": int(f.shape[1]) if f.ndim == 2 else 0}
                                       for s, (u, f) in out.items()},
                "seconds": round(seconds, 3), "created": time.time()}
        tmp = folder / "meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1) + "\n")
        os.replace(tmp, folder / "meta.json")
    return out, {"reused": False, "seconds": seconds, "key_hash": key["key_hash"], "folder": str(folder)}


def _read_meta(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def _save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        np.save(f, array)
    os.replace(tmp, path)
