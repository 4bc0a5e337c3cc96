"""Each block's pooled features of an encoder, from one forward pass (per-layer probes,
coreecg.eval.layer_probe).

Layer i (1-based) is block i's output, passed through the encoder's final norm where it has one
(the ViT's `transformer.norm`, the S4 encoder's `norm`; xresnet1d has none), then pooled as the
encoder's own `pooled` does: the mean over the valid tokens (a short record's padding left out).
So the last layer is exactly the encoder's own pooled output. Forward hooks on the blocks collect
the outputs: no second pass, no Python loop over leads or samples.

Published families (coreecg.model.published) expose no common block list and are refused,
named, by `encoder_blocks`.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.model.encoder import Encoder, masked_mean
from coreecg.model.s4 import S4Encoder, unchunked
from coreecg.model.xresnet1d import XResNet1d

# the encoder kinds with per-layer features (their registry names, for errors)
LAYERED = {Encoder: "coreecg", S4Encoder: "s4", XResNet1d: "xresnet1d"}


def encoder_blocks(encoder: nn.Module) -> tuple[nn.ModuleList, nn.Module, bool]:
    """(blocks in order, the final norm applied to every block's output (Identity if none),
    whether a block's output is channels first (B, D, L) rather than (B, L, D)); ValueError
    naming the encoder's class for a kind without blocks (a published family, a plugin)."""
    if isinstance(encoder, Encoder):
        return encoder.transformer.blocks, encoder.transformer.norm, False
    if isinstance(encoder, S4Encoder):
        return encoder.blocks, encoder.norm, False
    if isinstance(encoder, XResNet1d):
        return encoder.blocks, nn.Identity(), True
    kind = f"{type(encoder).__module__}.{type(encoder).__name__}"
    raise ValueError(f"{kind} exposes no blocks for per-layer features; encoders with per-layer features: "
                     f"{', '.join(LAYERED.values())} (a published family is probed on its pooled output only)")


def n_layers(encoder: nn.Module) -> int:
    """How many layers `pooled_layers` returns (one per block)."""
    return len(encoder_blocks(encoder)[0])


def pooled_layers(encoder: nn.Module, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> list[torch.Tensor]:
    """x: (B, C, T), NaN on a short record's padding -> n_layers tensors (B, D_layer): each block's
    output, normed as the encoder's output is, mean over the valid steps (a CNN stage: over its
    time steps, valid where its share of the input holds a real sample). The last equals
    `encoder.pooled(x, lead_idx)`. The caller chooses the mode (eval for features) and grad."""
    blocks, norm, channels_first = encoder_blocks(encoder)
    outputs: list[torch.Tensor] = []
    hooks = [b.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for b in blocks]
    try:
        with unchunked(encoder):                     # one call of each block per forward
            enc = encoder(x, lead_idx)
    finally:
        for h in hooks:
            h.remove()
    if len(outputs) != len(blocks):
        raise RuntimeError(f"{type(encoder).__name__}: {len(outputs)} block outputs from {len(blocks)} blocks "
                           "(a block ran twice or not at all)")
    pad = None if enc.valid is None else torch.isnan(x).any(dim=1)                 # (B, T) samples
    pooled = []
    for h in outputs:
        tokens = norm(h.transpose(1, 2) if channels_first else h)                  # (B, L, D)
        valid = enc.valid if enc.valid is None or tokens.shape[1] == enc.valid.shape[1] \
            else steps_real(pad, tokens.shape[1])
        pooled.append(masked_mean(tokens, valid))
    return pooled


def steps_real(pad: torch.Tensor, L: int) -> torch.Tensor:
    """pad (B, T) bool, True on padded samples -> (B, L) bool: a step of a sequence of L over T
    samples (ceil(T / L) samples each) is real when any of its samples is (SequenceEncoder's rule)."""
    B, T = pad.shape
    s = -(-T // L)
    return F.pad(~pad, (0, max(0, L * s - T)), value=False)[:, : L * s].reshape(B, L, s).any(dim=2)
