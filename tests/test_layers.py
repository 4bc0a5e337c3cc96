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
