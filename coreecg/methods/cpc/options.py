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

    steps: int | None = None          # None: CPC's 12 on frames, min(12, segments - 1) on segments
    context: Literal["auto", "frames", "segments"] = "auto"
    segment_samples: int = 225        # 0.9 s at 250 Hz: 3 ViT patches, 10 segments of a 2250-sample crop
    context_dim: int = 512            # the GRU's width (segments)
    temperature: float = 1.0          # logits = z^T W_k c / temperature (1: CPC's bilinear score)

    def __post_init__(self) -> None:     # the config prefixes its errors with methods.cpc
        if (self.steps is not None and self.steps < 1) or self.segment_samples < 1 or self.context_dim < 1 \
                or self.temperature <= 0:
            raise ConfigError("need steps (or null), segment_samples and context_dim >= 1 and temperature > 0")

    def check(self, config: Any) -> None:
        """Against the rest of the config (Config.validate calls it when CPC trains): before Ray
        starts, every prediction head must have a (context, target) pair (issue 61: a head past the
        last segment got no gradient, which DDP refuses on 2 workers)."""
        segments = self.segments(config)
        if self.context != "frames" and segments < 2:
            raise ConfigError(f"methods.cpc.segment_samples={self.segment_samples} leaves {segments} segment(s) "
                              f"of a {config.model.input_samples}-sample crop: need 2 or more to predict one")
        grid = encoder_spec(config.model.arch).output == GRID          # a patch encoder reads whole patches
        if grid and self.segment_samples % config.patch_size:
            raise ConfigError(f"methods.cpc.segment_samples={self.segment_samples} must be whole patches of "
                              f"{config.patch_key}={config.patch_size} for model.arch={config.model.arch}")
        if self.context_of(config) == "segments" and self.steps is not None and self.steps > segments - 1:
            raise ConfigError(
                f"methods.cpc.steps={self.steps} predicts up to {self.steps} segments ahead, but "
                f"methods.cpc.segment_samples={self.segment_samples} gives {segments} segments of a "
                f"{config.model.input_samples}-sample crop: only steps 1..{segments - 1} have a (context, target) "
                f"pair, so the other heads would never train; set methods.cpc.steps <= {segments - 1}, a smaller "
                f"segment_samples, or leave steps unset (null: min({DEFAULT_STEPS}, segments - 1))")

    def segments(self, config: Any) -> int:
        """Segments of a window in the segments context: model.input_samples // segment_samples."""
        return config.model.input_samples // self.segment_samples

    def context_of(self, config: Any) -> str | None:
        """"frames" or "segments", as the method will build it, where the config tells: an explicit
        context; a patch (grid) encoder has no frames; a sequence encoder offers them when its
        options declare `causal_frames` true (the S4 encoder unless bidirectional); a built-in that
        declares nothing has none. None: a plugin encoder that declares nothing (the method decides
        from the built module, and checks there)."""
        if self.context != "auto":
            return self.context
        spec = encoder_spec(config.model.arch)
        declared = getattr(config.encoder, "causal_frames", None)
        if spec.output == GRID or (declared is None and spec.built_in):
            return "segments"
        return None if declared is None else ("frames" if declared else "segments")

    def prediction_steps(self, config: Any, mode: str) -> int:
        """How many heads `mode` builds: `steps`, else CPC's 12 (frames) or min(12, segments - 1)."""
        if self.steps is not None:
            return self.steps
        return DEFAULT_STEPS if mode == "frames" else min(DEFAULT_STEPS, self.segments(config) - 1)


DEFAULT_STEPS = 12                    # CPC's prediction steps (van den Oord et al. 2018), where the context has them


# A checkpoint cannot resume across these: they change the heads.
SPEC = declare_method(MethodSpec(
    "cpc", "CPC", options=CPCOptions,
    # the temperature scales the logits; the steps and segments change how many candidates and terms
    loss_scales={k: ("methods.cpc.temperature", "methods.cpc.steps", "methods.cpc.segment_samples")
                 for k in ("loss", "loss_con")},
    structural=tuple(f"methods.cpc.{k}" for k in ("steps", "context", "context_dim")),
    reported_losses=("loss_con",)))          # the mean InfoNCE over the prediction steps (= loss)
