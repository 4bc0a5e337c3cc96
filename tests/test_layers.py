"""The transformer blocks: attention matches its definition, and it can learn retrieval by position."""
import torch
from torch import nn

from coreecg.model.embed import sincos_positions
from coreecg.model.layers import Attention, Transformer, init_weights


def test_attention_matches_explicit_softmax_with_padding_mask():
    torch.manual_seed(0)
    attn = Attention(16, num_heads=4)
    x = torch.randn(2, 5, 16)
    valid = torch.tensor([[True] * 5, [True, True, True, False, False]])
    out = attn(x, valid[:, None, None, :])
    q, k, v = attn.qkv(x).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / 2.0                          # sqrt(head_dim = 4)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    ref = attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16))
    assert torch.allclose(out, ref, atol=1e-5)
    # padded keys have no influence on the valid queries
    x2 = x.clone()
    x2[1, 3:] = 100.0
    assert torch.allclose(attn(x2, valid[:, None, None, :])[1, :3], out[1, :3], atol=1e-5)


def test_transformer_learns_to_fetch_the_token_at_its_position():
    """The decoders' core skill: a query that knows only its position fetches the content
    stored at that position (a broken attention or position path cannot leave the
    predict-the-mean plateau at MSE 1)."""
    torch.manual_seed(0)
    D, N, B = 64, 30, 32
    tr = Transformer(D, depth=2, num_heads=4)
    init_weights(tr)
    inp, head = nn.Linear(16, D), nn.Linear(D, 16)
    pos = sincos_positions(N, D)
    query = nn.Parameter(torch.randn(D) * 0.02)
    opt = torch.optim.AdamW([*tr.parameters(), *inp.parameters(), *head.parameters(), query], lr=1e-3)
    for _ in range(350):
        content = torch.randn(B, N, 16)
        x = torch.cat([inp(content) + pos, (query + pos).expand(B, N, D)], dim=1)
        loss = ((head(tr(x)[:, N:]) - content) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.3


def _two_paths(L: int, mask: bool, up_to: int = 32):
    torch.manual_seed(1)
    fused, batched = Attention(32, num_heads=4), Attention(32, num_heads=4)
    batched.load_state_dict(fused.state_dict())
    batched.batched_up_to = up_to
    x = torch.randn(6, L, 32, requires_grad=True)
    valid = torch.rand(6, L) > 0.3
    valid[:, 0] = True                                              # a key for every sample, as the model's
    m = valid[:, None, None, :] if mask else None
    out_f, out_b = fused(x, m), batched(x, m)
    g = torch.randn_like(out_f)
    grads = [torch.autograd.grad(o, [x, *mod.parameters()], g) for o, mod in ((out_f, fused), (out_b, batched))]
    return out_f, out_b, grads


def test_short_sequences_in_batched_matmuls_give_the_fused_kernels_numbers_and_gradients(monkeypatch):
    """Attention.batched_up_to (issue 41's experiment): the same values and gradients as SDPA, with
    and without the key-padding mask; longer sequences keep SDPA."""
    for mask in (False, True):
        out_f, out_b, (g_f, g_b) = _two_paths(12, mask)
        assert torch.allclose(out_f, out_b, atol=1e-5)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(g_f, g_b))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_f, out_b, _ = _two_paths(30, True)
    assert (out_f.float() - out_b.float()).abs().max() < 0.05      # bf16 rounding, both paths
    calls = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(a[0].shape[2]) or real(*a, **k))
    _two_paths(12, True, up_to=12)
    _two_paths(13, True, up_to=12)
    assert calls == [12, 13, 13]           # 12 tokens: only the module without the option; 13: both


def test_compiled_short_attention_stays_in_batched_matmuls():
    """Inductor rewrites a plain softmax(q k^T) v back into SDPA (its fuse_attention patterns); the
    batched form must survive compilation or the experiment measures nothing."""
    from torch.profiler import ProfilerActivity, profile

    torch._dynamo.reset()
    attn = Attention(32, num_heads=4)
    attn.batched_up_to = 32
    compiled = torch.compile(attn)
    x = torch.randn(8, 12, 32, requires_grad=True)
    valid = torch.ones(8, 1, 1, 12, dtype=torch.bool)
    compiled(x, valid).sum().backward()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        out = compiled(x, valid)
        out.sum().backward()
    names = {e.name for e in prof.events()}
    assert "aten::bmm" in names
    assert not any("scaled_dot_product" in n for n in names), sorted(n for n in names if "scaled_dot" in n)
    assert torch.allclose(out, attn(x, valid), atol=1e-5)
    torch._dynamo.reset()
