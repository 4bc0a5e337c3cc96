"""The input contract: what a model expects and, for a classifier, how its outputs become record
scores, derived from its config (never written by hand). An export's config.json carries it as
"input"; `load_model` returns it beside the model.

    loaded = load_model("exports/ft-ptbxl")      # or a run folder, encoder.pt, best.pt
    loaded.model, loaded.kind, loaded.config, loaded.contract
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from coreecg.encoders.build import build_encoder
from coreecg.encoders.registry import encoder_spec, is_published
from coreecg.config import STANDARD_LEADS, Config
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import Record
from coreecg.eval.downstream import crop_rule, eval_offsets
from coreecg.loading import Kind, ModelSource, build_model, open_source
from coreecg.model.published import family
from coreecg.model.published.registry import contract_of


@dataclass
class LoadedModel:
    """What `load_model` returns.

    model: an `Encoder` or a `Classifier`, in eval mode, on `map_location`.
    kind: "encoder" | "classifier".
    config: the full coreecg Config the model was built from.
    contract: the input contract, the same dict as config.json's "input" (`input_contract`).
    source: the path that was loaded (an export folder, a run folder or a .pt file).
    """

    model: nn.Module
    kind: Kind
    config: Config
    contract: dict[str, Any]
    source: Path


def load_model(path: str | Path, map_location: str | torch.device = "cpu") -> LoadedModel:
    """Any coreecg model source (`coreecg.loading`) -> LoadedModel (model in eval mode).

    path: an export folder (config.json + model.safetensors), a pretraining run folder
    (encoder.pt), a fine-tuning run folder (best.pt + metrics.json), or a .pt file
    (encoder.pt, best.pt, a pretraining or fine-tuning checkpoint_step*/checkpoint.pt).
    CheckpointError (a ValueError) naming the file for anything missing, corrupted or foreign.
    """
    src = open_source(path)
    return LoadedModel(build_model(src).to(map_location), src.kind, src.config, source_contract(src), src.path)


def model_input(path: str | Path, signal: np.ndarray, fs: float, leads: Sequence[str]) -> np.ndarray:
    """The windows a model is fed for one raw recording: signal (C, N) in mV at `fs` Hz, rows named
    by `leads` -> float32 (W, ...) in the model's own layout, batch axis first.

    A published family's weights (or a run / export of them): its declared contract
    (`coreecg.data.contract`, the family module's CONTRACT), the original pipeline's steps, e.g.
    ECGFounder's (W, 12, 5000), xECG's time-major (W, T, 12), HuBERT-ECG's flat (W, 6000).
    coreecg's own encoders: `preprocess_record` (data.preprocess) then each stored window's centre
    crop of model.input_samples, (W, C, input_samples). No model is built.
    """
    src = open_source(path, kind="encoder")
    arch = src.config.model.arch
    if is_published(arch) and family(arch).contract is not None:
        return contract_of(family(arch), src.config.model.n_leads).model_input(signal, fs, leads, str(path))
    cfg = src.config
    record = Record(source="array", record_id="array", signal=np.asarray(signal, dtype=np.float32), fs=float(fs),
                    lead_names=tuple(leads), patient_id=None, labels=(), path=str(path))
    pre = dataclasses.replace(cfg.data.preprocess, leads=tuple(STANDARD_LEADS[: cfg.model.n_leads]))
    windows = preprocess_record(record, pre)
    start = eval_offsets(windows.shape[-1], cfg.model.input_samples, 1)[0]
    return np.ascontiguousarray(windows[..., start: start + cfg.model.input_samples])


def source_contract(src: ModelSource) -> dict[str, Any]:
    """An export's recorded contract; a checkpoint's (or a bare save_pretrained folder's) derived
    from its config (a classifier's stored window from its corpus's manifest, when that is on
    this machine)."""
    if src.export is not None and isinstance(src.export.get("input"), dict):
        return src.export["input"]
    # a checkpoint, or a bare save_pretrained folder (no contract recorded): from its config
    if src.kind == "encoder":
        return input_contract(src.config, "encoder")
    stored = int(src.manifest["signal"]["shape"][-1]) if src.manifest else None
    return input_contract(src.config, "classifier", class_names=src.class_names, multilabel=src.multilabel,
                          stored_samples=stored)


def input_contract(config: Config, kind: Kind = "encoder", *, class_names: Sequence[str] | None = None,
                   multilabel: bool | None = None, stored_samples: int | None = None) -> dict[str, Any]:
    """What the model expects and (classifier) how its outputs become record scores, from `config`.

    Keys (every kind): tensor {layout, dtype, shape: [null = batch, leads, samples]},
    sampling_rate (Hz), window_samples / window_seconds (the model's input: one crop),
    stored_window_samples / stored_window_seconds (the preprocessed window the crops come from,
    z-scored as a whole), patch_size, patches_per_lead, leads (row order, names), bandpass
    {highpass_hz, lowpass_hz, order, ...}, resampling, normalisation {method, axis, eps, flat},
    preprocessing (the function that does all of it), output.
    Classifier also: class_names, task ("single-label" | "multi-label"), multilabel,
    finetuned_leads, aggregation {eval_crops, crop_offsets, window, record, rule}.

    class_names, multilabel: required for a classifier (they are not in the Config).
    stored_samples: samples of a stored window (default: data.preprocess's window).
    """
    p, m = config.data.preprocess, config.model
    stored = int(stored_samples or p.window_samples)
    leads = list(config.finetune.leads) if kind == "classifier" else list(STANDARD_LEADS[:m.n_leads])
    if kind == "encoder" and p.contract:          # a published family's corpus: its contract's rows, in its order
        leads = list(p.leads)
    contract: dict[str, Any] = {
        "tensor": {"layout": "(batch, leads, samples)", "dtype": "float32",
                   "shape": [None, len(leads), m.input_samples]},
        "sampling_rate": p.sampling_rate,
        "window_samples": m.input_samples,
        "window_seconds": m.input_samples / p.sampling_rate,
        "stored_window_samples": stored,
        "stored_window_seconds": stored / p.sampling_rate,
        "patch_size": config.patch_size,
        "patches_per_lead": config.n_patches,
        "leads": leads,
        "bandpass": {"highpass_hz": p.highpass_hz, "lowpass_hz": p.lowpass_hz, "order": p.filter_order,
                     "filter": "Butterworth high-pass then low-pass (cascaded SOS), zero-phase (sosfiltfilt), "
                               "at the native rate over the whole record, before resampling"},
        "resampling": f"scipy.signal.resample_poly to {p.sampling_rate} Hz with exact rational factors",
        "normalisation": ({"method": "z-score", "axis": "per lead over each stored window", "eps": p.zscore_eps,
                           "flat": f"a lead whose std < {p.zscore_eps:g} becomes zeros"}
                          if p.standardize == "lead" else
                          {"method": "z-score", "axis": "over leads and time together, each stored window",
                           "eps": p.zscore_eps, "flat": f"a window whose std < {p.zscore_eps:g} becomes zeros"}),
        "preprocessing": "coreecg.data.preprocess.preprocess_record(record, config.data.preprocess)",
    }
    if is_published(m.arch):                      # a published encoder: whose contract this is
        fam = family(m.arch)
        contract["encoder"] = {"arch": fam.name, "family": fam.title, "pooled": fam.pooling,
                               "normalisation": fam.normalisation, "licence": fam.licence,
                               "commercial_use": fam.commercial_use, "pretraining": fam.pretraining,
                               "pretrained_on": list(fam.pretrained_on)}
        if fam.contract is not None:              # the original pipeline, step by step (coreecg.data.contract)
            declared = contract_of(fam, m.n_leads).describe()
            contract["encoder"]["input"] = declared
            # coreecg's own filter and z-score do not apply: the family's steps do
            contract["bandpass"] = {"highpass_hz": None, "lowpass_hz": None, "order": None,
                                    "filter": "the family's declared contract: " + "; ".join(declared["steps"])}
            contract["resampling"] = "the family's declared contract (encoder.input.steps)"
            contract["normalisation"] = {"method": "the family's declared contract", "axis": "encoder.input.steps",
                                         "eps": None, "flat": None}
            contract["preprocessing"] = ("coreecg.model_input(path, signal, fs, leads) (a corpus: "
                                         f"data.preprocess.contract={fam.name})")
    if kind == "encoder":
        with torch.device("meta"):                    # its width and token stride, from the module's shape
            enc = build_encoder(config)
        width = enc.dim
        if encoder_spec(m.arch).output == "sequence":
            tokens = (f"(batch, steps, {width}): a sequence over time, one step per {enc.patch_size} input "
                      "samples (Encoder(x).tokens)")
        else:
            tokens = (f"(batch, leads * {config.n_patches}, {width}): token encodings in (lead, time) order "
                      "(Encoder(x).tokens)")
        contract["output"] = {
            "pooled": f"(batch, {width}): "
                      + (contract["encoder"]["pooled"] if "encoder" in contract else "mean of all token encodings")
                      + " (pooled), the feature downstream tasks use",
            "tokens": tokens,
            "lead_subsets": "feed fewer rows with lead_idx (standard-order indices) in PyTorch; ONNX takes all leads"}
        return contract
    if class_names is None or multilabel is None:
        raise ValueError("a classifier's contract needs its class_names and multilabel")
    crops = config.finetune.eval_crops
    contract.update({
        "class_names": list(class_names),
        "task": "multi-label" if multilabel else "single-label",
        "multilabel": bool(multilabel),
        "finetuned_leads": list(config.finetune.leads),
        "output": f"logits (batch, {len(class_names)}); probabilities = "
                  + ("sigmoid(logits)" if multilabel else "softmax(logits, dim=-1)"),
        "aggregation": {
            "eval_crops": crops,
            "crop_offsets": eval_offsets(stored, m.input_samples, crops),
            "window": f"mean of the logits of the {crops} crops, then "
                      + ("sigmoid" if multilabel else "softmax"),
            "record": "mean of its windows' probabilities",
            "rule": crop_rule(stored, m.input_samples, crops)},
    })
    return contract
