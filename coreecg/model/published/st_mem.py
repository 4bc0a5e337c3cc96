"""ST-MEM (Na et al., ICLR 2024): its published encoder, read as data and run by coreecg's own code.

ST-MEM publishes two checkpoints, both `torch.save` dicts whose "model" entry is a state dict:

    encoder   {"epoch", "model": the ViT encoder's state dict, "config": {"width", "depth", "heads", ...}}
    full      {"epoch", "model": the pretraining model's: the encoder under "encoder.", plus a decoder}

Keys of the encoder (D width, P patch size, N patches per lead, K the block index):

    pos_embedding (1, N + 2, D)             position 0: the leading SEP, 1..N: patches, N + 1: trailing SEP
    sep_embedding (D,)                      the SEP token
    to_patch_embedding.{1,2,3}              LayerNorm(P) -> Linear(P, D) -> LayerNorm(D) of each patch
    lead_embeddings.{0..11} (D,)            one per standard lead (I, II, III, aVR, aVL, aVF, V1-V6)
    blockK.attn.norm, blockK.attn.fn.to_qkv (bias), blockK.attn.fn.to_out.0    pre-norm attention
    blockK.ff.norm, blockK.ff.fn.net.0, blockK.ff.fn.net.3                       pre-norm Linear-GELU-Linear
    norm                                    the final LayerNorm, applied to the pooled feature

The computation (the paper's description, checked against the official features in
tests/test_published_encoders.py): each lead's patch sequence is wrapped by a SEP token at each
end (SEP + the first / last position embedding), patches get positions 1..n, every token of a
lead gets that lead's embedding, and all leads' tokens form one sequence for the transformer.
The pooled feature is the final LayerNorm of the mean over leads and patches of the last
block's patch tokens (SEP tokens left out).

The architecture is read from the state dict: width from sep_embedding, patch size from the
patch LayerNorm, patches per lead from pos_embedding (input samples = N * P), depth from the
block keys, the MLP width from ff.fn.net.0, leads from the lead embeddings. The head count is not
in the weights: the checkpoint's own "config" entry gives it when it has one (the encoder
checkpoint does), else the attention width / 64 (ST-MEM's head width: its ViT-B/75 is 768 / 12
heads, ViT-S/75 384 / 6).

No ST-MEM code is used (its licence is CC BY-NC 4.0): this module names its parameters as the
published state dicts do, so those load with `load_state_dict` unchanged.
"""
from __future__ import annotations

import re
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ModelConfig, PreprocessConfig
from coreecg.config.encoders import EncoderOptions
from coreecg.encoders.options import StMemOptions
from coreecg.model.encoder import Encoded, default_lead_idx, masked_mean
from coreecg.model.padding import fill, padding_mask
from coreecg.encoders.build import register_encoder
from coreecg.model.published.registry import PublishedFamily, register

NAME = "st_mem"
HEAD_WIDTH = 64                       # ST-MEM's dim_head: heads = attention width / 64 when not recorded
_BLOCK = re.compile(r"^block(\d+)\.")
_REQUIRED = ("pos_embedding", "sep_embedding", "to_patch_embedding.1.weight", "to_patch_embedding.2.weight",
             "lead_embeddings.0", "norm.weight", "block0.attn.fn.to_qkv.weight", "block0.ff.fn.net.0.weight")

# ST-MEM's downstream input (its configs/downstream/st_mem.yaml): 250 Hz, 2,250-sample crops,
# high-pass 0.67 Hz and low-pass 40 Hz, standardised over leads and time together.
CONTRACT = PreprocessConfig(sampling_rate=250, highpass_hz=0.67, lowpass_hz=40.0, standardize="record")


class _PreNorm(nn.Module):
    """x -> fn(LayerNorm(x)); the residual is added by the block."""

    def __init__(self, dim: int, fn: nn.Module):
        super().__init__()
        self.norm, self.fn = nn.LayerNorm(dim), fn

    def forward(self, x: torch.Tensor, *args: Any) -> torch.Tensor:
        return self.fn(self.norm(x), *args)


