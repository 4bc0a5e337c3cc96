"""An export folder from any model source: model.safetensors, config.json, README.md, the
pretraining corpus's fingerprints (pretraining_fingerprints.parquet, for the leakage guard) and,
when asked, model.onnx (docs/export.md).

config.json is the commit mark, written last: an export killed or failing half-way (ONNX
included) leaves a folder without one, which every loader refuses, never a config whose sha256
names other weights.
"""
from __future__ import annotations

import dataclasses
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import torch

from coreecg.encoders.build import build_encoder, encoder_class
from coreecg.config.encoder_registry import encoder_spec, is_published
from coreecg.checkpoints import CheckpointError
from coreecg.files import TEMP_GLOB, sha256_file, write_atomic, write_json, write_text
from coreecg.hub.card import CARD_FILE, model_card
from coreecg.hub.contract import source_contract
from coreecg.hub.onnx_export import ONNX_FILE, onnx_entry
from coreecg.hub.provenance import provenance
from coreecg.loading import CONFIG_FILE, WEIGHTS_FILE, ModelSource, build_model, open_source
from coreecg.model.pretrained import hub_config, write_weights
from coreecg.weights import PRECISION_CHECKS_FILE as CHECKS_FILE
from coreecg.train.leakage_guard import PRETRAINING_FINGERPRINTS, fingerprints_of, pretraining_of
from coreecg.model.published import family

# Lazy imports: coreecg.inference.precision_check in export_model (coreecg.inference imports this package).


def export_model(source: str | Path, output: str | Path, *, onnx: bool = False, precision: str | None = None,
                 check_corpus: str | Path | None = None, check_split: str = "test") -> Path:
    """Write `source` (anything `coreecg.loading` reads) as an export folder at `output`:
    model.safetensors, config.json, README.md, and with `onnx` model.onnx (`export_onnx`;
    checked against PyTorch in onnxruntime when that is installed, the largest difference
    recorded in config.json's "onnx"). -> the folder.

    The folder may exist only empty or holding an earlier export (its files are replaced; a
    model.onnx of the earlier export is removed, being stale). CheckpointError for a bad source.

    precision (auto, fp32, bf16, int8): check the non-float32 paths against float32 on
    `check_corpus` (default: the corpus the model was trained on, from its config) `check_split`
    (`coreecg.inference.precision_check.check_model`), write precision_checks.json (read by
    jobs/predict.py: a refused path is refused) and state the figures on the card; the export's
    default inference precision becomes `precision` (refused when its own check refused it:
    CheckpointError saying why). None: nothing checked.
    """
    src = open_source(source)
    out = Path(output).expanduser()
    _check_output(out, Path(source).expanduser())
    out.mkdir(parents=True, exist_ok=True)
    for stale in (CONFIG_FILE, ONNX_FILE, PRETRAINING_FINGERPRINTS):
        (out / stale).unlink(missing_ok=True)
    # the folder save_pretrained writes (the same two functions), with the contract and the card
    model = build_model(src)
    weights = write_weights(model, out, src.kind)
    contract = source_contract(src)
    meta = hub_config(model, model.pretrained_info, weights, {
        "architecture": _architecture(src), "input": contract, "provenance": provenance(src)})
    _carry_fingerprints(src, meta, out)
    if onnx:
        meta["onnx"] = onnx_entry(src, contract, out / ONNX_FILE)
    (out / CHECKS_FILE).unlink(missing_ok=True)
    if precision is not None:
        meta["precision"] = _precision_entry(source, out, precision, check_corpus, check_split)
        meta["config"]["inference"]["precision"] = precision
    write_text(out / CARD_FILE, model_card(meta))
    write_json(out / CONFIG_FILE, meta, indent=2)
    return out


