"""CoRe-ECG model invariants: shapes, padding, lead subsets, gradients, EMA, ablations."""
import pytest
import torch

from coreecg.methods import CoReECG
from coreecg.model import Encoder
from coreecg.train.step import PretrainStep, Schedule
from tests.helpers import tiny_config

T = 2250


def _x(B=4, C=12, seed=0):
    return torch.randn(B, C, T, generator=torch.Generator().manual_seed(seed))


def test_forward_returns_losses_and_diagnostics():
    model = CoReECG(tiny_config())
    out = model(_x(), generator=torch.Generator().manual_seed(0))
    for key in ("loss", "loss_rec", "loss_con", "visible_frac", "masked_frac", "dropped_frac",
                "fda_rel_perturbation", "teacher_student_cos"):
        assert key in out and out[key].ndim == 0 and torch.isfinite(out[key])
    assert torch.allclose(out["loss"], out["loss_rec"] + out["loss_con"])
    assert abs(out["visible_frac"] + out["masked_frac"] + out["dropped_frac"] - 1) < 1e-6


def test_padded_encoding_equals_unpadded():
    """Bernoulli STDM pads samples to the longest; padding must not change any encoding."""
    torch.manual_seed(0)
    enc = Encoder(n_patches=30, dim=32, depth=2, num_heads=2).eval()
    x = _x(B=2)
    visible = torch.zeros(2, 12, 30, dtype=torch.bool)
    visible[0, :4, :10] = True        # 40 tokens
    visible[1, 2:6, 5:11] = True      # 24 tokens -> padded by 16
    both = enc(x, visible=visible)
    assert both.valid is not None and both.valid[1].sum() == 24
    alone = enc(x[1:], visible=visible[1:])
    assert alone.valid.all()       # nothing padded (valid is always given: short records, NaN)
    assert torch.allclose(both.tokens[1, :24], alone.tokens[0], atol=1e-5)
    assert torch.equal(both.index[1, :24], alone.index[0])


def test_encoder_takes_12_6_1_leads():
    enc = Encoder(n_patches=30, dim=32, depth=1, num_heads=2).eval()
    x = _x(B=2)
    for c in (12, 6, 1):
        assert enc.pooled(x[:, :c]).shape == (2, 32)
        assert enc(x[:, :c]).tokens.shape == (2, c * 30, 32)
    # lead identity is an input: lead V2 fed as V2 differs from V2 fed as lead I
    v2 = x[:, 7:8]
    assert not torch.allclose(enc.pooled(v2, torch.tensor([7])), enc.pooled(v2))


def test_fda_weight_learns_and_teacher_has_no_grad():
    model = CoReECG(tiny_config())
    model(_x())["loss"].backward()
    assert model.fda.weight.grad is not None and model.fda.weight.grad.abs().sum() > 0
    for p in list(model.teacher_encoder.parameters()) + list(model.teacher_projection.parameters()):
        assert not p.requires_grad and p.grad is None
    assert model.encoder.transformer.blocks[0].attn.qkv.weight.grad.abs().sum() > 0
    assert model.time_decoder.head.weight.grad.abs().sum() > 0
    assert model.latent_decoder.mask_token.grad.abs().sum() > 0


def test_ema_update_after_step():
    cfg = tiny_config("methods.core.ema.momentum=0.9", "methods.core.ema.momentum_end=0.9")
    model = CoReECG(cfg)
    # make teacher differ from student first
    with torch.no_grad():
        for p in model.encoder.parameters():
            p.add_(0.1)
    old = [p.clone() for p in model.teacher_encoder.parameters()]
    step = PretrainStep(model, cfg, Schedule(steps_per_epoch=10, epochs=1, warmup_epochs=0))
    step(_x())
    for t, o, s in zip(model.teacher_encoder.parameters(), old, model.encoder.parameters()):
        assert torch.allclose(t, 0.9 * o + 0.1 * s, atol=1e-6)
    assert all(p.grad is None for p in model.teacher_encoder.parameters())


