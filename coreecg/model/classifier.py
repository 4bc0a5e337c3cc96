"""Downstream model: the one `Encoder` + a freshly initialised head (paper, Fig. "downstream
fine-tuning phase": a linear head on mean-pooled tokens; the benchmark's frozen mode: a learned
query attending over every token, docs/benchmark.md)."""
from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import STANDARD_LEADS
from coreecg.encoders.build import build_encoder
from coreecg.model.encoder import Encoder, _with_a_key
from coreecg.model.pretrained import PretrainedMixin
from coreecg.model.published.registry import model_layout
from coreecg.data.tasks import is_regression_task


def standard_lead_positions(leads: Sequence[str]) -> list[int]:
    """Lead names -> indices into the standard order (I, II, III, aVR, aVL, aVF, V1-V6)."""
    unknown = [x for x in leads if x not in STANDARD_LEADS]
    if unknown or not leads:
        raise ValueError(f"unknown lead name(s) {unknown}; known: {', '.join(STANDARD_LEADS)}")
    return [STANDARD_LEADS.index(x) for x in leads]


# finetune.mode -> (encoder frozen, pooling): linear probing and the benchmark's frozen-encoder
# mode train only the head; scratch is fine-tuning from random weights.
MODE_HEADS = {"finetune": (False, "mean"), "scratch": (False, "mean"), "linear": (True, "mean"),
              "frozen": (True, "attention")}


