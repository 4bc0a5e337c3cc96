"""`encoders.hubert_ecg`: HuBERT-ECG's published encoder (Coppola et al. 2024), torch-free.

One options class covers the three released sizes (they differ in sizes only, not in structure):

    small   hidden_size 512, num_layers 8,  num_heads 8,  intermediate_size 2048
    base    hidden_size 768, num_layers 12, num_heads 12, intermediate_size 3072   (the defaults)
    large   num_layers 16 (its other sizes are read from its config.json and weights)

All three: a five-layer convolutional feature encoder of 512 channels (kernels 10, 3, 3, 2, 2,
strides 4, 2, 2, 2, 2: one token per 64 input samples), a positional convolution of kernel 128 in
16 groups, post-LN transformer layers. The module is coreecg.model.published.hubert_ecg, which
writes these sizes from the weights it loads.
"""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import SEQUENCE, EncoderSpec, declare_encoder


@dataclass
class HubertEcgOptions:
    """HuBERT's sizes as its config.json names them (shortened): `hidden_size` the token width,
    `num_layers` transformer layers of `num_heads` heads and an MLP of `intermediate_size`;
    `conv_dim`/`conv_kernel`/`conv_stride` the feature encoder's layers (bias-free unless
    `conv_bias`; GroupNorm after the first); `feat_proj_layer_norm` a LayerNorm before the feature
    projection; `pos_conv_kernel`/`pos_conv_groups` the weight-normed positional convolution."""

    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    conv_dim: tuple[int, ...] = (512, 512, 512, 512, 512)
    conv_kernel: tuple[int, ...] = (10, 3, 3, 2, 2)
    conv_stride: tuple[int, ...] = (4, 2, 2, 2, 2)
    conv_bias: bool = False
    feat_proj_layer_norm: bool = True
    pos_conv_kernel: int = 128
    pos_conv_groups: int = 16
    layer_norm_eps: float = 1e-5
    dropout: float = 0.0

    def __post_init__(self) -> None:     # keys that go together (widths, heads, layer lists): `check`
        if min(self.hidden_size, self.num_layers, self.num_heads, self.intermediate_size) < 1:
            raise ConfigError("hidden_size, num_layers, num_heads and intermediate_size must be >= 1")
        if min(*self.conv_dim, *self.conv_kernel, *self.conv_stride, 1) < 1:
            raise ConfigError("conv_dim, conv_kernel and conv_stride entries must be >= 1")
        if min(self.pos_conv_kernel, self.pos_conv_groups) < 1:
            raise ConfigError("pos_conv_kernel and pos_conv_groups must be >= 1")
        if not self.layer_norm_eps > 0:
            raise ConfigError(f"layer_norm_eps={self.layer_norm_eps} must be > 0")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout={self.dropout} must be in [0, 1)")

    def check(self) -> None:
        if not self.conv_dim or not len(self.conv_dim) == len(self.conv_kernel) == len(self.conv_stride):
            raise ConfigError(f"encoders.hubert_ecg: conv_dim, conv_kernel and conv_stride give one entry per "
                              f"convolution (conv_dim {list(self.conv_dim)}, conv_kernel {list(self.conv_kernel)}, "
                              f"conv_stride {list(self.conv_stride)})")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"encoders.hubert_ecg: hidden_size={self.hidden_size} is not divisible by "
                              f"num_heads={self.num_heads}")
        if self.hidden_size % self.pos_conv_groups:
            raise ConfigError(f"encoders.hubert_ecg: hidden_size={self.hidden_size} is not divisible by "
                              f"pos_conv_groups={self.pos_conv_groups}")

    @classmethod
    def tiny(cls) -> "HubertEcgOptions":
        return cls(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64, conv_dim=(16,) * 5,
                   pos_conv_kernel=16, pos_conv_groups=4)

    @property
    def stride(self) -> int:
        """Input samples per output token (the product of the convolution strides: 64 published)."""
        out = 1
        for s in self.conv_stride:
            out *= s
        return out


SPEC = declare_encoder(EncoderSpec(
    "hubert_ecg", "HuBERT-ECG (published weights)", SEQUENCE, options=HubertEcgOptions,
    module="coreecg.model.published.hubert_ecg", published=True,
    input="(B, 6000): the 12 standard leads (I, II, III, aVR, aVL, aVF, V1-V6) band-passed 0.05-47 Hz, at "
          "500 Hz, min-max scaled to [-1, 1] per lead over the record, the first 5 s of each flattened lead "
          "after lead and decimated by 5 (scipy.signal.decimate) across the lead boundaries"))
