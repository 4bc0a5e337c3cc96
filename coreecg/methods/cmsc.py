"""CMSC, "Contrastive Multi-Segment Coding" (Kiyasseh, Zhu, Clifton, "CLOCS", ICML 2021), on the
one encoder: each training window is cut into `segments` adjacent, non-overlapping segments (two
4.5 s halves of the 9 s crop by default); each segment goes through the encoder alone, at its
own time positions, and a linear head; segments of the same window are positives, and so are
segments of the same patient's other windows (CLOCS's patient-specific positives); other
patients' segments of the global batch are negatives (`coreecg.losses.cmsc_contrastive`). No
augmentation. Why halves of a window and not adjacent windows of a longer record:
docs/baselines.md."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ConfigError
from coreecg.losses import cmsc_contrastive
from coreecg.methods.registry import register_method
from coreecg.methods.base import PretrainMethod
from coreecg.model.encoder import Encoder, masked_mean, default_lead_idx


def segment_masks(segments: int, batch: int, n_leads: int, n_patches: int) -> torch.Tensor:
    """(segments * batch, C, N) bool on the host: row s * batch + b sees only segment s, the
    patch columns [s * N / segments, (s + 1) * N / segments), on every lead."""
    column_segment = torch.arange(n_patches) // (n_patches // segments)                 # (N,)
    mask = column_segment[None, :] == torch.arange(segments)[:, None]                  # (S, N)
    return mask[:, None, None, :].expand(segments, batch, n_leads, n_patches).reshape(-1, n_leads, n_patches)


@dataclass
class CMSCOptions:
    """`methods.cmsc`: CMSC (Kiyasseh, Zhu, Clifton, "CLOCS", ICML 2021): adjacent non-overlapping
    segments of one window, and segments of one patient, are positives, other patients negatives;
    no augmentation (docs/baselines.md)."""

    temperature: float = 0.1
    segments: int = 2                 # adjacent segments per window, each 1/segments of the crop
    dim: int = 256                    # CLOCS's embedding size (a linear head on the pooled encoder)

    def __post_init__(self) -> None:     # the config prefixes its errors with methods.cmsc
        if self.temperature <= 0 or self.segments < 2 or self.dim < 1:
            raise ConfigError("need temperature > 0, segments >= 2 and dim >= 1")

    def check(self, config: Config) -> None:
        """Against the rest of the config (Config.validate calls it when CMSC trains)."""
        n = config.model.n_patches
        if n % self.segments:
            raise ConfigError(f"methods.cmsc.segments={self.segments} must divide the {n} patches of a "
                              "window (model.input_samples / model.patch_size)")


@register_method("cmsc", "CMSC", options=CMSCOptions, structural=("methods.cmsc.dim",))
class CMSC(PretrainMethod):
    """Encoder -> mean over the segment's tokens -> Linear(embed_dim, dim): CLOCS's embedding."""

    needs_patient_ids = True

    def __init__(self, config: Config):
        super().__init__(config)
        self.options = config.methods.cmsc
        self.encoder = Encoder.from_config(config.model)
        self.head = nn.Linear(config.model.embed_dim, self.options.dim)

    def embed_segments(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, C, T) -> (segments, B, dim): each segment encoded on its own (the visible-token
        path of the encoder: equal token counts, so no padding)."""
        B, C, _ = x.shape
        S, N = self.options.segments, self.config.model.n_patches
        visible = segment_masks(S, B, C, N)
        lead_idx = default_lead_idx(C, x.device, self.config.model.n_leads)
        enc = self.encoder(x.repeat(S, 1, 1), lead_idx, visible)              # (S * B, C * N / S, D)
        # a short record's padded patches are left out of the mean (a segment of padding only: 0)
        return self.head(masked_mean(enc.tokens, enc.valid)).view(S, B, -1)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                patient: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """x: (B, C, T); patient: (B,) patient ids (None: every window its own patient).
        -> {loss, loss_con, segment_cos}: the mean CMSC loss over all segment pairs."""
        B, C, _ = self.check_input(x)
        z = self.embed_segments(x)
        pairs = list(itertools.combinations(range(self.options.segments), 2))
        tau, gather = self.options.temperature, self.config.loss.gather_negatives
        loss = sum(cmsc_contrastive(z[i], z[j], tau, patient, gather) for i, j in pairs) / len(pairs)
        cos = torch.stack([F.cosine_similarity(z[i].detach().float(), z[j].detach().float(), dim=-1).mean()
                           for i, j in pairs]).mean()
        return {"loss": loss, "loss_con": loss.detach(), "segment_cos": cos}
