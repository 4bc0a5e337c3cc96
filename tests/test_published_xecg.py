"""xECG's published encoder (coreecg.model.published.xecg): its Hugging Face folder, read as data,
reproduces the original pipeline (embedding.npy, tokens.npy) from the original input
(model_input.npy), and the contract reproduces that input from the raw record; the sLSTM cells'
CUDA layout is converted (the bias trap detected); the architecture comes from the weights.

Fixtures: ../shared/fixtures/published/xecg (README.md there): random-but-perturbed weights saved
by xECG's own class with xlstm 2.0.6 (sLSTM cells in the CUDA layout, as the release), the
reference computed with xlstm's vanilla backend in float32.

Tolerances: the model is float32 end to end, as the reference; the sums run in a different order
(bmm against xlstm's matmul, einsum layouts), so float32 rounding (~1e-7 relative per op, over
five blocks and 40 recurrent steps) is what remains. Measured: embedding max |diff| 6.6e-7 at a
scale of 1.68, tokens 5.4e-6 at 6.7 (both ~1e-6 relative); the bound is 1e-5 x the scale. The
contract's model input uses the same scipy call as the original (scipy.signal.resample): measured 0.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from coreecg.data.contract import ContractError
from coreecg.config.base import ConfigError
from coreecg.encoders.published.xecg import XEcgOptions
from coreecg.model.published import FAMILIES
from coreecg.model.published.files import read_published
from coreecg.model.published.xecg import (CONTRACT, XEcgEncoder, published_state, read_architecture, recognise,
                                          unpack)

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "xecg"
CELL = "core.model.blocks.0.xlstm.slstm_cell."


def _fixture_files() -> list[dict]:
    return json.loads((FIXTURES / "fixture.json").read_text())["files"] if FIXTURES.is_dir() else []


def _load(folder: Path) -> tuple[XEcgEncoder, dict, dict | None]:
    """The family's path: read_published -> unpack -> recognise -> read_architecture -> build -> strict load."""
    state, recorded = unpack(read_published(folder))
    sub = recognise(state)
    assert sub is not None
    model = XEcgEncoder.from_config(read_architecture(sub, recorded)).eval()
    model.load_state_dict(sub)                       # strict
    return model, state, recorded


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Small recurrent steps: threads only contend (1 thread: 0.04 s a forward; 2 on a busy host: 0.9 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fx() -> SimpleNamespace:
    if not FIXTURES.is_dir():
        pytest.fail(f"xECG fixtures not found at {FIXTURES}")
    model, state, recorded = _load(FIXTURES)
    x = torch.from_numpy(np.load(FIXTURES / "model_input.npy"))
    with torch.no_grad():
        pooled, out = model.pooled(x), model(x)
    return SimpleNamespace(model=model, state=state, recorded=recorded, x=x, pooled=pooled, out=out)


# ---------------------------------------------------------------------------- the original pipeline


@pytest.mark.parametrize("entry", _fixture_files(), ids=lambda e: e["weights"])
def test_every_fixture_file_reproduces_the_embedding(entry):
    model, _, _ = _load(FIXTURES / entry["weights"])
    x = torch.from_numpy(np.load(FIXTURES / entry["model_input"]))
    ref = torch.from_numpy(np.load(FIXTURES / entry["embedding"]))
    with torch.no_grad():
        pooled = model.pooled(x)
    assert pooled.dtype == torch.float32 and pooled.shape == ref.shape == (1, 128)
    scale = float(ref.abs().max())
    assert float((pooled - ref).abs().max()) <= 1e-5 * scale


def test_tokens_match_the_last_block_in_time_order(fx):
    ref = torch.from_numpy(np.load(FIXTURES / "tokens.npy"))
    assert fx.out.tokens.shape == ref.shape == (1, 40, 128) and fx.out.grid == (1, 40)
    assert fx.out.valid is None and fx.out.pad is None           # a 10-s record: no padding patch
    assert float((fx.out.tokens - ref).abs().max()) <= 1e-5 * float(ref.abs().max())
    assert float((fx.out.tokens.mean(dim=1) - fx.pooled).abs().max()) <= 1e-6


def test_the_contract_reproduces_the_model_input():
    raw = np.load(FIXTURES / "raw.npy")
    meta = json.loads((FIXTURES / "raw.json").read_text())
    ours = CONTRACT.model_input(raw, meta["fs"], meta["leads"])
    ref = np.load(FIXTURES / "model_input.npy")
    assert ours.shape == ref.shape == (1, 1000, 12) and ours.dtype == np.float32
    assert float(np.abs(ours - ref).max()) <= 1e-6
    # the first 10 s of at most 12 s (coreecg's stored window); a shorter record is refused, not padded
    long = CONTRACT.model_input(np.tile(raw, (1, 2))[:, :6513], 500, meta["leads"])
    assert long.shape == (1, 1000, 12)
    with pytest.raises(ContractError, match="shorter than one window of 1000"):
        CONTRACT.model_input(raw[:, :2130], 500, meta["leads"])
    order = np.random.default_rng(0).permutation(12)
    np.testing.assert_array_equal(CONTRACT.model_input(raw[order], 500, [meta["leads"][i] for i in order]), ours)
    assert FAMILIES["xecg"].contract is CONTRACT and CONTRACT.describe()["layout"] == "time_major"


# ---------------------------------------------------------------------------- the sLSTM layout trap


def test_the_cuda_bias_order_is_converted_not_just_the_kernel(fx):
    """The trap: a loader that only transposes the kernel loads the bias in the wrong (head, gate,
    dim) order without any error; the embedding is then far off."""
    with pytest.raises(RuntimeError):                            # the file's own names never load unconverted
        XEcgEncoder(fx.model.options).load_state_dict({k: v for k, v in fx.state.items() if k != "mask_token"})
    wrong = XEcgEncoder(fx.model.options).eval()
    sub = recognise(fx.state)
    for key in [k for k in fx.state if k.endswith("slstm_cell._bias_")]:
        name = key.replace("core.model.", "").replace("_bias_", "bias")
        sub[name] = fx.state[key].view(4, 4, 32)                 # cuda order read as gate-major: no conversion
    wrong.load_state_dict(sub)
    with torch.no_grad():
        bad = wrong.pooled(fx.x)
    assert float((bad - fx.pooled).abs().max()) > 0.5
    assert float(torch.nn.functional.cosine_similarity(bad, fx.pooled).item()) < 0.9


def test_the_vanilla_backend_layout_is_recognised_too(fx):
    """A state saved with xlstm's vanilla backend: kernel (NH, 4 DH, DH), bias (gate, head, dim)."""
    vanilla = dict(fx.state)
    for key in [k for k in fx.state if k.endswith("slstm_cell._recurrent_kernel_")]:
        cuda = fx.state[key]                                     # (NH, DH, 4 DH)
        vanilla[key] = cuda.permute(0, 2, 1).contiguous()
        bias = key.replace("_recurrent_kernel_", "_bias_")
        vanilla[bias] = fx.state[bias].view(4, 4, 32).transpose(0, 1).reshape(-1)
    a, b = recognise(fx.state), recognise(vanilla)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    bad = dict(fx.state, **{CELL + "_recurrent_kernel_": torch.zeros(4, 32, 100)})
    with pytest.raises(ValueError, match=r"blocks\.0\.xlstm\.slstm_cell\._recurrent_kernel_.*\(4, 32, 100\)"):
        recognise(bad)


# ---------------------------------------------------------------------------- reading the architecture


def test_the_architecture_of_another_size_is_read_back(tmp_path):
    """A random module of another size in xECG's container (config.json + model.safetensors, sLSTM
    cells in the CUDA layout) reads back with the same sizes and the same output."""
    o = XEcgOptions(embed_dim=48, blocks="msmsm", num_heads=3, patch_size=10, conv_kernel=3, qkv_blocksize=2,
                    mlstm_dim=96, ffn_dim=64, post_norm=True, activation="relu", pooling="max")
    torch.manual_seed(1)
    model = XEcgEncoder(o, n_leads=12).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))                    # no zero (1 + weight) norms, no zero kernels
    folder = tmp_path / "xecg"
    folder.mkdir()
    save_file({**published_state(model.state_dict()), "mask_token": torch.zeros(48)},
              str(folder / "model.safetensors"))
    config = {"embedding_size": 48, "num_heads": 3, "patch_size": 10, "xlstm_config": list(o.blocks),
              "activation_fn": "relu", "cls_type": "max", "use_final_layer_norm": True}
    (folder / "config.json").write_text(json.dumps(config))
    state, recorded = unpack(read_published(folder))
    assert any(k.endswith("slstm_cell._recurrent_kernel_") and v.shape == (3, 16, 64) for k, v in state.items())
    cfg = read_architecture(recognise(state), recorded)
    assert cfg.encoders.xecg == o and cfg.model.arch == "xecg" and cfg.model.n_leads == 12
    back, _, _ = _load(folder)
    x = torch.randn(2, 200, 12)
    x[1, 150:] = 0                                               # padding patches 15..19 of the second record
    with torch.no_grad():
        assert torch.equal(back.pooled(x), model.pooled(x))
        out = back(x)
    assert out.valid is not None and out.valid[1].sum() == 15 and bool(out.valid[0].all())
    # max pooling leaves the padding patches out
    assert torch.equal(back.pooled(x)[1], out.tokens[1, :15].amax(dim=0))
    with pytest.raises(ValueError, match="xlstm_config"):
        read_architecture(recognise(state), {**recorded, "xlstm_config": ["s"] * 5})
    with pytest.raises(ValueError, match="cls_type 'attn_pool'"):
        read_architecture(recognise(state), {**recorded, "cls_type": "attn_pool"})


