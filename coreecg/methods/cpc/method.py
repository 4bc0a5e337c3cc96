"""Contrastive predictive coding (van den Oord, Li, Vinyals 2018) on any registered encoder: from
the context c_t, predict the encoding z_{t+k} (k = 1..steps) among the other windows' encodings at
that step. Two ways to get (z, c) from an encoder (methods.cpc.context, docs/encoders.md):

- frames: a causal encoder with local frames (`causal` and `local_features`: the S4 encoder) gives
  z, its stem's frames, and c, its own causal output: ECG-CPC's form;
- segments: any encoder embeds non-overlapping crops of the window one by one (z, one per crop),
  and a GRU runs over them (c). No context sees a target's samples, however wide the encoder's
  receptive field (a non-causal CNN's or a transformer's frames would leak the future).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import Config, ConfigError
from coreecg.encoders.build import build_encoder
from coreecg.methods.base import PretrainMethod
from coreecg.methods.classes import register_method
from coreecg.methods.contrastive import gather_with_grad
from coreecg.model.encoder import masked_mean


def cpc_infonce(context: torch.Tensor, targets: torch.Tensor, heads: nn.ModuleList, valid: torch.Tensor | None,
                temperature: float = 1.0, gather: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """CPC's InfoNCE over k = 1..len(heads) steps ahead.

    context: (B, L, Dc) c_t; targets: (B, L, Dz) z_t; heads: k -> Linear(Dc, Dz) (W_k);
    valid: (B, L) bool (False: padding) or None. For each k and t, the score of window b's
    prediction W_k c_{b,t} against window b''s z_{b',t+k} is their dot product / temperature; the
    positive is b' = b; the candidates are every window of the (global, with `gather`) batch at that
    step. -> (the mean loss over valid (b, t, k), the top-1 accuracy), scalars.
    """
    B, L, _ = context.shape
    losses, hits, count = context.new_zeros(()).float(), context.new_zeros(()).float(), context.new_zeros(()).float()
    for k, head in enumerate(heads, start=1):
        if k >= L:
            break
        pred = head(context[:, : L - k]).float()                          # (B, L - k, Dz)
        targ = targets[:, k:].float()                                      # (B, L - k, Dz)
        offset = 0
        if gather:
            targ, offset = gather_with_grad(targ)
        logits = torch.einsum("btd,ctd->tbc", pred, targ) / temperature    # (L - k, B, B * world)
        labels = (torch.arange(B, device=pred.device) + offset).expand(L - k, B)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        hit = (logits.argmax(-1) == labels).float().reshape(-1)
        w = torch.ones_like(ce) if valid is None else (valid[:, : L - k] & valid[:, k:]).T.reshape(-1).float()
        losses, hits, count = losses + (ce * w).sum(), hits + (hit * w).sum(), count + w.sum()
    count = count.clamp_min(1.0)
    return losses / count, (hits / count).detach()


@register_method("cpc")              # declared in options.py: its section, structural keys, losses
class CPC(PretrainMethod):
    """The encoder (and, for segments, a GRU context) with one bilinear prediction head per step."""

    def __init__(self, config: Config):
        super().__init__(config)
        o = self.options = config.methods.cpc
        self.encoder = build_encoder(config)
        frames = getattr(self.encoder, "causal", False) and hasattr(self.encoder, "local_features")
        if o.context == "frames" and not frames:
            raise ConfigError(f"methods.cpc.context=frames needs a causal encoder with local frames (model.arch=s4, "
                              f"not bidirectional); model.arch={config.model.arch} has none: use segments")
        self.mode = "frames" if o.context == "frames" or (o.context == "auto" and frames) else "segments"
        width = self.encoder.dim
        if self.mode == "segments":
            self.context_net: nn.Module | None = nn.GRU(width, o.context_dim, batch_first=True)
            context_width = o.context_dim
        else:
            self.context_net, context_width = None, width
        declared = o.context_of(config)
        if declared is not None and declared != self.mode:
            raise ConfigError(f"methods.cpc.context=auto: encoders.{config.model.arch} declares causal_frames="
                              f"{declared == 'frames'}, but the built encoder {'has' if frames else 'lacks'} causal "
                              "local frames (`causal` and `local_features`): declare what it builds")
        self.n_steps = o.prediction_steps(config, self.mode)
        # the config checked this before Ray where it knew the context; a plugin encoder's is known here
        if self.mode == "segments" and self.n_steps > o.segments(config) - 1:
            raise ConfigError(f"methods.cpc.steps={self.n_steps}: {o.segments(config)} segments give only "
                              f"{o.segments(config) - 1} steps ahead (see methods.cpc.steps)")
        self.heads = nn.ModuleList(nn.Linear(context_width, width, bias=False) for _ in range(self.n_steps))

    def steps(self, x: torch.Tensor, lead_idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x: (B, C, T) -> (context (B, L, Dc), targets (B, L, Dz), valid (B, L) or None)."""
        if self.mode == "frames":
            enc = self.encoder(x, lead_idx)
            return enc.tokens, self.encoder.local_features(x, lead_idx), enc.valid
        B, C, T = x.shape
        n, S = self.options.segment_samples, T // self.options.segment_samples
        crops = x[..., : S * n].reshape(B, C, S, n).permute(0, 2, 1, 3).reshape(B * S, C, n)
        enc = self.encoder(crops, lead_idx)
        z = masked_mean(enc.tokens, enc.valid).view(B, S, -1)                 # (B, S, D): one per segment
        valid = None if enc.valid is None else enc.valid.any(dim=1).view(B, S)
        context, _ = self.context_net(z)
        return context, z, valid

    def forward(self, x: torch.Tensor, generator: torch.Generator | None = None,
                patient: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """x: (B, C, T) -> {loss, loss_con, cpc_accuracy}."""
        B, C, _ = self.check_input(x)
        context, targets, valid = self.steps(x, self.lead_idx(C, x.device))
        if context.shape[1] <= len(self.heads):       # a head with no (context, target) pair would never train
            raise ConfigError(f"methods.cpc.steps={len(self.heads)}: the {self.mode} context has {context.shape[1]} "
                              f"steps, so at most {context.shape[1] - 1} can be predicted ahead")
        loss, accuracy = cpc_infonce(context, targets, self.heads, valid, self.options.temperature,
                                     self.config.optim.gather_negatives)
        return {"loss": loss, "loss_con": loss.detach(), "cpc_accuracy": accuracy}
