"""What an encoder costs, from a config alone: its parameters and the FLOPs of one training step of
the encoder per sample (forward and backward, counted by torch's FlopCounterMode), for the tables
and benchmarks that put an encoder's size beside its score (docs/encoders.md)."""
from __future__ import annotations

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from coreecg.config import Config
from coreecg.encoders.build import build_encoder


def encoder_cost(config: Config, batch: int = 2) -> dict[str, float]:
    """{"parameters": count, "train_gflop_per_sample": forward + backward GFLOP of the encoder on
    one (n_leads, input_samples) window}; the encoder built from its own generator (the caller's
    RNG untouched), on the CPU. Matrix products and convolutions are what FlopCounterMode counts
    (the S4 kernels' FFTs are not: 3 % of S4's at its paper size, about a quarter at the tiny test size)."""
    key = (repr(config.model), repr(getattr(config.encoders, config.model.arch, None)), tuple(config.plugins), batch)
    if key not in _CACHE:
        _CACHE[key] = _cost(config, batch)
    return dict(_CACHE[key])


_CACHE: dict[tuple, dict[str, float]] = {}       # one count per encoder shape in a process


def _cost(config: Config, batch: int) -> dict[str, float]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        encoder = build_encoder(config).train()
    x = torch.randn(batch, config.model.n_leads, config.model.input_samples)
    counter = FlopCounterMode(display=False)
    # the math kernel: attention as matmuls the counter sees (it has no formula for the CPU's fused one)
    with counter, sdpa_kernel(SDPBackend.MATH):
        encoder.pooled(x).sum().backward()
    params = sum(p.numel() for p in encoder.parameters())
    return {"parameters": float(params), "train_gflop_per_sample": counter.get_total_flops() / batch / 1e9}


__all__ = ["encoder_cost"]