def test_tiny_model_overfits_one_batch():
    """Same batch, same masks and FDA noise every step: the total loss must halve in 60 steps."""
    torch.manual_seed(0)
    cfg = tiny_config("optim.lr=3e-3", "optim.warmup_epochs=0", "optim.weight_decay=0.0",
                      "methods.core.ema.momentum=0.9", "methods.core.ema.momentum_end=0.9")
    model = CoReECG(cfg)
    t = torch.arange(T) / 250.0
    f = torch.linspace(0.5, 3.0, 8)[:, None, None]
    amp = torch.linspace(0.5, 1.5, 12)[None, :, None]
    x = amp * torch.sin(2 * torch.pi * f * t)                        # (8, 12, T), distinct per sample
    step = PretrainStep(model, cfg, Schedule(steps_per_epoch=60, epochs=1, warmup_epochs=0))
    losses = [step(x, generator=torch.Generator().manual_seed(0))["loss"].item() for _ in range(60)]
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:3]) / 3, losses


@pytest.mark.parametrize("overrides, built, absent", [
    (["methods.core.loss.alpha=0"], ["latent_decoder", "teacher_encoder", "fda"], ["time_decoder"]),
    (["methods.core.loss.beta=0"], ["time_decoder"], ["latent_decoder", "teacher_encoder", "projection", "fda"]),
    (["methods.core.fda.enabled=false"], ["teacher_encoder", "time_decoder"], ["fda"]),
])
def test_ablations_are_configs(overrides, built, absent):
    model = CoReECG(tiny_config(*overrides))
    for name in built:
        assert getattr(model, name) is not None
    for name in absent:
        assert getattr(model, name) is None
    out = model(_x())
    out["loss"].backward()
    if "methods.core.loss.alpha=0" in overrides:
        assert "loss_rec" not in out and torch.equal(out["loss"], out["loss_con"])
    if "methods.core.loss.beta=0" in overrides:
        assert "loss_con" not in out and torch.equal(out["loss"], out["loss_rec"])
    if "methods.core.fda.enabled=false" in overrides:
        assert out["fda_rel_perturbation"] == 0


@pytest.mark.parametrize("strategy, dropped", [("random", 0.0), ("temporal", 0.0), ("lead", 0.0)])
def test_masking_ablations_run_through_model(strategy, dropped):
    out = CoReECG(tiny_config(f"methods.core.masking.strategy={strategy}"))(_x())
    assert out["dropped_frac"] == dropped and abs(out["masked_frac"] - 0.75) < 0.06


def test_bf16_autocast_step_is_finite():
    cfg = tiny_config("train.precision=bf16")
    model = CoReECG(cfg)
    step = PretrainStep(model, cfg, Schedule(10, 1, 0))
    before = model.encoder.patch_embed.conv.weight.clone()
    out = step(_x())
    assert torch.isfinite(out["loss"]) and not torch.equal(before, model.encoder.patch_embed.conv.weight)


def test_gradient_clipping_bounds_the_update():
    cfg = tiny_config("optim.grad_clip=1e-6", "optim.warmup_epochs=0")
    model = CoReECG(cfg)
    step = PretrainStep(model, cfg, Schedule(10, 1, 0))
    out = step(_x())
    assert out["grad_norm"] > 1e-6                 # reported norm is the pre-clip norm
    params = [p for g in step.optimizer.param_groups for p in g["params"]]
    assert all(p.grad is None or p.grad.norm() <= 1e-5 for p in params)


def test_forward_is_deterministic_under_a_seed():
    def run(seed):
        torch.manual_seed(0)
        model = CoReECG(tiny_config())
        return model(_x(), generator=torch.Generator().manual_seed(seed))
    a, b, c = run(1), run(1), run(2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["loss"], c["loss"])
