"""ECGFounder's published Net1D (coreecg.model.published.ecgfounder) against the shared fixture: the
original code's model input, pooled embedding and last-stage tokens for its 12-lead and 1-lead
files, read through files.read_published (their numpy scalar needs the inert unpickler).

Tolerances. Model input: the contract makes the original's scipy calls (iirnotch/butter + filtfilt,
medfilt, numpy's z-score) in float64 on the same float64 signal, so it matches to float32 rounding
(measured: 0.0); 1e-6 allows a scipy build's last-bit differences. Embedding and tokens: the same
float32 arithmetic in another order (batched padding, the SE gate as a broadcast product, the mean
over another axis); measured max abs diff 4.8e-7 (12-lead) and 1.2e-7 (1-lead) on embeddings of
scale ~4, tokens 9.5e-7; 1e-5 absolute (~2.5e-6 relative to the scale) is a few float32 ulps per
layer over 20 layers, and far below what a wrong detail moves (a -inf instead of 0 in the shortcut's
pool padding: 8e-3).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config import STANDARD_LEADS
from coreecg.encoders.published.ecgfounder import ECGFounderOptions
from coreecg.model.published import ecgfounder as E
from coreecg.model.published.files import read_published
from coreecg.model.published.registry import family

FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published" / "ecgfounder"
ATOL_INPUT, ATOL_EMBEDDING = 1e-6, 1e-5

pytestmark = pytest.mark.skipif(not (FIXTURE / "fixture.json").is_file(), reason="no shared ECGFounder fixture")


def _files() -> list[dict]:
    if not (FIXTURE / "fixture.json").is_file():
        return []
    return json.loads((FIXTURE / "fixture.json").read_text())["files"]


def _load(weights: str):
    """A published file -> (raw state dict, recognised state, config, loaded module in eval mode)."""
    state, recorded = E.unpack(read_published(FIXTURE / weights))
    sub = E.recognise(state)
    config = E.read_architecture(sub, recorded)
    model = E.ECGFounderEncoder.from_config(config).eval()
    model.load_state_dict(sub)                     # strict
    return state, sub, config, model


@pytest.fixture(scope="module")
def loaded() -> dict[str, tuple]:
    return {f["weights"]: _load(f["weights"]) for f in _files()}


@pytest.mark.parametrize("entry", _files(), ids=lambda f: f["weights"])
def test_embedding_and_tokens_match_the_original(entry, loaded):
    _, _, config, model = loaded[entry["weights"]]
    x = torch.from_numpy(np.load(FIXTURE / entry["model_input"]))
    assert config.model.n_leads == x.shape[1] == len(entry.get("leads", STANDARD_LEADS))
    with torch.no_grad():
        pooled, enc = model.pooled(x), model(x)
    ref = np.load(FIXTURE / entry["embedding"])
    assert pooled.shape == ref.shape and pooled.dtype == torch.float32
    np.testing.assert_allclose(pooled.numpy(), ref, rtol=0, atol=ATOL_EMBEDDING)
    tokens = np.load(FIXTURE / entry["embedding"].replace("embedding", "tokens"))
    assert enc.grid == (1, tokens.shape[1]) and (enc.valid is None or bool(enc.valid.all()))
    np.testing.assert_allclose(enc.tokens.numpy(), tokens, rtol=0, atol=ATOL_EMBEDDING)


@pytest.mark.parametrize("entry", _files(), ids=lambda f: f["weights"])
def test_head_drop_keeps_the_file_logits_reachable(entry, loaded):
    """The dropped `dense` head on the pooled embedding gives the fixture's logits: the embedding is
    the one the 150 labels were read from."""
    state, sub, _, model = loaded[entry["weights"]]
    assert "dense.weight" in state and "dense.weight" not in sub
    x = torch.from_numpy(np.load(FIXTURE / entry["model_input"]))
    with torch.no_grad():
        logits = torch.nn.functional.linear(model.pooled(x), state["dense.weight"], state["dense.bias"])
    ref = np.load(FIXTURE / entry["embedding"].replace("embedding", "logits"))
    np.testing.assert_allclose(logits.numpy(), ref, rtol=0, atol=ATOL_EMBEDDING)


@pytest.mark.parametrize("entry", _files(), ids=lambda f: f["weights"])
def test_contract_reproduces_the_model_input(entry, loaded):
    raw = np.load(FIXTURE / "raw.npy")
    contract = E.contract_for(loaded[entry["weights"]][2])          # chosen by the file's input channels
    assert contract.leads == tuple(entry.get("leads", STANDARD_LEADS))
    mine = contract.model_input(raw, 500, STANDARD_LEADS)
    ref = np.load(FIXTURE / entry["model_input"])
    assert mine.shape == ref.shape and mine.dtype == np.float32
    np.testing.assert_allclose(mine, ref, rtol=0, atol=ATOL_INPUT)


def test_contract_windows_a_longer_record_each_alone():
    raw = np.load(FIXTURE / "raw.npy")
    long = np.concatenate([raw, raw[:, :2600]], axis=1)             # 1.52 windows: the remainder dropped
    out = E.CONTRACT.model_input(long, 500, STANDARD_LEADS)
    assert out.shape == (1, 12, 5000)
    np.testing.assert_allclose(out, E.CONTRACT.model_input(raw, 500, STANDARD_LEADS), atol=ATOL_INPUT)
    assert family("ecgfounder").contract is E.CONTRACT


@pytest.mark.parametrize("entry", _files(), ids=lambda f: f["weights"])
def test_every_extra_entry_is_dropped(entry, loaded):
    state, sub, _, model = loaded[entry["weights"]]
    assert set(sub) == set(model.state_dict())
    dropped = set(state) - set(sub)
    assert dropped and all(re.match(r"(first_bn|dense|stage_list\.\d+\.block_list\.\d+\.bn[123])\.", k)
                           for k in dropped)
    payload = read_published(FIXTURE / entry["weights"])
    assert {"optimizer", "scheduler", "val_auroc"} <= set(payload.entries)       # beside the state: not unpacked


def _random_file(tmp_path: Path, n_leads: int, options: ECGFounderOptions) -> tuple[Path, E.ECGFounderEncoder]:
    """A random Net1D of these sizes saved in ECGFounder's container (BatchNorms and head beside)."""
    torch.manual_seed(1)
    model = E.ECGFounderEncoder(n_leads, options).eval()
    state = dict(model.state_dict())
    state["first_bn.weight"] = torch.ones(options.base_filters)
    state["stage_list.0.block_list.0.bn1.running_var"] = torch.ones(options.base_filters)
    state["dense.weight"], state["dense.bias"] = torch.zeros(150, model.dim), torch.zeros(150)
    path = tmp_path / "net1d.pth"
    torch.save({"epoch": 3, "state_dict": {f"module.{k}": v for k, v in state.items()}, "optimizer": {}}, path)
    return path, model


