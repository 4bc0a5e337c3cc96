"""HuBERT-ECG (coreecg.model.published.hubert_ecg): its Hugging Face folder read as data reproduces the
original's embedding and last_hidden_state; its input contract reproduces the original's model input;
the architecture comes from the weights (another size, the legacy .pt form, the older weight-norm
names); the pretraining heads are dropped; broken states are ValueErrors naming the key.

Fixture: ../shared/fixtures/published/hubert_ecg (README.md there): reduced random weights saved by
the original code, a PTB-XL record, and the original pipeline's model input, tokens and embedding.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from coreecg.encoders.published.hubert_ecg import HubertEcgOptions
from coreecg.model.published.files import read_published
from coreecg.model.published.hubert_ecg import (CONTRACT, BiosppyFirBandpass, HubertEcgEncoder, NanToWindowMean,
                                                read_architecture, recognise, unpack)
from coreecg.model.published.registry import FAMILIES

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "hubert_ecg"
HEADS = {"final_proj.0.weight", "final_proj.0.bias", "label_embedding.0.weight", "masked_spec_embed"}
POS = "encoder.pos_conv_embed.conv."


@pytest.fixture(scope="module")
def fx() -> SimpleNamespace:
    if not FIXTURES.is_dir():
        pytest.fail(f"HuBERT-ECG fixtures not found at {FIXTURES}")
    spec = json.loads((FIXTURES / "fixture.json").read_text())
    raw = json.loads((FIXTURES / "raw.json").read_text())
    return SimpleNamespace(files=spec["files"], raw=np.load(FIXTURES / spec["raw"]), fs=raw["fs"], leads=raw["leads"],
                           stage1=np.load(FIXTURES / "stage1_ecg_preprocessing.npy"),
                           tokens=torch.from_numpy(np.load(FIXTURES / "tokens.npy")))


def _load(path: Path) -> tuple[HubertEcgEncoder, dict[str, torch.Tensor], dict, dict]:
    """A published file or folder -> (the strictly loaded module in eval mode, its recognised state,
    the file's candidate state, the recorded config)."""
    state, recorded = unpack(read_published(path))
    sub = recognise(state)
    assert sub is not None
    model = HubertEcgEncoder.from_config(read_architecture(sub, recorded))
    model.load_state_dict(sub)                  # strict
    return model.eval(), sub, state, recorded


def _random(o: HubertEcgOptions, seed: int = 1) -> HubertEcgEncoder:
    torch.manual_seed(seed)
    model = HubertEcgEncoder(o)
    with torch.no_grad():
        for p in model.parameters():          # away from the init (unit norms, zero biases)
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


# ---------------------------------------------------------------------------- the original's outputs


def test_every_fixture_file_reproduces_the_embedding_and_tokens(fx):
    for entry in fx.files:
        model, sub, state, _ = _load(FIXTURES / entry["weights"])
        x = torch.from_numpy(np.load(FIXTURES / entry["model_input"]))
        expected = torch.from_numpy(np.load(FIXTURES / entry["embedding"]))
        assert x.shape == (1, 6000) and all(p.dtype == torch.float32 for p in model.parameters())
        with torch.no_grad():
            pooled, out = model.pooled(x), model(x)
        # float32 throughout, the same operations in another order (SDPA vs q * scale, fused GELU):
        # measured 2.4e-7 on the embedding (scale 2.2) and 1.2e-6 on the tokens (scale 3.8)
        assert pooled.shape == expected.shape == (1, 96)
        torch.testing.assert_close(pooled, expected, atol=1e-5, rtol=0)
        assert out.tokens.shape == fx.tokens.shape == (1, 93, 96) and out.grid == (1, 93) and out.valid is None
        torch.testing.assert_close(out.tokens, fx.tokens, atol=1e-5, rtol=0)
        # every extra entry dropped by name: what is kept is exactly the module's state
        assert set(sub) == set(model.state_dict())
        assert set(state) - set(sub) == HEADS


def test_contract_reproduces_the_model_input_step_by_step(fx):
    # the same scipy calls in float64 (firwin/filtfilt, resample, decimate): measured 0.0 on the
    # model input and 3e-8 (float32 rounding of the stored array) on stage 1
    x, fs = fx.raw.astype(np.float64), float(fx.fs)
    for step in CONTRACT.steps[:3]:                       # band-pass, resample, min-max = ecg_preprocessing
        x, fs = step.apply(x, fs)
    np.testing.assert_allclose(x, fx.stage1, atol=1e-6, rtol=0)
    for entry in fx.files:
        expected = np.load(FIXTURES / entry["model_input"])
        got = CONTRACT.model_input(fx.raw, fx.fs, fx.leads)
        assert got.shape == expected.shape == (1, 6000) and got.dtype == np.float32
        np.testing.assert_allclose(got, expected, atol=1e-6, rtol=0)
    assert CONTRACT.layout == "flat" and CONTRACT.describe()["shape"] == [None, 6000]
    # the leads are picked by name: a shuffled record gives the same input
    order = np.random.default_rng(0).permutation(12)
    shuffled = CONTRACT.model_input(fx.raw[order], fx.fs, [fx.leads[i] for i in order])
    np.testing.assert_array_equal(shuffled, got)


def test_contract_steps_follow_biosppy_and_the_dataset():
    fir = BiosppyFirBandpass()
    assert [fir.taps(fs) for fs in (500, 100, 250, 1000)] == [151, 31, 75, 301]
    # NaN -> the mean over the whole window (every lead), not each lead's own mean
    x = np.array([[1.0, np.nan, 3.0], [10.0, 20.0, 30.0]])
    out, _ = NanToWindowMean().apply(x, 500.0)
    assert out[0, 1] == pytest.approx((1 + 3 + 10 + 20 + 30) / 5) and not np.isnan(out).any()


def test_registered_family():
    fam = FAMILIES["hubert_ecg"]
    assert fam.contract is CONTRACT and fam.unpack is unpack and fam.commercial_use is False
    assert "ptbxl" in fam.pretrained_on and HubertEcgEncoder.output_kind == "sequence"


# ---------------------------------------------------------------------------- the architecture from the weights


OTHER = HubertEcgOptions(hidden_size=48, num_layers=3, num_heads=6, intermediate_size=80, conv_dim=(24, 16, 16, 16, 8),
                         conv_kernel=(10, 3, 3, 2, 2), conv_bias=True, feat_proj_layer_norm=False, pos_conv_kernel=16,
                         pos_conv_groups=4)


class HuBERTECGConfig:
    """Stands in for the original's pickled config object (a legacy .pt's "model_config"): read inert."""

    def __init__(self, entries: dict):
        self.__dict__.update(entries)


def _hf_config(o: HubertEcgOptions) -> dict:
    return {"model_type": "hubert_ecg", "hidden_size": o.hidden_size, "num_hidden_layers": o.num_layers,
            "num_attention_heads": o.num_heads, "intermediate_size": o.intermediate_size,
            "conv_dim": list(o.conv_dim), "conv_kernel": list(o.conv_kernel), "conv_stride": list(o.conv_stride),
            "layer_norm_eps": 1e-5, "do_stable_layer_norm": False, "feat_extract_norm": "group"}


def test_another_size_saved_as_a_folder_reads_back_the_same(tmp_path):
    model = _random(OTHER)
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.update({"final_proj.0.weight": torch.zeros(32, 48), "label_embedding.0.weight": torch.zeros(10, 32),
                  "masked_spec_embed": torch.zeros(48)})
    save_file(state, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(_hf_config(OTHER)))
    back, sub, _, _ = _load(tmp_path)
    assert back.options == OTHER and set(sub) == set(model.state_dict())
    x = torch.randn(2, 3000)
    with torch.no_grad():
        torch.testing.assert_close(back.pooled(x), model.pooled(x), atol=0, rtol=0)
        assert back(x).tokens.shape == (2, 46, 48) and back.patch_size == 64


@pytest.mark.parametrize("form", ["weight_g", "plain"])
def test_legacy_dict_and_older_weight_norm_names(tmp_path, form):
    model = _random(OTHER, seed=2)
    state = {f"hubert_ecg.{k}": v for k, v in model.state_dict().items()}      # a fine-tuned classifier's backbone
    g, v = state.pop(f"hubert_ecg.{POS}parametrizations.weight.original0"), \
        state.pop(f"hubert_ecg.{POS}parametrizations.weight.original1")
    if form == "weight_g":
        state.update({f"hubert_ecg.{POS}weight_g": g, f"hubert_ecg.{POS}weight_v": v})
    else:
        state[f"hubert_ecg.{POS}weight"] = torch._weight_norm(v, g, 2)
    state["classifier.weight"] = torch.zeros(5, 48)
    config = HuBERTECGConfig(_hf_config(OTHER)) if form == "weight_g" else _hf_config(OTHER)
    torch.save({"model_state_dict": state, "model_config": config, "global_step": 7}, tmp_path / "m.pt")
    assert bool(read_published(tmp_path / "m.pt").inert) == (form == "weight_g")
    back, sub, _, _ = _load(tmp_path / "m.pt")
    assert back.options == OTHER and set(sub) == set(model.state_dict())
    x = torch.randn(1, 2000)
    with torch.no_grad():
        torch.testing.assert_close(back.pooled(x), model.pooled(x), atol=1e-6, rtol=0)


def test_broken_states_name_the_key():
    model = _random(HubertEcgOptions.tiny())
    state = dict(model.state_dict())
    missing = dict(state)
    del missing["encoder.layers.1.feed_forward.output_dense.weight"]
    with pytest.raises(ValueError, match=r"missing key 'encoder\.layers\.1\.feed_forward\.output_dense\.weight'"):
        read_architecture(missing, None)
    wrong = dict(state, **{"feature_projection.projection.weight": torch.zeros(32, 15)})
    with pytest.raises(ValueError, match=r"'feature_projection\.projection\.weight' has shape \(32, 15\), expected"):
        read_architecture(wrong, None)
    wrong = dict(state, **{"encoder.layers.0.attention.k_proj.weight": torch.zeros(32, 31)})
    with pytest.raises(ValueError, match=r"'encoder\.layers\.0\.attention\.k_proj\.weight' has shape \(32, 31\)"):
        read_architecture(wrong, None)
    with pytest.raises(ValueError, match="model_type='wav2vec2'"):
        read_architecture(state, {"model_type": "wav2vec2"})
    with pytest.raises(ValueError, match="do_stable_layer_norm"):
        read_architecture(state, {"do_stable_layer_norm": True})
    assert recognise({"pos_embedding": torch.zeros(1)}) is None
    cfg = read_architecture(state, {"num_attention_heads": 4})
    assert cfg.encoders.hubert_ecg == HubertEcgOptions.tiny() and cfg.model.input_samples == 6000


def test_sequence_encoder_refuses_token_masks():
    model = _random(HubertEcgOptions.tiny())
    x = torch.randn(2, 6000)
    with pytest.raises(ValueError, match="token masks"):
        model(x, visible=torch.ones(2, 93, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, 6000\)"):
        model(torch.randn(2, 12, 500))
    with torch.no_grad():
        torch.testing.assert_close(model.pooled(x[:, None]), model.pooled(x))     # (B, 1, T) is taken too
