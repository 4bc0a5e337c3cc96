"""`encoders.xecg`: xECG's published encoder (BenchECG and xECG, arXiv 2509.10151), sizes only
(torch-free); the module is coreecg.model.published.xecg, its sizes are read from the weights.

xECG is a bidirectional stack of xLSTM blocks (sLSTM "s" and mLSTM "m") over 250 ms patches of a
12-lead ECG at 100 Hz. Published: one size, `riccardolunelli/xECG_base_model_v1` (width 1024,
nine blocks s s m m s s m m s, 4 heads, patches of 25 samples): the defaults here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import SEQUENCE, EncoderSpec, declare_encoder

ACTIVATIONS = ("gelu", "relu", "relu^2", "sigmoid", "swish", "selu")     # xlstm 2.0.6's FFN activations
POOLINGS = ("avg", "max")


def rounded_up(width: float, multiple: int = 64) -> int:
    """xlstm's projection width: `width` rounded up to a multiple of 64 (1.3 x 1024 -> 1344)."""
    return int(math.ceil(width / multiple) * multiple)


@dataclass
class XEcgOptions:
    """xECG's sizes. `blocks`: one letter per block, "s" an sLSTM block (with its gated FFN of
    `ffn_dim`), "m" an mLSTM block (inner width `mlstm_dim`, q/k/v maps block-diagonal in blocks of
    `qkv_blocksize`); `num_heads` heads in both kinds; causal depthwise convolutions of
    `conv_kernel`; `post_norm`: a final LayerNorm (xECG's `use_final_layer_norm`, off in the
    release); `activation`: the FFN's gate; `pooling`: xECG's `cls_type` ("avg" in the release)."""

    embed_dim: int = 1024
    blocks: str = "ssmmssmms"
    num_heads: int = 4
    patch_size: int = 25
    conv_kernel: int = 4
    qkv_blocksize: int = 4
    mlstm_dim: int = 2048          # proj_factor 2 x 1024, rounded up to 64
    ffn_dim: int = 1344            # proj_factor 1.3 x 1024, rounded up to 64
    post_norm: bool = False
    activation: str = "gelu"
    pooling: str = "avg"

    def __post_init__(self) -> None:
        if min(self.embed_dim, self.num_heads, self.patch_size, self.conv_kernel, self.qkv_blocksize,
               self.mlstm_dim, self.ffn_dim) < 1:
            raise ConfigError("embed_dim, num_heads, patch_size, conv_kernel, qkv_blocksize, mlstm_dim and ffn_dim "
                              "must be >= 1")
        if not self.blocks or set(self.blocks) - {"s", "m"}:
            raise ConfigError(f"blocks={self.blocks!r} must be a non-empty string of 's' (sLSTM) and 'm' (mLSTM)")
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"activation={self.activation!r} must be one of {ACTIVATIONS}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"pooling={self.pooling!r} must be one of {POOLINGS}")

    def check(self) -> None:
        """Keys that go together: the widths must split into the heads and q/k/v blocks."""
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by num_heads={self.num_heads}")
        if self.mlstm_dim % self.num_heads or self.mlstm_dim % self.qkv_blocksize:
            raise ConfigError(f"mlstm_dim={self.mlstm_dim} must be divisible by num_heads={self.num_heads} and "
                              f"qkv_blocksize={self.qkv_blocksize}")

    @classmethod
    def tiny(cls) -> "XEcgOptions":
        return cls(embed_dim=32, blocks="sms", num_heads=2, mlstm_dim=64, ffn_dim=64)


SPEC = declare_encoder(EncoderSpec(
    "xecg", "xECG (published weights)", SEQUENCE, options=XEcgOptions, module="coreecg.model.published.xecg",
    published=True,
    input="(B, T, 12) time-major: leads I, II, III, aVR, aVL, aVF, V1-V6 in mV at 100 Hz (FFT-resampled), "
          "no filter, no normalisation, at most 1200 samples cut to a multiple of 25; a patch whose first "
          "sample is 0 on every lead is padding"))
