"""`encoders.merl`: MERL's published ECG encoders (Liu et al., ICML 2024), torch-free.

MERL releases a 1-D ResNet (resnet18/34/50/101) and a 1-D ViT (vit_tiny/small/middle/base), both
pretrained against MIMIC-IV-ECG reports. One options class covers both: `variant` says which
network, the other fields its sizes (those of the other network are unused). Loading the weights
(coreecg.model.published.merl) writes the sizes they hold; `MerlOptions.release(name)` gives the
sizes of a released name.
"""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import SEQUENCE, EncoderSpec, declare_encoder

VARIANTS = ("resnet", "vit")

# The released sizes (MERL's utils/resnet1d.py and utils/vit1d.py factories)
RELEASES: dict[str, dict] = {
    "resnet18": dict(variant="resnet", blocks=(2, 2, 2, 2), bottleneck=False),
    "resnet34": dict(variant="resnet", blocks=(3, 4, 6, 3), bottleneck=False),
    "resnet50": dict(variant="resnet", blocks=(3, 4, 6, 3), bottleneck=True),
    "resnet101": dict(variant="resnet", blocks=(3, 4, 23, 3), bottleneck=True),
    "vit_tiny": dict(variant="vit", width=192, depth=12, mlp_dim=768, heads=3),
    "vit_small": dict(variant="vit", width=384, depth=12, mlp_dim=1536, heads=6),
    "vit_middle": dict(variant="vit", width=512, depth=12, mlp_dim=2048, heads=8),
    "vit_base": dict(variant="vit", width=768, depth=12, mlp_dim=3072, heads=12),
}


@dataclass
class MerlOptions:
    """`encoders.merl`. Defaults: the released ResNet18 (`res18_best_encoder.pth`); the ViT fields
    default to the released vit_tiny (`vit_tiny_best_encoder.pth`).

    variant: "resnet" or "vit".
    ResNet: a stem Conv1d(leads, widths[0], 7, stride 2) + BN + ReLU (no max-pool), then one stage
        per entry of `widths` with `blocks` residual blocks each (stride 2 from the second stage
        on); basic blocks (two 3-convolutions) or, with `bottleneck`, 1-3-1 blocks of expansion 4.
    ViT: patches of `patch_size` samples of all leads at once (a Conv1d), `depth` pre-norm blocks
        of `width` with `heads` heads of `dim_head` each (the attention's inner width is
        heads * dim_head, not necessarily `width`) and an MLP of `mlp_dim`; `qkv_bias`.
    """

    variant: str = "resnet"
    blocks: tuple[int, ...] = (2, 2, 2, 2)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    bottleneck: bool = False
    patch_size: int = 50
    width: int = 192
    depth: int = 12
    mlp_dim: int = 768
    heads: int = 3
    dim_head: int = 64
    qkv_bias: bool = True

    def __post_init__(self) -> None:
        self.blocks, self.widths = tuple(self.blocks), tuple(self.widths)
        if self.variant not in VARIANTS:
            raise ConfigError(f"variant={self.variant!r} must be one of {VARIANTS} (MERL's ResNet or ViT)")
        if not self.blocks or len(self.blocks) != len(self.widths) or min(*self.blocks, *self.widths) < 1:
            raise ConfigError(f"blocks {list(self.blocks)} and widths {list(self.widths)} must give one count >= 1 "
                              "and one width >= 1 per stage")
        if min(self.patch_size, self.width, self.depth, self.mlp_dim, self.heads, self.dim_head) < 1:
            raise ConfigError("patch_size, width, depth, mlp_dim, heads and dim_head must be >= 1")

    @classmethod
    def release(cls, name: str) -> "MerlOptions":
        """The sizes of a released encoder: resnet18/34/50/101, vit_tiny/small/middle/base."""
        if name not in RELEASES:
            raise ConfigError(f"MERL released {', '.join(RELEASES)}; not {name!r}")
        return cls(**RELEASES[name])

    @property
    def release_name(self) -> str | None:
        """The released name these sizes are (None: a size MERL did not release)."""
        for name, sizes in RELEASES.items():
            ref = MerlOptions(**sizes)
            same = ("blocks", "widths", "bottleneck") if self.variant == "resnet" else \
                ("patch_size", "width", "depth", "mlp_dim", "heads", "dim_head", "qkv_bias")
            if ref.variant == self.variant and all(getattr(ref, k) == getattr(self, k) for k in same):
                return name
        return None

    @classmethod
    def tiny(cls, variant: str = "resnet") -> "MerlOptions":
        return cls(variant=variant, blocks=(1, 1), widths=(8, 16), patch_size=50, width=16, depth=2, mlp_dim=32,
                   heads=2, dim_head=8)


SPEC = declare_encoder(EncoderSpec(
    "merl", "MERL ResNet / ViT (published weights)", SEQUENCE, options=MerlOptions,
    module="coreecg.model.published.merl", published=True,
    input="(B, 12, 5000): 10 s at 500 Hz, no filter, one min-max to [0, 1] over the whole (12, 5000) "
          "window (+1e-8 in the denominator), rows in MIMIC-IV-ECG order I, II, III, aVR, aVF, aVL, V1-V6"))
