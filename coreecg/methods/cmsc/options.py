"""CMSC's options, the section `methods.cmsc`, and its declaration in the method registry
(torch-free: the config reads the section without building the model)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coreecg.config.base import ConfigError
from coreecg.config.method_registry import MethodSpec, declare_method


@dataclass
class CMSCOptions:
    """`methods.cmsc`: CMSC (Kiyasseh, Zhu, Clifton, "CLOCS", ICML 2021): adjacent non-overlapping
    segments of one window, and segments of one patient, are positives, other patients negatives;
    no augmentation (docs/baselines.md)."""

    temperature: float = 0.1
    segments: int = 2                 # adjacent segments per window, each 1/segments of the crop
    dim: int = 256                    # CLOCS's embedding size (a linear head on the pooled encoder)

    def __post_init__(self) -> None:     # the config prefixes its errors with methods.cmsc
        if self.temperature <= 0 or self.segments < 2 or self.dim < 1:
            raise ConfigError("need temperature > 0, segments >= 2 and dim >= 1")

    def check(self, config: Any) -> None:
        """Against the rest of the config (Config.validate calls it when CMSC trains)."""
        n = config.n_patches
        if n % self.segments:
            raise ConfigError(f"methods.cmsc.segments={self.segments} must divide the {n} patches of a "
                              f"window (model.input_samples / {config.patch_key})")


SPEC = declare_method(MethodSpec("cmsc", "CMSC", options=CMSCOptions, structural=("methods.cmsc.dim",),
                                 loss_scales={k: ("methods.cmsc.temperature", "methods.cmsc.segments")
                                              for k in ("loss", "loss_con")},
                                 reported_losses=("loss_con",)))   # the mean CMSC loss over segment pairs (= loss)
