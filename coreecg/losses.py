"""The two pretraining objectives: masked reconstruction MSE and InfoNCE."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def masked_mse(pred: torch.Tensor, target: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean squared error over masked patches only.

    pred, target: (B, C, N, P); masked: (B, C, N) bool. Each patch's error is its mean over
    the P samples (as in ST-MEM/MAE), averaged over the masked patches of the whole batch.
    Visible and dropped patches contribute exactly nothing (they are multiplied out, not
    down-weighted). Returns a scalar; 0 if nothing is masked.
    """
    per_patch = (pred.float() - target.float()).pow(2).mean(dim=-1)   # (B, C, N)
    m = masked.to(per_patch.dtype)
    return (per_patch * m).sum() / m.sum().clamp_min(1.0)


def _gather_with_grad(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' rows, concatenated in rank order, with gradients flowing back to each rank."""
    import torch.distributed as dist
    import torch.distributed.nn.functional as dist_fn

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t, 0
    return torch.cat(dist_fn.all_gather(t), dim=0), dist.get_rank() * t.shape[0]


def info_nce(student: torch.Tensor, teacher: torch.Tensor, tau: float, gather: bool = False) -> torch.Tensor:
    """InfoNCE (paper, Eq. contrastive_loss): each student embedding against every teacher
    embedding of the batch, its own teacher embedding being the positive.

    student, teacher: (B, D). Similarity is cosine. With gather=True the negatives are the
    teacher embeddings of every data-parallel rank (B * world_size candidates).
    Returns the mean over the local batch of -log softmax(sim / tau)[positive].
    """
    s = F.normalize(student.float(), dim=-1)
    t = F.normalize(teacher.float(), dim=-1)
    offset = 0
    if gather:
        t, offset = _gather_with_grad(t)
    logits = s @ t.T / tau                                              # (B, B * world)
    labels = torch.arange(s.shape[0], device=s.device) + offset
    return F.cross_entropy(logits, labels)
