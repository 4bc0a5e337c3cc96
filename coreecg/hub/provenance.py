"""Where an export's weights came from (config.json's "provenance", read by the model card): the
source, the pretraining method and corpus, and for a classifier its fine-tuning dataset,
selection and test metrics. An export of an export keeps the provenance it recorded."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from coreecg.config.encoder_registry import is_published
from coreecg.checkpoints import CheckpointError
from coreecg.config import Config
from coreecg.loading import METRICS_FILE, ModelSource, corpus_manifest, open_source
from coreecg.model.published import family


def provenance(src: ModelSource) -> dict[str, Any]:
    """config.json's "provenance" entry of a model source."""
    if src.export is not None:
        return src.export.get("provenance") or {}
    where = str(src.path.resolve())
    if src.kind == "encoder":
        return {"pretraining": _pretraining_info(src.config, src.weights), "source": where}
    return {"source": where, "pretraining": _encoder_pretraining_info(src.config, src.metrics),
            "finetuning": _finetuning_info(src.config, src.metrics, src.manifest, src.entries)}


def _corpus_info(config: Config, manifest: dict[str, Any] | None) -> dict[str, Any]:
    d = config.data
    if not d.corpus:
        return {"source": "synthetic", "path": None, "records": d.synthetic_records}
    if d.is_mixture:                     # several corpora (docs/mixtures.md): paths and weights
        return {"path": list(d.corpora), "source": "mixture", "records": None,
                "weights": list(d.corpus_weights) or "proportional to train windows"}
    out: dict[str, Any] = {"path": d.corpus, "source": None, "records": None}
    if manifest:
        out.update(source=manifest.get("source"), label_view=manifest.get("label_view"),
                   source_options=manifest.get("source_options"),
                   records=(manifest.get("counts") or {}).get("records_written"))
    return out


def _pretraining_info(config: Config, file: Path | None) -> dict[str, Any]:
    """Method and corpus of the pretraining run whose config this is (a published encoder's:
    its family, licence and pretraining data as coreecg knows them)."""
    if is_published(config.model.arch):
        fam = family(config.model.arch)
        return {"method": None, "label": config.method_label, "variant": config.train.variant or None,
                "published": fam.name, "title": fam.title, "licence": fam.licence, "corpus": None,
                "note": fam.pretraining, "checkpoint": str(file.resolve()) if file else None}
    return {"method": config.pretrain.method, "label": config.method_label, "variant": config.train.variant or None,
            "plugins": list(config.plugins), "corpus": _corpus_info(config, corpus_manifest(config)),
            "checkpoint": str(file.resolve()) if file else None}


def _encoder_pretraining_info(config: Config, metrics: dict[str, Any] | None) -> dict[str, Any]:
    """A fine-tuned model's pretraining, from its encoder checkpoint's own config: the fine-tuning
    config's pretrain section is the fine-tuning job's, not the encoder's."""
    if config.finetune.mode == "scratch":
        return {"method": None, "label": "Supervised", "variant": None, "corpus": None,
                "note": "no pretraining (trained from scratch)"}
    if config.finetune.encoder == "random":
        return {"method": None, "label": config.finetune.method or "Random init", "variant": None, "corpus": None,
                "note": "no pretraining (a seeded, randomly initialised encoder: finetune.encoder=random)"}
    path = Path(config.finetune.encoder).expanduser() if config.finetune.encoder else None
    if path is not None and path.exists():       # any source: encoder.pt, a run folder, an export
        try:
            encoder = open_source(path, kind="encoder")
        except CheckpointError:
            encoder = None
        if encoder is not None:           # an export keeps what its own source recorded
            recorded = (encoder.export or {}).get("provenance") or {}
            return recorded.get("pretraining") or _pretraining_info(encoder.config, encoder.weights)
    label = (metrics or {}).get("method")
    return {"method": None, "label": label, "variant": None, "corpus": None, "checkpoint": str(path) if path else None,
            "note": f"the encoder checkpoint ({path or 'unnamed'}) is not available here: its method is known "
                    f"only by its table name ({label or 'unknown'})"}


def _finetuning_info(config: Config, metrics: dict[str, Any] | None, manifest: dict[str, Any] | None,
                     entries: dict[str, Any]) -> dict[str, Any]:
    m = metrics or {}
    f = config.finetune
    return {"dataset": m.get("dataset") or (manifest or {}).get("source"), "mode": f.mode,
            "leads": list(f.leads), "train_fraction": f.train_fraction, "seed": config.train.seed,
            "corpus": _corpus_info(config, manifest), "best_epoch": entries.get("epoch"),
            "selection": m.get("selection"), "test": m.get("test"), "crop_rule": m.get("crop_rule"),
            "metrics_file": METRICS_FILE if metrics else None}
