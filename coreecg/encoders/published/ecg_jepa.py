"""`encoders.ecg_jepa`: ECG-JEPA's published ViT (Kim 2024), torch-free: its sizes and declaration.

The module is coreecg.model.published.ecg_jepa; loading its weights writes the sizes they hold.
"""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import GRID, EncoderSpec, declare_encoder
from coreecg.encoders.options import ViTOptions


@dataclass
class EcgJepaOptions(ViTOptions):
    """ECG-JEPA's context encoder (MaskTransformer): the ViT's sizes (`ViTOptions`, its checks) and
    `qkv_bias`. Defaults: the published multi-block and random-masking checkpoints (768 wide, 12
    blocks, 16 heads, MLP 4x, no qkv bias, tokens of 50 samples = 0.2 s at 250 Hz). The head count
    is not in the weights (ECG-JEPA's loader hard-codes 16); `dropout` is the original's drop_rate
    and attention dropout (0 in its downstream code)."""

    patch_size: int = 50
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 16
    qkv_bias: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.embed_dim % 4:
            raise ConfigError(f"embed_dim={self.embed_dim} must be a multiple of 4 (the 2-D sin-cos table gives "
                              "a quarter of the width to each of sin/cos of patch and lead)")

    @classmethod
    def tiny(cls) -> "EcgJepaOptions":
        return cls(embed_dim=32, depth=2, num_heads=4)


SPEC = declare_encoder(EncoderSpec(
    "ecg_jepa", "ECG-JEPA ViT (published weights)", GRID, options=EcgJepaOptions,
    module="coreecg.model.published.ecg_jepa", published=True,
    input="(B, 8, 2500): leads I, II, V1-V6 in that order (a subset through lead_idx), 10 s at 250 Hz "
          "(scipy.signal.resample, FFT, of the whole record), millivolts: no filter, no normalisation"))
