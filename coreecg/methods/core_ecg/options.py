"""CoRe-ECG's options, the section `methods.core` (paper: Implementation Details), and its
declaration in the method registry. Torch-free: the config reads the section without building
the model.

    methods:
      core:
        masking: {strategy: stdm, p_time: 0.5, p_lead: 0.2, k: 4}
        fda: {enabled: true, learnable: true}
        loss: {alpha: 1.0, beta: 1.0, tau: 0.2}
        time_decoder: {dim: 256, depth: 10, heads: 4, layout: axial}
        latent_decoder: {dim: 256, depth: 8, heads: 4, layout: joint}
        projection: {hidden_dim: 1024, dim: 256}
        ema: {momentum: 0.996, momentum_end: 1.0}

Configs written when these were the top-level sections masking, augment and loss, the decoder
and projection keys of `model` and the EMA keys of `optim` still load (MOVED_KEYS below: each
old key read at its new place).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from coreecg.config.base import ConfigError
from coreecg.config.method_registry import MethodSpec, declare_method


@dataclass
class MaskingOptions:
    """Which tokens the student sees.

    strategy: stdm (the paper), random (ST-MEM-style per-token masking at `ratio`),
    temporal (whole time columns at `ratio`, MTAE-like), lead (whole leads at `ratio`,
    MLAE-like). Only stdm drops tokens; the others split into visible and masked.
    """

    strategy: Literal["stdm", "random", "temporal", "lead"] = "stdm"
    p_time: float = 0.5
    p_lead: float = 0.2
    k: int = 4
    mode: Literal["bernoulli", "exact"] = "bernoulli"
    ratio: float = 0.75

    def __post_init__(self) -> None:      # the config prefixes its errors with methods.core.masking
        for name in ("p_time", "p_lead", "ratio"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name}={getattr(self, name)} must lie in [0, 1]")


@dataclass
class FDAOptions:
    """Frequency Dynamic Augmentation of the teacher's view (fine-tuning's augmentation is
    another thing: finetune.augment)."""

    enabled: bool = True              # False: the teacher sees the raw view (ablation)
    learnable: bool = True            # False: W stays at its initial value
    eps: float = 1e-3
    init_std: float = 0.1             # W ~ N(0, init_std): breaks the A = 0.5 tie at step 0
    # W's starting map (paper: silent). random: N(0, init_std) alone, so the perturbed half of
    # each lead's bins is a random half, ECG band included; band: +1 inside the preprocessing
    # pass-band (data.preprocess.highpass_hz..lowpass_hz), -1 outside, plus the same noise:
    # the paper's premise that the 0.65-40 Hz band carries the ECG. See docs/decisions.md.
    init: Literal["random", "band"] = "band"


@dataclass
class LossOptions:
    """L = alpha * L_rec + beta * L_con (paper Eq. 9); tau: InfoNCE's temperature."""

    alpha: float = 1.0                # reconstruction weight; 0 = contrastive-only ablation
    beta: float = 1.0                 # contrastive weight; 0 = reconstructive-only ablation
    tau: float = 0.2

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.beta < 0 or self.alpha + self.beta == 0:
            raise ConfigError("alpha and beta must be >= 0 and not both 0")
        if self.tau <= 0:
            raise ConfigError(f"tau={self.tau} must be > 0")


@dataclass
class DecoderOptions:
    """A decoder's transformer. layout (the paper is silent): "joint" attends over all C * N
    tokens, "lead" runs one sequence per lead with shared weights (ST-MEM's decoder), "axial"
    alternates within-lead and within-column blocks. Measured in docs/decisions.md."""

    dim: int = 256
    depth: int = 10
    heads: int = 4
    layout: Literal["joint", "lead", "axial"] = "axial"

    def __post_init__(self) -> None:
        if min(self.dim, self.depth, self.heads) < 1 or self.dim % self.heads:
            raise ConfigError(f"need dim, depth, heads >= 1 and dim ({self.dim}) divisible by heads ({self.heads})")
        if self.layout == "axial" and self.depth < 2:
            raise ConfigError("layout=axial alternates within-lead and within-column blocks: it needs depth >= 2")


