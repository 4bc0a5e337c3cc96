"""ECG-JEPA's published encoder (coreecg.model.published.ecg_jepa) against the fixture made by the
original code (shared/fixtures/published/ecg_jepa/README.md): the file read as data, its sizes read
from the weights, the pooled feature and the tokens, the input contract; and the reading of
another size, broken states, token masks and lead subsets against a plain re-statement of the
original's arithmetic (explicit softmax with -inf, the position table added before every block)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config.base import STANDARD_LEADS
from coreecg.model.published import ecg_jepa as jepa
from coreecg.model.published.files import read_published
from coreecg.model.published.registry import family

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "ecg_jepa"
SPEC = json.loads((FIXTURES / "fixture.json").read_text()) if FIXTURES.is_dir() else {"files": []}
needs_fixtures = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"no fixtures at {FIXTURES}")


def _load(path: Path) -> tuple[jepa.EcgJepaEncoder, dict]:
    """The pipeline coreecg runs on a published file: read, unpack, recognise, read the sizes,
    build, strict load."""
    state, recorded = jepa.unpack(read_published(path))
    sub = jepa.recognise(state)
    assert sub is not None
    model = jepa.EcgJepaEncoder.from_config(jepa.read_architecture(sub, recorded))
    model.load_state_dict(sub)
    return model.eval(), sub


@needs_fixtures
@pytest.mark.parametrize("entry", SPEC["files"], ids=lambda e: e["weights"])
def test_fixture_pooled_and_tokens(entry):
    """pooled(model_input.npy) is the original's `representation` (embedding.npy); forward's tokens
    are its LayerNorm-ed tokens (tokens.npy). Float32 both sides, the same operations up to SDPA's
    summation order: measured 2.4e-7 (embedding, scale 1.3) and 9.5e-7 (tokens, scale 3.5); the
    bound is 1e-5 of the scale."""
    model, sub = _load(FIXTURES / entry["weights"])
    assert set(sub) == set(model.state_dict())
    x = torch.from_numpy(np.load(FIXTURES / entry["model_input"]))
    emb = np.load(FIXTURES / entry["embedding"])
    with torch.no_grad():
        pooled = model.pooled(x).numpy()
        enc = model(x)
    assert pooled.shape == emb.shape
    assert np.abs(pooled - emb).max() <= 1e-5 * max(1.0, np.abs(emb).max())
    tokens = np.load(FIXTURES / "tokens.npy")
    assert enc.grid == (8, 50) and enc.valid is None
    assert np.abs(enc.tokens.numpy() - tokens).max() <= 1e-5 * max(1.0, np.abs(tokens).max())


@needs_fixtures
@pytest.mark.parametrize("entry", SPEC["files"], ids=lambda e: e["weights"])
def test_contract_gives_model_input(entry):
    """CONTRACT on raw.npy (500 Hz, 12 leads) is model_input.npy: the same scipy.signal.resample of
    the whole record in float64, then float32; measured exactly 0 (bound 1e-6 mV)."""
    raw = np.load(FIXTURES / SPEC["raw"])
    out = jepa.CONTRACT.model_input(raw, 500, STANDARD_LEADS)
    want = np.load(FIXTURES / entry["model_input"])
    assert out.shape == (1, 8, 2500) and tuple(entry["leads"]) == jepa.LEADS
    assert np.abs(out[0] - want[0]).max() <= 1e-6


def test_registered_family():
    fam = family("ecg_jepa")
    assert fam.contract is jepa.CONTRACT and fam.build == jepa.EcgJepaEncoder.from_config
    assert fam.preprocess.sampling_rate == 250 and fam.preprocess.leads == jepa.LEADS
    assert jepa.EcgJepaEncoder.output_kind == "grid"


def _other_size() -> jepa.EcgJepaEncoder:
    """A random module of sizes unlike the fixture's: width 48, 3 blocks, MLP 2x, qkv bias, 20 patches
    of 25 samples."""
    torch.manual_seed(1)
    model = jepa.EcgJepaEncoder(n_patches=20, patch_size=25, dim=48, depth=3, mlp_ratio=2.0, qkv_bias=True)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def test_reads_another_size(tmp_path):
    """Saved in the family's container, a module of another size reads back with its own sizes and
    gives the same output."""
    model = _other_size()
    torch.save({"encoder": model.state_dict(), "epoch": 4}, tmp_path / "other.pth")
    back, _ = _load(tmp_path / "other.pth")
    o = jepa.read_architecture(back.state_dict()).encoders.ecg_jepa
    assert (o.embed_dim, o.depth, o.patch_size, o.mlp_ratio, o.qkv_bias, o.num_heads) == (48, 3, 25, 2.0, True, 16)
    assert (back.n_patches, back.patch_size, back.dim) == (20, 25, 48)
    x = torch.randn(2, 8, 500)
    with torch.no_grad():
        assert torch.equal(back.pooled(x), model.pooled(x))


def test_broken_states_name_the_key():
    state = _other_size().state_dict()
    missing = {k: v for k, v in state.items() if k != "encoder_blocks.blocks.1.mlp.fc2.bias"}
    with pytest.raises(ValueError, match=r"missing key 'encoder_blocks\.blocks\.1\.mlp\.fc2\.bias'"):
        jepa.read_architecture(missing)
    wrong = dict(state, **{"encoder_blocks.blocks.2.attn.proj.weight": torch.zeros(48, 40)})
    with pytest.raises(ValueError, match=r"'encoder_blocks\.blocks\.2\.attn\.proj\.weight' has shape \(48, 40\)"):
        jepa.read_architecture(wrong)
    with pytest.raises(ValueError, match="'pos_embed' has shape"):
        jepa.read_architecture(dict(state, pos_embed=torch.zeros(162, 48)))
    assert jepa.recognise({k: v for k, v in state.items() if k != "W_P.weight"}) is None


def test_every_other_entry_is_dropped():
    """A whole pretraining model's state (context and target encoders, predictor) plus strays: the
    recognised state is exactly the module's keys, taken from the context encoder."""
    model = _other_size()
    state = model.state_dict()
    whole = {f"encoder.{k}": v for k, v in state.items()}
    whole.update({f"target_encoder.{k}": v + 1 for k, v in state.items()})
    whole.update({"predictor.mask_token": torch.zeros(1, 1, 24), "predictor.pos_embed": torch.zeros(20, 24),
                  "encoder.mask_token": torch.zeros(1, 1, 48), "encoder.head.weight": torch.zeros(5, 48)})
    sub = jepa.recognise(whole)
    assert set(sub) == set(state)
    assert all(torch.equal(sub[k], state[k]) for k in state)
    flat = dict(state, **{"predictor.mask_token": torch.zeros(1, 1, 24), "head.weight": torch.zeros(5, 48)})
    assert set(jepa.recognise(flat)) == set(state)


