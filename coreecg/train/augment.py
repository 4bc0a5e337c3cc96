"""Fine-tuning's augmentation policy (finetune.augment): `ecg_randaugment`, RandAugment for ECG
training crops, over the kinds of operation ST-MEM's fine-tuning draws from, in this package's
own definitions. Pretraining views belong to their methods (CoRe-ECG's FDA:
coreecg.methods.core_ecg.fda; MoCo v3's: coreecg.methods.views).

Each op: (x (n, C, T) finite, magnitude m in [0, 1], device generator, fs Hz) -> (n, C, T).
Strengths grow linearly with m and are relative to each lead's own spread (its std in the
crop), so they mean the same on any corpus normalisation.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import torch

from coreecg.config import FINETUNE_AUGMENT_OPS
from coreecg.devices import generator_on


def _rand(x: torch.Tensor, shape: tuple[int, ...], g: torch.Generator | None) -> torch.Tensor:
    return torch.rand(shape, generator=g, device=x.device, dtype=torch.float32)


def _spread(x: torch.Tensor) -> torch.Tensor:
    """(n, C, T) -> (n, C, 1): each lead's std in the crop (1 for a flat lead: still perturbed)."""
    s = x.float().std(dim=-1, keepdim=True)
    return torch.where(s > 1e-6, s, torch.ones_like(s))


def _segment(x: torch.Tensor, lo: float, hi: float, g: torch.Generator | None) -> torch.Tensor:
    """(n, 1, T) bool: per sample one window of a random length in [lo, hi] * T, at a random place."""
    n, _, T = x.shape
    length = (lo + (hi - lo) * _rand(x, (n, 1, 1), g)) * T
    start = _rand(x, (n, 1, 1), g) * (T - length)
    t = torch.arange(T, device=x.device)
    return (t >= start) & (t < start + length)


def _wave(x: torch.Tensor, lo_hz: float, hi_hz: float, fs: float, g: torch.Generator | None) -> torch.Tensor:
    """(n, 1, T) sinusoid of a random frequency in [lo_hz, hi_hz] and a random phase."""
    n, _, T = x.shape
    freq = lo_hz + (hi_hz - lo_hz) * _rand(x, (n, 1, 1), g)
    phase = 2 * math.pi * _rand(x, (n, 1, 1), g)
    return torch.sin(2 * math.pi * freq * torch.arange(T, device=x.device) / fs + phase)


def _amplitude(x: torch.Tensor, scale: float, m: float, g: torch.Generator | None) -> torch.Tensor:
    """(n, C, 1): per lead, uniform in [0, scale * m] of the lead's spread."""
    return scale * m * _rand(x, x.shape[:2] + (1,), g) * _spread(x)


def _erase(x, m, g, fs):      # whole leads set to 0 (a lead off), each with probability m / 2
    return x * (_rand(x, x.shape[:2] + (1,), g) >= 0.5 * m)


def _flip(x, m, g, fs):       # sign inversion (reversed electrode polarity); no strength
    return -x


def _drop(x, m, g, fs):       # single samples set to 0 (dropouts), each with probability m / 10
    return x * (_rand(x, tuple(x.shape), g) >= 0.1 * m)


def _cutout(x, m, g, fs):     # one window of up to m / 4 of the crop set to 0 on every lead
    return x * ~_segment(x, 0.0, 0.25 * m, g)


def _shift(x, m, g, fs):      # the crop shifted by up to m / 4 of its length either way, zeros shifted in
    n, C, T = x.shape
    shift = ((2 * _rand(x, (n, 1, 1), g) - 1) * 0.25 * m * T).round().long()
    src = torch.arange(T, device=x.device) - shift
    inside = (src >= 0) & (src < T)
    return torch.gather(x, -1, src.clamp(0, T - 1).expand(n, C, T)) * inside


def _sine(x, m, g, fs):       # baseline wander: a 0.05-1 Hz sinusoid of up to m / 2 of each lead's spread
    return x + _amplitude(x, 0.5, m, g) * _wave(x, 0.05, 1.0, fs, g)


def _square(x, m, g, fs):     # a square wave of the same range (step-like baseline jumps)
    return x + _amplitude(x, 0.5, m, g) * torch.sign(_wave(x, 0.05, 1.0, fs, g))


def _partial_sine(x, m, g, fs):    # a 1-10 Hz sinusoid on one stretch (motion artefact)
    wave = _wave(x, 1.0, 10.0, fs, g) * _segment(x, 0.1, 0.5, g)
    return x + _amplitude(x, 0.5, m, g) * wave


def _partial_noise(x, m, g, fs):   # white noise of up to m / 2 of the spread on one stretch (EMG burst)
    noise = torch.randn(tuple(x.shape), generator=g, device=x.device) * _segment(x, 0.1, 0.5, g)
    return x + _amplitude(x, 0.5, m, g) * noise


def _noise(x, m, g, fs):           # white noise of up to m / 5 of the spread everywhere
    return x + _amplitude(x, 0.2, m, g) * torch.randn(tuple(x.shape), generator=g, device=x.device)


Op = Callable[[torch.Tensor, float, "torch.Generator | None", float], torch.Tensor]
FINETUNE_OPS: dict[str, Op] = {
    "erase": _erase, "flip": _flip, "drop": _drop, "cutout": _cutout, "shift": _shift, "sine": _sine,
    "square": _square, "partial_sine": _partial_sine, "partial_noise": _partial_noise, "noise": _noise}
assert tuple(FINETUNE_OPS) == FINETUNE_AUGMENT_OPS   # the config validates names against its own list


def ecg_randaugment(x: torch.Tensor, ops: Sequence[str], num_ops: int, magnitude: float, prob: float,
                    generator: torch.Generator | None = None, fs: float = 250.0) -> torch.Tensor:
    """RandAugment for ECG training crops: x (B, C, T) -> (B, C, T), same dtype.

    Per sample, `num_ops` rounds: each draws one of `ops` (uniformly, with replacement) and
    applies it with probability `prob` at strength `magnitude`. The draws of which op each
    sample gets come from `generator` (the loop's host generator: no device sync); an op then
    runs once per round on the samples that drew it (loops over ops, never over samples), its
    own random numbers from a device generator seeded from `generator`: the same generator
    state gives the same output. NaN (a short record's padding, the model's padding mask)
    stays NaN and nowhere else becomes NaN. Training only: evaluation never calls it.
    """
    if not ops:
        return x
    unknown = [o for o in ops if o not in FINETUNE_OPS]
    if unknown:
        raise ValueError(f"unknown augmentation op(s) {unknown}; known: {', '.join(FINETUNE_OPS)}")
    B = x.shape[0]
    host = generator.device if generator is not None else torch.device("cpu")
    choice = torch.randint(len(ops), (num_ops, B), generator=generator, device=host)
    applied = torch.rand((num_ops, B), generator=generator, device=host) < prob
    g = generator_on(generator, x.device)
    pad = torch.isnan(x)
    out = x.float().nan_to_num(0.0)
    for r in range(num_ops):
        for k, name in enumerate(ops):
            idx = torch.nonzero(applied[r] & (choice[r] == k)).flatten()
            if len(idx):
                idx = idx.to(x.device)
                out[idx] = FINETUNE_OPS[name](out[idx], magnitude, g, fs)
    return out.masked_fill(pad, float("nan")).to(x.dtype)
