"""Pre-norm transformer blocks shared by the encoder and both decoders."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Attention(nn.Module):
    """Multi-head self-attention on fused SDPA kernels.

    `batched_up_to` (0: off): sequences of at most this many tokens take plain batched matmuls
    and a softmax instead of SDPA: a fused GPU kernel works in 64- or 128-row tiles whatever the
    length, so the axial Time Decoder's 30- and 12-token sequences leave most of each tile idle
    (`bench.pretrain_step --short-attention N`; docs/decisions.md). The same numbers up to float
    rounding (tests/test_layers.py).
    """

    def __init__(self, dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout
        self.batched_up_to = 0

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, D); attn_mask: (B, 1, 1, L) bool, True = may attend (padding is False)."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.num_heads, D // self.num_heads).permute(2, 0, 3, 1, 4)
        dropout = self.dropout if self.training else 0.0
        if self.batched_up_to and L <= self.batched_up_to:     # no guard on L when off
            out = batched_attention(q, k, v, attn_mask, dropout)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout)
        return self.proj(out.transpose(1, 2).reshape(B, L, D))


def batched_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None = None,
                      dropout_p: float = 0.0) -> torch.Tensor:
    """SDPA's result in batched matmuls: q, k, v (B, h, L, d); attn_mask broadcastable to
    (B, h, L, L), bool, True = may attend -> (B, h, L, d). The scores are (B, h, L, L): for short
    sequences only. The softmax runs in float32 (as the fused kernels accumulate)."""
    B, h, L, d = q.shape
    # 3-D bmm on (B*h, L, d), the scale on q: a form inductor does not rewrite back into SDPA
    scores = torch.bmm((q * d ** -0.5).reshape(B * h, L, d), k.reshape(B * h, L, d).transpose(1, 2))
    scores = scores.view(B, h, L, L).float()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    probs = scores.softmax(-1)
    if dropout_p:
        probs = F.dropout(probs, dropout_p)
    return torch.bmm(probs.to(v.dtype).view(B * h, L, L), v.reshape(B * h, L, d)).view(B, h, L, d)


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads, dropout)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout),
                                 nn.Linear(hidden, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), attn_mask)
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    """A stack of pre-norm blocks followed by a final LayerNorm.

    checkpointing (train.activation_checkpointing): under autograd each block keeps only its
    input and is recomputed in backward (same values; less memory, one more block forward).
    """

    def __init__(self, dim: int, depth: int, num_heads: int, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, num_heads, mlp_ratio, dropout) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.checkpointing = False

    def run_block(self, i: int, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Block i on x (B, L, D) -> (B, L, D), recomputed in backward when checkpointing."""
        if self.checkpointing and torch.is_grad_enabled():
            return checkpoint(self.blocks[i], x, attn_mask, use_reentrant=False)
        return self.blocks[i](x, attn_mask)

    def forward(self, x: torch.Tensor, valid: torch.Tensor | None = None, varying: bool = False) -> torch.Tensor:
        """x: (B, L, D); valid: (B, L) bool, False marks padding keys. Returns (B, L, D).

        varying: L changes from batch to batch (bernoulli STDM's visible sets). A compiled block
        (train.compile) then compiles one graph for every L at its first call, instead of one for
        the first L and a dynamic one when a second L comes (a recompilation of seconds, mid-run).
        """
        attn_mask = None if valid is None else valid[:, None, None, :]
        if varying:
            torch._dynamo.maybe_mark_dynamic(x, 1)
            if attn_mask is not None:
                torch._dynamo.maybe_mark_dynamic(attn_mask, 3)
        for i in range(len(self.blocks)):
            x = self.run_block(i, x, attn_mask)
        return self.norm(x)


def init_weights(module: nn.Module) -> None:
    """MAE-style init: xavier-uniform linears, zero biases, unit LayerNorms."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.xavier_uniform_(m.weight)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
