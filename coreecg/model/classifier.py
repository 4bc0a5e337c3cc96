"""Downstream model: the one `Encoder` + a freshly initialised linear head on mean-pooled tokens
(paper, Fig. "downstream fine-tuning phase")."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import STANDARD_LEADS
from coreecg.model.encoder import Encoder


def standard_lead_positions(leads: Sequence[str]) -> list[int]:
    """Lead names -> indices into the standard order (I, II, III, aVR, aVL, aVF, V1-V6)."""
    unknown = [x for x in leads if x not in STANDARD_LEADS]
    if unknown or not leads:
        raise ValueError(f"unknown lead name(s) {unknown}; known: {', '.join(STANDARD_LEADS)}")
    return [STANDARD_LEADS.index(x) for x in leads]


class Classifier(nn.Module):
    """encoder(x) -> mean over all (lead, time) tokens -> Linear(D, K) logits.

    Input rows are exactly `leads` (a subset of the standard 12 in any order): only their
    tokens enter the encoder, each with its own lead embedding; nothing is zero-filled.
    `frozen_encoder` (linear probing): the encoder runs without gradients, in eval mode.
    Single-label tasks train with softmax cross-entropy, multi-label ones with sigmoid BCE.
    """

    def __init__(self, encoder: Encoder, n_classes: int, leads: Sequence[str], multilabel: bool,
                 frozen_encoder: bool = False):
        super().__init__()
        self.encoder, self.multilabel, self.frozen_encoder = encoder, multilabel, frozen_encoder
        self.leads = tuple(leads)
        self.register_buffer("lead_idx", torch.tensor(standard_lead_positions(leads)), persistent=False)
        self.head = nn.Linear(encoder.dim, n_classes)
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)
        if frozen_encoder:
            encoder.requires_grad_(False)

    def train(self, mode: bool = True) -> "Classifier":
        super().train(mode)
        if self.frozen_encoder:
            self.encoder.eval()      # a frozen feature extractor never uses dropout
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, len(leads), T) -> pooled features (B, D)."""
        if x.shape[1] != len(self.leads):
            raise ValueError(f"input has {x.shape[1]} leads, the model takes {len(self.leads)} ({', '.join(self.leads)})")
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen_encoder):
            return self.encoder.pooled(x, self.lead_idx)

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """x: (B, len(leads), T); target: (B, K) multi-hot (one-hot for single-label) or None.

        -> {"logits": (B, K)} plus {"loss": ()} when a target is given.
        """
        logits = self.head(self.features(x))
        out = {"logits": logits}
        if target is not None:
            out["loss"] = self.loss(logits, target)
        return out

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(logits, target.float())
        return F.cross_entropy(logits, target.argmax(dim=1))

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """(.., K) logits -> sigmoid (multi-label) or softmax (single-label) probabilities."""
        return torch.sigmoid(logits.float()) if self.multilabel else torch.softmax(logits.float(), dim=-1)
