"""masked_mse and info_nce against hand-computed values."""
import math

import torch

from coreecg.methods.core_ecg.losses import info_nce, masked_mse


def test_masked_mse_only_masked_patches_count():
    g = torch.Generator().manual_seed(0)
    target = torch.randn(2, 3, 4, 5, generator=g)
    pred = torch.randn(2, 3, 4, 5, generator=g)
    masked = torch.rand(2, 3, 4, generator=g) < 0.5
    base = masked_mse(pred, target, masked)
    expected = ((pred - target) ** 2).mean(-1)[masked].mean()
    assert torch.allclose(base, expected)
    # Changing a visible/dropped target changes nothing; changing a masked one does.
    t2 = target.clone()
    t2[~masked] += 100.0
    assert torch.equal(masked_mse(pred, t2, masked), base)
    t3 = target.clone()
    t3[masked.nonzero()[0].tolist()] += 1.0
    assert masked_mse(pred, t3, masked) != base


def test_masked_mse_empty_mask_is_zero():
    x = torch.randn(1, 2, 3, 4)
    assert masked_mse(x, x + 1, torch.zeros(1, 2, 3, dtype=torch.bool)).item() == 0.0


def test_info_nce_hand_computed():
    s = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    t = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    tau = 0.5
    # cosine similarities: s0.t0 = 1/sqrt2, s0.t1 = 0, s1.t0 = 1/sqrt2, s1.t1 = 1
    r = 1 / math.sqrt(2)
    l0 = -math.log(math.exp(r / tau) / (math.exp(r / tau) + math.exp(0)))
    l1 = -math.log(math.exp(1 / tau) / (math.exp(r / tau) + math.exp(1 / tau)))
    assert abs(info_nce(s, t, tau).item() - (l0 + l1) / 2) < 1e-6


def test_info_nce_gather_without_distributed_equals_local():
    s, t = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.allclose(info_nce(s, t, 0.2, gather=True), info_nce(s, t, 0.2))
