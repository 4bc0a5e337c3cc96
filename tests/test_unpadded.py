"""Attention without a key-padding mask where none is needed (coreecg.model.padding.unpadded):
the same numbers as with the mask, and no mask reaches SDPA when the batch is known unpadded
and every sample has as many visible tokens (exact STDM), so flash attention can run on CUDA."""
import numpy as np
import pytest
import torch

import coreecg.model.layers as layers
from coreecg.config import load_config
from coreecg.data.corpus import unpadded_split
from coreecg.methods.core_ecg.masking import stdm
from coreecg.methods import CoReECG
from coreecg.model.encoder import Encoder
from coreecg.model.padding import assumed_unpadded, unpadded
from coreecg.train.step import PretrainStep, Schedule
from tests.helpers import tiny_config


@pytest.fixture
def masks_seen(monkeypatch) -> list:
    """The attn_mask of every SDPA call in the model's attention layers (None or its shape)."""
    seen, real = [], torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(None if attn_mask is None else tuple(attn_mask.shape))
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(layers.F, "scaled_dot_product_attention", spy)
    return seen


def test_the_context_is_scoped():
    assert not assumed_unpadded()
    with unpadded():
        assert assumed_unpadded()
        with unpadded(False):
            assert not assumed_unpadded()
        assert assumed_unpadded()
    assert not assumed_unpadded()


@pytest.mark.parametrize("mode", ["exact", "bernoulli"])
def test_encoder_gives_the_same_tokens_with_or_without_the_mask(mode, masks_seen):
    cfg = tiny_config()
    torch.manual_seed(0)
    enc = Encoder.from_config(cfg).eval()
    x = torch.randn(6, 12, 2250)
    n = cfg.n_patches
    visible = stdm(6, 12, n, 0.5, 0.5, 3, generator=torch.Generator().manual_seed(0), mode=mode)[0]
    with torch.no_grad():
        masked = enc(x, visible=visible)
        n_masked_calls = len(masks_seen)
        with unpadded():
            free = enc(x, visible=visible)
    assert torch.equal(masked.index, free.index)
    ok = masked.valid if free.valid is None else free.valid
    assert torch.allclose(masked.tokens[ok], free.tokens[ok], atol=1e-5)
    assert all(m is not None for m in masks_seen[:n_masked_calls])          # today's path: always a mask
    counts = visible.reshape(6, -1).sum(1)
    if mode == "exact":
        assert len(set(counts.tolist())) == 1
        assert free.valid is None and free.pad is None
        assert masks_seen[n_masked_calls:] == [None] * cfg.encoders.coreecg.depth       # flash-eligible
    else:   # visible sets of different sizes still need their padding mask
        assert len(set(counts.tolist())) > 1 and free.valid is not None
        assert torch.equal(free.valid, torch.arange(free.valid.shape[1])[None] < counts[:, None])


def test_a_full_sequence_has_no_mask_when_unpadded(masks_seen):
    enc = Encoder.from_config(tiny_config()).eval()
    x = torch.randn(2, 12, 2250)
    with torch.no_grad(), unpadded():
        out = enc(x)
        pooled = enc.pooled(x)
    assert out.valid is None and masks_seen and all(m is None for m in masks_seen)
    assert torch.allclose(pooled, enc.pooled(x), atol=1e-6)


@pytest.mark.parametrize("mode", ["exact", "bernoulli"])
def test_a_seeded_step_is_the_same_with_or_without_the_mask(mode):
    """The training step's loss and update do not depend on whether the all-true mask is passed."""
    x = torch.randn(4, 12, 2250, generator=torch.Generator().manual_seed(3))
    results = {}
    for flag in (False, True):
        cfg = tiny_config("train.precision=fp32", f"methods.core.masking.mode={mode}")
        torch.manual_seed(0)
        model = CoReECG(cfg)
        step = PretrainStep(model, cfg, Schedule(10, 2, 0))
        step.unpadded = flag
        out = step(x, generator=torch.Generator().manual_seed(0))
        # the gradients, not the update: Adam's first update is ~lr * sign(g), blind to magnitude
        results[flag] = (float(out["loss"]), {n: p.grad.clone() for n, p in model.named_parameters()
                                              if p.grad is not None})
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-5)
    assert results[True][1].keys() == results[False][1].keys() and results[True][1]
    for name, g in results[False][1].items():
        assert torch.allclose(results[True][1][name], g, rtol=1e-4, atol=1e-6), name


def test_unpadded_split_reads_the_manifest_count(tmp_path):
    import json

    from coreecg.data.corpus import FORMAT_VERSION, MANIFEST

    def corpus(name: str, counts: dict) -> str:
        (tmp_path / name).mkdir()
        (tmp_path / name / MANIFEST).write_text(json.dumps({"format_version": FORMAT_VERSION, "counts": counts}))
        return str(tmp_path / name)

    assert unpadded_split(corpus("none", {"padded_windows": {"train": 0, "val": 2}}), "train")
    assert not unpadded_split(corpus("some", {"padded_windows": {"train": 5, "val": 0}}), "train")
    # A corpus written before the count existed: unknown, so the mask stays.
    assert not unpadded_split(corpus("old", {"windows": {"train": 10}}), "train")
    assert not unpadded_split(corpus("partly", {"padded_windows": {"train": None}}), "train")


@pytest.mark.parametrize("seconds", [10.0, 7.0])
def test_a_built_corpus_counts_its_padded_windows(ray_session, tmp_path, seconds):
    """A built corpus carries the count per split, against the windows it wrote: synthetic records
    of 10 s fill their windows (none padded); of 7 s, each is one NaN-padded window."""
    from coreecg.data.corpus import load_manifest
    from coreecg.data.pipeline import build_corpus
    from coreecg.data.reading import read_split

    cfg = load_config(overrides=["data.synthetic_records=64", "data.shard_records=32"]).data
    build_corpus("synthetic", None, tmp_path / "c", cfg,
                 source_options={"seed": 0, "n_records": 64, "duration_s": seconds})
    manifest = load_manifest(tmp_path / "c")
    counts = manifest["counts"]["padded_windows"]
    assert set(counts) == {"train", "val", "test"}
    for split in (s for s, n in manifest["counts"]["windows"].items() if n):
        d = read_split(tmp_path / "c", split, ["signal"])
        padded = int(np.isnan(d["signal"][:, 0, -1]).sum())
        assert counts[split] == padded == (0 if seconds == 10.0 else len(d["signal"]))
    assert unpadded_split(tmp_path / "c", "train") == (seconds == 10.0)
