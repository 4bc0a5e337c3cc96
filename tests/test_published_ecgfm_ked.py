"""ECGFM-KED's published encoder (coreecg.model.published.ecgfm_ked): the release's nested file read
as data reproduces the original pipeline's input, tokens and pooled embedding; the architecture is
read from the weights at any size; every entry but the backbone is dropped; broken states are
ValueErrors naming the key.

Fixtures: ../shared/fixtures/published/ecgfm_ked (README.md there): a toy-size file written by the
original code (xresnet1d101's helper at layers [1, 1, 2, 1], widen 0.125), its model input from a
PTB-XL record and the backbone's output.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config.base import ConfigError
from coreecg.encoders.published.ecgfm_ked import EcgFmKedOptions
from coreecg.model.published import FAMILIES
from coreecg.model.published.ecgfm_ked import (CONTRACT, LEADS, PREPROCESS, EcgFmKedEncoder, read_architecture,
                                               recognise, unpack)
from coreecg.model.published.files import read_published

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "ecgfm_ked"


def _fixture() -> dict:
    if not FIXTURES.is_dir():
        pytest.fail(f"ECGFM-KED fixtures not found at {FIXTURES}")
    return json.loads((FIXTURES / "fixture.json").read_text())


FILES = [f["weights"] for f in json.loads((FIXTURES / "fixture.json").read_text())["files"]] \
    if FIXTURES.is_dir() else ["<missing>"]


def _load(path: Path) -> tuple[EcgFmKedEncoder, dict, dict]:
    """read_published -> unpack -> recognise -> read_architecture -> build -> strict load."""
    payload = read_published(path)
    state, recorded = unpack(payload)
    sub = recognise(state)
    assert sub is not None, f"{path.name}: not recognised"
    model = EcgFmKedEncoder.from_config(read_architecture(sub, recorded))
    model.load_state_dict(sub)               # strict
    return model.eval(), sub, payload.entries


@pytest.fixture(scope="module")
def release() -> tuple[EcgFmKedEncoder, dict, dict]:
    """The fixture's (first) release file, loaded once."""
    return _load(FIXTURES / FILES[0])


# ---------------------------------------------------------------------------- the original's outputs


