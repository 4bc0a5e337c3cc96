"""Random ECG views for view-based contrastive methods (MoCo v3): the augmentations published ECG
contrastive baselines use (docs/baselines.md), each drawn per sample and applied to the whole
batch at once (no per-sample or per-lead Python loop)."""
from __future__ import annotations

import math
import torch

from coreecg.methods.view_options import ViewsConfig  # noqa: F401  (its options, re-exported)
from coreecg.devices import generator_on


def _uniform(shape: tuple[int, ...], low: float, high: float, generator, device) -> torch.Tensor:
    return low + (high - low) * torch.rand(shape, generator=generator, device=device)


def resized_crop(x: torch.Tensor, scale: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """Random resized crop: x (B, C, T); scale (B,) kept fraction in (0, 1]; start (B,) in [0, 1]
    (the crop's start as a fraction of the room left). The kept stretch [s, s + scale * T) is
    resampled to T samples by linear interpolation: one gather per neighbour, no loop."""
    B, C, T = x.shape
    length = scale * T                                                   # (B,)
    offset = start * (T - length)                                        # (B,)
    pos = offset[:, None] + (torch.arange(T, device=x.device) + 0.5)[None, :] * (length / T)[:, None] - 0.5
    pos = pos.clamp(0, T - 1)
    left = pos.floor().long()
    right = (left + 1).clamp(max=T - 1)
    w = (pos - left).to(x.dtype)[:, None, :]                             # (B, 1, T)
    gather = lambda idx: torch.take_along_dim(x, idx[:, None, :].expand(B, C, T), dim=2)   # noqa: E731
    return gather(left) * (1 - w) + gather(right) * w


def time_mask(x: torch.Tensor, fraction: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    """"Time out": zero one contiguous stretch of `fraction` (B,) of the window on every lead,
    starting at `start` (B,) in [0, 1] of the room left. x: (B, C, T) -> (B, C, T)."""
    T = x.shape[-1]
    t = torch.arange(T, device=x.device)[None, :]
    length = (fraction * T).round()                                      # whole samples
    begin = (start * (T - length)).round()
    keep = (t < begin[:, None]) | (t >= (begin + length)[:, None])
    return x * keep[:, None, :].to(x.dtype)


def random_view(x: torch.Tensor, cfg: ViewsConfig, fs: float, generator: torch.Generator | None = None
                ) -> torch.Tensor:
    """One random view of each window: resized crop -> per-lead gain -> baseline shift ->
    baseline wander -> Gaussian noise -> time out (each only when enabled in `cfg`).
    x: (B, C, T) float -> (B, C, T) float32.

    Every random draw comes from `generator` (on x's device, or a device generator seeded from
    it), so a seeded step gives the same views.
    """
    g = generator_on(generator, x.device)
    B, C, T = x.shape
    dev = x.device
    x = x.float()
    if cfg.crop_min < 1:
        x = resized_crop(x, _uniform((B,), cfg.crop_min, 1.0, g, dev), torch.rand((B,), generator=g, device=dev))
    if cfg.gain_max > 1:
        log_g = math.log(cfg.gain_max)
        x = x * _uniform((B, C, 1), -log_g, log_g, g, dev).exp()
    if cfg.baseline_shift > 0:
        x = x + _uniform((B, C, 1), -cfg.baseline_shift, cfg.baseline_shift, g, dev)
    if cfg.baseline_wander > 0:     # respiration-like drift
        freq = _uniform((B, C, 1), 0.05, 0.5, g, dev)
        phase = _uniform((B, C, 1), 0.0, 2 * math.pi, g, dev)
        amp = _uniform((B, C, 1), 0.0, cfg.baseline_wander, g, dev)
        t = torch.arange(T, device=dev, dtype=torch.float32) / fs
        x = x + amp * torch.sin(2 * math.pi * freq * t + phase)
    if cfg.noise_std > 0:
        x = x + cfg.noise_std * torch.randn((B, C, T), generator=g, device=dev)
    if cfg.time_mask_max > 0:
        fraction = _uniform((B,), cfg.time_mask_min, cfg.time_mask_max, g, dev)
        x = time_mask(x, fraction, torch.rand((B,), generator=g, device=dev))
    return x
