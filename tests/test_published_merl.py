"""MERL's published encoders (coreecg.model.published.merl) against the fixture made by MERL's own
code (/work/shared/fixtures/published/merl, README.md there): the weights read as data, the
architecture read from them, the pooled embedding, the tokens and the input contract.

Tolerances. Model input: MERL computes its min-max in float64 and casts to float32, as the
contract does, with the same numpy reductions: the two agree to the bit (measured 0.0); 1e-7 (under
one float32 step at 1.0) allows only a different rounding of the cast. Embeddings: float32 networks;
the ResNet runs the same convolutions and BatchNorm (measured 0.0 on a feature of scale 1.6); the
ViT's attention is SDPA here and matmul-softmax in MERL, a different summation order (measured
4.8e-7 on the pooled feature of scale 2.9, 1.3e-6 on tokens of scale 5.5): 1e-5 x the scale.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config.base import ConfigError
from coreecg.encoders.published.merl import MerlOptions
from coreecg.model.published import FAMILIES
from coreecg.model.published import recognise as recognise_any
from coreecg.model.published.files import read_published
from coreecg.model.published.merl import (CONTRACT, MODEL_LEADS, MerlEncoder, MerlResNet, MerlViT, read_architecture,
                                          recognise, unpack)

FIX = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "merl"
PTBXL_LEADS = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
REL = 1e-5

pytestmark = pytest.mark.skipif(not (FIX / "fixture.json").is_file(), reason=f"no MERL fixture at {FIX}")


def _files() -> list[dict]:
    return json.loads((FIX / "fixture.json").read_text())["files"] if (FIX / "fixture.json").is_file() else []


def _read(path: Path, recorded_heads: int | None = None):
    """A file -> (its recognised state, the config read, the model with it loaded strict, in eval)."""
    state, recorded = unpack(read_published(path))
    sub = recognise(state)
    assert sub is not None, f"{path.name}: not recognised as MERL"
    config = read_architecture(sub, {"heads": recorded_heads} if recorded_heads else recorded)
    model = MerlEncoder.from_config(config)
    model.load_state_dict(sub)
    return sub, config, model.eval()


@pytest.fixture(scope="module")
def model_input() -> torch.Tensor:
    return torch.from_numpy(np.load(FIX / "model_input.npy"))


@pytest.mark.parametrize("entry", _files(), ids=lambda e: e["weights"])
def test_the_published_file_gives_merls_embedding_and_tokens(entry, model_input):
    sub, config, model = _read(FIX / entry["weights"])
    want = np.load(FIX / entry["embedding"])
    with torch.no_grad():
        got = model.pooled(model_input).numpy()
        tokens = model(model_input).tokens.numpy()
    assert got.shape == want.shape
    assert np.abs(got - want).max() <= REL * np.abs(want).max()
    tokens_file = FIX / entry["embedding"].replace("embedding", "tokens")
    if tokens_file.is_file():
        want_tokens = np.load(tokens_file)
        assert tokens.shape == want_tokens.shape
        assert np.abs(tokens - want_tokens).max() <= REL * np.abs(want_tokens).max()
    # every other entry of the file (the ResNet's untrained linear head) is dropped by name
    assert set(sub) == set(model.state_dict())
    raw_keys = set(unpack(read_published(FIX / entry["weights"]))[0])
    assert raw_keys - set(sub) == ({"linear.weight", "linear.bias"} if isinstance(model, MerlResNet) else set())


def test_the_fixture_files_read_as_their_sizes():
    _, res, resnet = _read(FIX / "res18_best_encoder.pth")
    o = res.encoders.merl
    assert (o.variant, o.blocks, o.widths, o.bottleneck) == ("resnet", (1, 1, 1, 1), (64, 128, 256, 512), False)
    assert (res.model.arch, res.model.n_leads, resnet.dim, resnet.patch_size) == ("merl", 12, 512, 16)
    _, vit, model = _read(FIX / "vit_tiny_best_encoder.pth")
    o = vit.encoders.merl
    assert (o.variant, o.patch_size, o.width, o.depth, o.mlp_dim, o.heads, o.dim_head) == ("vit", 50, 96, 2, 192,
                                                                                           3, 64)
    assert (vit.model.input_samples, model.n_patches, model.dim) == (5000, 100, 96)
    # the registry's own lookup finds this family (and no other claims the files)
    for name in ("res18_best_encoder.pth", "vit_tiny_best_encoder.pth"):
        fam, _, _ = recognise_any(read_published(FIX / name))
        assert fam is FAMILIES["merl"]


def test_the_contract_reproduces_merls_model_input():
    raw = np.load(FIX / "raw.npy")
    want = np.load(FIX / "model_input.npy")
    got = CONTRACT.model_input(raw, 500, PTBXL_LEADS)
    assert got.shape == want.shape == (1, 12, 5000) and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-7
    # the rows are MIMIC-IV-ECG's order (aVF before aVL) and the min-max is one over the whole window
    x = raw.astype(np.float64)
    scaled = (x - x.min()) / (x.max() - x.min() + 1e-8)
    assert MODEL_LEADS[4:6] == ("aVF", "aVL")
    np.testing.assert_allclose(got[0, 4], scaled[5], atol=1e-7)
    np.testing.assert_allclose(got[0, 5], scaled[4], atol=1e-7)
    assert np.abs(got[0, 4] - scaled[4]).max() > 1e-3


def test_a_short_record_is_zero_padded_before_the_min_max():
    """MERL's CPSC2018 branch: the first 2500 samples, zero-padded to 5000, then the min-max."""
    raw = np.load(FIX / "raw.npy")[:, :2500].astype(np.float64)
    padded = np.pad(raw, ((0, 0), (0, 2500)))
    want = (padded - padded.min()) / (padded.max() - padded.min() + 1e-8)
    got = CONTRACT.model_input(raw, 500, PTBXL_LEADS)[0]
    np.testing.assert_allclose(got[[0, 1, 2, 3, 5, 4, 6, 7, 8, 9, 10, 11]], want, atol=1e-7)