def _reference(model: jepa.EcgJepaEncoder, x: torch.Tensor, rows: list[int], keep: torch.Tensor) -> torch.Tensor:
    """The original's arithmetic, one sample: x (C, T) of the model rows `rows`, keep (n,) patches kept
    on every lead (its masked forward) -> (C * kept, D) tokens after the final norm."""
    s, P, N = model.state_dict(), model.patch_size, model.n_patches
    C, n = x.shape[0], x.shape[1] // P
    t = x.reshape(C * n, P) @ s["W_P.weight"].T + s["W_P.bias"]
    pos = s["pos_embed"].reshape(8, N, -1)[rows, :n].reshape(C * n, -1)
    lead, patch = torch.arange(C).repeat_interleave(n), torch.arange(n).repeat(C)
    mask = (lead[:, None] == lead[None]) | (patch[:, None] == patch[None])
    sel = keep.repeat(C)
    t, pos, mask = t[sel], pos[sel], mask[sel][:, sel]
    D = t.shape[1]
    h = D // 16
    ln = torch.nn.functional.layer_norm
    for k in range(model.depth):
        b = f"encoder_blocks.blocks.{k}."
        t = t + pos
        y = ln(t, (D,), s[b + "norm1.weight"], s[b + "norm1.bias"])
        qkv = (y @ s[b + "attn.qkv.weight"].T + s.get(b + "attn.qkv.bias", 0)).reshape(-1, 3, 16, h).permute(1, 2, 0, 3)
        att = (qkv[0] @ qkv[1].transpose(-1, -2)) * h ** -0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        y = (att @ qkv[2]).transpose(0, 1).reshape(-1, D)
        t = t + y @ s[b + "attn.proj.weight"].T + s[b + "attn.proj.bias"]
        y = ln(t, (D,), s[b + "norm2.weight"], s[b + "norm2.bias"])
        y = torch.nn.functional.gelu(y @ s[b + "mlp.fc1.weight"].T + s[b + "mlp.fc1.bias"])
        t = t + y @ s[b + "mlp.fc2.weight"].T + s[b + "mlp.fc2.bias"]
    return ln(t, (D,), s["norm.weight"], s["norm.bias"])


