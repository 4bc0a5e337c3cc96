"""The CPU bf16 path's oneDNN-fused Linear layers (coreecg.inference.fused, inference.fuse):
which layers are swapped and which are left, the same function as Linear + GELU within bf16's
rounding (contiguous or not, either GELU), the plain form under autograd and compilation, and a
real encoder prepared for bf16 scoring within the path's bound of float32, whatever shares its batch.
"""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coreecg.config import load_config
from coreecg.encoders.build import build_encoder
from coreecg.inference import fused
from coreecg.inference.fused import FusedLinear, PointwiseStack, fold_batch_norms, fuse_linears
from coreecg.inference.precision import prepare_model
from tests.helpers import tiny_config

needs_onednn_bf16 = pytest.mark.skipif(not fused.available(), reason="this torch/processor has no oneDNN bf16 linear")
CPU = torch.device("cpu")


class Net(nn.Module):
    """An MLP in a Sequential (Linear, GELU, Dropout, Linear, tanh GELU), a bare Linear, a
    MultiheadAttention (reads its out_proj's weight) and a subclass of Linear."""

    class MyLinear(nn.Linear):
        def forward(self, x):
            return super().forward(x) * 2

    def __init__(self):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Dropout(0.1), nn.Linear(64, 32),
                                 nn.GELU(approximate="tanh"))
        self.proj = nn.Linear(32, 16, bias=False)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.mine = Net.MyLinear(16, 8)

    def forward(self, x):
        x = self.mlp(x) + self.attn(x, x, x, need_weights=False)[0]
        return self.mine(self.proj(x))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a.float() - b.float()).abs().max() / b.float().abs().max())


def test_fuse_swaps_plain_linears_takes_in_their_gelu_and_keeps_the_state_dict():
    net = Net().eval()
    keys = list(net.state_dict())
    assert fuse_linears(net) == 3                           # mlp.0, mlp.3, proj
    assert isinstance(net.mlp[0], FusedLinear) and net.mlp[0].gelu == "none"
    assert isinstance(net.mlp[1], nn.Identity)
    assert isinstance(net.mlp[3], FusedLinear) and net.mlp[3].gelu == "tanh" and isinstance(net.mlp[4], nn.Identity)
    assert isinstance(net.proj, FusedLinear) and net.proj.gelu is None and net.proj.bias is None
    assert type(net.attn.out_proj) is not FusedLinear     # MultiheadAttention reads its weight
    assert type(net.mine) is Net.MyLinear                  # a subclass has its own forward
    assert list(net.state_dict()) == keys


@needs_onednn_bf16
def test_fused_is_linear_and_gelu_to_bf16_rounding_contiguous_or_not():
    torch.manual_seed(0)
    for gelu in (None, "none", "tanh"):
        lin = nn.Linear(96, 160)
        f = FusedLinear(copy.deepcopy(lin).bfloat16(), gelu)
        x = torch.randn(3, 96, 40).transpose(1, 2)          # (3, 40, 96), not contiguous
        ref = F.linear(x, lin.weight, lin.bias)
        ref = ref if gelu is None else F.gelu(ref, approximate=gelu)
        with torch.inference_mode():
            out = f(x.bfloat16())
            plain = f._plain(x.bfloat16())
        assert out.dtype == torch.bfloat16 and out.shape == (3, 40, 160)
        assert _rel(out, ref) < 1e-2 and _rel(plain, ref) < 1e-2
        assert _rel(out, plain) < 1e-2


@needs_onednn_bf16
def test_a_run_of_1x1_convolutions_becomes_one_stack_of_products_and_a_lone_one_stays():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv1d(8, 16, 1), nn.GELU(), nn.Conv1d(16, 16, 1), nn.Conv1d(16, 4, 3),
                        nn.Conv1d(4, 4, 1), nn.ReLU()).eval()
    x = torch.randn(3, 8, 50)
    with torch.inference_mode():
        ref = seq(x)
    prepared = copy.deepcopy(seq).bfloat16()
    assert fuse_linears(prepared) == 2                             # the run of two; the lone 1x1 stays
    assert isinstance(prepared[0], PointwiseStack) and isinstance(prepared[1], nn.Identity)
    assert isinstance(prepared[2], nn.Identity) and type(prepared[4]) is nn.Conv1d
    assert [p.gelu for p in prepared[0].products] == ["none", None]
    with torch.inference_mode():
        out = prepared(x.bfloat16())
    assert out.shape == ref.shape and _rel(out, ref) < 2e-2


def test_without_onednn_bf16_the_fused_layer_runs_the_plain_form(monkeypatch):
    lin = nn.Linear(16, 24).bfloat16()
    f = FusedLinear(lin, "tanh")
    monkeypatch.setattr(fused, "available", lambda: False)
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", None, raising=False)   # never called
    x = torch.randn(5, 16, dtype=torch.bfloat16)
    with torch.inference_mode():
        assert torch.equal(f(x), F.gelu(F.linear(x, lin.weight, lin.bias), approximate="tanh"))


