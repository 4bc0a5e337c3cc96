"""STDM and the ablation masks: partitions, rates, counts, determinism."""
import pytest
import torch

from coreecg.methods.core_ecg.options import MaskingOptions
from coreecg.methods.core_ecg.masking import lead_mask, make_masks, random_token_mask, stdm, temporal_mask

B, C, N = 2000, 12, 30


def _partition(v, m, d):
    total = v.int() + m.int() + d.int()
    assert v.dtype == m.dtype == d.dtype == torch.bool
    assert torch.equal(total, torch.ones_like(total)), "every position must be in exactly one set"


@pytest.mark.parametrize("mode", ["bernoulli", "exact"])
def test_stdm_partitions_and_rates(mode):
    g = torch.Generator().manual_seed(0)
    v, m, d = stdm(B, C, N, p_time=0.5, p_lead=0.2, k=4, generator=g, mode=mode)
    assert v.shape == m.shape == d.shape == (B, C, N)
    _partition(v, m, d)
    full = v.sum(1) == 0                                    # (B, N) full-masked columns
    assert torch.all(m.sum(1)[full] == C) and not d.any(1)[full].any()
    partial = ~full
    assert torch.all(v.sum(1)[partial] == 4), "exactly k visible leads per partial column"
    rate = full.float().mean().item()
    assert abs(rate - 0.5) < 0.01
    rest = (~v) & partial[:, None, :]                       # drop candidates
    drop_rate = (d & rest).sum().item() / rest.sum().item()
    assert abs(drop_rate - 0.2) < 0.01
    if mode == "exact":
        assert torch.all(full.sum(1) == 15)
        assert torch.all(v.sum((1, 2)) == 15 * 4)


def test_stdm_rates_follow_parameters():
    g = torch.Generator().manual_seed(1)
    v, m, d = stdm(B, C, N, p_time=0.3, p_lead=0.5, k=2, generator=g)
    full = v.sum(1) == 0
    assert abs(full.float().mean().item() - 0.3) < 0.01
    rest = (~v) & ~full[:, None, :]
    assert abs(d.sum().item() / rest.sum().item() - 0.5) < 0.01
    assert torch.all(v.sum(1)[~full] == 2)


def test_stdm_visible_leads_uniform():
    g = torch.Generator().manual_seed(2)
    v, _, _ = stdm(B, C, N, 0.0, 0.2, 4, generator=g)
    per_lead = v.float().mean((0, 2))                       # each lead visible with prob k / C
    assert torch.allclose(per_lead, torch.full((C,), 4 / 12), atol=0.01)


def test_stdm_never_hides_a_whole_sample():
    g = torch.Generator().manual_seed(3)
    v, _, _ = stdm(5000, C, 2, p_time=0.9, p_lead=0.2, k=4, generator=g)
    assert torch.all(v.sum((1, 2)) > 0)


def test_stdm_seeded_determinism():
    a = stdm(8, C, N, 0.5, 0.2, 4, generator=torch.Generator().manual_seed(7))
    b = stdm(8, C, N, 0.5, 0.2, 4, generator=torch.Generator().manual_seed(7))
    c = stdm(8, C, N, 0.5, 0.2, 4, generator=torch.Generator().manual_seed(8))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a[0], c[0])


def test_stdm_rejects_bad_k_and_mode():
    with pytest.raises(ValueError, match="k="):
        stdm(2, 12, 30, 0.5, 0.2, 12)
    with pytest.raises(ValueError, match="mode"):
        stdm(2, 12, 30, 0.5, 0.2, 4, mode="poisson")


def test_ablation_masks():
    g = torch.Generator().manual_seed(0)
    v, m, d = random_token_mask(64, C, N, 0.75, generator=g)
    _partition(v, m, d)
    assert not d.any() and torch.all(m.sum((1, 2)) == 270)
    v, m, d = temporal_mask(64, C, N, 0.5, generator=g)
    _partition(v, m, d)
    assert torch.all((m.sum(1) == 0) | (m.sum(1) == C)) and torch.all(m.all(1).sum(1) == 15)
    v, m, d = lead_mask(64, C, N, 0.75, generator=g)
    _partition(v, m, d)
    assert torch.all((m.sum(2) == 0) | (m.sum(2) == N)) and torch.all(m.all(2).sum(1) == 9)


@pytest.mark.parametrize("strategy", ["stdm", "random", "temporal", "lead"])
def test_make_masks_dispatch(strategy):
    cfg = MaskingOptions(strategy=strategy)
    v, m, d = make_masks(cfg, 16, C, N, generator=torch.Generator().manual_seed(0))
    _partition(v, m, d)
    assert d.any() == (strategy == "stdm")