@dataclass
class ProjectionOptions:
    """The projection head after the Latent Decoder (student) and the teacher encoder: a 2-layer
    MLP (not in the paper, docs/decisions.md)."""

    hidden_dim: int = 1024
    dim: int = 256


@dataclass
class EMAOptions:
    """The teacher's momentum (paper Eqs. 4, 8)."""

    momentum: float = 0.996           # at step 0 ...
    momentum_end: float = 1.0         # ... cosine-increased to this at the last step (BYOL)

    def __post_init__(self) -> None:
        if not 0 <= self.momentum <= self.momentum_end <= 1:
            raise ConfigError("need 0 <= momentum <= momentum_end <= 1")


@dataclass
class CoReOptions:
    """`methods.core`: CoRe-ECG's every hyperparameter but the encoder's (model) and the
    optimiser's (optim). Defaults: the paper's values."""

    masking: MaskingOptions = field(default_factory=MaskingOptions)
    fda: FDAOptions = field(default_factory=FDAOptions)
    loss: LossOptions = field(default_factory=LossOptions)
    time_decoder: DecoderOptions = field(default_factory=DecoderOptions)
    latent_decoder: DecoderOptions = field(default_factory=lambda: DecoderOptions(depth=8, layout="joint"))
    projection: ProjectionOptions = field(default_factory=ProjectionOptions)
    ema: EMAOptions = field(default_factory=EMAOptions)

    def check(self, config: Any) -> None:
        """Against the rest of the config (Config.validate calls it when CoRe-ECG trains)."""
        m = config.model
        if self.masking.strategy == "stdm" and not 0 < self.masking.k < m.n_leads:
            hint = (" (one lead has no spatial axis to mask: set methods.core.masking.strategy=temporal)"
                    if m.n_leads == 1 else "")
            raise ConfigError(f"methods.core.masking.k={self.masking.k} must satisfy 0 < k < model.n_leads={m.n_leads}"
                              + hint)


def _moved() -> dict[str, str]:
    """The keys CoRe-ECG's options had before they were its own section -> their places in methods.core."""
    out = {f"masking.{f.name}": f"methods.core.masking.{f.name}" for f in fields(MaskingOptions)}
    out |= {f"augment.{f.name}": f"methods.core.fda.{f.name}" for f in fields(FDAOptions) if f.name != "enabled"}
    out["augment.fda"] = "methods.core.fda.enabled"
    out |= {f"loss.{f.name}": f"methods.core.loss.{f.name}" for f in fields(LossOptions)}
    for which in ("time", "latent"):
        out |= {f"model.{which}_decoder_{f.name}": f"methods.core.{which}_decoder.{f.name}"
                for f in fields(DecoderOptions)}
    out |= {"model.proj_hidden_dim": "methods.core.projection.hidden_dim",
            "model.proj_dim": "methods.core.projection.dim",
            "optim.ema_momentum": "methods.core.ema.momentum",
            "optim.ema_momentum_end": "methods.core.ema.momentum_end"}
    return out


MOVED_KEYS = _moved()

# The structural keys decide which branches and shapes exist (loss.alpha = 0 builds no Time
# Decoder, beta = 0 no Latent Decoder, projection, teacher or FDA; a fixed W is a buffer): a
# checkpoint cannot resume across them. Everything else in methods.core defines the method (rows
# of a table may differ in it), as its own section always does.
SPEC = declare_method(MethodSpec(
    "core", "CoRe-ECG", options=CoReOptions, needs="grid",      # STDM masks tokens on the (lead, time) grid
    # loss = alpha * loss_rec + beta * loss_con; loss_con's InfoNCE scale moves with tau
    loss_scales={"loss": ("methods.core.loss.alpha", "methods.core.loss.beta", "methods.core.loss.tau"),
                 "loss_con": ("methods.core.loss.tau",)},
    structural=("methods.core.loss.alpha>0", "methods.core.loss.beta>0", "methods.core.fda.enabled",
                "methods.core.fda.learnable", "methods.core.time_decoder", "methods.core.latent_decoder",
                "methods.core.projection"),
    reported_losses=("loss_rec", "loss_con"),      # an ablation reports only the terms it trains
    moved_keys=MOVED_KEYS))