class AttentionPool(nn.Module):
    """One learned query attends over every token (multi-head, SDPA): (B, L, D) -> (B, D).

    Lets a frozen encoder's tokens be weighed per task, which a mean cannot (the benchmark's
    frozen-encoder setting trains such a head, not only a linear one). `valid` (B, L) bool masks
    tokens out (padding); None = all tokens.
    """

    def __init__(self, dim: int, num_heads: int | None = None):
        super().__init__()
        self.num_heads = num_heads or (dim // 64 if dim % 64 == 0 and dim >= 64 else 1)
        if dim % self.num_heads:
            raise ValueError(f"attention pooling: width {dim} is not divisible by {self.num_heads} heads")
        self.norm = nn.LayerNorm(dim)
        self.query = nn.Parameter(torch.zeros(dim))          # 1-D: no weight decay, like a bias
        self.kv = nn.Linear(dim, 2 * dim)
        self.out = nn.Linear(dim, dim)
        nn.init.trunc_normal_(self.query, std=0.02)

    def forward(self, tokens: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
        B, L, D = tokens.shape
        h = self.num_heads
        k, v = self.kv(self.norm(tokens)).view(B, L, 2, h, D // h).permute(2, 0, 3, 1, 4)   # (B, h, L, D/h) each
        q = self.query.to(k.dtype).expand(B, -1).view(B, 1, h, D // h).transpose(1, 2)     # (B, h, 1, D/h)
        # a sample without any valid token (an all-padding crop) keeps one key: finite, unscored
        mask = None if valid is None else _with_a_key(valid)[:, None, None, :]
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)                         # (B, h, 1, D/h)
        return self.out(o.transpose(1, 2).reshape(B, D))


# The Hub has no time-series classification task: "other" (docs/export.md)
class Classifier(nn.Module, PretrainedMixin, pipeline_tag="other"):
    """encoder(x) -> pooled tokens -> Linear(D, K) logits.

    Input rows are exactly `leads` (a subset of the standard 12 in any order): only their
    tokens enter the encoder, each with its own lead embedding; nothing is zero-filled.
    `frozen_encoder` (linear probing, frozen mode): the encoder runs without gradients, in eval
    mode. `pooling`: "mean" over all (lead, time) tokens (the paper's), or "attention"
    (`AttentionPool`). Single-label tasks train with softmax cross-entropy, multi-label ones
    with sigmoid BCE. `regression` (a regression task, coreecg.data.tasks): K outputs of real values,
    trained with MSE on targets standardised by the train split's mean and SD (`set_scaler`; the
    buffers target_mean, target_std travel in the state dict, hence in best.pt and an export), and
    `probabilities` returns them in the target's units.
    `Classifier.from_pretrained` / `save_pretrained` / `push_to_hub`: coreecg.model.pretrained.
    """

    pretrained_kind = "classifier"

    def __init__(self, encoder: Encoder, n_classes: int, leads: Sequence[str], multilabel: bool,
                 frozen_encoder: bool = False, pooling: str = "mean", regression: bool = False):
        super().__init__()
        if pooling not in ("mean", "attention"):
            raise ValueError(f"pooling={pooling!r} is not 'mean' or 'attention'")
        self.encoder, self.multilabel, self.frozen_encoder = encoder, multilabel, frozen_encoder
        self.leads = tuple(leads)
        self.register_buffer("lead_idx", torch.tensor(standard_lead_positions(leads)), persistent=False)
        self.pool = AttentionPool(encoder.dim) if pooling == "attention" else None
        self.head = nn.Linear(encoder.dim, n_classes)
        nn.init.trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)
        if frozen_encoder:
            encoder.requires_grad_(False)
        self.regression = bool(regression)
        if self.regression:     # a label classifier's state dict keeps its keys (old checkpoints load)
            self.register_buffer("target_mean", torch.zeros(n_classes))
            self.register_buffer("target_std", torch.ones(n_classes))

    def set_scaler(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """A regression head's target scaler (the train split's mean and SD per output)."""
        if not self.regression:
            raise ValueError("set_scaler: this classifier predicts labels, not a regression target")
        std_t = torch.as_tensor(std, dtype=torch.float32)
        if not bool((std_t > 0).all()):
            raise ValueError(f"set_scaler: the target SD must be > 0, got {list(std)} (a constant target)")
        self.target_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.target_std.copy_(std_t)

    def train(self, mode: bool = True) -> "Classifier":
        super().train(mode)
        if self.frozen_encoder:
            self.encoder.eval()      # a frozen feature extractor never uses dropout
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """x: (B, len(leads), T) -> pooled features (B, D)."""
        if x.shape[1] != len(self.leads):
            raise ValueError(f"input has {x.shape[1]} leads, the model takes {len(self.leads)} "
                             f"({', '.join(self.leads)})")
        x, lead_idx = model_layout(self.encoder, x, self.lead_idx)   # a published family's own layout and rows
        with torch.set_grad_enabled(torch.is_grad_enabled() and not self.frozen_encoder):
            if self.pool is None:
                return self.encoder.pooled(x, lead_idx)
            encoded = self.encoder(x, lead_idx)
        return self.pool(encoded.tokens, encoded.valid)

    @classmethod
    def for_mode(cls, encoder: Encoder, n_classes: int, leads: Sequence[str], multilabel: bool,
                 mode: str, head: str = "auto", regression: bool = False) -> "Classifier":
        """The classifier finetune.mode trains (MODE_HEADS); `head` (finetune.head) other than
        "auto" replaces the mode's pooling (an attention-pooling head in finetune/scratch mode)."""
        frozen, pooling = MODE_HEADS[mode]
        return cls(encoder, n_classes, leads, multilabel, frozen_encoder=frozen,
                   pooling=pooling if head == "auto" else head, regression=regression)

    @classmethod
    def _build_for(cls, config, class_names, multilabel) -> "Classifier":
        """from_pretrained's (coreecg.model.pretrained): the classifier config.finetune describes."""
        return cls.for_mode(build_encoder(config), len(class_names), config.finetune.leads,
                            bool(multilabel), config.finetune.mode, config.finetune.head,
                            regression=is_regression_task(config.finetune.task))

    def forward(self, x: torch.Tensor, target: torch.Tensor | None = None,
                pooled: bool = False) -> dict[str, torch.Tensor]:
        """x: (B, len(leads), T), or with `pooled` the encoder's pooled features (B, D) (a linear
        probe on cached features: the encoder is bypassed); target: (B, K) multi-hot (one-hot
        for single-label) or None.

        -> {"logits": (B, K)} plus {"loss": ()} when a target is given.
        """
        logits = self.head(x if pooled else self.features(x))
        out = {"logits": logits}
        if target is not None:
            out["loss"] = self.loss(logits, target)
        return out

    def loss(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """target: (B, K) multi-hot / one-hot, or a regression task's values in its units."""
        logits = logits.float()
        if self.regression:
            return F.mse_loss(logits, (target.float() - self.target_mean) / self.target_std)
        if self.multilabel:
            return F.binary_cross_entropy_with_logits(logits, target.float())
        return F.cross_entropy(logits, target.argmax(dim=1))

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """(.., K) logits -> sigmoid (multi-label) or softmax (single-label) probabilities; a
        regression head's values in the target's units (the scaler undone)."""
        if self.regression:
            return logits.float() * self.target_std + self.target_mean
        return torch.sigmoid(logits.float()) if self.multilabel else torch.softmax(logits.float(), dim=-1)
