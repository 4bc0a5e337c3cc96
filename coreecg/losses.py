"""Pretraining objectives: masked reconstruction MSE, CoRe-ECG's InfoNCE, and the contrastive
losses of the baselines (MoCo v3, CMSC). Every contrastive loss draws its negatives from one pool,
chosen by the one key `loss.gather_negatives`: `gather=True` (the default) the global batch, every
data-parallel rank's rows; `gather=False` the rank's own batch. On one process both are the batch."""
from __future__ import annotations

import torch
import torch.nn.functional as F


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


def _gather_with_grad(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' rows, concatenated in rank order, with gradients flowing back to each rank."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return t, 0
    try:
        from torch.distributed._functional_collectives import all_gather_single_autograd, wait_tensor
    except ImportError:     # older torch (2.11 lacks it): the autograd-aware all_gather it replaces
        from torch.distributed.nn.functional import all_gather

        return torch.cat(all_gather(t.contiguous())), dist.get_rank() * t.shape[0]
    # Functional collective (torch.distributed.nn's all_gather is deprecated and warned every
    # step): the backward is a reduce-scatter, so each rank's rows get every rank's gradient.
    gathered = wait_tensor(all_gather_single_autograd(t.contiguous(), 0, dist.group.WORLD))
    return gathered, dist.get_rank() * t.shape[0]


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
    """MoCo v3's ctr(q, k): each query against the keys of the whole (global) batch (the rank's
    batch without `gather`), its own key the positive; keys carry no gradient. Scaled by 2 tau,
    as the MoCo v3 code does.

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


def cmsc_contrastive(a: torch.Tensor, b: torch.Tensor, tau: float, patient: torch.Tensor | None = None,
                     gather: bool = True) -> torch.Tensor:
    """CLOCS's CMSC loss for one pair of segment views (Kiyasseh et al., ICML 2021, and
    `obtain_contrastive_loss` in its code; docs/baselines.md). a[i] and b[i] are adjacent segments
    of window i; the candidates of a[i] are b of the whole (global) batch, or of the rank's batch
    without `gather`, and the other way round (cosine similarity / tau, both views with
    gradient). Positives: the own pair, and every pair of windows of one patient (`patient`
    equal: other recordings and other windows of the same recording); everything else is a
    negative. As in CLOCS every candidate stays in the softmax, and the loss per direction is the
    mean of two terms, the own pairs' mean -log p and the same-patient pairs' mean -log p (the
    latter only when the pool has such pairs); unlike CLOCS (one triangle per direction) both
    directions take every same-patient pair.

    a, b: (B, E); patient: (B,) int64 or None (every window its own patient) -> scalar. With
    `gather` the same-patient mean is over the pairs of every rank, so the mean over ranks of
    this loss (what DDP's gradient averaging optimises) is the one-rank loss of the global batch.
    """
    a, b = F.normalize(a.float(), dim=-1), F.normalize(b.float(), dim=-1)
    all_a, all_b, offset, world = a, b, 0, 1
    if gather:
        all_a, offset = _gather_with_grad(a)
        all_b, _ = _gather_with_grad(b)
        world = all_a.shape[0] // a.shape[0]
    rows = torch.arange(a.shape[0], device=a.device)
    own = rows + offset                                                  # (B,) own pair's column
    patient = own if patient is None else patient
    all_patient = _gather_no_grad(patient)[0] if gather else patient
    # (B, B * world): same patient, less the own pair (its own term). Built elementwise: an
    # in-place `same[rows, own] = False` copies the scalar to the GPU and syncs every step.
    columns = torch.arange(all_patient.shape[0], device=a.device)
    same = (patient[:, None] == all_patient[None, :]) & (columns[None, :] != own[:, None])
    # The same-patient mean divides by the pairs of the whole pool (every rank's, counted from the
    # gathered ids), so the ranks' shares sum to the global mean; no sync, no extra collective.
    pairs = (all_patient[:, None] == all_patient[None, :]).sum().float() - all_patient.shape[0]
    has_pairs = (pairs > 0).float()
    loss = a.new_zeros(())
    for logits in (a @ all_b.T / tau, b @ all_a.T / tau):               # (B, B * world) each
        log_p = logits.log_softmax(dim=-1)
        own_term = -log_p[rows, own].mean()
        patient_term = -torch.where(same, log_p, 0.0).sum() * world / pairs.clamp_min(1.0)
        loss = loss + (own_term + has_pairs * patient_term) / (1.0 + has_pairs)
    return loss / 2
