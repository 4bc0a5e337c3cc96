"""ECG-FM's published encoder (coreecg.model.published.ecg_fm) against the fixture made with the
original fairseq-signals / ECG-FM code (shared/fixtures/published/ecg_fm/README.md).

Tolerances: the model is float32 and coreecg's module does the same operations in another order
(SDPA instead of fairseq's F.multi_head_attention_forward, its own GroupNorm / weight-norm calls):
measured max |diff| 1.2e-7 (pretrained) and 2.4e-7 (fine-tuned) on embeddings of scale 1.6, and
1.2e-6 on tokens of scale 4, i.e. a few float32 ulps. The bounds below (1e-5 embedding, 2e-5 tokens)
leave ~50x of that and still catch any wrong operation (a missing norm, a wrong pooling or head
count moves them by > 1e-2). The model input is computed with the very numpy/scipy calls of
ecg-transform (interp1d, mean/std ddof 0): measured 0.0; bound 1e-6.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config import STANDARD_LEADS
from coreecg.model.published import ecg_fm
from coreecg.model.published.files import Payload, read_published
from coreecg.model.published.registry import FAMILIES

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "ecg_fm"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="ECG-FM fixture not present")


def _cases() -> list[dict[str, str]]:
    if not FIXTURES.is_dir():
        return []
    return json.loads((FIXTURES / "fixture.json").read_text())["files"]


def _load(path: Path) -> tuple[ecg_fm.EcgFmEncoder, dict[str, torch.Tensor], dict]:
    """A published file -> (the loaded module in eval mode, its raw "model" state, the recorded config)."""
    state, recorded = ecg_fm.unpack(read_published(path))
    sub = ecg_fm.recognise(state)
    assert sub is not None
    config = ecg_fm.read_architecture(sub, recorded)
    model = ecg_fm.EcgFmEncoder.from_config(config)
    model.load_state_dict(sub)                # strict
    return model.eval(), state, recorded


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple[ecg_fm.EcgFmEncoder, dict[str, torch.Tensor], dict]]:
    return {c["weights"]: _load(FIXTURES / c["weights"]) for c in _cases()}


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["weights"])
def test_pooled_and_tokens_match_the_original(case, loaded):
    model, _, _ = loaded[case["weights"]]
    x = torch.from_numpy(np.load(FIXTURES / case["model_input"]))
    want = np.load(FIXTURES / case["embedding"])
    with torch.no_grad():
        got = model.pooled(x).numpy()
        tokens = model(x).tokens.numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-5
    want_tokens = np.load(FIXTURES / case["embedding"].replace("embedding", "tokens"))
    assert tokens.shape == want_tokens.shape == (1, 156, model.dim)
    assert np.abs(tokens - want_tokens).max() < 2e-5


def test_fixture_sizes_and_pooling_read(loaded):
    pre, _, _ = loaded["mimic_iv_ecg_physionet_pretrained.pt"]
    fine, state, _ = loaded["mimic_iv_ecg_finetuned.pt"]
    for model in (pre, fine):
        assert (model.dim, len(model.encoder.layers), model.patch_size, model.n_leads) == (48, 3, 16, 12)
        assert model.encoder.layers[0].self_attn.heads == 12
    assert (pre.pooling, fine.pooling) == ("mean", "nonzero")
    # the head (reference only, not kept) applied to our pooling gives the original's logits
    x = torch.from_numpy(np.load(FIXTURES / "model_input.npy"))
    with torch.no_grad():
        logits = torch.nn.functional.linear(fine.pooled(x), state["proj.weight"], state["proj.bias"]).numpy()
    assert np.abs(logits - np.load(FIXTURES / "logits_finetuned.npy")).max() < 1e-5


@pytest.mark.parametrize("case", _cases(), ids=lambda c: c["weights"])
def test_recognise_keeps_exactly_the_encoder(case, loaded):
    model, state, _ = loaded[case["weights"]]
    sub = ecg_fm.recognise(state)
    assert set(sub) == set(model.state_dict())
    prefix = "encoder." if "proj.weight" in state else ""
    kept = {ecg_fm._LEGACY.get(k[len(prefix):], k[len(prefix):]) for k in state if k.startswith(prefix)} & set(sub)
    dropped = {k.removeprefix(prefix).split(".")[0] for k in state} - {k.split(".")[0] for k in kept}
    assert len(kept) == len(sub)
    assert dropped == ({"proj"} if prefix else {"mask_emb", "quantizer", "project_q", "final_proj"})


def test_contract_reproduces_model_input():
    raw = np.load(FIXTURES / "raw.npy")
    windows = ecg_fm.CONTRACT.model_input(raw, 500, STANDARD_LEADS)
    assert windows.shape == (2, 12, 2500) and windows.dtype == np.float32
    assert np.abs(windows[0] - np.load(FIXTURES / "model_input.npy")[0]).max() < 1e-6
    # the z-score is over the whole record, not each window: the first window alone is not z-scored
    assert abs(float(windows[0].std(axis=-1).mean()) - 1.0) > 1e-4


def _random_sized_file(tmp_path: Path) -> tuple[Path, ecg_fm.EcgFmEncoder]:
    """A fine-tuned-style fairseq file of another size: odd position kernel, mixed conv kernels,
    C == D (no post_extract_proj), legacy weight_g/weight_v, a head and pretraining extras."""
    torch.manual_seed(1)
    model = ecg_fm.EcgFmEncoder(n_leads=12, embed_dim=24, depth=2, num_heads=4, ffn_dim=40, conv_dims=(16, 24, 24),
                                conv_kernels=(3, 2, 2), conv_strides=(2, 2, 2), pos_kernel=15, pos_groups=4,
                                pooling="nonzero").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    inv = {v: k for k, v in ecg_fm._LEGACY.items()}
    state = {f"encoder.{inv.get(k, k)}": v for k, v in model.state_dict().items()}
    state.update({"proj.weight": torch.randn(5, 24), "proj.bias": torch.zeros(5), "encoder.mask_emb": torch.zeros(24)})
    cfg = {"model": {"_name": "ecg_transformer_classifier", "encoder_attention_heads": 4,
                     "conv_feature_layers": "[(16, 3, 2)] + [(24, 2, 2)] * 2", "extractor_mode": "default"}}
    path = tmp_path / "other.pt"
    torch.save({"args": None, "cfg": cfg, "model": state, "optimizer_history": []}, path)
    return path, model


def test_architecture_of_another_size(tmp_path):
    path, original = _random_sized_file(tmp_path)
    model, _, _ = _load(path)
    assert (model.dim, len(model.encoder.layers), model.patch_size, model.pooling) == (24, 2, 8, "nonzero")
    assert model.post_extract_proj is None and model.encoder.layers[0].self_attn.heads == 4
    x = torch.randn(2, 12, 400)
    with torch.no_grad():
        assert torch.equal(model.pooled(x), original.pooled(x))
        assert model(x).tokens.shape == (2, 400 // 8 - 1, 24)     # (400 - 3) // 2 + 1 = 199 -> 99 -> 49


def test_missing_and_misshapen_keys_are_named(loaded):
    _, state, recorded = loaded["mimic_iv_ecg_physionet_pretrained.pt"]
    sub = ecg_fm.recognise(state)
    for key in ("encoder.layers.1.fc2.weight", "layer_norm.bias", "post_extract_proj.weight"):
        broken = {k: v for k, v in sub.items() if k != key}
        with pytest.raises(ValueError, match=f"missing key '{key}'"):
            ecg_fm.read_architecture(broken, recorded)
    for key in ("encoder.layers.2.self_attn.q_proj.weight", "feature_extractor.conv_layers.2.0.weight"):
        shape = list(sub[key].shape)
        shape[1] += 1                                                 # its input width
        broken = dict(sub, **{key: torch.zeros(shape)})
        with pytest.raises(ValueError, match=f"key '{key}' has shape"):
            ecg_fm.read_architecture(broken, recorded)
    for text in ("[(64, 2, 2)] * 4", "[(32, 2, 2)] * 10**9", "__import__('os')", "[(32, 2)] * 4"):
        with pytest.raises(ValueError, match="conv_feature_layers"):
            ecg_fm.read_architecture(sub, dict(recorded, conv_feature_layers=text))
    with pytest.raises(ValueError, match="num_heads=5"):
        ecg_fm.read_architecture(sub, dict(recorded, encoder_attention_heads=5))


def test_recognise_refuses_other_states_and_unpack_reads_a_sidecar():
    assert ecg_fm.recognise({"sep_embedding": torch.zeros(4), "encoder.layer_norm.weight": torch.zeros(4)}) is None
    payload = Payload(Path("x.pt"), Path("x.pt"), {"model": {"a": torch.zeros(1)}}, None, {"model": {"_name": "w"}})
    assert ecg_fm.unpack(payload) == ({"a": payload.entries["model"]["a"]}, {"_name": "w"})


def test_sequence_interface(loaded):
    model, _, _ = loaded["mimic_iv_ecg_finetuned.pt"]
    x = torch.from_numpy(np.load(FIXTURES / "model_input.npy")).repeat(2, 1, 1)
    x[1, :, 2000:] = float("nan")                                      # a short record's padding
    with torch.no_grad():
        enc = model(x)
        pooled = model.pooled(x)
    assert enc.grid == (1, 156) and enc.valid is not None
    assert enc.valid[0].all() and int(enc.valid[1].sum()) == 125      # 2000 / 16
    assert torch.isfinite(pooled).all() and not torch.allclose(pooled[0], pooled[1])
    with pytest.raises(ValueError, match="token masks"):
        model(x, visible=torch.ones(2, 1, 156, dtype=torch.bool))


def test_family_registered_and_full_size():
    fam = FAMILIES["ecg_fm"]
    assert fam.contract is ecg_fm.CONTRACT and fam.unpack is ecg_fm.unpack and fam.commercial_use
    with torch.device("meta"):
        full = ecg_fm.EcgFmEncoder()
    # the published encoder (ECG-FM's 90.9 M counts the pretraining quantizer and projections too)
    assert sum(p.numel() for p in full.parameters()) == 90_373_248
