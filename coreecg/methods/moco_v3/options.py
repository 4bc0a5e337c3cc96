"""MoCo v3's options, the section `methods.moco_v3`, and its declaration in the method registry
(torch-free: the config reads the section without building the model)."""
from __future__ import annotations

from dataclasses import dataclass, field

from coreecg.config.base import ConfigError
from coreecg.config.method_registry import MethodSpec, declare_method
from coreecg.methods.view_options import ViewsConfig


@dataclass
class MoCoV3Options:
    """`methods.moco_v3`: MoCo v3 (Chen, Xie, He, ICCV 2021) on the one encoder: query encoder +
    projector + predictor, momentum key encoder + projector, symmetric InfoNCE with the keys of
    the global batch (`optim.gather_negatives`). Defaults: the paper's ViT recipe (docs/baselines.md)."""

    temperature: float = 0.2
    momentum: float = 0.99            # key encoder EMA at step 0 ...
    momentum_end: float = 1.0         # ... cosine-increased to this at the last step
    dim: int = 256                    # projector / predictor output
    hidden_dim: int = 4096            # projector / predictor hidden width
    proj_layers: int = 3
    pred_layers: int = 2
    # MoCo v3's stabiliser for ViTs: a frozen random patch projection.
    freeze_patch_embed: bool = True
    views: ViewsConfig = field(default_factory=ViewsConfig)

    def __post_init__(self) -> None:     # the config prefixes its errors with methods.moco_v3
        if self.temperature <= 0 or not 0 <= self.momentum <= self.momentum_end <= 1:
            raise ConfigError("need temperature > 0 and 0 <= momentum <= momentum_end <= 1")
        if min(self.dim, self.hidden_dim) < 1 or self.proj_layers < 1 or self.pred_layers < 1:
            raise ConfigError("dim, hidden_dim, proj_layers and pred_layers must be >= 1")


# A checkpoint cannot resume across these: they change the heads or which parameters train.
SPEC = declare_method(MethodSpec(
    "moco_v3", "MoCo V3", options=MoCoV3Options,
    loss_scales={k: ("methods.moco_v3.temperature",) for k in ("loss", "loss_con")},
    structural=tuple(f"methods.moco_v3.{k}" for k in ("dim", "hidden_dim", "proj_layers", "pred_layers",
                                                      "freeze_patch_embed")),
    reported_losses=("loss_con",)))          # the symmetric contrastive loss (= loss)
