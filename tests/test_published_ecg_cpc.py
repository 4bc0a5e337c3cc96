"""ECG-CPC's published checkpoint (coreecg.model.published.ecg_cpc), read as data: the fixture made
with the original code (../shared/fixtures/published/ecg_cpc, README.md there) is reproduced from
raw signal to tokens and pooled embedding; the architecture comes from the weights and the sidecar
config; foreign or broken states are named errors.

Tolerances. Embedding and tokens: the model is float32 throughout (a complex64 Cauchy sum over the
state modes, float32 FFT convolutions of length 2400), as the original; its own two float32
evaluations of the same kernel (KeOps vs torch, fixture README) differ by 1.4e-6 in the tokens
(max |token| 5.3) and 2.4e-7 in the embedding. Measured here: tokens 1.9e-6, embedding 4.8e-7, so
tokens atol 1e-5 and embedding atol 2e-6 (both ~5e-7 relative to their scale). Model input: the
original resamples float32 data with resampy, coreecg in float64 then rounds; measured 7.2e-7 at a
signal of ~5 mV (one float32 ulp at 4 is 4.8e-7): atol 2e-6.
"""
from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import yaml

from coreecg.encoders.published.ecg_cpc import EcgCpcOptions
from coreecg.model.published import FAMILIES
from coreecg.model.published.ecg_cpc import CONTRACT, EcgCpcEncoder, read_architecture, recognise, unpack
from coreecg.model.published.files import read_published

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "ecg_cpc"
SPEC = json.loads((FIXTURES / "fixture.json").read_text()) if FIXTURES.is_dir() else {"files": []}
FILES = [f["weights"] for f in SPEC["files"]]


def _load(path: Path) -> SimpleNamespace:
    payload = read_published(path)
    state, recorded = unpack(payload)
    sub = recognise(state)
    assert sub is not None
    config = read_architecture(sub, recorded)
    model = EcgCpcEncoder.from_config(config)
    model.load_state_dict(sub)                                    # strict
    x = torch.from_numpy(np.load(path.parent / "model_input.npy"))
    with torch.no_grad():
        tokens = model.eval()(x).tokens
    return SimpleNamespace(payload=payload, state=state, sub=sub, config=config, model=model, x=x, tokens=tokens)


@pytest.fixture(scope="module")
def loaded() -> dict[str, SimpleNamespace]:
    if not FIXTURES.is_dir():
        pytest.fail(f"ECG-CPC fixtures not found at {FIXTURES}")
    return {f["weights"]: _load(FIXTURES / f["weights"]) for f in SPEC["files"]}


# ---------------------------------------------------------------------------- the original's outputs


@pytest.mark.parametrize("weights", FILES)
def test_the_published_checkpoint_reproduces_the_tokens_and_the_embedding(loaded, weights):
    entry = next(f for f in SPEC["files"] if f["weights"] == weights)
    fx = loaded[weights]
    assert fx.payload.inert                                           # hyper_parameters: omegaconf, made inert
    assert fx.config.model.arch == "ecg_cpc" and fx.config.model.input_samples == 2400
    o = fx.config.encoders.ecg_cpc
    assert (o.stem, o.stem_strides, o.d_model, o.n_layers, o.d_state, o.l_max, o.causal) == \
        ((256,) * 4, (2, 1, 1, 1), 256, 2, 8, 1200, True)
    # every entry but the backbone's dropped: the SSL head, the loops, the optimiser
    assert set(fx.sub) == set(fx.model.state_dict())
    assert "ts_encoder.head_ssl.proj.0.weight" in fx.state and not any("head_ssl" in k for k in fx.sub)
    assert all(p.dtype == torch.float32 for p in fx.model.state_dict().values() if p.is_floating_point())
    x = torch.from_numpy(np.load(FIXTURES / entry["model_input"]))
    embedding = torch.from_numpy(np.load(FIXTURES / entry["embedding"]))
    with torch.no_grad():
        out = fx.model(x)
        pooled = fx.model.pooled(x)
    torch.testing.assert_close(out.tokens, fx.tokens, atol=0, rtol=0)
    assert out.grid == (1, 1200) and bool(out.valid.all()) and fx.model.patch_size == 2
    assert pooled.shape == embedding.shape == (1, 256) and pooled.dtype == torch.float32
    torch.testing.assert_close(pooled, embedding, atol=2e-6, rtol=0)
    tokens = FIXTURES / "tokens.npy"
    if tokens.is_file():
        torch.testing.assert_close(out.tokens, torch.from_numpy(np.load(tokens)), atol=1e-5, rtol=0)


