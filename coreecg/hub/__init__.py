"""Weights out: a trained encoder or fine-tuned classifier as a folder anyone can load.

    from coreecg.hub import export_model, load_model
    export_model("runs/ft-ptbxl", "exports/ft-ptbxl")        # or a pretraining run, encoder.pt, best.pt
    loaded = load_model("exports/ft-ptbxl")                   # also a run folder, encoder.pt or best.pt
    loaded.model, loaded.kind, loaded.config, loaded.contract

An export folder (docs/export.md):

    model.safetensors   the weights (Encoder.state_dict() for an encoder; Classifier.state_dict(),
                        keys encoder.* and head.*, for a classifier); float32, no pickle
    config.json         a Hugging Face config (model_type, architectures, constructor arguments,
                        id2label), then coreecg's: format and version, kind, architecture, the input contract ("input"),
                        the sha256 of model.safetensors (checked on every load), provenance and
                        the full coreecg config (the model is rebuilt from it exactly)
    README.md           the model card (method, data and licences, metrics with 95 % CIs, limits)
    model.onnx          optional (export_onnx; jobs/export.py --onnx)

`Encoder` and `Classifier` also load, save and push as Hugging Face models
(`from_pretrained`, `save_pretrained`, `push_to_hub`: coreecg.model.pretrained); an export is
what `save_pretrained` writes plus the input contract and this card; `push_export` publishes a
whole export folder (card, contract, fingerprints) to the Hub.

One module per job: `contract` (the input contract, derived from the config, and `load_model`,
which returns it beside the model), `export` (the folder), `onnx_export`, `card` (README.md),
`provenance` (where the weights came from), `publish` (`push_export`). Reading any model source, an export included, is
`coreecg.loading`'s (`load_encoder` and `load_classifier` are re-exported here); it needs neither
Ray nor the training code, and a weights file that differs from its recorded sha256 is a
CheckpointError naming the file.
"""
from __future__ import annotations

from coreecg.hub.card import CARD_FILE, DATA_LICENCES, model_card
from coreecg.hub.contract import LoadedModel, input_contract, load_model, model_input
from coreecg.hub.export import export_model
from coreecg.hub.onnx_export import ONNX_FILE, check_onnx, export_onnx
from coreecg.hub.publish import push_export
from coreecg.loading import CONFIG_FILE, FORMAT, FORMAT_VERSION, WEIGHTS_FILE, load_classifier, load_encoder

__all__ = ["LoadedModel", "input_contract", "load_model", "model_input", "load_encoder", "load_classifier",
           "export_model",
           "push_export", "export_onnx", "check_onnx", "model_card", "DATA_LICENCES", "FORMAT", "FORMAT_VERSION",
           "CARD_FILE", "CONFIG_FILE", "ONNX_FILE", "WEIGHTS_FILE"]