def test_visible_tokens_are_the_masked_forward():
    """`visible` (B, C, n): a patch mask shared by the leads is the original's masked forward; samples
    of a batch with different visible counts each get their own result (the padding never leaks);
    every token visible is the unmasked forward."""
    model = _other_size()
    x = torch.randn(2, 8, 500)
    keep = [torch.rand(20) < 0.5, torch.rand(20) < 0.8]
    visible = torch.stack([k[None, :].expand(8, -1) for k in keep])
    with torch.no_grad():
        enc = model(x, visible=visible)
        full = model(x, visible=torch.ones(2, 8, 20, dtype=torch.bool))
        plain = model(x)
        for i in range(2):
            want = _reference(model, x[i], list(range(8)), keep[i])
            m = int(keep[i].sum()) * 8
            assert torch.allclose(enc.tokens[i, :m], want, atol=1e-5)
            assert bool(enc.valid[i, :m].all()) and not bool(enc.valid[i, m:].any())
            flat = torch.arange(160).reshape(8, 20)[:, keep[i]].reshape(-1)
            assert torch.equal(enc.index[i, :m], flat)
    assert enc.grid == (8, 20)
    assert torch.allclose(full.tokens, plain.tokens, atol=1e-6) and full.valid is None


def test_lead_subsets_and_unknown_leads():
    """lead_idx (standard order) picks the position rows of each lead and attention stays within a row
    or a patch index, as the original's `restrict_leads`; III is not ECG-JEPA's lead."""
    model = _other_size()
    x = torch.randn(1, 3, 500)
    lead_idx = torch.tensor([STANDARD_LEADS.index(n) for n in ("V2", "I", "V6")])
    with torch.no_grad():
        got = model(x, lead_idx).tokens[0]
    want = _reference(model, x[0], [3, 0, 7], torch.ones(20, dtype=torch.bool))
    assert torch.allclose(got, want, atol=1e-5)
    with pytest.raises(ValueError, match=r"\['III'\]"):
        model(x, torch.tensor([0, 2, 6]))
    with pytest.raises(ValueError, match="covers 1..20 patches"):
        model(torch.randn(1, 8, 525))


def test_padding_is_left_out():
    """A short record padded with NaN pools as the record cut to its real patches."""
    model = _other_size()
    x = torch.randn(2, 8, 500)
    padded = x.clone()
    padded[:, :, 300:] = float("nan")
    with torch.no_grad():
        enc = model(padded)
        assert torch.allclose(model.pooled(padded), model.pooled(x[:, :, :300]), atol=1e-5)
    assert enc.pad is not None and int(enc.pad[0].sum()) == 8 * 8


def test_full_size_defaults():
    """The defaults are the published size: 85.1M parameters (ECG-JEPA counts its pos_embed table too:
    a frozen Parameter there, a buffer here)."""
    with torch.device("meta"):
        model = jepa.EcgJepaEncoder()
    n = sum(p.numel() for p in model.parameters())
    assert (model.dim, model.depth, model.n_patches, model.patch_size) == (768, 12, 50, 50)
    assert n == 12 * (12 * 768 * 768 + 10 * 768) + 53 * 768 == 85_067_520