def test_the_contract_gives_the_benchmarks_model_input():
    raw = np.load(FIXTURES / "raw.npy")
    meta = json.loads((FIXTURES / "raw.json").read_text())
    expected = np.load(FIXTURES / "model_input.npy")
    got = CONTRACT.model_input(raw, meta["fs"], meta["leads"])
    assert got.shape == expected.shape == (1, 12, 2400) and got.dtype == np.float32
    np.testing.assert_allclose(got[0], expected[0], atol=2e-6, rtol=0)
    # leads are picked by name: the rows in another order give the same input
    order = np.arange(12)[::-1]
    again = CONTRACT.model_input(raw[order], meta["fs"], [meta["leads"][i] for i in order])
    np.testing.assert_array_equal(again, got)
    family = FAMILIES["ecg_cpc"]
    assert family.contract is CONTRACT and family.unpack is unpack and family.pretrained_on == ("heedb",)
    assert CONTRACT.describe()["shape"] == [None, 12, 2400]


def test_causal_and_longer_than_the_kernel(loaded):
    """A token sees only its past; an input longer than l_max tokens doubles the kernel (as the
    original does) and leaves the first l_max tokens as they were."""
    fx = loaded[FILES[0]]
    longer = torch.cat([fx.x, 1.0 + fx.x[..., :200]], dim=-1)          # 1300 tokens > l_max = 1200
    with torch.no_grad():
        long = fx.model(longer).tokens
    assert long.shape == (1, 1300, 256)
    torch.testing.assert_close(long[:, :1200], fx.tokens, atol=1e-5, rtol=0)
    assert not torch.allclose(long[:, 1200:], fx.tokens[:, :100], atol=1e-2)
    with pytest.raises(ValueError, match="token masks"):
        fx.model(fx.x, visible=torch.ones(1, 1, 1200, dtype=torch.bool))


def test_the_published_size_has_the_reported_parameter_count():
    # 2,932,736: a third-party count of the real file (fixture README)
    model = EcgCpcEncoder(12, EcgCpcOptions())
    assert sum(p.numel() for p in model.parameters()) == 2_932_736
    assert model.dim == 512 and model.patch_size == 2


# ---------------------------------------------------------------------------- other sizes, broken files


def _random_checkpoint(tmp_path: Path, options: EcgCpcOptions, sidecar: dict | None) -> tuple[Path, EcgCpcEncoder]:
    """A random EcgCpcEncoder of `options`, saved as the original's Lightning container (the
    backbone under ts_encoder., an SSL head, an EMA copy, a downstream head) with its sidecar; B
    as a stride-0 expanded view, as a freshly built original holds it."""
    torch.manual_seed(1)
    model = EcgCpcEncoder(12, options)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            if t.is_floating_point() and not name.endswith(("omega", "z")):
                t.add_(0.05 * torch.randn_like(t))
            if name.endswith("running_var"):
                t.abs_().add_(0.5)
            if name.endswith("kernel.B"):          # identical rows, saved as the original's stride-0 view
                t.copy_(t[:, :1].expand_as(t))
    state = {f"ts_encoder.{k}": v[:, :1].expand_as(v) if k.endswith("kernel.B") else v.clone()
             for k, v in model.state_dict().items()}
    state["ts_encoder.head_ssl.proj.0.weight"] = torch.randn(options.d_model, options.d_model)
    state["ts_encoder.ema.encoder.layers.0.0.weight"] = torch.randn(3)
    state["head.0.weight"] = torch.randn(5, options.d_model)
    path = tmp_path / "last_1.ckpt"
    torch.save({"epoch": 0, "state_dict": state, "optimizer_states": []}, path)
    if sidecar is not None:
        (tmp_path / "config_last_1_ckpt.yaml").write_text(yaml.safe_dump(sidecar))
    return path, model.eval()