def _config_of(leads: int, samples: int, sizes: MerlOptions):
    from coreecg.config import Config, ModelConfig
    from coreecg.config.encoders import EncoderOptions

    return Config(model=ModelConfig(arch="merl", n_leads=leads, input_samples=samples),
                  encoders=EncoderOptions({"merl": sizes}))


@pytest.mark.parametrize("sizes, samples, extra, heads", [
    (MerlOptions(variant="resnet", blocks=(1, 2, 1), widths=(8, 16, 8), bottleneck=True), 400,
     {"linear.weight": torch.zeros(10, 32), "linear.bias": torch.zeros(10)}, None),
    (MerlOptions(variant="resnet", blocks=(2, 1), widths=(8, 12)), 400, {}, None),
    (MerlOptions(variant="vit", patch_size=25, width=32, depth=3, mlp_dim=48, heads=2, dim_head=64,
                 qkv_bias=False), 200, {"head.weight": torch.zeros(3, 32)}, None),
    (MerlOptions(variant="vit", patch_size=10, width=16, depth=1, mlp_dim=24, heads=2, dim_head=8), 100, {}, 2),
], ids=["resnet-bottleneck", "resnet-basic", "vit-no-qkv-bias", "vit-recorded-heads"])
def test_another_size_is_read_back_from_its_weights(tmp_path, sizes, samples, extra, heads):
    torch.manual_seed(0)
    config = _config_of(12, samples, sizes)
    model = MerlEncoder.from_config(config).eval()
    for m in model.modules():          # non-trivial BatchNorm statistics, so a wrong load would show
        if isinstance(m, torch.nn.BatchNorm1d):
            m.running_mean.normal_()
            m.running_var.uniform_(0.5, 2.0)
    path = tmp_path / "encoder.pth"
    torch.save({**model.state_dict(), **extra}, path)          # MERL's container: a bare state dict
    sub, read, back = _read(path, heads)
    assert read.encoders.merl == sizes
    assert (read.model.n_leads, read.model.input_samples) == (12, samples if sizes.variant == "vit" else 5000)
    assert set(sub) == set(back.state_dict())
    x = torch.randn(2, 12, samples)
    with torch.no_grad():
        assert torch.equal(back.pooled(x), model.pooled(x))
        steps = -(-samples // back.patch_size) if sizes.variant == "resnet" else samples // back.patch_size
        assert back(x).tokens.shape == (2, steps, back.dim)


def test_the_whole_ecg_text_model_keeps_only_its_encoder():
    state, _ = unpack(read_published(FIX / "vit_tiny_best_encoder.pth"))
    whole = {**{f"ecg_encoder.{k}": v for k, v in state.items()}, "proj_e.0.weight": torch.zeros(4, 96),
             "lm_model.embeddings.word_embeddings.weight": torch.zeros(5, 8), "linear1.weight": torch.zeros(4, 96)}
    sub = recognise(whole)
    assert sub is not None and set(sub) == set(state)


def test_a_missing_key_and_a_wrong_shape_are_named():
    res = recognise(unpack(read_published(FIX / "res18_best_encoder.pth"))[0])
    vit = recognise(unpack(read_published(FIX / "vit_tiny_best_encoder.pth"))[0])
    for state, key in ((res, "layer3.0.bn2.running_var"), (res, "layer4.0.shortcut.1.weight"),
                       (vit, "block1.ff.fn.net.3.weight"), (vit, "norm.bias")):
        broken = {k: v for k, v in state.items() if k != key}
        with pytest.raises(ValueError, match=f"missing key '{key}'"):
            read_architecture(broken)
    for state, key, shape in ((res, "layer2.0.conv2.weight", (128, 128, 5)), (vit, "pos_embedding", (1, 100, 97)),
                              (vit, "block0.attn.fn.to_out.0.weight", (96, 190))):
        with pytest.raises(ValueError, match=f"key '{key}' has shape"):
            read_architecture({**state, key: torch.zeros(shape)})
    with pytest.raises(ValueError, match="unexpected key 'layer1.3.conv2.weight'"):
        read_architecture({**res, "layer1.3.conv2.weight": torch.zeros(64, 64, 3)})
    # without its signature keys a state is not MERL's (the ViT patches by a Conv1d, the ResNet's stem is 1-D)
    assert recognise({k: v for k, v in vit.items() if k != "pos_embedding"}) is None
    assert recognise({**res, "conv1.weight": torch.zeros(64, 12, 7, 7)}) is None


def test_inputs_the_encoders_refuse_and_lead_placement(model_input):
    _, _, vit = _read(FIX / "vit_tiny_best_encoder.pth")
    with pytest.raises(ValueError, match="position table covers 1..100 patches"):
        vit.pooled(torch.zeros(1, 12, 5050))
    with pytest.raises(ValueError, match="no token masks"):
        vit(model_input, visible=torch.ones(1, 1, 100, dtype=torch.bool))
    # rows fed by lead_idx land on their channels (MIMIC-IV-ECG order), the others are 0
    idx = torch.tensor([0, 1, 6, 7])
    placed = torch.zeros_like(model_input)
    placed[:, idx] = model_input[:, idx]
    with torch.no_grad():
        assert torch.equal(vit.pooled(model_input[:, idx], idx), vit.pooled(placed))


def test_released_sizes_and_options():
    assert MerlOptions().release_name == "resnet18" and MerlOptions(variant="vit").release_name == "vit_tiny"
    with torch.device("meta"):
        r50 = MerlEncoder.from_config(_config_of(12, 5000, MerlOptions.release("resnet50")))
        base = MerlEncoder.from_config(_config_of(12, 5000, MerlOptions.release("vit_base")))
    assert isinstance(r50, MerlResNet) and r50.dim == 2048 and "layer1.0.shortcut.0.weight" in r50.state_dict()
    assert isinstance(base, MerlViT) and base.dim == 768 and base.state_dict()["block11.attn.fn.to_qkv.weight"].shape \
        == (3 * 768, 768)
    with pytest.raises(ConfigError, match="variant"):
        MerlOptions(variant="resnet18")
    with pytest.raises(ConfigError, match="one count"):
        MerlOptions(blocks=(2, 2), widths=(64,))
    with pytest.raises(ConfigError, match="released"):
        MerlOptions.release("resnet152")
