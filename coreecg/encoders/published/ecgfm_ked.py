"""`encoders.ecgfm_ked`: the sizes of ECGFM-KED's ECG encoder (Tian et al., Cell Reports Medicine
2024), an xresnet1d101 (torch-free; the module is coreecg.model.published.ecgfm_ked).

Defaults are the published model (`xresnet1d101(input_channels=12, kernel_size=5)` of its
main_mimiciv.py): a stem of three convolutions (32, 32, 64), stage widths (64, 128, 128, 192) (ECGFM-KED's
own, not the PTB-XL benchmark's 64-512) with (3, 4, 23, 3) bottleneck blocks (expansion 4), so 768
features per step. Loading its weights writes the sizes they hold.
"""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import SEQUENCE, EncoderSpec, declare_encoder

EXPANSION = 4         # bottleneck blocks: a block of width w yields 4 w channels


@dataclass
class EcgFmKedOptions:
    """`encoders.ecgfm_ked`: `stem` (the stem convolutions' widths, the first of stride 2, kernel
    `kernel_size_stem`), then one stage per entry of `widths` with `layers` bottleneck blocks each
    (stride 2 from the second stage on, middle convolution of kernel `kernel_size`)."""

    stem: tuple[int, ...] = (32, 32, 64)
    widths: tuple[int, ...] = (64, 128, 128, 192)
    layers: tuple[int, ...] = (3, 4, 23, 3)
    kernel_size: int = 5
    kernel_size_stem: int = 5

    def __post_init__(self) -> None:
        self.stem, self.widths, self.layers = tuple(self.stem), tuple(self.widths), tuple(self.layers)
        if not self.stem or not self.widths or len(self.widths) != len(self.layers):
            raise ConfigError(f"encoders.ecgfm_ked: stem and widths must be non-empty and layers give one count per "
                              f"width (widths {list(self.widths)}, layers {list(self.layers)})")
        if min(*self.stem, *self.widths, *self.layers) < 1:
            raise ConfigError("encoders.ecgfm_ked: stem, widths and layers must be >= 1")
        for name in ("kernel_size", "kernel_size_stem"):
            k = getattr(self, name)
            if k < 1 or k % 2 == 0:      # padding (k - 1) // 2 keeps the length only for odd k
                raise ConfigError(f"encoders.ecgfm_ked: {name}={k} must be odd and >= 1")

    @classmethod
    def tiny(cls) -> "EcgFmKedOptions":
        return cls(stem=(8, 8, 16), widths=(4, 8), layers=(1, 1), kernel_size=3, kernel_size_stem=3)

    @property
    def dim(self) -> int:
        return self.widths[-1] * EXPANSION

    @property
    def stride(self) -> int:
        """Input samples per output step: the stem's 2, the max-pool's 2, 2 per later stage."""
        return 4 * 2 ** (len(self.widths) - 1)


SPEC = declare_encoder(EncoderSpec(
    "ecgfm_ked", "ECGFM-KED xresnet1d101 (published weights)", SEQUENCE, options=EcgFmKedOptions,
    module="coreecg.model.published.ecgfm_ked", published=True,
    input="(B, 12, 1000): leads I, II, III, aVR, aVL, aVF, V1-V6, 10 s at 100 Hz (FFT-resampled from 500 Hz), "
          "raw mV, NaN set to 0, no filter, no normalisation"))