def _precision_entry(source: str | Path, out: Path, precision: str, corpus: str | Path | None,
                     split: str) -> dict[str, Any]:
    """Check the paths, record them in `out`, -> config.json's "precision" entry."""
    from coreecg.hub.contract import load_model
    from coreecg.inference.items import InferenceError
    from coreecg.inference.precision_check import bounds_of, check_model, record_checks

    loaded = load_model(source, map_location="cpu")
    if corpus is None:
        named = loaded.config.data.corpus
        corpus = named[0] if isinstance(named, tuple) and named else named or None
    entry: dict[str, Any] = {"default": precision, "bounds": bounds_of(loaded.config), "checks": {},
                             "not_checked": {}, "checked_on": None}
    if corpus is None or not (Path(corpus).expanduser() / "manifest.json").is_file():
        why = ("no corpus to check on: the model names none" if corpus is None
               else f"{corpus}: not a corpus here (give check_corpus / --check-corpus)")
        entry["not_checked"] = {p: why for p in ("bf16", "int8")}
    else:
        try:
            checks, skipped = check_model(loaded, Path(corpus).expanduser(), split)
        except (InferenceError, ValueError, OSError) as e:
            raise CheckpointError(f"precision check of {source} on {corpus} ({split}): {e}") from None
        record_checks(out, checks)
        entry.update(checks=checks, not_checked=skipped,
                     checked_on=next((c["checked_on"] for c in checks.values()), None))
    refused = entry["checks"].get(precision, {})
    if refused and not refused.get("accepted", True):
        raise CheckpointError(f"--precision {precision} is refused for {source}: {refused['reason']}")
    return entry


def _carry_fingerprints(src: ModelSource, meta: dict[str, Any], out: Path) -> None:
    """Copy the pretraining corpus's fingerprint file into the export and name it (with its
    sha256) in the provenance, so the leakage guard works from the export wherever the corpus is
    (coreecg.train.leakage_guard). Without a pretraining corpus, or with none found here, the
    provenance says so and nothing is copied."""
    corpus = (meta["provenance"].get("pretraining") or {}).get("corpus")
    pre = pretraining_of(src)
    if not isinstance(corpus, dict) or (pre.corpus is None and pre.carried is None):
        return
    try:
        table, where = fingerprints_of(pre)
    except (OSError, ValueError) as e:      # LeakageError, a corpus that cannot be read: the export goes on
        corpus["fingerprints"] = {"file": None, "note": str(e)}
        return
    copied = write_atomic(out / PRETRAINING_FINGERPRINTS, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    corpus["fingerprints"] = {"file": PRETRAINING_FINGERPRINTS, "sha256": sha256_file(copied),
                              "windows": table.num_rows, "copied_from": where}


def _check_output(out: Path, source: Path) -> None:
    if not out.exists():
        return
    if not out.is_dir():
        raise CheckpointError(f"{out}: exists and is not a folder")
    if out.resolve() == source.resolve():
        raise CheckpointError(f"{out}: is the source itself; export to another folder")
    known = {WEIGHTS_FILE, CONFIG_FILE, CARD_FILE, ONNX_FILE, PRETRAINING_FINGERPRINTS, CHECKS_FILE}
    known |= {f"{name}.tmp" for name in known}      # left by an export that was killed (before coreecg.files)
    others = sorted(p.name for p in out.iterdir() if p.name not in known and not fnmatch(p.name, TEMP_GLOB))
    if others:
        raise CheckpointError(f"{out}: not empty and not an earlier export (holds {', '.join(others[:5])}); "
                              "give an empty or new folder")


def _encoder_class(arch: str) -> str:
    cls = encoder_class(arch)
    return f"{cls.__module__}.{cls.__qualname__}"


def _pooling(cfg) -> str:
    """How a classifier's head input is pooled from the encoder's tokens (padding never counts)."""
    if cfg.finetune.pooling == "attention":
        return "attention pooling: one learned query over all (lead, time) token encodings (AttentionPool)"
    if is_published(cfg.model.arch):
        return f"{family(cfg.model.arch).title}: its own pooled feature (encoder.pooled)"
    return "mean over all (lead, time) token encodings"


def _architecture(src: ModelSource) -> dict[str, Any]:
    """config.json's "architecture": the classes and sizes in words (the card reads it)."""
    cfg = src.config
    with torch.device("meta"):                    # its width, from the module's shape
        width = build_encoder(cfg).dim
    arch: dict[str, Any] = {"class": _encoder_class(cfg.model.arch), "title": encoder_spec(cfg.model.arch).title,
                            **dataclasses.asdict(cfg.model), "width": width}
    if cfg.encoder is not None:                   # the encoder's own sizes, encoders.<arch>
        arch["options"] = dataclasses.asdict(cfg.encoder)
    if src.kind == "classifier":
        arch = {"class": "coreecg.model.classifier.Classifier", "encoder": arch,
                "n_classes": len(src.class_names), "mode": cfg.finetune.mode, "multilabel": bool(src.multilabel),
                "leads": list(cfg.finetune.leads), "frozen_encoder": cfg.finetune.mode in ("linear", "frozen"),
                "pooling": _pooling(cfg), "head": "Linear(embed_dim, n_classes)"}
    return arch
