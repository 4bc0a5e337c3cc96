"""`encoders.ecgfounder`: ECGFounder's Net1D (Li et al., NEJM AI 2025), torch-free.

The published 12-lead and 1-lead (lead I) models share every size but the input channels, which
are `model.n_leads` (12 or 1), so one options class covers both. Loading the weights
(coreecg.model.published.ecgfounder) writes the sizes they hold.
"""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import SEQUENCE, EncoderSpec, declare_encoder


@dataclass
class ECGFounderOptions:
    """Net1D's sizes: a first SAME convolution (`base_filters` wide, kernel `kernel_size`, stride
    `first_stride`), then one stage per entry of `filters` with `blocks` bottleneck blocks each
    (1x1 -> grouped k-wide convolution of `filters[s] // groups_width` groups -> 1x1, middle width
    `int(filters[s] * ratio)`, squeeze-excitation of hidden width `filters[s] // se_ratio`); the
    first block of every stage has stride `stride`. Defaults: the published model (30.8M parameters
    with 12 leads, width 1024)."""

    base_filters: int = 64
    filters: tuple[int, ...] = (64, 160, 160, 400, 400, 1024, 1024)
    blocks: tuple[int, ...] = (2, 2, 2, 3, 3, 4, 4)
    kernel_size: int = 16
    stride: int = 2                   # each stage's first block (hard-coded 2 in ECGFounder's scripts)
    first_stride: int = 2             # the first convolution's (hard-coded 2 in Net1D)
    groups_width: int = 16            # channels per group of the k-wide convolution
    ratio: float = 1.0                # middle width / output width of a block
    se_ratio: int = 2                 # squeeze-excitation reduction (fixed in Net1D)

    def __post_init__(self) -> None:     # keys that go together (filters, blocks, groups): `check`
        self.filters, self.blocks = tuple(self.filters), tuple(self.blocks)
        if min(self.base_filters, self.kernel_size, self.stride, self.first_stride, self.groups_width,
               self.se_ratio, *self.filters, *self.blocks, 1) < 1:
            raise ConfigError("base_filters, filters, blocks, kernel_size, stride, first_stride, groups_width "
                              "and se_ratio must be >= 1")
        if not self.ratio > 0:
            raise ConfigError(f"ratio={self.ratio} must be > 0")

    def check(self) -> None:
        if not self.filters or len(self.filters) != len(self.blocks):
            raise ConfigError(f"encoders.ecgfounder: filters and blocks give one entry per stage (filters "
                              f"{list(self.filters)}, blocks {list(self.blocks)})")
        for f in self.filters:
            groups, middle = f // self.groups_width, int(f * self.ratio)
            if groups < 1 or middle < 1 or middle % groups or f // self.se_ratio < 1:
                raise ConfigError(f"encoders.ecgfounder: a stage of width {f} needs groups_width "
                                  f"({self.groups_width}) <= {f}, a middle width int({f} * ratio) = {middle} "
                                  f"divisible by its {groups} groups and se_ratio ({self.se_ratio}) <= {f}")

    @classmethod
    def tiny(cls) -> "ECGFounderOptions":
        return cls(base_filters=16, filters=(16, 32), blocks=(1, 2))


SPEC = declare_encoder(EncoderSpec(
    "ecgfounder", "ECGFounder Net1D (published weights)", SEQUENCE, options=ECGFounderOptions,
    module="coreecg.model.published.ecgfounder", published=True,
    input="(B, C, T): the 12 standard leads (12-lead model) or lead I (1-lead model), 5000 samples at "
          "500 Hz, notch 50 Hz + band-pass 0.67-40 Hz + 0.4 s median baseline removed, z-scored over "
          "leads and time together"))
