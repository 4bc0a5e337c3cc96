"""Frequency Dynamic Augmentation (paper, Sec. FDA and Algorithm 1): the view CoRe-ECG's teacher
sees (options: `methods.core.fda`).

The teacher's view is X_aug = irfft(rfft(X) * (A + lambda * Z)) with A = sigmoid(W)
a learnable per-lead frequency-importance map, lambda an inverse-importance noise scale
that is zero on each lead's above-median frequencies and has unit mean elsewhere, and
Z ~ N(0, 1) fresh per sample.

How W learns: W is a parameter of the student side. The contrastive loss compares the
student projection with the teacher projection of X_aug; the teacher's weights are EMA
copies with requires_grad=False, but the teacher forward runs with autograd on, so the
gradient flows through the teacher's activations into X_aug, through irfft/rfft into
A and lambda, and into W. The optimiser updates W; nothing updates the teacher weights
except the EMA.
"""
from __future__ import annotations

import torch
from torch import nn

from coreecg.devices import generator_on


def frequency_dynamic_augment(x: torch.Tensor, weight: torch.Tensor, noise: torch.Tensor,
                              eps: float = 1e-3) -> torch.Tensor:
    """Pure FDA.

    x: (B, C, T) signal; weight W: (C, K) with K = T // 2 + 1; noise Z: (B, C, K) real.
    Returns the augmented view (B, C, T), same dtype as x. Computed in float32 (FFTs in
    reduced precision are neither supported everywhere nor accurate).
    """
    B, C, T = x.shape
    K = T // 2 + 1
    if weight.shape != (C, K):
        raise ValueError(f"FDA weight has shape {tuple(weight.shape)}, expected {(C, K)} for x {tuple(x.shape)}")
    if noise.shape != (B, C, K):
        raise ValueError(f"FDA noise has shape {tuple(noise.shape)}, expected {(B, C, K)}")
    with torch.autocast(device_type=x.device.type, enabled=False):
        A = torch.sigmoid(weight.float())                              # (C, K) importance
        theta = torch.quantile(A, 0.5, dim=-1, keepdim=True)           # (C, 1) per-lead median
        lam = torch.where(A >= theta, torch.zeros_like(A), 1.0 / (eps + A))
        n_nonzero = (lam != 0).sum(-1, keepdim=True).clamp_min(1)
        lam = lam / (lam.sum(-1, keepdim=True) / n_nonzero).clamp_min(1e-12)   # non-zero mean -> 1
        spec = torch.fft.rfft(x.float(), dim=-1)                       # (B, C, K) complex
        out = torch.fft.irfft(spec * (A + lam * noise.float()), n=T, dim=-1)
    return out.to(x.dtype)


class FrequencyDynamicAugmentation(nn.Module):
    """FDA with its importance logits W (C, K) as a parameter (or a frozen buffer).

    W starts at N(0, init_std): with W = 0 every A ties at 0.5, every frequency sits at the
    median threshold, lambda is zero everywhere and X_aug = X / 2 -- no augmentation at all.
    A small random W breaks the tie, so from step 0 half of each lead's bins carry noise.
    """

    def __init__(self, n_leads: int, n_samples: int, eps: float = 1e-3, init_std: float = 0.1,
                 learnable: bool = True, band: tuple[float, float] | None = None, fs: float = 250.0):
        """band=(lo_hz, hi_hz): W starts at +1 inside the band and -1 outside (plus the noise),
        so the band's bins start as the important half; None: noise only."""
        super().__init__()
        self.eps = eps
        w = torch.randn(n_leads, n_samples // 2 + 1) * init_std
        if band is not None:
            freq = torch.arange(n_samples // 2 + 1) * fs / n_samples
            w += torch.where((freq >= band[0]) & (freq <= band[1]), 1.0, -1.0)
        if learnable:
            self.weight = nn.Parameter(w)
        else:
            self.register_buffer("weight", w)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, C, T) -> (B, C, T) with fresh Gaussian noise per sample. lead_idx (C,): the
        standard lead of each row (a one-lead corpus uses its lead's row of W; leads in another order, theirs)."""
        B, C, _ = x.shape
        weight = self.weight if lead_idx is None else self.weight[lead_idx]
        generator = generator_on(generator, x.device)
        noise = torch.randn((B, C, weight.shape[1]), generator=generator, device=x.device)
        return frequency_dynamic_augment(x, weight, noise, self.eps)