@pytest.mark.parametrize("variant", ["input_linear_prenorm", "bidirectional_no_sidecar"])
def test_the_architecture_is_read_from_another_size(tmp_path, variant):
    if variant == "input_linear_prenorm":
        options = EcgCpcOptions(stem=(16, 16, 24), stem_kernels=(3, 1, 1), stem_strides=(3, 1, 1),
                                stem_dilations=(1, 1, 1), d_model=20, n_layers=3, d_state=6, l_max=40,
                                prenorm=True, dropout=0.1)
        sidecar = {"ts": {"enc": {"features": [16, 16, 24], "kss": [3, 1, 1], "strides": [3, 1, 1],
                                  "dilations": [1, 1, 1]},
                          "pred": {"model_dim": 20, "prenorm": True, "dropout": 0.1}}}
    else:                                  # no sidecar: the published strides (2, 1, ...) and post-norm
        options = EcgCpcOptions(stem=(16, 16), stem_kernels=(5, 1), stem_strides=(2, 1), stem_dilations=(1, 1),
                                d_model=16, n_layers=1, d_state=4, l_max=32, causal=False)
        sidecar = None
    path, reference = _random_checkpoint(tmp_path, options, sidecar)
    payload = read_published(path)
    state, recorded = unpack(payload)
    assert (recorded is None) == (sidecar is None)
    sub = recognise(state)
    assert sub["predictor.predictor.s4_layers.0.kernel.kernel.B"].stride()[1] == 0
    assert set(sub) == set(reference.state_dict())                    # head, EMA, downstream head dropped
    config = read_architecture(sub, recorded)
    assert config.encoders.ecg_cpc == options
    assert config.model.input_samples == options.l_max * options.stride
    model = EcgCpcEncoder.from_config(config)
    model.load_state_dict(sub)
    x = torch.randn(2, 12, config.model.input_samples)
    with torch.no_grad():
        torch.testing.assert_close(model.eval().pooled(x), reference.pooled(x), atol=0, rtol=0)
        assert model(x).tokens.shape == (2, options.l_max, options.d_model)


def test_broken_states_are_named_errors(loaded):
    sub = loaded[FILES[0]].sub
    kernel = "predictor.predictor.s4_layers.1.kernel.kernel."
    missing = {k: v for k, v in sub.items() if k != kernel + "Q"}
    with pytest.raises(ValueError, match=f"missing key '{kernel}Q'"):
        read_architecture(missing, None)
    wrong = dict(sub, **{"predictor.predictor.s4_layers.0.output_linear.0.weight": torch.zeros(256, 256)})
    with pytest.raises(ValueError, match="key 'predictor.predictor.s4_layers.0.output_linear.0.weight' has shape"):
        read_architecture(wrong, None)
    stem = dict(sub, **{"encoder.layers.2.0.weight": torch.zeros(256, 128, 1)})
    with pytest.raises(ValueError, match="encoder.layers.2.0.weight"):
        read_architecture(stem, None)
    batchnorm = dict(sub, **{"predictor.predictor.norms.0.running_mean": torch.zeros(256)})
    with pytest.raises(ValueError, match="unexpected key 'predictor.predictor.norms.0.running_mean'"):
        read_architecture(batchnorm, None)
    with pytest.raises(ValueError, match="ts.enc.kss"):
        read_architecture(sub, {"ts": {"enc": {"kss": [5, 1, 1, 1], "strides": [2, 1, 1, 1]}}})
    # a missing S4 parameter is still this family's state, and read_architecture names it
    with pytest.raises(ValueError, match="missing key 'predictor.predictor.s4_layers.0.kernel.kernel.omega'"):
        read_architecture(recognise({k: v for k, v in sub.items() if "omega" not in k}), None)
    # not this family's: the signature keys are absent
    assert recognise({k: v for k, v in sub.items() if not k.startswith("predictor.")}) is None
    assert recognise({"model": {"pos_embedding": torch.zeros(1)}}) is None
