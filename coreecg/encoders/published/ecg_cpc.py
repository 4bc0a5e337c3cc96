"""`encoders.ecg_cpc`: ECG-CPC's published encoder (Al-Masud, Lopez Alcaraz, Strodthoff, ICLR 2026):
a convolutional stem and a stack of S4 blocks (the NPLR "S4" kernel of Gu et al., HiPPO-LegS),
pretrained with Contrastive Predictive Coding on HEEDB. Torch-free: the config reads this section
without building the model (coreecg.model.published.ecg_cpc). Loading the weights writes the sizes
they hold; the defaults are the published checkpoint's (last_11597276.ckpt)."""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import SEQUENCE, EncoderSpec, declare_encoder


@dataclass
class EcgCpcOptions:
    """The sizes of ECG-CPC's `ts_encoder` (encoder + predictor).

    stem, stem_kernels, stem_strides, stem_dilations: one Conv1d (no bias, padding (k - 1) // 2) +
    BatchNorm1d + ReLU per entry (the original's RNNEncoder); samples per token = the strides'
    product. d_model: the S4 width H (an input Linear maps stem[-1] to it when they differ);
    n_layers S4 blocks, each with a state of d_state (d_state / 2 conjugate pairs stored) and a
    rank-`rank` low-rank term; l_max: the kernel length in tokens the stored FFT nodes are for
    (longer inputs double it, as the original). causal: one kernel (False: a second, anti-causal
    one); prenorm: LayerNorm before each block instead of after the residual (the original's
    default: after). dropout: the blocks' (tied) dropout, 0 in eval.
    """

    stem: tuple[int, ...] = (512, 512, 512, 512)
    stem_kernels: tuple[int, ...] = (3, 1, 1, 1)
    stem_strides: tuple[int, ...] = (2, 1, 1, 1)
    stem_dilations: tuple[int, ...] = (1, 1, 1, 1)
    d_model: int = 512
    n_layers: int = 4
    d_state: int = 8
    rank: int = 1
    l_max: int = 1200
    causal: bool = True
    prenorm: bool = False
    dropout: float = 0.2

    def __post_init__(self) -> None:
        if min(self.d_model, self.n_layers, self.d_state, self.l_max) < 1 or self.d_state % 2:
            raise ConfigError("d_model, n_layers, l_max must be >= 1 and d_state even and >= 2 "
                              "(complex-conjugate pairs)")
        if self.rank != 1:
            raise ConfigError(f"rank={self.rank}: only the rank-1 low-rank term (HiPPO-LegS) is implemented")
        if self.l_max % 2:
            raise ConfigError(f"l_max={self.l_max} must be even (the kernel is the inverse real FFT of "
                              "l_max / 2 + 1 nodes)")
        if not self.stem or min(*self.stem, *self.stem_kernels, *self.stem_strides, *self.stem_dilations) < 1:
            raise ConfigError("stem widths, kernels, strides and dilations must be non-empty and >= 1")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"dropout={self.dropout} must be in [0, 1)")

    def check(self) -> None:
        n = len(self.stem)
        if not len(self.stem_kernels) == len(self.stem_strides) == len(self.stem_dilations) == n:
            raise ConfigError(f"encoders.ecg_cpc: stem_kernels, stem_strides and stem_dilations give one value per "
                              f"stem width (stem {list(self.stem)}, kernels {list(self.stem_kernels)}, strides "
                              f"{list(self.stem_strides)}, dilations {list(self.stem_dilations)})")

    @classmethod
    def tiny(cls) -> "EcgCpcOptions":
        return cls(stem=(16, 16), stem_kernels=(3, 1), stem_strides=(2, 1), stem_dilations=(1, 1), d_model=16,
                   n_layers=2, d_state=4, l_max=64, dropout=0.0)

    @property
    def stride(self) -> int:
        """Input samples per output token."""
        out = 1
        for s in self.stem_strides:
            out *= s
        return out


SPEC = declare_encoder(EncoderSpec(
    "ecg_cpc", "ECG-CPC S4 (published weights)", SEQUENCE, options=EcgCpcOptions,
    module="coreecg.model.published.ecg_cpc", published=True,
    input="(B, 12, T): the 12 standard leads (I, II, III, aVR, aVL, aVF, V1-V6) in raw mV, NaN -> 0, resampled "
          "to 240 Hz with resampy kaiser_best; 10 s = 2400 samples (the benchmark: 2.5 s = 600)"))