@pytest.mark.parametrize("weights", FILES)
def test_the_release_reproduces_the_original_embedding_and_tokens(weights):
    entry = next(f for f in _fixture()["files"] if f["weights"] == weights)
    model, sub, entries = _load(FIXTURES / weights)
    x = torch.from_numpy(np.load(FIXTURES / entry["model_input"]))
    embedding = torch.from_numpy(np.load(FIXTURES / entry["embedding"]))
    tokens = torch.from_numpy(np.load(FIXTURES / "tokens.npy"))
    with torch.no_grad():
        pooled, enc = model.pooled(x), model(x)
    assert pooled.dtype == torch.float32 and pooled.shape == embedding.shape == (1, model.dim)
    # The same float32 convolutions in the same order on the same CPU: measured max abs diff 0.0
    # (embedding scale ~1); 1e-5 leaves room for another BLAS, and a wrong layer (a missing ReLU, the
    # shortcut's floor instead of ceil) moves it by > 1e-2.
    torch.testing.assert_close(pooled, embedding, atol=1e-5, rtol=0)
    assert enc.grid == (1, 32) and (enc.valid is None or bool(enc.valid.all()))
    assert enc.tokens.shape == tokens.shape == (1, 32, model.dim)
    torch.testing.assert_close(enc.tokens, tokens, atol=1e-5, rtol=0)
    assert model.patch_size == 32 and -(-x.shape[-1] // model.patch_size) == enc.tokens.shape[1]
    # what the original reads: the nested file's "ecg_model", not its TQN "model" entry
    assert sub.keys() == entries["ecg_model"].keys() == model.state_dict().keys()


def test_the_contract_reproduces_the_original_model_input():
    raw = np.load(FIXTURES / "raw.npy")
    leads = json.loads((FIXTURES / "raw.json").read_text())["leads"]
    out = CONTRACT.model_input(raw, 500, leads)
    ref = np.load(FIXTURES / "model_input.npy")
    assert out.shape == ref.shape == (1, 12, 1000) and out.dtype == np.float32
    # the same scipy.signal.resample call in float64, then float32: measured max abs diff 0.0
    np.testing.assert_allclose(out, ref, atol=1e-6, rtol=0)
    # leads are picked by name: a record stored in MIMIC-IV-ECG's order (aVF before aVL) gives the same input
    mimic = [leads.index(name) for name in ("I", "II", "III", "aVR", "aVF", "aVL", *LEADS[6:])]
    np.testing.assert_array_equal(CONTRACT.model_input(raw[mimic], 500, [leads[i] for i in mimic]), out)
    # NaN -> 0 after the FFT: a lead with one NaN sample becomes all zeros, the others are untouched
    holed = raw.astype(np.float64)
    holed[2, 100] = np.nan
    again = CONTRACT.model_input(holed, 500, leads)
    assert not again[0, 2].any() and np.array_equal(np.delete(again, 2, axis=1), np.delete(out, 2, axis=1))
    assert CONTRACT.describe()["shape"] == [None, 12, 1000]


def test_the_family_is_registered_with_its_contract():
    fam = FAMILIES["ecgfm_ked"]
    assert fam.contract is CONTRACT and fam.preprocess is PREPROCESS and fam.unpack is unpack
    assert fam.pretrained_on == ("mimic-iv-ecg",) and fam.commercial_use is False
    assert PREPROCESS.sampling_rate == CONTRACT.sampling_rate == 100 and PREPROCESS.window_samples == 1000


# ---------------------------------------------------------------------------- the architecture from the weights


def _random(model: EcgFmKedEncoder, seed: int = 0) -> EcgFmKedEncoder:
    """Every float tensor perturbed (BatchNorm's zero-initialised weights too), variances positive."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point():
                t.add_(0.2 * torch.randn(t.shape, generator=g))
                if name.endswith("running_var"):
                    t.abs_().add_(0.5)
    return model.eval()


def test_another_size_is_read_back_from_its_weights(tmp_path):
    sizes = dict(n_leads=12, stem=(8, 8, 16), widths=(4, 8, 12), layers=(2, 1, 3), kernel_size=3,
                 kernel_size_stem=7)       # stage 0: 16 -> 4 * 4 channels, a shortcut without a conv
    made = _random(EcgFmKedEncoder(**sizes))
    head = {"7.0.weight": torch.ones(3), "7.2.weight": torch.ones(96), "7.4.weight": torch.ones(5, 96),
            "7.4.bias": torch.zeros(5)}       # a classification head after the last stage
    torch.save({"ecg_model": {**made.state_dict(), **head}, "model": {"decoder_norm.weight": torch.ones(4)},
                "text_encoder": {"bert_model.embeddings.word_embeddings.weight": torch.ones(3, 4)},
                "config": {"ecg_model_name": "xresnet1d_101"}, "epoch": 1}, tmp_path / "ked.pt")
    model, sub, _ = _load(tmp_path / "ked.pt")
    o = read_architecture(sub, None).encoders.ecgfm_ked
    assert (o.stem, o.widths, o.layers, o.kernel_size, o.kernel_size_stem) == \
        (sizes["stem"], sizes["widths"], sizes["layers"], 3, 7)
    assert sub.keys() == made.state_dict().keys() and "4.0.idpath.0.0.weight" not in sub   # the head dropped
    x = torch.randn(2, 12, 700)
    with torch.no_grad():
        torch.testing.assert_close(model.pooled(x), made.pooled(x), atol=0, rtol=0)
        assert model(x).tokens.shape == (2, 44, 48)      # 700 -> 350 -> 175 -> 88 -> 44 (ceil), 12 * 4 wide
    # the flat layout ("ecg_model."-prefixed top-level keys beside the other towers') reads the same
    torch.save({**{f"ecg_model.{k}": v for k, v in made.state_dict().items()}, "model.logit_scale": torch.ones(())},
               tmp_path / "flat.pt")
    flat, flat_sub, _ = _load(tmp_path / "flat.pt")
    assert flat_sub.keys() == sub.keys()


def test_the_towers_are_not_taken_for_the_backbone(release):
    entries = release[2]
    assert recognise(entries["model"]) is None and recognise(entries["text_encoder"]) is None
    assert recognise({"0.0.weight": torch.ones(1)}) is None


@pytest.mark.parametrize("key", ["1.0.weight", "5.0.idpath.1.1.running_mean", "6.1.convpath.0.2.0.weight"])
def test_a_missing_key_is_named(key, release):
    sub = dict(release[1])
    del sub[key]
    with pytest.raises(ValueError, match=f"missing key '{key}'"):
        read_architecture(sub, None)


def test_a_wrong_shape_an_unexpected_key_and_a_differing_twin_are_named(release):
    sub = release[1]
    bad = dict(sub, **{"6.1.convs.1.0.weight": torch.zeros(16, 16, 3)})
    with pytest.raises(ValueError, match=r"'6.1.convs.1.0.weight' has shape \(16, 16, 3\), expected \(16, 16, 5\)"):
        read_architecture(bad, None)
    bad = dict(sub, **{"7.0.convs.2.0.weight": torch.zeros(48, 24, 1)})
    with pytest.raises(ValueError, match=r"'7.0.convs.2.0.weight' has shape \(48, 24, 1\), expected \(96, 24, 1\)"):
        read_architecture(bad, None)
    bad = dict(sub, **{"6.0.idpath.0.0.weight": torch.zeros(64, 64, 1)})
    with pytest.raises(ValueError, match="unexpected key '6.0.idpath.0.0.weight'"):
        read_architecture(bad, None)
    bad = dict(sub, **{"5.0.convs.1.0.weight": sub["5.0.convs.1.0.weight"] + 1})
    with pytest.raises(ValueError, match="'5.0.convs.1.0.weight' differs from '5.0.convpath.0.1.0.weight'"):
        read_architecture(bad, None)


# ---------------------------------------------------------------------------- the module


def test_the_published_size_and_the_options():
    o = EcgFmKedOptions()
    with torch.device("meta"):
        full = EcgFmKedEncoder(12, o.stem, o.widths, o.layers, o.kernel_size, o.kernel_size_stem)
        out = full.features(torch.empty(1, 12, 1000))
    assert full.dim == o.dim == 768 and full.patch_size == o.stride == 32 and out.shape == (1, 768, 32)
    assert sum(p.numel() for p in full.parameters()) == 7_865_984
    assert EcgFmKedEncoder(12, **{k: getattr(EcgFmKedOptions.tiny(), k) for k in
                                  ("stem", "widths", "layers", "kernel_size", "kernel_size_stem")}).dim == 32
    with pytest.raises(ConfigError, match="kernel_size=4 must be odd"):
        EcgFmKedOptions(kernel_size=4)
    with pytest.raises(ConfigError, match="one count per width"):
        EcgFmKedOptions(widths=(64, 128), layers=(1,))


def test_a_lead_subset_is_placed_at_its_channels_and_masks_are_refused(release):
    model = release[0]
    x = torch.from_numpy(np.load(FIXTURES / "model_input.npy"))
    rows = torch.tensor([1, 6, 11])
    full = torch.zeros_like(x)
    full[:, rows] = x[:, rows]
    with torch.no_grad():
        torch.testing.assert_close(model.pooled(x[:, rows], rows), model.pooled(full), atol=0, rtol=0)
    with pytest.raises(ValueError, match="takes no token masks"):
        model(x, visible=torch.ones(1, 1, 32, dtype=torch.bool))
