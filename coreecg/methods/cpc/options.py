"""CPC's options, the section `methods.cpc`, and its declaration in the method registry
(torch-free: the config reads the section without building the model)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from coreecg.config.base import ConfigError
from coreecg.config.encoder_registry import GRID, encoder_spec
from coreecg.config.method_registry import MethodSpec, declare_method


@dataclass
class CPCOptions:
    """`methods.cpc`: contrastive predictive coding (van den Oord, Li, Vinyals 2018), the objective
    of ECG-CPC and the best of five in Al-Masud & Strodthoff's 2026 comparison: from the context at
    step t, predict the encoding k = 1..`steps` steps ahead against the other windows' encodings at
    that step (InfoNCE, one bilinear head per k; the pool is `optim.gather_negatives`).

    context: where the steps come from. "frames" (a causal encoder with local frames, the S4
    encoder: ECG-CPC's form) predicts the encoder's stem frames from its own causal output;
    "segments" (any encoder) encodes non-overlapping `segment_samples` crops of the window one by
    one and runs a GRU of width `context_dim` over them, so no context sees a target's samples;
    "auto": frames where the encoder offers them, else segments (docs/encoders.md)."""

    steps: int = 12
    context: Literal["auto", "frames", "segments"] = "auto"
    segment_samples: int = 225        # 0.9 s at 250 Hz: 3 ViT patches, 10 segments of a 2250-sample crop
    context_dim: int = 512            # the GRU's width (segments)
    temperature: float = 1.0          # logits = z^T W_k c / temperature (1: CPC's bilinear score)

    def __post_init__(self) -> None:     # the config prefixes its errors with methods.cpc
        if self.steps < 1 or self.segment_samples < 1 or self.context_dim < 1 or self.temperature <= 0:
            raise ConfigError("need steps, segment_samples and context_dim >= 1 and temperature > 0")

    def check(self, config: Any) -> None:
        """Against the rest of the config (Config.validate calls it when CPC trains)."""
        segments = config.model.input_samples // self.segment_samples
        if self.context != "frames" and segments < 2:
            raise ConfigError(f"methods.cpc.segment_samples={self.segment_samples} leaves {segments} segment(s) "
                              f"of a {config.model.input_samples}-sample crop: need 2 or more to predict one")
        grid = encoder_spec(config.model.arch).output == GRID          # a patch encoder reads whole patches
        if grid and self.segment_samples % config.patch_size:
            raise ConfigError(f"methods.cpc.segment_samples={self.segment_samples} must be whole patches of "
                              f"{config.patch_key}={config.patch_size} for model.arch={config.model.arch}")


# A checkpoint cannot resume across these: they change the heads.
SPEC = declare_method(MethodSpec(
    "cpc", "CPC", options=CPCOptions,
    # the temperature scales the logits; the steps and segments change how many candidates and terms
    loss_scales={k: ("methods.cpc.temperature", "methods.cpc.steps", "methods.cpc.segment_samples")
                 for k in ("loss", "loss_con")},
    structural=tuple(f"methods.cpc.{k}" for k in ("steps", "context", "context_dim")),
    reported_losses=("loss_con",)))          # the mean InfoNCE over the prediction steps (= loss)
