"""The options of random ECG views (`ViewsConfig`), torch-free so that the config reads a
view-based method's section without building it; the views themselves: coreecg.methods.views."""
from __future__ import annotations

from dataclasses import dataclass

from coreecg.config.base import ConfigError


@dataclass
class ViewsConfig:
    """Random ECG views for view-based contrastive methods (MoCo v3: `methods.moco_v3.views`),
    each drawn per sample and applied batched. Scalar knobs, so a sweep can sample each one.
    Defaults: Mehari & Strodthoff's RandomResizedCrop + TimeOut (their SimCLR/BYOL/SwAV recipe,
    docs/baselines.md); the other augmentations are off (0 or 1) unless set.

    crop_min: random resized crop: a stretch of U(crop_min, 1) of the window, stretched back to
        the full length (this also changes the apparent heart rate); 1 disables.
    time_mask_min, time_mask_max: "time out": one contiguous stretch of U(min, max) of the
        window set to zero on every lead; max 0 disables.
    gain_max: per-lead gain, log-uniform in [1 / gain_max, gain_max]; 1 disables.
    noise_std: additive Gaussian noise, in units of the z-scored signal.
    baseline_shift: per-lead constant offset, U(-b, b).
    baseline_wander: per-lead sinusoid of 0.05-0.5 Hz, random phase, amplitude U(0, b).
    """

    crop_min: float = 0.5
    time_mask_min: float = 0.2
    time_mask_max: float = 0.4
    gain_max: float = 1.0
    noise_std: float = 0.0
    baseline_shift: float = 0.0
    baseline_wander: float = 0.0

    def __post_init__(self) -> None:     # the config prefixes its errors with the section's key
        if not 0 < self.crop_min <= 1:
            raise ConfigError(f"crop_min={self.crop_min} must lie in (0, 1]")
        if not 0 <= self.time_mask_min <= self.time_mask_max < 1:
            raise ConfigError(f"need 0 <= time_mask_min ({self.time_mask_min}) <= time_mask_max "
                              f"({self.time_mask_max}) < 1 (some signal must remain)")
        if self.gain_max < 1:
            raise ConfigError(f"gain_max={self.gain_max} must be >= 1 (gains span [1/gain_max, gain_max])")
        if min(self.noise_std, self.baseline_shift, self.baseline_wander) < 0:
            raise ConfigError("noise_std, baseline_shift and baseline_wander must be >= 0")
