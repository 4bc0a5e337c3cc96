"""Contrastive losses with negatives gathered from every data-parallel rank, and the one pool
key (2 gloo processes on CPU)."""
import warnings

import pytest
import torch

from coreecg.config import load_config
from coreecg.methods.cmsc import cmsc_contrastive
from coreecg.methods.core_ecg.losses import info_nce
from coreecg.methods.moco_v3 import moco_contrastive
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


def _cmsc_worker(rank, world, a_all, b_all, patient_all):
    n = a_all.shape[0] // world
    a = a_all[rank * n:(rank + 1) * n].clone().requires_grad_(True)
    b = b_all[rank * n:(rank + 1) * n].clone().requires_grad_(True)
    loss = cmsc_contrastive(a, b, 0.1, patient_all[rank * n:(rank + 1) * n].clone())
    (loss / world).backward()                    # DDP averages gradients over ranks
    return loss.detach(), a.grad.clone(), b.grad.clone()


def test_cmsc_same_patient_pair_split_across_ranks_is_a_positive_as_on_one_rank():
    g = torch.Generator().manual_seed(4)
    a_all, b_all = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
    patient = torch.tensor([10, 11, 12, 13, 14, 15, 16, 10])    # the one shared patient: rows 0 and 7
    results = run_on_ranks(_cmsc_worker, a_all, b_all, patient)

    a, b = a_all.clone().requires_grad_(True), b_all.clone().requires_grad_(True)
    ref = cmsc_contrastive(a, b, 0.1, patient)
    ref.backward()
    assert torch.allclose((results[0][0] + results[1][0]) / 2, ref, atol=1e-6)
    assert torch.allclose(torch.cat([results[0][1], results[1][1]]), a.grad, atol=1e-6)
    assert torch.allclose(torch.cat([results[0][2], results[1][2]]), b.grad, atol=1e-6)
    # the pair counted: with every window its own patient the one-rank loss is another
    assert not torch.allclose(cmsc_contrastive(a_all, b_all, 0.1, torch.arange(8)), ref)


def _pool_worker(rank, world, u_all, v_all):
    n = u_all.shape[0] // world
    u, v = u_all[rank * n:(rank + 1) * n], v_all[rank * n:(rank + 1) * n]
    patient = torch.arange(n) + rank * n
    return {gather: torch.stack([info_nce(u, v, 0.2, gather), moco_contrastive(u, v, 0.2, gather),
                                 cmsc_contrastive(u, v, 0.1, patient, gather)]) for gather in (True, False)}


def test_one_key_gives_every_contrastive_loss_the_same_pool():
    """gather=True: each of the three losses is its one-rank loss on the global batch;
    gather=False: each rank's loss on its own batch, for all three alike."""
    assert load_config().optim.gather_negatives is True               # the default: the global batch
    g = torch.Generator().manual_seed(5)
    u_all, v_all = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
    results = run_on_ranks(_pool_worker, u_all, v_all)

    def losses(u, v):
        return torch.stack([info_nce(u, v, 0.2), moco_contrastive(u, v, 0.2), cmsc_contrastive(u, v, 0.1)])

    whole = losses(u_all, v_all)
    assert torch.allclose((results[0][True] + results[1][True]) / 2, whole, atol=1e-6)
    for rank in (0, 1):
        assert torch.allclose(results[rank][False], losses(u_all[4 * rank:4 * rank + 4], v_all[4 * rank:4 * rank + 4]),
                              atol=1e-6)
    assert not torch.allclose(results[0][False], results[0][True])     # the pools really differ


@pytest.mark.parametrize("method, loss_fn", [("core", "info_nce"), ("moco_v3", "moco_contrastive"),
                                             ("cmsc", "cmsc_contrastive")])
@pytest.mark.parametrize("gather", [True, False])
def test_every_contrastive_method_reads_the_one_pool_key(monkeypatch, method, loss_fn, gather):
    """CoRe-ECG, MoCo v3 and CMSC pass optim.gather_negatives to their loss, and nothing else."""
    import importlib

    from coreecg.methods import build_method
    from tests.helpers import tiny_config

    module = importlib.import_module({"core": "coreecg.methods.core_ecg.method",
                                      "moco_v3": "coreecg.methods.moco_v3.method",
                                      "cmsc": "coreecg.methods.cmsc.method"}[method])
    real, seen = getattr(module, loss_fn), []

    def spy(*args, **kwargs):
        seen.append(kwargs["gather"] if "gather" in kwargs else args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(module, loss_fn, spy)
    cfg = tiny_config(f"pretrain.method={method}", f"optim.gather_negatives={str(gather).lower()}",
                      "methods.moco_v3.hidden_dim=64", "methods.moco_v3.dim=16", "methods.cmsc.dim=16")
    build_method(cfg)(torch.randn(4, 12, 2250), torch.Generator().manual_seed(0))
    assert seen and all(s is gather for s in seen)
