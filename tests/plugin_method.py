"""A complete pretraining method outside coreecg: masked-token regression of the encoder's own
input patches through a linear head (docs/methods.md shows this file; tests run it)."""
from dataclasses import dataclass

import torch
from torch import nn

from coreecg.masking import random_token_mask
from coreecg.methods import PretrainMethod, register_method
from coreecg.model.embed import patchify
from coreecg.model.encoder import Encoder


@dataclass
class PatchRegressionOptions:          # the typed config section methods.patch_regression
    ratio: float = 0.5                 # fraction of tokens hidden from the encoder


@register_method("patch_regression", "Patch regression", options=PatchRegressionOptions)
class PatchRegression(PretrainMethod):
    def __init__(self, config):
        super().__init__(config)
        m = config.model
        self.encoder = Encoder.from_config(m)                 # the one encoder: exported, probed, fine-tuned
        self.head = nn.Linear(m.embed_dim, m.patch_size)

    def forward(self, x, generator=None, record=None):
        """x: (B, C, T) -> {"loss"}: visible tokens regress their own input patches."""
        B, C, _ = x.shape
        visible, _, _ = random_token_mask(B, C, self.config.model.n_patches,
                                          self.config.methods.patch_regression.ratio, generator)
        enc = self.encoder(x, visible=visible)
        target = patchify(x, self.config.model.patch_size).flatten(1, 2)          # (B, C * N, P)
        target = torch.gather(target, 1, enc.index[..., None].expand(-1, -1, target.shape[-1]))
        loss = (self.head(enc.tokens) - target).pow(2).mean()
        return {"loss": loss, "loss_rec": loss.detach()}
