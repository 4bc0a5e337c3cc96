"""The built-in encoders' declarations and options sections (torch-free: the config reads
`encoders.<name>` and checks a method against an encoder without building either).

    coreecg     the paper's ViT (coreecg.model.encoder.Encoder): tokens on the (lead, time) grid;
                its sizes `encoders.coreecg.*` (patch_size, embed_dim, depth, num_heads, mlp_ratio,
                dropout; `model.*` before: moved keys, coreecg.config.loading)
    st_mem      ST-MEM's published ViT (coreecg.model.published): `encoders.st_mem.*`, the same
                keys, written from its weights when they are loaded
    xresnet1d   the PTB-XL benchmark's strongest supervised family (Strodthoff et al. 2021):
                a 1-D XResNet, bottleneck blocks; default xresnet1d101
    s4          a diagonal state-space encoder (S4D: Gu et al. 2022) behind a convolutional stem,
                as ECG-CPC (Al-Masud & Strodthoff 2026)

Each options dataclass holds its paper's sizes as defaults; `tiny()` gives the test size.
"""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import GRID, SEQUENCE, EncoderSpec, declare_encoder


@dataclass
class ViTOptions:
    """`encoders.coreecg`: the paper's ViT (Implementation Details): patches of `patch_size`
    samples per lead (75 at 250 Hz: 0.3 s), `depth` pre-norm transformer blocks of width
    `embed_dim` with `num_heads` heads and an MLP of `mlp_ratio` x the width."""

    patch_size: int = 75
    embed_dim: int = 256
    depth: int = 10
    num_heads: int = 4
    mlp_ratio: float = 4.0
    dropout: float = 0.0

    def __post_init__(self) -> None:     # keys that go together (width, heads): `check`, on the whole config
        if min(self.patch_size, self.embed_dim, self.depth, self.num_heads) < 1 or self.mlp_ratio <= 0:
            raise ConfigError("patch_size, embed_dim, depth and num_heads must be >= 1 and mlp_ratio > 0")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout={self.dropout} must be in [0, 1)")

    def check(self) -> None:
        if self.embed_dim % self.num_heads:
            raise ConfigError(f"embed_dim={self.embed_dim} is not divisible by its head count "
                              f"num_heads={self.num_heads}")

    @classmethod
    def tiny(cls) -> "ViTOptions":
        return cls(embed_dim=32, depth=2, num_heads=2)


@dataclass
class StMemOptions(ViTOptions):
    """`encoders.st_mem`: ST-MEM's ViT-B (Na et al. 2024) by default; loading its weights
    (coreecg.model.published.st_mem) writes the sizes they hold."""

    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12


@dataclass
class XResNet1dOptions:
    """`encoders.xresnet1d`: stem convolutions, then one stage per entry of `widths` with `layers`
    blocks each (stride 2 from the second stage on); bottleneck blocks of `expansion` 4 (1: basic
    blocks). Defaults: xresnet1d101 (layers 3, 4, 23, 3), kernel 5, as the PTB-XL benchmark."""

    stem: tuple[int, ...] = (32, 32, 64)
    widths: tuple[int, ...] = (64, 128, 256, 512)
    layers: tuple[int, ...] = (3, 4, 23, 3)
    expansion: int = 4
    kernel_size: int = 5
    dropout: float = 0.0

    def __post_init__(self) -> None:     # keys that go together (widths, layers): `check`, on the whole config
        if min(*self.stem, *self.widths, *self.layers, self.expansion, 1) < 1:
            raise ConfigError("stem, widths, layers and expansion must be >= 1")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size={self.kernel_size} must be odd (same-length convolutions)")

    def check(self) -> None:
        if not self.stem or not self.widths or len(self.widths) != len(self.layers):
            raise ConfigError(f"encoders.xresnet1d: stem and widths must be non-empty and layers give one count per "
                              f"width (widths {list(self.widths)}, layers {list(self.layers)})")

    @classmethod
    def tiny(cls) -> "XResNet1dOptions":
        return cls(stem=(8, 8, 16), widths=(16, 32), layers=(1, 1), expansion=1)


@dataclass
class S4Options:
    """`encoders.s4`: a convolutional stem (`stem` widths; each convolution's kernel is its stride,
    `stem_strides`: samples per output step = their product), then `n_layers` S4D blocks of width
    `d_model` with `d_state` state size each (pre-norm, GELU, GLU output, residual). `bidirectional`:
    each block also reads the sequence backwards (not causal). Defaults: ECG-CPC's shape (S4 behind
    a convolutional stem, 512 wide, 4 layers): 3.45M parameters here against its reported 3.8M (its
    exact layer sizes are not published in what we read; docs/encoders.md)."""

    d_model: int = 512
    n_layers: int = 4
    d_state: int = 64
    stem: tuple[int, ...] = (512, 512, 512, 512)
    stem_strides: tuple[int, ...] = (5, 1, 1, 1)
    bidirectional: bool = False
    dt_min: float = 0.001
    dt_max: float = 0.1
    dropout: float = 0.1

    def __post_init__(self) -> None:
        if min(self.d_model, self.n_layers, self.d_state) < 1 or self.d_state % 2:
            raise ConfigError("d_model, n_layers must be >= 1 and d_state even (complex-conjugate pairs)")
        if min(*self.stem, *self.stem_strides, 1) < 1:
            raise ConfigError("stem widths and stem_strides must be >= 1")
        if not 0 < self.dt_min <= self.dt_max:
            raise ConfigError("need 0 < dt_min <= dt_max")

    def check(self) -> None:
        if len(self.stem) != len(self.stem_strides):
            raise ConfigError(f"encoders.s4: stem_strides gives one stride per stem width (stem {list(self.stem)}, "
                              f"stem_strides {list(self.stem_strides)})")

    @classmethod
    def tiny(cls) -> "S4Options":
        return cls(d_model=16, n_layers=2, d_state=8, stem=(16, 16), stem_strides=(5, 3), dropout=0.0)

    @property
    def causal_frames(self) -> bool:
        """Whether it offers CPC causal local frames (`methods.cpc.context: auto` then takes them)."""
        return not self.bidirectional

    @property
    def stride(self) -> int:
        out = 1
        for s in self.stem_strides:
            out *= s
        return out


VIT = declare_encoder(EncoderSpec("coreecg", "CoRe-ECG ViT (the paper's encoder)", GRID, options=ViTOptions,
                                  module="coreecg.model.encoder"))
ST_MEM = declare_encoder(EncoderSpec("st_mem", "ST-MEM ViT (published weights)", GRID, options=StMemOptions,
                                     module="coreecg.model.published.st_mem", published=True,
                                     input="(B, C, T): ST-MEM's leads and 2250 samples at 250 Hz"))
XRESNET1D = declare_encoder(EncoderSpec("xresnet1d", "xresnet1d", SEQUENCE, options=XResNet1dOptions,
                                        module="coreecg.model.xresnet1d",
                                        input="(B, C, T): any subset of the 12 standard leads, placed at "
                                              "their channels (the others 0); any T"))
S4 = declare_encoder(EncoderSpec("s4", "S4 (diagonal state space, conv stem)", SEQUENCE, options=S4Options,
                                 module="coreecg.model.s4",
                                 input="(B, C, T): any subset of the 12 standard leads, placed at their "
                                       "channels (the others 0); any T"))
