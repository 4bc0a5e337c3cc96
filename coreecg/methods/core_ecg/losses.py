"""CoRe-ECG's two objectives: the masked reconstruction MSE (Time Decoder) and the InfoNCE of the
student projection against the teacher's (its negatives from the one pool, `optim.gather_negatives`:
coreecg.methods.contrastive)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from coreecg.methods.contrastive import gather_with_grad


def masked_mse(pred: torch.Tensor, target: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Mean squared error over masked patches only.

    pred, target: (B, C, N, P); masked: (B, C, N) bool. Each patch's error is its mean over
    the P samples (as in ST-MEM/MAE), averaged over the masked patches of the whole batch.
    Visible and dropped patches contribute exactly nothing (they are multiplied out, not
    down-weighted). Returns a scalar; 0 if nothing is masked.
    Unmasked patches are selected out (`torch.where`) before any arithmetic: whatever they hold
    (NaN, a short record's padding) reaches neither the loss nor a gradient.
    """
    diff = torch.where(masked[..., None], pred.float() - target.float(), 0.0)
    per_patch = diff.pow(2).mean(dim=-1)                               # (B, C, N)
    m = masked.to(per_patch.dtype)
    return per_patch.sum() / m.sum().clamp_min(1.0)


def info_nce(student: torch.Tensor, teacher: torch.Tensor, tau: float, gather: bool = True) -> torch.Tensor:
    """InfoNCE (paper, Eq. contrastive_loss): each student embedding against every teacher
    embedding of the batch, its own teacher embedding being the positive.

    student, teacher: (B, D). Similarity is cosine. With gather=True the negatives are the
    teacher embeddings of every data-parallel rank (B * world_size candidates), else the rank's.
    Returns the mean over the local batch of -log softmax(sim / tau)[positive].
    """
    s = F.normalize(student.float(), dim=-1)
    t = F.normalize(teacher.float(), dim=-1)
    offset = 0
    if gather:
        t, offset = gather_with_grad(t)
    logits = s @ t.T / tau                                              # (B, B * world)
    labels = torch.arange(s.shape[0], device=s.device) + offset
    return F.cross_entropy(logits, labels)