def test_a_missing_key_and_a_wrong_shape_are_named(fx):
    missing = {k: v for k, v in fx.state.items() if k != "core.model.blocks.2.xlstm.q_proj.weight"}
    with pytest.raises(ValueError, match=r"missing key 'blocks\.2\.xlstm\.q_proj\.weight'"):
        read_architecture(recognise(missing), fx.recorded)
    no_bias = {k: v for k, v in fx.state.items() if k != "core.model.blocks.4.xlstm.slstm_cell._bias_"}
    with pytest.raises(ValueError, match=r"missing key 'blocks\.4\.xlstm\.slstm_cell\.bias'"):
        read_architecture(recognise(no_bias), fx.recorded)
    wrong = dict(fx.state, **{"core.model.blocks.1.ffn.proj_down.weight": torch.zeros(128, 100)})
    with pytest.raises(ValueError, match=r"'blocks\.1\.ffn\.proj_down\.weight' has shape \(128, 100\), "
                                         r"expected \(128, 192\)"):
        read_architecture(recognise(wrong), fx.recorded)
    gap = {k: v for k, v in fx.state.items() if not k.startswith("core.model.blocks.3.")}
    with pytest.raises(ValueError, match=r"blocks\.3\."):
        read_architecture(recognise(gap), fx.recorded)


