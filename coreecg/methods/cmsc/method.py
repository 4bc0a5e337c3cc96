"""CMSC, "Contrastive Multi-Segment Coding" (Kiyasseh, Zhu, Clifton, "CLOCS", ICML 2021), on the
one encoder: each training window is cut into `segments` adjacent, non-overlapping segments (two
4.5 s halves of the 9 s crop by default); each segment goes through the encoder alone, at its
own time positions, and a linear head; segments of the same window are positives, and so are
segments of the same patient's other windows (CLOCS's patient-specific positives); other
patients' segments of the global batch are negatives (`cmsc_contrastive`). No
augmentation. Why halves of a window and not adjacent windows of a longer record:
docs/baselines.md."""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config
from coreecg.methods.base import PretrainMethod
from coreecg.methods.contrastive import gather_no_grad, gather_with_grad
from coreecg.methods.classes import register_method
from coreecg.encoders.build import build_encoder
from coreecg.model.encoder import masked_mean


def segment_masks(segments: int, batch: int, n_leads: int, n_patches: int) -> torch.Tensor:
    """(segments * batch, C, N) bool on the host: row s * batch + b sees only segment s, the
    patch columns [s * N / segments, (s + 1) * N / segments), on every lead."""
    column_segment = torch.arange(n_patches) // (n_patches // segments)                 # (N,)
    mask = column_segment[None, :] == torch.arange(segments)[:, None]                  # (S, N)
    return mask[:, None, None, :].expand(segments, batch, n_leads, n_patches).reshape(-1, n_leads, n_patches)


def cmsc_contrastive(a: torch.Tensor, b: torch.Tensor, tau: float, patient: torch.Tensor | None = None,
                     gather: bool = True) -> torch.Tensor:
    """CLOCS's CMSC loss for one pair of segment views (Kiyasseh et al., ICML 2021, and
    `obtain_contrastive_loss` in its code; docs/baselines.md). a[i] and b[i] are adjacent segments
    of window i; the candidates of a[i] are b of the whole (global) batch, or of the rank's batch
    without `gather`, and the other way round (cosine similarity / tau, both views with
    gradient). Positives: the own pair, and every pair of windows of one patient (`patient`
    equal: other recordings and other windows of the same recording); everything else is a
    negative. As in CLOCS every candidate stays in the softmax, and the loss per direction is the
    mean of two terms, the own pairs' mean -log p and the same-patient pairs' mean -log p (the
    latter only when the pool has such pairs); unlike CLOCS (one triangle per direction) both
    directions take every same-patient pair.

    a, b: (B, E); patient: (B,) int64 or None (every window its own patient) -> scalar. With
    `gather` the same-patient mean is over the pairs of every rank, so the mean over ranks of
    this loss (what DDP's gradient averaging optimises) is the one-rank loss of the global batch.
    """
    a, b = F.normalize(a.float(), dim=-1), F.normalize(b.float(), dim=-1)
    all_a, all_b, offset, world = a, b, 0, 1
    if gather:
        all_a, offset = gather_with_grad(a)
        all_b, _ = gather_with_grad(b)
        world = all_a.shape[0] // a.shape[0]
    rows = torch.arange(a.shape[0], device=a.device)
    own = rows + offset                                                  # (B,) own pair's column
    patient = own if patient is None else patient
    all_patient = gather_no_grad(patient)[0] if gather else patient
    # (B, B * world): same patient, less the own pair (its own term). Built elementwise: an
    # in-place `same[rows, own] = False` copies the scalar to the GPU and syncs every step.
    columns = torch.arange(all_patient.shape[0], device=a.device)
    same = (patient[:, None] == all_patient[None, :]) & (columns[None, :] != own[:, None])
    # The same-patient mean divides by the pairs of the whole pool (every rank's, counted from the
    # gathered ids), so the ranks' shares sum to the global mean; no sync, no extra collective.
    pairs = (all_patient[:, None] == all_patient[None, :]).sum().float() - all_patient.shape[0]
    has_pairs = (pairs > 0).float()
    loss = a.new_zeros(())
    for logits in (a @ all_b.T / tau, b @ all_a.T / tau):               # (B, B * world) each
        log_p = logits.log_softmax(dim=-1)
        own_term = -log_p[rows, own].mean()
        patient_term = -torch.where(same, log_p, 0.0).sum() * world / pairs.clamp_min(1.0)
        loss = loss + (own_term + has_pairs * patient_term) / (1.0 + has_pairs)
    return loss / 2


@register_method("cmsc")             # declared in options.py: its section, structural keys, losses
class CMSC(PretrainMethod):
    """Encoder -> mean over the segment's tokens -> Linear(encoder width, dim): CLOCS's embedding.
    Any registered encoder: a grid encoder (the ViT) sees each segment as its visible tokens (the
    window's positions kept); a sequence encoder sees each segment as its own crop of the window."""

    needs_patient_ids = True

    def __init__(self, config: Config):
        super().__init__(config)
        self.options = config.methods.cmsc
        self.encoder = build_encoder(config)
        self.head = nn.Linear(self.encoder.dim, self.options.dim)

    def embed_segments(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C, T) -> (segments, B, dim): each segment encoded on its own (the visible-token
        path of the encoder: equal token counts, so no padding)."""
        B, C, T = x.shape
        S, N = self.options.segments, self.config.n_patches
        lead_idx = self.lead_idx(C, x.device)
        if getattr(self.encoder, "output_kind", "grid") == "sequence":      # each segment its own crop
            crops = x[..., : T // S * S].reshape(B, C, S, T // S).permute(2, 0, 1, 3).reshape(S * B, C, T // S)
            enc = self.encoder(crops, lead_idx)                                # (S * B, L / S, D)
        else:
            visible = segment_masks(S, B, C, N)
            enc = self.encoder(x.repeat(S, 1, 1), lead_idx, visible)          # (S * B, C * N / S, D)
        # a short record's padded patches are left out of the mean (a segment of padding only: 0)
        return self.head(masked_mean(enc.tokens, enc.valid)).view(S, B, -1)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                patient: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """x: (B, C, T); patient: (B,) patient ids (None: every window its own patient).
        -> {loss, loss_con, segment_cos}: the mean CMSC loss over all segment pairs."""
        B, C, _ = self.check_input(x)
        z = self.embed_segments(x)
        pairs = list(itertools.combinations(range(self.options.segments), 2))
        tau, gather = self.options.temperature, self.config.optim.gather_negatives
        loss = sum(cmsc_contrastive(z[i], z[j], tau, patient, gather) for i, j in pairs) / len(pairs)
        cos = torch.stack([F.cosine_similarity(z[i].detach().float(), z[j].detach().float(), dim=-1).mean()
                           for i, j in pairs]).mean()
        return {"loss": loss, "loss_con": loss.detach(), "segment_cos": cos}
