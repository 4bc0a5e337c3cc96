"""Frequency Dynamic Augmentation (Algorithm 1)."""
import torch

from coreecg.methods.core_ecg.fda import FrequencyDynamicAugmentation, frequency_dynamic_augment


def _setup(seed=0, B=3, C=4, T=250):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, C, T, generator=g)
    K = T // 2 + 1
    w = torch.randn(C, K, generator=g)
    z = torch.randn(B, C, K, generator=g)
    return x, w, z


def test_important_frequencies_scaled_by_A_only():
    x, w, z = _setup()
    out = frequency_dynamic_augment(x, w, z, eps=1e-3)
    A = torch.sigmoid(w)
    keep = A >= torch.quantile(A, 0.5, dim=-1, keepdim=True)          # (C, K)
    spec_in, spec_out = torch.fft.rfft(x.double()), torch.fft.rfft(out.double())
    expected = spec_in * A.double()
    # DC and Nyquist bins of a real signal lose an imaginary part in irfft; compare real parts there.
    err = (spec_out - expected).abs()[:, keep]
    assert err.max() < 1e-3 * spec_in.abs().max()
    # ... and the other bins are perturbed (noise reaches them).
    assert (spec_out - expected).abs()[:, ~keep].mean() > 0.1 * spec_in.abs().mean()
    assert abs(keep.float().mean().item() - 0.5) < 0.02              # the per-lead median splits the bins


def test_lambda_zero_on_important_and_unit_mean_elsewhere():
    x, w, _ = _setup(B=1)
    x, w = x.double(), w.double()
    # With Z = 1 the spectral multiplier is exactly A + lambda.
    out = frequency_dynamic_augment(x, w, torch.ones(1, *w.shape, dtype=torch.float64))
    A = torch.sigmoid(w)
    lam = (torch.fft.rfft(out) / torch.fft.rfft(x)).real[0] - A
    keep = A >= torch.quantile(A, 0.5, dim=-1, keepdim=True)
    assert lam[keep].abs().max() < 1e-4        # FDA computes in float32
    noisy_mean = (lam * ~keep).sum(-1) / (~keep).sum(-1)
    assert torch.allclose(noisy_mean, torch.ones_like(noisy_mean), atol=1e-4)
    # inverse proportionality: less important bins get more noise
    a, noise_scale = A[0][~keep[0]], lam[0][~keep[0]]
    order = a.argsort()
    assert torch.all(noise_scale[order][:-1] >= noise_scale[order][1:])


def test_zero_weight_is_degenerate_and_default_init_is_not():
    x, w, z = _setup()
    out = frequency_dynamic_augment(x, torch.zeros_like(w), z)
    assert torch.allclose(out, 0.5 * x, atol=1e-5)     # the tie this module's init avoids
    fda = FrequencyDynamicAugmentation(4, 250)
    aug = fda(x, torch.Generator().manual_seed(0))
    rel = ((aug - x).norm() / x.norm()).item()
    assert 0.1 < rel < 2.0


def test_fda_fresh_noise_per_sample_and_shape():
    fda = FrequencyDynamicAugmentation(4, 250)
    x = torch.randn(1, 4, 250).expand(2, 4, 250)
    aug = fda(x, torch.Generator().manual_seed(0))
    assert aug.shape == x.shape
    assert not torch.allclose(aug[0], aug[1])


def test_fixed_fda_has_no_parameters():
    fda = FrequencyDynamicAugmentation(4, 250, learnable=False)
    assert list(fda.parameters()) == [] and fda.weight.shape == (4, 126)