def test_every_entry_outside_the_encoder_is_dropped_by_name(fx):
    extra = {**fx.state, "fc.weight": torch.zeros(5, 128), "fc.bias": torch.zeros(5),
             "head.proj.weight": torch.zeros(3, 3), "core.model.blocks.0.xlstm.dino_head.weight": torch.zeros(2),
             "teacher.patch_embedding.conv.weight": torch.zeros(1)}
    sub = recognise(extra)
    assert set(sub) == set(fx.model.state_dict()) and "mask_token" in fx.state
    # a training checkpoint's names (xECG's own load_checkpoint mapping) give the same state
    lightning = {"model." + k.replace("core.model.", "xlstm.model."): v for k, v in fx.state.items()}
    sub2, _ = unpack(SimpleNamespace(entries={"state_dict": lightning, "epoch": 3}, config=None))
    assert recognise(sub2).keys() == sub.keys()
    assert recognise({"pos_embedding": torch.zeros(1), "sep_embedding": torch.zeros(1)}) is None
    assert recognise({k: v for k, v in fx.state.items() if k != "patch_embedding.conv.weight"}) is None


# ---------------------------------------------------------------------------- the encoder interface


def test_leads_padding_and_token_masks(fx):
    model = fx.model
    assert (model.n_leads, model.dim, model.patch_size, model.output_kind) == (12, 128, 25, "sequence")
    x = fx.x[:, :500]
    with torch.no_grad():
        six = model.pooled(x[..., 6:], torch.arange(6, 12))     # the chest leads alone = the others zero
        zeroed = x.clone()
        zeroed[..., :6] = 0
        assert torch.equal(six, model.pooled(zeroed))
        nan = fx.x[:, :525].clone()
        nan[:, 500:] = float("nan")                              # coreecg's padding -> xECG's zero padding
        assert torch.equal(model(nan).valid, torch.arange(21)[None] < 20)
        padded = torch.cat([x, torch.zeros(1, 25, 12)], dim=1)
        assert torch.equal(model.pooled(nan), model.pooled(padded))
    with pytest.raises(ValueError, match="token masks"):
        model(fx.x, visible=torch.ones(1, 1, 40, dtype=torch.bool))
    with pytest.raises(ValueError, match="shorter than one patch"):
        model.pooled(fx.x[:, :24])
    with pytest.raises(ConfigError, match="blocks"):
        XEcgOptions(blocks="smx")
    with pytest.raises(ConfigError, match="num_heads"):
        XEcgEncoder(XEcgOptions(embed_dim=30, num_heads=4))
    assert XEcgEncoder(XEcgOptions.tiny()).pooled(torch.randn(1, 50, 12)).shape == (1, 32)