def test_architecture_read_from_another_size(tmp_path):
    options = ECGFounderOptions(base_filters=32, filters=(32, 48, 64), blocks=(2, 1, 3), kernel_size=7,
                                groups_width=8, ratio=0.5, se_ratio=4)
    path, model = _random_file(tmp_path, 3, options)
    state, recorded = E.unpack(read_published(path))
    sub = E.recognise(state)
    config = E.read_architecture(sub, recorded)
    assert (config.model.n_leads, config.encoders.ecgfounder) == (3, options)
    rebuilt = E.ECGFounderEncoder.from_config(config).eval()
    rebuilt.load_state_dict(sub)
    x = torch.randn(2, 3, 1001)                                         # odd lengths: the zero-padded pools
    with torch.no_grad():
        assert rebuilt(x).tokens.shape == (2, -(-1001 // rebuilt.patch_size), 64)
        torch.testing.assert_close(rebuilt.pooled(x), model.pooled(x), rtol=0, atol=0)


def test_missing_key_and_wrong_shape_name_the_key(loaded):
    _, sub, _, _ = next(iter(loaded.values()))
    missing = dict(sub)
    del missing["stage_list.3.block_list.1.se_fc2.bias"]
    with pytest.raises(ValueError, match=r"stage_list\.3\.block_list\.1\.se_fc2\.bias"):
        E.read_architecture(missing, None)
    wrong = dict(sub)
    wrong["stage_list.5.block_list.0.conv2.conv.weight"] = torch.zeros(128, 8, 16)
    with pytest.raises(ValueError, match=r"stage_list\.5\.block_list\.0\.conv2\.conv\.weight.*\(128, 8, 16\)"):
        E.read_architecture(wrong, None)
    del wrong["stage_list.0.block_list.0.conv3.conv.weight"]
    with pytest.raises(ValueError, match=r"missing key 'stage_list\.0\.block_list\.0\.conv3\.conv\.weight'"):
        E.read_architecture(wrong, None)


def test_other_state_is_not_recognised_and_leads_are_checked(loaded):
    assert E.recognise({"pos_embedding": torch.zeros(1), "first_conv.conv.weight": torch.zeros(1)}) is None
    one = loaded["1_lead_ECGFounder.pth"][3] if "1_lead_ECGFounder.pth" in loaded else None
    if one is None:
        pytest.skip("no 1-lead file")
    with pytest.raises(ValueError, match="reads I"):
        one(torch.zeros(1, 1, 512), lead_idx=torch.tensor([1]))
    with pytest.raises(ValueError, match="token masks"):
        one(torch.zeros(1, 1, 512), visible=torch.ones(1, 2, dtype=torch.bool))


def test_published_size_and_short_record_padding():
    with torch.device("meta"):
        full = E.ECGFounderEncoder(12)
    assert (full.dim, full.patch_size) == (1024, 256)
    assert sum(p.numel() for p in full.parameters()) == 30_598_896      # the backbone, without the 150-label head
    tiny = E.ECGFounderEncoder(12, ECGFounderOptions.tiny()).eval()
    assert tiny.patch_size == 8                                         # 2 (first conv) x 2 x 2 (two stages)
    x = torch.randn(1, 12, 1024)
    x[..., 600:] = float("nan")                                         # a short record's padding
    enc = tiny(x)
    assert enc.tokens.shape == (1, 128, 32) and enc.valid is not None
    assert enc.valid[0].sum() == 75 and bool(enc.valid[0, :75].all())  # ceil(600 / 8) steps hold real samples
