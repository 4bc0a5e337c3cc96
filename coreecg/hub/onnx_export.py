"""ONNX of an encoder or a fine-tuned classifier (batch axis dynamic), and its check against
PyTorch in onnxruntime. Exported with torch.export (dynamo), written atomically."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from torch import nn
import numpy as np

from coreecg.files import sha256_file, write_atomic
from coreecg.hub.contract import load_model
from coreecg.loading import Kind, ModelSource, build_model
from coreecg.model.classifier import Classifier
from coreecg.model.encoder import Encoder, masked_mean
from coreecg.model.sequence import SequenceEncoder

# Lazy imports: onnxruntime, the optional `onnx` extra.

ONNX_FILE = "model.onnx"
ONNX_OPSET = 18
ONNX_CHECK_BATCHES = (1, 3)          # two batch sizes: proves the batch axis is dynamic


def export_onnx(model_or_path: nn.Module | str | Path, output_file: str | Path, kind: Kind | None = None,
                opset: int = ONNX_OPSET) -> Path:
    """ONNX of an encoder or a fine-tuned classifier, batch axis dynamic. -> output_file.

    encoder: input "ecg" (batch, n_leads, input_samples) float32 -> outputs "pooled" (batch, D),
    the mean over all tokens that downstream tasks use (Encoder.pooled), and "tokens"
    (batch, n_leads * n_patches, D), the token encodings in (lead, time) order.
    classifier: input "ecg" (batch, len(leads), input_samples) -> "logits" (batch, K); the
    crop and record aggregation (the contract's "aggregation") stay with the caller.
    model_or_path: an Encoder, a Classifier, or anything `load_model` reads. kind: checked
    against the model when given ("encoder" of a classifier source exports its encoder).
    """
    if isinstance(model_or_path, nn.Module):
        model = model_or_path
    else:
        loaded = load_model(model_or_path)
        model = loaded.model.encoder if kind == "encoder" and loaded.kind == "classifier" else loaded.model
    wrapper, example, outputs = _onnx_wrapper(model, kind)
    out = Path(output_file).expanduser()
    # The dynamo exporter (torch.export), not the legacy TorchScript tracer. Both export this SDPA
    # transformer and both keep a dynamic batch, but the tracer freezes every Python-level shape
    # check it passes through into a constant (TracerWarnings in default_lead_idx and
    # LeadTimeEmbedding), whereas torch.export proves the batch axis symbolic or fails loudly;
    # and the tracer is deprecated since torch 2.9. Cost: a slower export (seconds, not minutes).
    batch = torch.export.Dim("batch", min=1)
    program = torch.onnx.export(wrapper, (example,), input_names=["ecg"], output_names=outputs,
                                dynamic_shapes=({0: batch},), opset_version=opset, dynamo=True,
                                external_data=False, optimize=True, verbose=False)
    return write_atomic(out, lambda tmp: program.save(str(tmp)))


def onnx_entry(src: ModelSource, contract: dict[str, Any], file: Path) -> dict[str, Any]:
    """Write model.onnx of an export's source at `file`; -> its config.json entry ("onnx")."""
    model = build_model(src)
    export_onnx(model, file)
    try:
        diff: float | None = check_onnx(model, file)
    except ImportError:         # onnxruntime is optional: the file is written, unchecked
        diff = None
    c = contract["tensor"]["shape"]
    tokens, dim = _token_shape(model, c[1], c[2])
    return {"file": ONNX_FILE, "sha256": sha256_file(file), "opset": ONNX_OPSET,
            "exporter": "torch.onnx.export(dynamo=True)",
            "input": {"ecg": ["batch", c[1], c[2]]},
            "outputs": ({"logits": ["batch", len(src.class_names)]} if src.kind == "classifier" else
                        {"pooled": ["batch", dim], "tokens": ["batch", tokens, dim]}),
            "max_abs_diff_vs_pytorch": diff,
            "checked_batch_sizes": list(ONNX_CHECK_BATCHES) if diff is not None else []}


def _onnx_wrapper(model: nn.Module, kind: Kind | None) -> tuple[nn.Module, torch.Tensor, list[str]]:
    """-> (an eval-mode module returning plain tensors, an example input, output names)."""
    if isinstance(model, Classifier):
        if kind not in (None, "classifier"):
            raise ValueError(f"kind={kind!r} but the model is a Classifier (pass its .encoder for the encoder)")
        encoder, n_leads = model.encoder, len(model.leads)
        if not _exportable(encoder):
            raise TypeError(f"ONNX export takes coreecg's registered encoders, not {type(encoder).__name__} (a "
                            "published encoder: docs/published_encoders.md)")
        wrapper: nn.Module = _ClassifierLogits(model)
        outputs = ["logits"]
    elif _exportable(model):
        if kind not in (None, "encoder"):
            raise ValueError(f"kind={kind!r} but the model is an Encoder")
        encoder, n_leads = model, model.n_leads
        wrapper, outputs = _EncoderOutputs(model), ["pooled", "tokens"]
    else:
        raise TypeError(f"export_onnx takes an Encoder or a Classifier, not {type(model).__name__}")
    example = torch.randn(2, n_leads, _samples(encoder), generator=torch.Generator().manual_seed(0))
    return wrapper.eval(), example.to(next(model.parameters()).device), outputs


def _exportable(model: nn.Module) -> bool:
    """coreecg's ViT or a sequence encoder (a published family's adapter is not exported)."""
    return isinstance(model, (Encoder, SequenceEncoder))


def _samples(encoder: nn.Module) -> int:
    """The example input's length: the ViT's position table (n_patches x patch_size), else the
    model's config (a loaded model carries it) or the paper's 2250."""
    if isinstance(encoder, Encoder):
        return encoder.embed.pos.shape[0] * encoder.patch_size
    info = getattr(encoder, "pretrained_info", None)
    return info.config.model.input_samples if info is not None else 2250


@torch.no_grad()
def _token_shape(model: nn.Module, leads: int, samples: int) -> tuple[int, int]:
    """(tokens, width) of an encoder's output for one input of `leads` x `samples` (measured: the
    ViT's leads x patches, a sequence encoder's steps)."""
    encoder = getattr(model, "encoder", model)
    x = torch.zeros(1, leads, samples, device=next(encoder.parameters()).device)
    lead_idx = getattr(model, "lead_idx", None)
    enc = encoder(x, lead_idx)
    return int(enc.tokens.shape[1]), int(enc.tokens.shape[2])


class _EncoderOutputs(nn.Module):
    """(B, C, T) -> (pooled (B, D), tokens (B, C * N, D)): Encoder.pooled and Encoder(x).tokens."""

    def __init__(self, encoder: Encoder):
        super().__init__()
        self.encoder = encoder

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        enc = self.encoder(x)
        return masked_mean(enc.tokens, enc.valid), enc.tokens     # a short record's padding is not pooled


class _ClassifierLogits(nn.Module):
    """(B, len(leads), T) -> logits (B, K)."""

    def __init__(self, classifier: Classifier):
        super().__init__()
        self.classifier = classifier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(x)["logits"]


def check_onnx(model: nn.Module, onnx_file: str | Path, batch_sizes: Sequence[int] = ONNX_CHECK_BATCHES) -> float:
    """Largest |onnxruntime - PyTorch| over every output for random inputs of each batch size
    (onnxruntime needed)."""
    import onnxruntime as ort

    wrapper, example, _ = _onnx_wrapper(model, None)
    session = ort.InferenceSession(str(onnx_file), providers=["CPUExecutionProvider"])
    worst = 0.0
    gen = torch.Generator().manual_seed(1)
    for b in batch_sizes:
        x = torch.randn(b, *example.shape[1:], generator=gen)
        with torch.no_grad():
            ref = wrapper(x.to(example.device))
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = session.run(None, {"ecg": x.numpy()})
        worst = max(worst, *(float(np.abs(g - r.cpu().numpy()).max()) for g, r in zip(got, ref)))
    return worst
