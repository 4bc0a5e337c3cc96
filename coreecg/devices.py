"""Moving small tensors between the host and the training device."""
from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A small host tensor (masks, indices) onto `device` without stalling the host: pinned,
    non-blocking on CUDA; unchanged when it is already there."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        # Contiguous before pinning: a strided pinned tensor is staged through pageable memory.
        return t.contiguous().pin_memory().to(device, non_blocking=True)
    return t.to(device)
