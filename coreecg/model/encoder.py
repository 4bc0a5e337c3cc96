"""The one ECG encoder: student (visible tokens), EMA teacher (all tokens) and downstream."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from coreecg.config import Config
from coreecg.devices import to_device
from coreecg.model.embed import LeadTimeEmbedding, PatchEmbedding
from coreecg.model.layers import Transformer, init_weights
from coreecg.model.padding import assumed_unpadded, fill, padding_mask
from coreecg.model.pretrained import PretrainedMixin


class Encoded(NamedTuple):
    """Encoder output on the (lead, time) grid.

    tokens: (B, L, D) encodings; index: (B, L) flat grid position c * N + n of each token;
    valid: (B, L) bool, False on padding: the end of a sample's shorter visible set and the
    patches of a short record's padding (NaN in x); None only where neither can occur; grid: (C, N).
    """

    tokens: torch.Tensor
    index: torch.Tensor
    valid: torch.Tensor | None
    grid: tuple[int, int]
    pad: torch.Tensor | None = None     # (B, C * N) bool over the grid: a short record's padding


ALIGN = 8      # SDPA's attention-mask alignment (aten preprocess_mask; torch._inductor's sdpa constraint)


def default_lead_idx(n_leads: int, device: torch.device, total: int = 12) -> torch.Tensor:
    """Leads fed in the standard order starting at lead I: 12 -> all, 6 -> limb leads, 1 -> lead I."""
    if n_leads > total:
        raise ValueError(f"{n_leads} input leads but the model knows {total}")
    return torch.arange(n_leads, device=device)


class Encoder(nn.Module, PretrainedMixin, pipeline_tag="feature-extraction"):
    """Patch embedding + lead/position embeddings + pre-norm transformer.

    Any subset of the standard leads can be fed: pass `lead_idx` (C,) naming which standard
    lead each input row is (default: the first C in I, II, III, aVR, aVL, aVF, V1-V6 order).
    `Encoder.from_pretrained` / `save_pretrained` / `push_to_hub`: coreecg.model.pretrained.
    """

    def __init__(self, n_leads: int = 12, n_patches: int = 30, patch_size: int = 75, dim: int = 256,
                 depth: int = 10, num_heads: int = 4, mlp_ratio: float = 4.0, dropout: float = 0.0):
        super().__init__()
        self.n_leads, self.patch_size, self.dim = n_leads, patch_size, dim
        self.patch_embed = PatchEmbedding(patch_size, dim)
        self.embed = LeadTimeEmbedding(dim, n_leads, n_patches)
        self.transformer = Transformer(dim, depth, num_heads, mlp_ratio, dropout)
        init_weights(self.transformer)

    output_kind = "grid"

    @classmethod
    def from_config(cls, config: Config) -> "Encoder":
        """The encoder of a Config: its input (`model.n_leads`, `model.input_samples`) and its
        sizes (`encoders.coreecg`)."""
        o = config.encoders.coreecg
        return cls(config.model.n_leads, config.n_patches, o.patch_size, o.embed_dim, o.depth, o.num_heads,
                   o.mlp_ratio, o.dropout)

    @classmethod
    def _build_for(cls, config, class_names=None, multilabel=None) -> nn.Module:
        """from_pretrained's (coreecg.model.pretrained): the encoder the folder's config names, so
        `Encoder.from_pretrained` opens every registered encoder's export."""
        return build_encoder(config)

    def tokens(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """x: (B, C, T) -> embedded tokens (B, C, N, D) before the transformer."""
        if lead_idx is None:
            lead_idx = default_lead_idx(x.shape[1], x.device, self.n_leads)
        t = self.patch_embed(x)
        return t + self.embed(lead_idx, t.shape[2]).to(t.dtype)

    def forward(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None,
                visible: torch.Tensor | None = None, varying: bool = False) -> Encoded:
        """x: (B, C, T), NaN on a short record's padding; visible: (B, C, N) bool or None (= every
        token), on x's device or on the host. varying: the visible count may differ between the
        samples of a batch and between batches (bernoulli STDM), so the padding mask is always
        built and the length is dynamic: a compiled step keeps one graph (no recompilation when a
        batch happens to have equal counts, or a new length).

        With `visible`, only visible tokens enter the transformer. Samples with fewer visible
        tokens than the batch maximum are padded at the end and the padding is masked out
        of attention, so no Python loop over samples is needed. The padded length must be
        known on the host: from host masks (the training loop's) that costs no device sync.
        Patches of a short record's padding (coreecg.model.padding: any NaN sample) are never
        attended to and are marked invalid in the output, also when `visible` names them; NaN
        is replaced by 0 first (its gradient is 0). All on the device: no sync.
        """
        # Inside padding.unpadded() the caller knows on the host that x holds no padding: no mask
        # then, unless visible sets differ in size (flash attention takes no mask).
        pad = None if assumed_unpadded() else padding_mask(x, self.patch_size)
        t = self.tokens(fill(x), lead_idx)
        B, C, N, D = t.shape
        flat = t.reshape(B, C * N, D)
        real = None if pad is None else ~pad.reshape(B, C * N)
        if visible is None:
            index = torch.arange(C * N, device=x.device).expand(B, -1)
            return Encoded(self.transformer(flat, _with_a_key(real)), index, real, (C, N), _not(real))
        counts = visible.reshape(B, C * N).sum(1)
        longest, shortest = torch.stack([counts.max(), counts.min()]).tolist()   # a device sync unless on host
        if varying:
            # A multiple of ALIGN (the extra tokens are masked keys, their outputs invalid): inductor
            # guards on the mask's row alignment, so an unaligned length would recompile the blocks.
            longest = min(C * N, -(-longest // ALIGN) * ALIGN)
        # Stable sort puts each sample's visible positions first, in grid order.
        index = torch.argsort((~visible.reshape(B, C * N)).to(torch.int8), dim=1, stable=True)[:, :longest]
        index = to_device(index, x.device)
        valid = None if real is None else torch.gather(real, 1, index)
        if shortest < longest or varying:
            shorter = to_device(torch.arange(longest, device=counts.device)[None, :] < counts[:, None], x.device)
            valid = shorter if valid is None else valid & shorter
        gathered = torch.gather(flat, 1, index[..., None].expand(-1, -1, D))
        return Encoded(self.transformer(gathered, _with_a_key(valid), varying), index, valid, (C, N), _not(real))

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """Mean of the token encodings of the real (not padded) patches: (B, C, T) -> (B, D).
        Teacher target and downstream feature; an all-padding input pools to zeros."""
        enc = self.forward(x, lead_idx)
        return masked_mean(enc.tokens, enc.valid)


def masked_mean(tokens: torch.Tensor, valid: torch.Tensor | None) -> torch.Tensor:
    """(B, L, D) tokens, (B, L) bool -> (B, D): the mean over the valid tokens only (0 if none)."""
    if valid is None:
        return tokens.mean(dim=1)
    w = valid.to(tokens.dtype)[..., None]
    count = valid.sum(dim=1, keepdim=True).clamp_min(1).float()      # exact (bf16 counts are not)
    return ((tokens * w).sum(dim=1).float() / count).to(tokens.dtype)


def _not(real: torch.Tensor | None) -> torch.Tensor | None:
    return None if real is None else ~real


def _with_a_key(valid: torch.Tensor | None) -> torch.Tensor | None:
    """Attention keys (None: every position): `valid`, plus the first position of a sample with
    no valid token at all (all keys masked would make SDPA's softmax NaN, and NaN poisons the backward even where
    its output is discarded). Such a sample's outputs stay marked invalid."""
    if valid is None:
        return None
    first = torch.arange(valid.shape[1], device=valid.device) == 0
    return valid | (first[None, :] & ~valid.any(dim=1, keepdim=True))


from coreecg.encoders.build import build_encoder, register_encoder  # noqa: E402  (binds after the class exists)

register_encoder("coreecg")(Encoder)
