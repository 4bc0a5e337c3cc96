"""(lead, time) patch tokens: shared 1-D conv patch embedding + lead and position embeddings."""
from __future__ import annotations

import torch
from torch import nn


def sincos_positions(n_positions: int, dim: int) -> torch.Tensor:
    """Fixed 1-D sine-cosine table (n_positions, dim), as MAE and ST-MEM use."""
    pos = torch.arange(n_positions, dtype=torch.float64)[:, None]
    freq = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim // 2))
    angles = pos * freq[None, :]
    return torch.cat([angles.sin(), angles.cos()], dim=1).float()


class LeadTimeEmbedding(nn.Module):
    """Learnable lead embeddings (one per standard lead) plus fixed sine-cosine temporal
    position embeddings, added to tokens on the (lead, time) grid; the encoder and each
    decoder own one.

    Fixed unit-scale positions (not a learnable 0.02-scale table) keep the time index
    visible in every token, so a decoder's mask tokens can find the visible tokens of
    their own time step; measured in docs/decisions.md.
    """

    def __init__(self, dim: int, n_leads: int, n_patches: int):
        super().__init__()
        self.lead = nn.Parameter(torch.zeros(n_leads, dim))
        nn.init.trunc_normal_(self.lead, std=0.02)
        self.register_buffer("pos", sincos_positions(n_patches, dim), persistent=False)

    def forward(self, lead_idx: torch.Tensor, n_patches: int) -> torch.Tensor:
        """lead_idx: (C,) indices into the standard lead order -> (C, N, D) to add to tokens."""
        if n_patches > self.pos.shape[0]:
            raise ValueError(f"{n_patches} patches exceed the {self.pos.shape[0]} position embeddings")
        return self.lead[lead_idx][:, None, :] + self.pos[None, :n_patches, :]


class PatchEmbedding(nn.Module):
    """Non-overlapping 1-D convolution (kernel = stride = patch size) shared by all leads."""

    def __init__(self, patch_size: int, dim: int):
        super().__init__()
        self.patch_size = patch_size
        self.conv = nn.Conv1d(1, dim, kernel_size=patch_size, stride=patch_size)
        nn.init.xavier_uniform_(self.conv.weight.view(dim, -1))
        nn.init.zeros_(self.conv.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C, T) -> (B, C, N, D), N = T // patch_size (a trailing remainder is cut)."""
        B, C, T = x.shape
        N = T // self.patch_size
        tokens = self.conv(x[..., : N * self.patch_size].reshape(B * C, 1, N * self.patch_size))
        return tokens.view(B, C, -1, N).transpose(2, 3)


def patchify(x: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, T) -> (B, C, N, P): the reconstruction targets."""
    B, C, T = x.shape
    N = T // patch_size
    return x[..., : N * patch_size].reshape(B, C, N, patch_size)
