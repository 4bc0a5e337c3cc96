"""A complete pretraining method outside coreecg: masked-token regression of the encoder's own
input patches through a small head (docs/methods.md shows this file; tests run it)."""
from dataclasses import dataclass

import torch
from torch import nn

from coreecg.methods.core_ecg.masking import random_token_mask
from coreecg.methods import PretrainMethod, register_method
from coreecg.model.embed import patchify
from coreecg.encoders import build_encoder


@dataclass
class PatchRegressionOptions:          # the typed config section methods.patch_regression
    ratio: float = 0.5                 # fraction of tokens hidden from the encoder
    hidden_dim: int = 0                # the head's hidden width; 0: one linear layer

    def __post_init__(self):           # checked whenever a config is read; the error gets the key
        if not 0 < self.ratio < 1 or self.hidden_dim < 0:
            raise ValueError(f"need 0 < ratio < 1 and hidden_dim >= 0, got ratio={self.ratio}, "
                             f"hidden_dim={self.hidden_dim}")


# hidden_dim decides the head's modules: a run cannot resume from a checkpoint with another one
@register_method("patch_regression", "Patch regression", options=PatchRegressionOptions, needs="grid",
                 structural=("methods.patch_regression.hidden_dim",))
class PatchRegression(PretrainMethod):
    reported_losses = ("loss_patch",)                        # the console shows "patch"; a sweep objective

    def __init__(self, config):
        super().__init__(config)
        o = config.methods.patch_regression
        self.encoder = build_encoder(config)       # model.arch's encoder (a grid one): exported, probed, fine-tuned
        width, patch = self.encoder.dim, config.patch_size
        self.head = (nn.Linear(width, patch) if o.hidden_dim == 0 else nn.Sequential(
            nn.Linear(width, o.hidden_dim), nn.GELU(), nn.Linear(o.hidden_dim, patch)))

    def forward(self, x, generator=None, patient=None):
        """x: (B, C, T) -> {"loss", "loss_patch"}: visible tokens regress their own input patches."""
        B, C, _ = x.shape
        visible, _, _ = random_token_mask(B, C, self.config.n_patches,
                                          self.config.methods.patch_regression.ratio, generator)
        enc = self.encoder(x, visible=visible)
        target = patchify(x, self.config.patch_size).flatten(1, 2)          # (B, C * N, P)
        target = torch.gather(target, 1, enc.index[..., None].expand(-1, -1, target.shape[-1]))
        loss = (self.head(enc.tokens) - target).pow(2).mean()
        return {"loss": loss, "loss_patch": loss.detach()}