class _Attention(nn.Module):
    """Multi-head self-attention with a fused biased qkv projection, on SDPA (scale 1/sqrt(head width))."""

    def __init__(self, dim: int, heads: int, inner: int, dropout: float):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.to_qkv = nn.Linear(dim, 3 * inner)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, D); attn_mask: (B, 1, 1, L) bool, True = may attend. -> (B, L, D)."""
        B, L, _ = x.shape
        q, k, v = self.to_qkv(x).view(B, L, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        return self.to_out(out.transpose(1, 2).reshape(B, L, -1))


class _FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, dim),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class _Block(nn.Module):
    def __init__(self, dim: int, heads: int, hidden: int, dropout: float):
        super().__init__()
        self.attn = _PreNorm(dim, _Attention(dim, heads, dim, dropout))
        self.ff = _PreNorm(dim, _FeedForward(dim, hidden, dropout))

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(x, attn_mask)
        return x + self.ff(x)


class STMemEncoder(nn.Module):
    """ST-MEM's ViT encoder behind coreecg's `Encoder` interface (`pooled`, `forward` -> Encoded).

    Any subset of the standard leads can be fed: `lead_idx` (C,) names the standard lead of each
    input row and picks its lead embedding (default: the first C in standard order), as for
    coreecg's Encoder. Inputs up to `n_patches * patch_size` samples (a trailing remainder of a
    patch is cut); the trailing SEP always takes the table's last position, as in ST-MEM.
    """

    def __init__(self, n_leads: int = 12, n_patches: int = 30, patch_size: int = 75, dim: int = 768,
                 depth: int = 12, num_heads: int = 12, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.n_leads, self.n_patches, self.patch_size, self.dim = n_leads, n_patches, patch_size, dim
        self.depth = depth
        self.pos_embedding = nn.Parameter(torch.randn(1, n_patches + 2, dim) * 0.02)
        self.sep_embedding = nn.Parameter(torch.randn(dim) * 0.02)
        self.to_patch_embedding = nn.Sequential(nn.Identity(), nn.LayerNorm(patch_size), nn.Linear(patch_size, dim),
                                                nn.LayerNorm(dim))
        self.lead_embeddings = nn.ParameterList(nn.Parameter(torch.randn(dim) * 0.02) for _ in range(n_leads))
        hidden = int(round(dim * mlp_ratio))
        for k in range(depth):
            self.add_module(f"block{k}", _Block(dim, num_heads, hidden, dropout))
        self.dropout = nn.Dropout(dropout)
        self.norm = nn.LayerNorm(dim)
        self.source = ""                  # the weights' file, named in errors (set by coreecg.loading)

    @classmethod
    def from_config(cls, config: Config) -> "STMemEncoder":
        """From a Config: its input (`model`) and sizes (`encoders.st_mem`, read from the weights)."""
        o = config.encoders.st_mem
        return cls(config.model.n_leads, config.n_patches, o.patch_size, o.embed_dim, o.depth, o.num_heads,
                   o.mlp_ratio, o.dropout)

    def tokens(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, C, T) -> embedded tokens (B, C, n + 2, D) before the transformer: SEP, n patches, SEP."""
        B, C, T = x.shape
        n = T // self.patch_size
        if n > self.n_patches or n == 0:
            raise ValueError(f"{self.source or 'ST-MEM encoder'}: input of {T} samples is {n} patches of "
                             f"{self.patch_size}; this ST-MEM encoder's "
                             f"position table covers 1..{self.n_patches} patches "
                             f"({self.n_patches * self.patch_size} samples)")
        if lead_idx is None:
            lead_idx = default_lead_idx(C, x.device, self.n_leads)
        patches = x[..., : n * self.patch_size].reshape(B, C, n, self.patch_size)
        t = self.to_patch_embedding(patches) + self.pos_embedding[:, 1: n + 1][:, None]      # (B, C, n, D)
        pos = self.pos_embedding[0]
        sep = (self.sep_embedding + pos[[0, -1]]).to(t.dtype)                               # (2, D)
        t = torch.cat([sep[0].expand(B, C, 1, -1), t, sep[1].expand(B, C, 1, -1)], dim=2)
        lead = torch.stack(list(self.lead_embeddings))[lead_idx].to(t.dtype)                # (C, D)
        return t + lead[None, :, None, :]

    def _blocks(self, x: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, L, D); valid: (B, L) bool, False marks padding keys -> the last block's (B, L, D)."""
        attn_mask = None if valid is None else valid[:, None, None, :]
        x = self.dropout(x)
        for k in range(self.depth):
            x = getattr(self, f"block{k}")(x, attn_mask)
        return x

    def _patch_tokens(self, x: torch.Tensor, lead_idx: torch.Tensor | None,
                      pad: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, C, T), NaN-free; pad: (B, C, n) bool, True on a short record's padded patches
        (never attended to) or None -> the last block's patch tokens (B, C, n, D), SEP dropped."""
        t = self.tokens(x, lead_idx)
        B, C, n2, D = t.shape
        return self._blocks(t.reshape(B, C * n2, D), _keys(pad)).view(B, C, n2, D)[:, :, 1:-1]

    def forward(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None,
                visible: torch.Tensor | None = None) -> Encoded:
        """x: (B, C, T); visible: (B, C, n) bool or None (= every patch). -> Encoded: each patch
        token's encoding (the final LayerNorm applied per token) on the (C, n) grid; the SEP
        tokens always attend and are not returned.

        With `visible`, only the SEP and visible patch tokens enter the transformer (padded to
        the batch maximum, padding masked out of attention), as coreecg's Encoder does.
        """
        pad, x = _padding(x, self.patch_size)
        if visible is None:
            out = self._patch_tokens(x, lead_idx, pad)
            B, C, n, D = out.shape
            valid = None if pad is None else ~pad.reshape(B, C * n)
            return Encoded(self.norm(out.reshape(B, C * n, D)), torch.arange(C * n, device=x.device).expand(B, -1),
                           valid, (C, n), None if pad is None else pad.reshape(B, C * n))
        t = self.tokens(x, lead_idx)
        B, C, n2, D = t.shape
        n = n2 - 2
        visible = visible.to(x.device).reshape(B, C, n)
        if pad is not None:
            visible = visible & ~pad             # a short record's padding is never a visible patch
        # rank 0: SEP (always first, 2C of them), 1: visible patch, 2: hidden patch; a stable sort
        # keeps grid order within each rank, so the first 2C positions are the SEP tokens
        rank = torch.cat([torch.zeros(B, C, 1, dtype=torch.int8, device=x.device), 2 - visible.to(torch.int8),
                          torch.zeros(B, C, 1, dtype=torch.int8, device=x.device)], dim=2).reshape(B, C * n2)
        counts = visible.reshape(B, C * n).sum(1)
        longest = int(counts.max()) + 2 * C
        order = torch.argsort(rank, dim=1, stable=True)[:, :longest]
        valid = torch.arange(longest, device=x.device)[None, :] < (counts + 2 * C)[:, None]
        gathered = torch.gather(t.reshape(B, C * n2, D), 1, order[..., None].expand(-1, -1, D))
        out = self._blocks(gathered, None if bool(valid.all()) else valid)[:, 2 * C:]
        grid = order[:, 2 * C:]                                   # (lead, position) in the SEP-wrapped grid
        index = (grid // n2) * n + grid % n2 - 1                 # -> c * n + patch
        valid = valid[:, 2 * C:]
        return Encoded(self.norm(out), index, None if bool(valid.all()) else valid, (C, n))

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """ST-MEM's feature: (B, C, T) -> (B, D), the final LayerNorm of the mean over leads and
        patches of the last block's patch tokens (the norm after the mean, not before)."""
        pad, x = _padding(x, self.patch_size)
        tokens = self._patch_tokens(x, lead_idx, pad)
        B, C, n, D = tokens.shape
        if pad is None:
            return self.norm(tokens.mean(dim=(1, 2)))
        return self.norm(masked_mean(tokens.reshape(B, C * n, D), ~pad.reshape(B, C * n)))


def _padding(x: torch.Tensor, patch_size: int) -> tuple[torch.Tensor | None, torch.Tensor]:
    """A short record's padding (NaN, coreecg.model.padding): (B, C, n) bool or None when the
    batch has none (ST-MEM's own arithmetic, unmasked), and x with NaN set to 0."""
    pad = padding_mask(x, patch_size)
    return (pad if bool(pad.any()) else None), fill(x)


def _keys(pad: torch.Tensor | None) -> torch.Tensor | None:
    """(B, C, n) padded patches -> (B, C * (n + 2)) attention keys: both SEP tokens of every lead
    and its real patches."""
    if pad is None:
        return None
    sep = torch.ones(*pad.shape[:2], 1, dtype=torch.bool, device=pad.device)
    return torch.cat([sep, ~pad, sep], dim=2).reshape(pad.shape[0], -1)


# ---------------------------------------------------------------------------- reading the weights


def recognise(state: dict[str, Any]) -> dict[str, torch.Tensor] | None:
    """A state dict -> the ST-MEM encoder's state (the full model's "encoder." prefix removed),
    or None when it is not ST-MEM's."""
    for prefix in ("", "encoder."):
        sub = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        if all(k in sub for k in _REQUIRED):
            return {k: v for k, v in sub.items() if _is_encoder_key(k)}
    return None


def _is_encoder_key(key: str) -> bool:
    root = key.split(".", 1)[0]
    return root in ("pos_embedding", "sep_embedding", "to_patch_embedding", "lead_embeddings", "norm") \
        or _BLOCK.match(key) is not None


def read_architecture(state: dict[str, torch.Tensor], recorded: dict[str, Any] | None = None) -> Config:
    """The config of an ST-MEM encoder state dict (defaults elsewhere): `model` (arch "st_mem", its
    leads and input samples) and `encoders.st_mem` (its sizes); ValueError for one whose shapes do
    not fit together. `recorded`: the checkpoint's own "config" entry (heads)."""
    dim = int(state["sep_embedding"].shape[0])
    patch = int(state["to_patch_embedding.1.weight"].shape[0])
    n_patches = int(state["pos_embedding"].shape[1]) - 2
    depth = 1 + max(int(m.group(1)) for m in map(_BLOCK.match, state) if m)
    n_leads = len([k for k in state if k.startswith("lead_embeddings.")])
    inner = int(state["block0.attn.fn.to_qkv.weight"].shape[0]) // 3
    hidden = int(state["block0.ff.fn.net.0.weight"].shape[0])
    if inner != dim:
        raise ValueError(f"attention width {inner} differs from the model width {dim} (not supported)")
    heads = (recorded or {}).get("heads")
    heads = int(heads) if isinstance(heads, int) and heads > 0 else max(1, inner // HEAD_WIDTH)
    if inner % heads or n_patches < 1 or n_leads < 1:
        raise ValueError(f"inconsistent shapes: width {dim}, {heads} heads, {n_patches} patches, {n_leads} leads")
    missing = [k for d in range(depth) for k in (f"block{d}.attn.fn.to_qkv.weight", f"block{d}.ff.fn.net.3.weight")
               if k not in state]
    if missing:
        raise ValueError(f"blocks missing: {missing[:3]}")
    sizes = StMemOptions(patch_size=patch, embed_dim=dim, depth=depth, num_heads=heads, mlp_ratio=hidden / dim)
    return Config(model=ModelConfig(arch=NAME, n_leads=n_leads, input_samples=n_patches * patch),
                  encoders=EncoderOptions({NAME: sizes}))


STMemEncoder.output_kind = "grid"
register_encoder(NAME)(STMemEncoder)
register(PublishedFamily(
    name=NAME, title="ST-MEM (Na et al., ICLR 2024)", label="ST-MEM", recognise=recognise,
    read_architecture=read_architecture,
    build=STMemEncoder.from_config, preprocess=CONTRACT, module="coreecg.model.published.st_mem.STMemEncoder",
    licence="CC BY-NC 4.0 (bakqui/ST-MEM, non-commercial); check it before any commercial use",
    pooling="final LayerNorm of the mean over leads and patches of the last block's patch tokens",
    normalisation="z-score over leads and time together (each window)",
    pretraining="ST-MEM's own pretraining data (Chapman, Ningbo, CODE-15 per the paper); not checked "
                "by coreecg's leakage guard",
    pretrained_on=("chapman", "ningbo", "code15"), commercial_use=False,
    releases=(("st_mem_vit_base_encoder.pth", "bakqui/ST-MEM's README (its Google Drive links)"),
              ("st_mem_vit_base_full.pth", "bakqui/ST-MEM's README (its Google Drive links)")),
))
