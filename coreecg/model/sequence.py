"""What every encoder that yields a sequence over time shares (a CNN, a state-space model): the
`Encoded` interface the methods, the classifier, loading and export read, for inputs of any lead
subset and with a short record's padding.

A subclass implements `features(x) -> (B, D, L)` on a (B, n_leads, T) input with no NaN, sets
`dim` (D), `patch_size` (samples per output step: padding and crops are judged in these steps) and
`n_leads`. Input rows are placed at their standard leads' channels (`lead_idx`), the others 0: the
network's first layer always sees the 12 standard channels, so a model fine-tuned on a lead subset
reads the weights pretrained for those leads.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.model.encoder import Encoded, default_lead_idx, masked_mean
from coreecg.model.padding import assumed_unpadded, fill
from coreecg.model.pretrained import PretrainedMixin


class SequenceEncoder(nn.Module, PretrainedMixin, pipeline_tag="feature-extraction"):
    """Base of the sequence encoders: (B, C, T) -> `Encoded` with grid (1, L), tokens (B, L, D)."""

    output_kind = "sequence"
    n_leads: int = 12
    dim: int = 0
    patch_size: int = 1

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n_leads, T) with no NaN -> (B, D, L)."""
        raise NotImplementedError

    def placed(self, x: torch.Tensor, lead_idx: torch.Tensor | None) -> torch.Tensor:
        """(B, C, T) rows of the leads `lead_idx` (default: the first C standard leads) -> (B,
        n_leads, T), each row at its lead's channel, absent leads 0."""
        B, C, T = x.shape
        if lead_idx is None:
            if C == self.n_leads:
                return x        # every lead, in the standard order
            lead_idx = default_lead_idx(C, x.device, self.n_leads)
        out = x.new_zeros(B, self.n_leads, T)
        return out.index_copy(1, lead_idx.to(x.device), x)

    def forward(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None,
                visible: torch.Tensor | None = None, varying: bool = False) -> Encoded:
        """x: (B, C, T), NaN on a short record's padding -> Encoded(tokens (B, L, D), index (B, L),
        valid (B, L) or None, grid (1, L), pad). A step is valid when its input window holds a
        real sample. `visible` (token masks) is refused: masked modelling needs a grid encoder."""
        if visible is not None:
            raise ValueError(f"{type(self).__name__} yields a sequence over time and takes no token masks "
                             "(masked modelling needs an encoder with tokens on the (lead, time) grid)")
        pad = None if assumed_unpadded() else torch.isnan(x).any(dim=1)             # (B, T)
        h = self.features(self.placed(fill(x), lead_idx))                              # (B, D, L)
        B, D, L = h.shape
        tokens = h.transpose(1, 2)
        index = torch.arange(L, device=x.device).expand(B, -1)
        if pad is None:
            return Encoded(tokens, index, None, (1, L))
        # a step is real when any sample of its stride's share of the input is real (the input cut
        # or padded with padding to L x patch_size samples)
        s, T = self.patch_size, pad.shape[1]
        real = F.pad(~pad, (0, max(0, L * s - T)), value=False)[:, : L * s].reshape(B, L, s).any(dim=2)
        return Encoded(tokens, index, real, (1, L), ~real)

    def pooled(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> torch.Tensor:
        """(B, C, T) -> (B, D): the mean over the real steps."""
        enc = self.forward(x, lead_idx)
        return masked_mean(enc.tokens, enc.valid)

    def sequence(self, x: torch.Tensor, lead_idx: torch.Tensor | None = None) -> Encoded:
        """The sequence over time (the same as forward for this kind)."""
        return self.forward(x, lead_idx)
