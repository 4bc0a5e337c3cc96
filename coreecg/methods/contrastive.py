"""The negatives pool every contrastive method draws from, chosen by the one key
`optim.gather_negatives`: gathered (the default), the global batch, every data-parallel rank's
rows; not gathered, the rank's own batch. On one process both are the batch. CoRe-ECG's InfoNCE,
MoCo v3's and CMSC's losses gather through these two functions, so that methods compared in one
table see the same pool."""
from __future__ import annotations

import torch
import torch.distributed as dist

try:        # the functional collective; older torch lacks it (2.11): torch.distributed.nn's all_gather
    from torch.distributed._functional_collectives import all_gather_single_autograd, wait_tensor
except ImportError:
    from torch.distributed.nn.functional import all_gather
    all_gather_single_autograd = wait_tensor = None


def gather_with_grad(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(B, ...) -> all ranks' rows concatenated in rank order, (B * world, ...), with gradients
    flowing back to each rank; and this rank's offset into them."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t, 0
    if all_gather_single_autograd is None:     # older torch: the autograd-aware all_gather it replaces
        return torch.cat(all_gather(t.contiguous())), dist.get_rank() * t.shape[0]
    # Functional collective (torch.distributed.nn's all_gather is deprecated and warned every
    # step): the backward is a reduce-scatter, so each rank's rows get every rank's gradient.
    gathered = wait_tensor(all_gather_single_autograd(t.contiguous(), 0, dist.group.WORLD))
    return gathered, dist.get_rank() * t.shape[0]


def gather_no_grad(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(B, ...) -> all ranks' rows in rank order, (B * world, ...), without gradient; and this
    rank's offset into them."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t, 0
    out = t.new_empty((dist.get_world_size() * t.shape[0], *t.shape[1:]))
    dist.all_gather_into_tensor(out, t.contiguous())
    return out, dist.get_rank() * t.shape[0]
