"""InfoNCE with negatives gathered from every data-parallel rank (2 gloo processes on CPU)."""
import warnings

import torch

from coreecg.losses import info_nce
from tests.helpers import run_on_ranks


def _worker(rank, world, s_all, t_all):
    b = s_all.shape[0] // world
    s = s_all[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    t = t_all[rank * b:(rank + 1) * b].clone().requires_grad_(True)
    with warnings.catch_warnings():     # the deprecated all_gather warned on every step
        warnings.simplefilter("error")
        loss = info_nce(s, t, 0.2, gather=True)
    # DDP averages gradients over ranks; mimic it so grads compare with the single-process loss.
    (loss / world).backward()
    return loss.detach(), s.grad.clone(), t.grad.clone()


def test_gathered_negatives_equal_one_big_batch():
    g = torch.Generator().manual_seed(0)
    s_all, t_all = torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    results = run_on_ranks(_worker, s_all, t_all)

    s_ref = s_all.clone().requires_grad_(True)
    t_ref = t_all.clone().requires_grad_(True)
    ref = info_nce(s_ref, t_ref, 0.2)
    ref.backward()
    # the mean of per-rank losses is the full-batch loss with all 8 teachers as candidates
    assert torch.allclose((results[0][0] + results[1][0]) / 2, ref, atol=1e-6)
    # student grads are local; teacher grads arrive from the other rank's students too
    assert torch.allclose(torch.cat([results[0][1], results[1][1]]), s_ref.grad, atol=1e-6)
    assert torch.allclose(torch.cat([results[0][2], results[1][2]]), t_ref.grad, atol=1e-6)
    # and it differs from two independent local losses (negatives really crossed ranks)
    local = (info_nce(s_all[:4], t_all[:4], 0.2) + info_nce(s_all[4:], t_all[4:], 0.2)) / 2
    assert not torch.allclose(local, ref)
