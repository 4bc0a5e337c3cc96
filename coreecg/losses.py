"""Pretraining objectives: masked reconstruction MSE, CoRe-ECG's InfoNCE, and the contrastive
losses of the baselines (MoCo v3, CMSC), each with negatives from every data-parallel rank."""
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
    from torch.distributed._functional_collectives import all_gather_single_autograd, wait_tensor

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t, 0
    # Functional collective (torch.distributed.nn's all_gather is deprecated and warned every
    # step): the backward is a reduce-scatter, so each rank's rows get every rank's gradient.
    gathered = wait_tensor(all_gather_single_autograd(t.contiguous(), 0, dist.group.WORLD))
    return gathered, dist.get_rank() * t.shape[0]


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


def _gather_no_grad(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' rows in rank order (no gradient), and this rank's offset into them."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t, 0
    out = t.new_empty((dist.get_world_size() * t.shape[0], *t.shape[1:]))
    dist.all_gather_into_tensor(out, t.contiguous())
    return out, dist.get_rank() * t.shape[0]


def moco_contrastive(query: torch.Tensor, key: torch.Tensor, tau: float, gather: bool = True) -> torch.Tensor:
    """MoCo v3's ctr(q, k): each query against the keys of the whole (global) batch, its own key
    the positive; keys carry no gradient. Scaled by 2 tau, as the MoCo v3 code does.

    query, key: (B, D) -> scalar, the mean over the local queries.
    """
    q = F.normalize(query.float(), dim=-1)
    k = F.normalize(key.detach().float(), dim=-1)
    offset = 0
    if gather:
        k, offset = _gather_no_grad(k)
    logits = q @ k.T / tau                                              # (B, B * world)
    labels = torch.arange(q.shape[0], device=q.device) + offset
    return F.cross_entropy(logits, labels) * (2 * tau)


def cmsc_contrastive(a: torch.Tensor, b: torch.Tensor, tau: float, record: torch.Tensor | None = None,
                     gather: bool = True) -> torch.Tensor:
    """CLOCS's CMSC loss for one pair of segment views: a[i] and b[i] are adjacent segments of
    window i (the positive); the candidates are the other view's embeddings of the whole (global)
    batch, except those of the same recording (`record` equal), which are never negatives.
    Cosine similarity / tau, symmetric (a -> b rows and b -> a), both views with gradient.

    a, b: (B, E); record: (B,) int64 or None (every window its own recording) -> scalar.
    """
    a, b = F.normalize(a.float(), dim=-1), F.normalize(b.float(), dim=-1)
    offset = 0
    all_a, all_b = a, b
    if gather:
        all_a, offset = _gather_with_grad(a)
        all_b, _ = _gather_with_grad(b)
    labels = torch.arange(a.shape[0], device=a.device) + offset
    logits_ab, logits_ba = a @ all_b.T / tau, b @ all_a.T / tau        # (B, B * world)
    if record is not None:
        all_rec = _gather_no_grad(record)[0] if gather else record
        same = record[:, None] == all_rec[None, :]
        same[torch.arange(a.shape[0], device=a.device), labels] = False      # the positive stays
        logits_ab = logits_ab.masked_fill(same, float("-inf"))
        logits_ba = logits_ba.masked_fill(same, float("-inf"))
    return (F.cross_entropy(logits_ab, labels) + F.cross_entropy(logits_ba, labels)) / 2
