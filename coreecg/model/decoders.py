"""Time Decoder, Latent Decoder and the projection head."""
from __future__ import annotations

import torch
from torch import nn

from coreecg.model.embed import LeadTimeEmbedding
from coreecg.model.encoder import Encoded, _with_a_key, masked_mean
from coreecg.model.layers import Transformer, init_weights


class GridDecoder(nn.Module):
    """Visible encodings back on the full (lead, time) grid, a learnable mask token at every
    masked and dropped position, lead and position embeddings added again, then a transformer.

    layout="joint": one sequence of all C * N tokens per sample. layout="lead": one sequence
    of N tokens per lead (B * C sequences, shared weights, ST-MEM's decoder), so each lead's
    mask tokens attend to that lead's own visible encodings, which already carry the other
    leads' information from the joint encoder. layout="axial": blocks alternate between
    within-lead sequences (N tokens) and within-time-column sequences (C tokens), so a masked
    token reaches both its lead's visible patches and the visible leads of its own time step
    through short sequences.
    """

    def __init__(self, enc_dim: int, dim: int, depth: int, num_heads: int, n_leads: int, n_patches: int,
                 mlp_ratio: float = 4.0, dropout: float = 0.0, layout: str = "joint"):
        super().__init__()
        if layout not in ("joint", "lead", "axial"):
            raise ValueError(f"decoder layout must be 'joint', 'lead' or 'axial', got {layout!r}")
        self.layout = layout
        self.input = nn.Linear(enc_dim, dim)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.embed = LeadTimeEmbedding(dim, n_leads, n_patches)
        self.transformer = Transformer(dim, depth, num_heads, mlp_ratio, dropout)
        nn.init.normal_(self.mask_token, std=0.02)
        init_weights(self.transformer)
        init_weights(self.input)

    def forward(self, enc: Encoded, lead_idx: torch.Tensor) -> torch.Tensor:
        """enc: student output (tokens (B, L, enc_dim)); lead_idx: (C,) -> (B, C * N, dim)."""
        C, N = enc.grid
        h = self.input(enc.tokens)
        B, _, D = h.shape
        # Padding is scattered into a spare slot C * N that is cut off afterwards.
        index = enc.index if enc.valid is None else torch.where(enc.valid, enc.index, C * N)
        grid = self.mask_token.to(h.dtype).expand(B, C * N + 1, D)
        grid = grid.scatter(1, index[..., None].expand(-1, -1, D), h)[:, : C * N]
        grid = grid + self.embed(lead_idx, N).reshape(C * N, D).to(h.dtype)
        # A short record's padded positions (enc.pad) are never attended to (no key).
        real = None if enc.pad is None else ~enc.pad
        if self.layout == "lead":   # (B, C * N, D) -> (B * C, N, D): a view, leads are contiguous
            keys = None if real is None else _with_a_key(real.reshape(B * C, N))
            return self.transformer(grid.reshape(B * C, N, D), keys).reshape(B, C * N, D)
        if self.layout == "axial":
            x, run = grid.view(B, C, N, D), self.transformer.run_block
            lead_keys = col_keys = None
            if real is not None:
                lead_keys = _with_a_key(real.reshape(B * C, N))[:, None, None, :]
                col_keys = _with_a_key(real.view(B, C, N).transpose(1, 2).reshape(B * N, C))[:, None, None, :]
            for i in range(len(self.transformer.blocks)):
                if i % 2 == 0:      # within each lead: (B * C, N, D)
                    x = run(i, x.reshape(B * C, N, D), lead_keys).view(B, C, N, D)
                else:               # within each time column: (B * N, C, D)
                    x = run(i, x.transpose(1, 2).reshape(B * N, C, D), col_keys).view(B, N, C, D).transpose(1, 2)
            return self.transformer.norm(x).reshape(B, C * N, D)
        return self.transformer(grid, None if real is None else _with_a_key(real))


class TimeDecoder(GridDecoder):
    """Predicts the P samples of every (lead, time) patch."""

    def __init__(self, enc_dim: int, dim: int, depth: int, num_heads: int, n_leads: int, n_patches: int,
                 patch_size: int, mlp_ratio: float = 4.0, dropout: float = 0.0, layout: str = "joint"):
        super().__init__(enc_dim, dim, depth, num_heads, n_leads, n_patches, mlp_ratio, dropout, layout)
        self.head = nn.Linear(dim, patch_size)
        init_weights(self.head)

    def forward(self, enc: Encoded, lead_idx: torch.Tensor) -> torch.Tensor:
        """-> reconstruction (B, C, N, P)."""
        C, N = enc.grid
        out = self.head(super().forward(enc, lead_idx))
        return out.view(out.shape[0], C, N, -1)


class LatentDecoder(GridDecoder):
    """Infers the global embedding of the whole signal from its visible part (mean pooled)."""

    def forward(self, enc: Encoded, lead_idx: torch.Tensor) -> torch.Tensor:
        """-> (B, dim): the mean over the grid's real positions (a short record's padding left out)."""
        return masked_mean(super().forward(enc, lead_idx), None if enc.pad is None else ~enc.pad)


class Projection(nn.Module):
    """Two-layer MLP head mapping a global embedding into the contrastive space: (B, D) -> (B, out)."""

    def __init__(self, dim: int, hidden: int, out: int):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, out))
        init_weights(self.net)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z)