def test_batch_norms_fold_into_the_convolution_before_them_with_the_same_function():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv1d(4, 8, 5, padding=2, bias=False), nn.BatchNorm1d(8), nn.ReLU(),
                        nn.BatchNorm1d(8), nn.Conv1d(8, 8, 3), nn.BatchNorm1d(8))
    for bn in (seq[1], seq[3], seq[5]):                      # statistics and an affine map of their own
        bn.running_mean.normal_(0, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        nn.init.uniform_(bn.weight, 0.5, 1.5)
        nn.init.normal_(bn.bias)
    seq.eval()
    x = torch.randn(3, 4, 40)
    with torch.inference_mode():
        ref = seq(x)
    folded = copy.deepcopy(seq)
    assert fold_batch_norms(folded) == 2                     # seq[3] follows a ReLU: it stays
    assert isinstance(folded[1], nn.Identity) and isinstance(folded[5], nn.Identity)
    assert type(folded[3]) is nn.BatchNorm1d and folded[0].bias is not None
    with torch.inference_mode():
        torch.testing.assert_close(folded(x), ref, rtol=1e-5, atol=1e-5)
    training = copy.deepcopy(seq).train()                    # batch statistics: nothing to fold
    assert fold_batch_norms(training) == 0


def test_a_prepared_bf16_xresnet_has_its_batch_norms_folded_within_bounds():
    from tests.test_encoders import XRES
    torch.manual_seed(0)
    enc = build_encoder(tiny_config(*XRES, "pretrain.method=moco_v3")).eval()
    x = torch.randn(4, 12, 1000)
    prepared, _ = prepare_model(enc, "bf16", CPU, x[:1])
    kept, _ = prepare_model(enc, "bf16", CPU, x[:1], fuse=False)
    assert not any(isinstance(m, nn.BatchNorm1d) for m in prepared.modules())
    assert any(isinstance(m, nn.BatchNorm1d) for m in kept.modules())
    assert any(isinstance(m, nn.BatchNorm1d) for m in enc.modules())      # the float32 model keeps its own
    with torch.inference_mode():
        ref, out = enc.pooled(x), prepared.pooled(x.bfloat16()).float()
    assert float(((out - ref).norm(dim=1) / ref.norm(dim=1)).max()) < load_config().inference.max_embedding_diff


@needs_onednn_bf16
def test_fused_runs_the_plain_form_under_autograd_and_for_float32():
    lin = nn.Linear(16, 24).bfloat16()
    f = FusedLinear(lin, "none")
    x = torch.randn(5, 16, dtype=torch.bfloat16, requires_grad=True)
    f(x).sum().backward()                                   # the oneDNN op has no backward: plain form
    assert lin.weight.grad is not None and x.grad is not None
    frozen = FusedLinear(nn.Linear(16, 24).bfloat16().requires_grad_(False), "none")
    x.grad = None
    frozen(x).sum().backward()                              # a frozen layer still passes its input's gradient
    assert x.grad is not None and x.grad.abs().sum() > 0
    f32 = FusedLinear(nn.Linear(16, 24), "none")
    y = torch.randn(5, 16)
    with torch.inference_mode():
        assert torch.equal(f32(y), F.gelu(F.linear(y, f32.weight, f32.bias)))


@needs_onednn_bf16
@pytest.mark.parametrize("arch", ["coreecg", "s4"])
def test_a_prepared_bf16_encoder_is_fused_within_bounds_and_batch_independent(arch):
    small_s4 = ["pretrain.method=moco_v3", "encoders.s4.d_model=16", "encoders.s4.n_layers=2", "encoders.s4.d_state=8",
                "encoders.s4.stem=[16,16,16]", "encoders.s4.stem_strides=[5,1,1]"]          # a stem of two 1x1
    cfg = tiny_config(f"model.arch={arch}", *([] if arch == "coreecg" else small_s4))
    torch.manual_seed(0)
    enc = build_encoder(cfg).eval()
    x = torch.randn(6, 12, cfg.model.input_samples)
    example = x[:1]
    fused_model, _ = prepare_model(enc, "bf16", CPU, example)
    plain_model, _ = prepare_model(enc, "bf16", CPU, example, fuse=False)
    assert any(isinstance(m, FusedLinear) for m in fused_model.modules())
    assert not any(isinstance(m, FusedLinear) for m in plain_model.modules())
    assert not any(isinstance(m, FusedLinear) for m in enc.modules())      # the float32 model is left as it was
    if arch == "s4":                                                     # its stem's 1x1 convolutions
        assert isinstance(fused_model.stem[2], PointwiseStack) and len(fused_model.stem[2].products) == 3
    pool = "pooled" if arch == "coreecg" else "features"
    with torch.inference_mode():
        ref = getattr(enc, pool)(x)
        out = getattr(fused_model, pool)(x.bfloat16()).float()
        alone = torch.cat([getattr(fused_model, pool)(x[i:i + 1].bfloat16()).float() for i in range(len(x))])
    ref, out, alone = (t.reshape(len(x), -1) for t in (ref, out, alone))
    bound = load_config().inference.max_embedding_diff
    assert float(((out - ref).norm(dim=1) / ref.norm(dim=1)).max()) < bound
    assert float(((alone - out).norm(dim=1) / out.norm(dim=1)).max()) < bound
