"""`encoders.ecg_fm`: ECG-FM's published encoder (McKeen et al. 2024; wav2vec 2.0 + CMSC on
fairseq-signals), its sizes read from the weights by coreecg.model.published.ecg_fm (torch-free)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import SEQUENCE, EncoderSpec, declare_encoder

POOLINGS = ("mean", "nonzero")


@dataclass
class EcgFmOptions:
    """ECG-FM's wav2vec 2.0 encoder; defaults: the published model (90.9 M parameters).

    conv_dims / conv_kernels / conv_strides: the convolutional feature extractor, one entry per
    layer (fairseq-signals' `conv_feature_layers` "[(256, 2, 2)] * 4"); conv_bias: whether its
    convolutions have biases. embed_dim, depth, num_heads, ffn_dim: the post-LN transformer.
    pos_kernel, pos_groups: the weight-normed convolutional position embedding (`conv_pos`,
    `conv_pos_groups`). pooling: "mean" over tokens (the pretrained file, as the ECG-FM benchmark
    pools it) or "nonzero" (the fine-tuned file: ECG-FM's own sum / count of non-zero entries, per
    channel). dropout: every dropout of the transformer (0 in inference).
    """

    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    ffn_dim: int = 3072
    conv_dims: tuple[int, ...] = (256, 256, 256, 256)
    conv_kernels: tuple[int, ...] = (2, 2, 2, 2)
    conv_strides: tuple[int, ...] = (2, 2, 2, 2)
    conv_bias: bool = False
    pos_kernel: int = 128
    pos_groups: int = 16
    pooling: Literal["mean", "nonzero"] = "mean"
    dropout: float = 0.0

    def __post_init__(self) -> None:     # keys that go together (widths, heads): `check`, on the whole config
        if min(self.embed_dim, self.depth, self.num_heads, self.ffn_dim, self.pos_kernel, self.pos_groups) < 1:
            raise ConfigError("embed_dim, depth, num_heads, ffn_dim, pos_kernel and pos_groups must be >= 1")
        if min(*self.conv_dims, *self.conv_kernels, *self.conv_strides, 1) < 1:
            raise ConfigError("conv_dims, conv_kernels and conv_strides must be >= 1")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling={self.pooling!r} must be one of {POOLINGS}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout={self.dropout} must be in [0, 1)")

    def check(self) -> None:
        if not self.conv_dims or not len(self.conv_dims) == len(self.conv_kernels) == len(self.conv_strides):
            raise ConfigError(f"encoders.ecg_fm: conv_dims, conv_kernels and conv_strides give one entry per "
                              f"convolution (conv_dims {list(self.conv_dims)}, conv_kernels "
                              f"{list(self.conv_kernels)}, conv_strides {list(self.conv_strides)})")
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}")
        if self.embed_dim % self.pos_groups:
            raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by pos_groups={self.pos_groups}")

    @classmethod
    def tiny(cls) -> "EcgFmOptions":
        return cls(embed_dim=24, depth=2, num_heads=4, ffn_dim=48, conv_dims=(16, 16, 16, 16), pos_kernel=16,
                   pos_groups=4)

    @property
    def patch_size(self) -> int:
        """Input samples per output token (the product of the convolutions' strides): what
        `Config.patch_size` reads, so model.input_samples is a whole number of tokens."""
        out = 1
        for s in self.conv_strides:
            out *= s
        return out


SPEC = declare_encoder(EncoderSpec(
    "ecg_fm", "ECG-FM (published weights)", SEQUENCE, options=EcgFmOptions, module="coreecg.model.published.ecg_fm",
    published=True,
    input="(B, 12, T): leads I, II, III, aVR, aVL, aVF, V1-V6 in that order at 500 Hz, each lead z-scored over "
          "the whole record (eps 1e-8), constant leads 0, no filtering; 2500-sample (5 s) windows"))
