"""MoCo v3 (Chen, Xie, He, "An Empirical Study of Training Self-Supervised Vision Transformers",
ICCV 2021) for ECG, on the one encoder: two random views of each window; the query path is
encoder -> projector -> predictor, the key path a momentum (EMA) copy of encoder and projector;
the loss is the symmetric ctr(q1, k2) + ctr(q2, k1) with the keys of the global batch
(`moco_contrastive`; the pool is `optim.gather_negatives`, as for every contrastive method:
coreecg.methods.contrastive). Departures from the image recipe: docs/baselines.md."""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config
from coreecg.methods.base import PretrainMethod
from coreecg.methods.contrastive import gather_no_grad
from coreecg.methods.classes import register_method
from coreecg.methods.views import random_view
from coreecg.encoders.build import build_encoder
from coreecg.model.padding import fill


def mlp(layers: int, in_dim: int, hidden: int, out_dim: int, last_bn: bool) -> nn.Sequential:
    """MoCo v3's heads: Linear (no bias) -> BN -> ReLU between layers, and a BN without affine
    parameters after the last Linear (last_bn; both ViT heads have it)."""
    mods: list[nn.Module] = []
    for i in range(layers):
        d_in, d_out = (in_dim if i == 0 else hidden), (out_dim if i == layers - 1 else hidden)
        mods.append(nn.Linear(d_in, d_out, bias=False))
        if i < layers - 1:
            mods += [nn.BatchNorm1d(d_out), nn.ReLU(inplace=True)]
        elif last_bn:
            mods.append(nn.BatchNorm1d(d_out, affine=False))
    return nn.Sequential(*mods)


def moco_contrastive(query: torch.Tensor, key: torch.Tensor, tau: float, gather: bool = True) -> torch.Tensor:
    """MoCo v3's ctr(q, k): each query against the keys of the whole (global) batch (the rank's
    batch without `gather`), its own key the positive; keys carry no gradient. Scaled by 2 tau,
    as the MoCo v3 code does.

    query, key: (B, D) -> scalar, the mean over the local queries.
    """
    q = F.normalize(query.float(), dim=-1)
    k = F.normalize(key.detach().float(), dim=-1)
    offset = 0
    if gather:
        k, offset = gather_no_grad(k)
    logits = q @ k.T / tau                                              # (B, B * world)
    labels = torch.arange(q.shape[0], device=q.device) + offset
    return F.cross_entropy(logits, labels) * (2 * tau)


@register_method("moco_v3")          # declared in options.py: its section, structural keys, losses
class MoCoV3(PretrainMethod):
    """Query: encoder + projector + predictor; key: their EMA copies (no predictor), in train mode
    (batch-statistics BN, as MoCo v3's momentum encoder). Features are the mean over all tokens,
    as downstream uses them (our encoder has no [CLS] token)."""

    targets_in_eval_mode = False

    def __init__(self, config: Config):
        super().__init__(config)
        o = config.methods.moco_v3
        self.options = o
        self.encoder = build_encoder(config)
        if o.freeze_patch_embed and hasattr(self.encoder, "patch_embed"):     # a ViT's stabiliser only
            self.encoder.patch_embed.requires_grad_(False)
        self.projector = mlp(o.proj_layers, self.encoder.dim, o.hidden_dim, o.dim, last_bn=True)
        self.predictor = mlp(o.pred_layers, o.dim, o.hidden_dim, o.dim, last_bn=True)
        self.momentum_encoder = copy.deepcopy(self.encoder).requires_grad_(False)
        self.momentum_projector = copy.deepcopy(self.projector).requires_grad_(False)

    def student_teacher_pairs(self) -> list[tuple[nn.Module, nn.Module]]:
        return [(self.encoder, self.momentum_encoder), (self.projector, self.momentum_projector)]

    def ema_schedule(self) -> tuple[float, float]:
        return self.options.momentum, self.options.momentum_end

    def views(self, x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """x: (B, C, T) -> two independent random views stacked, (2B, C, T)."""
        return random_view(torch.cat([x, x]), self.options.views, self.config.data.preprocess.sampling_rate,
                           generator)

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                patient: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """x: (B, C, T) -> {loss, loss_con, view_difference, query_key_cos}."""
        B, C, _ = self.check_input(x)
        views = self.views(x, generator)
        lead_idx = self.lead_idx(C, x.device)
        # The encoders see both views in one batch (LayerNorm only: per-sample); the heads see
        # one view at a time, so their BatchNorm statistics are per view, as in MoCo v3.
        feats = self.encoder.pooled(views, lead_idx)
        q1, q2 = (self.predictor(self.projector(f)) for f in feats.split(B))
        with torch.no_grad():
            keys = self.momentum_encoder.pooled(views, lead_idx)
            k1, k2 = (self.momentum_projector(f) for f in keys.split(B))
        tau, gather = self.options.temperature, self.config.optim.gather_negatives
        loss = moco_contrastive(q1, k2, tau, gather) + moco_contrastive(q2, k1, tau, gather)
        v1, v2 = fill(views.detach()).split(B)         # a short record's padding (NaN) counts as 0
        return {"loss": loss, "loss_con": loss.detach(),
                "view_difference": (v1 - v2).norm() / fill(x).float().norm().clamp_min(1e-12),
                "query_key_cos": F.cosine_similarity(torch.cat([q1, q2]).detach().float(),
                                                     torch.cat([k2, k1]).float(), dim=-1).mean()}
