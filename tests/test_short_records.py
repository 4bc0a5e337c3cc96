"""Records shorter than the stored window (issue 29, item 5; docs/data_pipeline.md "Short records"):
kept down to `data.preprocess.min_duration_s`, padded with NaN, and the padding never counts as
signal (loss, visible patches, pooled features, evaluation crops)."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import wfdb

from coreecg.config import PreprocessConfig, load_config
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import Record, RecordError
from coreecg.methods.core_ecg.losses import masked_mse
from coreecg.methods.core_ecg.masking import exclude_padding, make_masks
from coreecg.methods.core_ecg import CoReECG
from coreecg.model.classifier import Classifier
from coreecg.model.encoder import Encoder
from coreecg.model.padding import fill, padding_mask, valid_samples
from coreecg.train.ingest import crop_offsets, to_model_input
from tests.helpers import TINY, tiny_config

CFG = PreprocessConfig()          # min_duration_s = 5 (the default)
PTBXL_500 = "ptbxl/records500/00000"
P = 75                             # encoders.coreecg.patch_size
REAL = 7 * 250                     # samples of a 7 s record at 250 Hz


def _ptbxl(ecg_data: Path, name: str = "00003_hr", seconds: float | None = None) -> Record:
    r = wfdb.rdrecord(str(ecg_data / PTBXL_500 / name))
    sig = r.p_signal.T.astype(np.float32)
    if seconds is not None:
        sig = sig[:, : int(round(seconds * r.fs))]
    return Record("ptbxl", name, sig, float(r.fs), tuple(r.sig_name), None, (), str(ecg_data / PTBXL_500 / name))


@pytest.fixture(scope="module")
def short_window(ecg_data) -> np.ndarray:
    """The stored window (12, 2500) of the first 7 s of a real PTB-XL record, float16 as stored."""
    w = preprocess_record(_ptbxl(ecg_data, seconds=7), CFG)
    assert w.shape == (1, 12, 2500)
    return w[0].astype(np.float16)


# ---------------------------------------------------------------------------- preprocessing


def test_short_real_record_is_kept_padded_and_its_real_part_is_the_unpadded_preprocessing(ecg_data):
    w = preprocess_record(_ptbxl(ecg_data, seconds=7), CFG)
    assert w.shape == (1, 12, 2500) and w.dtype == np.float32
    pad = np.isnan(w[0])
    assert pad.sum() == 12 * (2500 - REAL) and pad[:, REAL:].all() and not pad[:, :REAL].any()
    # the same 7 s preprocessed as a full 7 s window: identical real part, z-scored over it alone
    alone = preprocess_record(_ptbxl(ecg_data, seconds=7), PreprocessConfig(window_s=7.0, min_duration_s=7.0))
    assert alone.shape == (1, 12, REAL)
    np.testing.assert_array_equal(w[0, :, :REAL], alone[0])
    assert np.allclose(w[0, :, :REAL].mean(-1), 0, atol=1e-5) and np.allclose(w[0, :, :REAL].std(-1), 1, atol=1e-4)
    # a longer record keeps giving consecutive full windows, none padded
    long = preprocess_record(_ptbxl(ecg_data), CFG)
    assert long.shape == (1, 12, 2500) and not np.isnan(long).any()


def test_a_cpsc2018_record_cut_to_6s_gives_one_padded_window(ecg_data):
    """CPSC2018 records run 6-60 s (the shared sample has none under 10 s: cut a real one)."""
    from coreecg.data.sources import get_source

    src = get_source("cpsc2018", label_view="none")
    ref = next(r for r in src.list_records(ecg_data / "cpsc2018-cinc2020") if r.record_id == "A0001")
    rec = src.read(ref)
    rec = dataclasses.replace(rec, signal=rec.signal[:, : int(6 * rec.fs)])
    w = preprocess_record(rec, CFG)
    assert w.shape == (1, 12, 2500) and np.isnan(w).sum() == 12 * 1000 and np.isfinite(w[..., :1500]).all()


def test_a_4s_record_is_still_quarantined_naming_the_file(ecg_data):
    rec = _ptbxl(ecg_data, seconds=4)
    with pytest.raises(RecordError) as err:
        preprocess_record(rec, CFG)
    assert err.value.path == rec.path and rec.path.endswith("00003_hr") and rec.path in str(err.value)
    assert err.value.reason == "record is 4 s, shorter than 5 s (2000 samples at 500 Hz, needs 2500)"


def test_nan_in_a_raw_record_is_still_refused(ecg_data):
    rec = _ptbxl(ecg_data, seconds=7)
    rec.signal[3, 100] = np.nan
    with pytest.raises(RecordError, match="NaN or infinite samples in lead aVR"):
        preprocess_record(rec, CFG)


def test_min_duration_must_keep_at_least_one_patch():
    from coreecg.config import ConfigError

    with pytest.raises(ConfigError, match="min_duration_s"):
        load_config(overrides=["data.preprocess.min_duration_s=0.2"])
    with pytest.raises(ConfigError, match="min_duration_s"):
        load_config(overrides=["data.preprocess.min_duration_s=0"])


# ---------------------------------------------------------------------------- crops and masks


def test_crops_start_in_the_real_part_and_full_windows_crop_as_before():
    T, L, B = 2500, 2250, 512
    x = torch.randn(B, 12, T, dtype=torch.float16)
    real = torch.tensor([T, 2400, REAL, 1250] * (B // 4))
    x[torch.arange(T)[None, None, :].expand(B, 12, T) >= real[:, None, None]] = float("nan")
    uid = torch.arange(B)
    assert torch.equal(valid_samples(x), real)
    crops = to_model_input(x, uid, 3, 1, L)
    offsets = crop_offsets(uid, 3, 1, (real - L + 1).clamp(1, T - L + 1))
    full = real == T
    assert torch.equal(offsets[full], crop_offsets(uid, 3, 1, T - L + 1)[full])   # unchanged
    assert offsets[full].max() > 150 and offsets[real == 2400].max() <= 150 and (offsets[real < L] == 0).all()
    assert 0 < offsets[real == 2400].float().mean() < 150          # still random within the real part
    # what each crop holds: real samples first, as many as there are, then padding
    got = valid_samples(crops)
    assert torch.equal(got, torch.minimum(real - offsets, torch.tensor(L)))


def test_padding_mask_matches_the_record_and_no_padded_patch_is_visible_or_in_the_loss(short_window):
    x = to_model_input(torch.from_numpy(short_window)[None].repeat(64, 1, 1), torch.arange(64), 0, 0, 2250)
    pad = padding_mask(x, P)                                   # (64, 12, 30)
    expect = torch.arange(30) >= REAL // P                     # 23 whole real patches; patch 23 is part padding
    assert torch.equal(pad, expect.expand(64, 12, 30))
    masking = tiny_config().methods.core.masking
    visible, masked, dropped = exclude_padding(make_masks(masking, 64, 12, 30, torch.Generator().manual_seed(1)), pad)
    assert not (visible & pad).any() and not (masked & pad).any() and (dropped | ~pad).all()
    assert torch.equal(visible.int() + masked.int() + dropped.int(), torch.ones(64, 12, 30, dtype=torch.int))
    assert visible.any() and masked.any()


def test_stdm_rescue_makes_real_signal_visible():
    """With most columns full-masked, every sample still sees one of its sure (real) columns."""
    from coreecg.methods.core_ecg.masking import stdm
    from coreecg.model.padding import sure_patches

    assert sure_patches(tiny_config()) == 16                  # 5 s = 1,250 samples: 16 whole patches
    g = torch.Generator().manual_seed(0)
    visible, _, _ = stdm(4096, 12, 30, 0.97, 0.2, 3, generator=g, n_sure=3)
    assert visible[:, :, :3].any(dim=(1, 2)).all()
    visible, _, _ = stdm(4096, 12, 30, 0.97, 0.2, 3, generator=torch.Generator().manual_seed(0))
    assert not visible[:, :, :3].any(dim=(1, 2)).all()        # without n_sure it would not hold
    a = stdm(64, 12, 30, 0.5, 0.2, 3, generator=torch.Generator().manual_seed(1))
    b = stdm(64, 12, 30, 0.5, 0.2, 3, generator=torch.Generator().manual_seed(1), n_sure=30)
    assert all(torch.equal(x, y) for x, y in zip(a, b))     # n_sure = N: the masks as before


def test_core_ecg_never_sees_or_supervises_padding_and_nan_reaches_no_gradient(short_window, monkeypatch):
    import coreecg.methods.core_ecg.method as core

    torch.manual_seed(0)
    model = CoReECG(tiny_config())
    seen = {}

    def spy(pred, target, masked):
        seen.update(target=target.detach(), masked=masked)
        return masked_mse(pred, target, masked)

    monkeypatch.setattr(core, "masked_mse", spy)
    enc_out = {}
    model.encoder.register_forward_hook(lambda m, a, out: enc_out.setdefault("enc", out))
    full = torch.randn(4, 12, 2500) * 0.5
    stored = torch.cat([torch.from_numpy(short_window).float()[None].repeat(4, 1, 1), full])
    x = to_model_input(stored, torch.arange(8), 0, 0, 2250).requires_grad_(True)
    out = model(x, generator=torch.Generator().manual_seed(0))
    pad = padding_mask(x.detach(), P)
    assert pad[:4].any() and not pad[4:].any()
    for key, v in out.items():
        assert torch.isfinite(v).all(), key
    assert not (seen["masked"] & pad).any() and torch.isfinite(seen["target"]).all()
    enc = enc_out["enc"]                                       # the student's gathered tokens
    padded_token = torch.gather(pad.reshape(8, -1), 1, enc.index)
    assert not (enc.valid & padded_token).any()                # gathered padding is never a valid key
    out["loss"].backward()
    assert torch.isfinite(x.grad).all() and (x.grad[torch.isnan(x.detach())] == 0).all()
    assert x.grad[:4, :, :REAL].abs().sum() > 0                # the real part does get gradient
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad).all(), name


def test_masked_mse_ignores_padding_whatever_it_holds():
    g = torch.Generator().manual_seed(0)
    pred = torch.randn(2, 12, 30, 75, generator=g, requires_grad=True)
    target = torch.randn(2, 12, 30, 75, generator=g)
    pad = torch.zeros(2, 12, 30, dtype=torch.bool)
    pad[:, :, 20:] = True
    masked = (torch.rand(2, 12, 30, generator=g) < 0.6) & ~pad
    losses, grads = [], []
    for fill_value in (0.0, float("nan"), float("inf"), 1e4):
        t = target.clone()
        t[pad] = fill_value
        pred.grad = None
        loss = masked_mse(pred, t, masked)
        loss.backward()
        losses.append(loss.detach())
        grads.append(pred.grad.clone())
    assert all(torch.isfinite(v) for v in losses) and all(torch.equal(losses[0], v) for v in losses)
    for gr in grads:
        assert torch.equal(gr, grads[0]) and (gr[pad] == 0).all() and gr[masked].abs().sum() > 0


def test_pooled_features_ignore_padding_values_and_length(short_window):
    torch.manual_seed(0)
    enc = Encoder(n_patches=30, dim=32, depth=2, num_heads=2).eval()
    real = torch.from_numpy(short_window[:, :REAL]).float()[None]          # (1, 12, 1750)
    nan = float("nan")
    a = torch.cat([real, torch.full((1, 12, 500), nan)], -1)               # padded to 2250
    b = torch.cat([real, torch.full((1, 12, 50), nan)], -1)                # padded to 1800
    cut = real[..., : (REAL // P) * P]                                     # the whole real patches only
    with torch.no_grad():
        fa, fb, fc = enc.pooled(a), enc.pooled(b), enc.pooled(cut)
        # real samples inside the part-padded patch 23 do not count either
        a2 = a.clone()
        a2[..., (REAL // P) * P:REAL] = 7.0
        fa2 = enc.pooled(a2)
        zero_padded = enc.pooled(fill(a))                                  # zeros are NOT padding
    assert torch.isfinite(fa).all()
    assert all(torch.allclose(fa, other, atol=1e-5) for other in (fb, fc, fa2))
    assert not torch.allclose(fa, zero_padded, atol=1e-3)
    clf = Classifier(enc, 3, ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6"),
                     multilabel=False).eval()
    with torch.no_grad():
        assert torch.allclose(clf(a)["logits"], clf(b)["logits"], atol=1e-5)
        nothing = enc.pooled(torch.full((1, 12, 2250), nan))              # all padding: zeros, not NaN
    assert torch.equal(nothing, torch.zeros_like(nothing))


def test_teacher_view_keeps_the_padding(short_window):
    """FDA runs on the zero-filled window; the padding is put back (NaN) before the teacher pools."""
    model = CoReECG(tiny_config())
    x = to_model_input(torch.from_numpy(short_window)[None].repeat(2, 1, 1), torch.arange(2), 0, 0, 2250)
    views, pooled = {}, model.teacher_encoder.pooled

    def spy(v, *args):
        views["v"] = v.detach()
        return pooled(v, *args)

    model.teacher_encoder.pooled = spy
    h_t, rel = model._teacher(x, torch.Generator().manual_seed(5))
    v = views["v"]
    assert torch.equal(torch.isnan(v), torch.isnan(x)) and torch.isfinite(h_t).all() and torch.isfinite(rel)
    assert 0 < rel < 1


def test_evaluation_scores_only_crops_with_real_patches():
    from coreecg.eval.downstream import eval_offsets, predict

    torch.manual_seed(0)
    leads = ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6")
    clf = Classifier(Encoder(n_patches=30, dim=32, depth=1, num_heads=2), 4, leads, multilabel=False)
    sig = np.random.default_rng(0).standard_normal((2, 12, 2500)).astype(np.float16)
    sig[0, :, 800:] = np.nan                   # real part: the first crop only (offsets 0, 875, 1750)
    assert eval_offsets(2500, 750, 3) == [0, 875, 1750]
    probs, feats = predict(clf, sig, list(range(12)), 750, 3, torch.device("cpu"))
    assert np.isfinite(probs).all() and np.isfinite(feats).all()
    one, _ = predict(clf, sig[:1, :, :750], list(range(12)), 750, 1, torch.device("cpu"))
    np.testing.assert_allclose(probs[0], one[0], rtol=1e-5, atol=1e-6)   # crops 2, 3 were not scored


# ---------------------------------------------------------------------------- end to end (Ray)


@pytest.fixture(scope="module")
def short_corpus(ray_session, ecg_data, tmp_path_factory):
    """PTB-XL's sample with every other 500 Hz record cut to 7 s (real signal, real labels)."""
    from coreecg.data.pipeline import build_corpus

    root = tmp_path_factory.mktemp("short") / "ptbxl"
    src = ecg_data / "ptbxl"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("records500"))
    (root / "records500" / "00000").mkdir(parents=True)
    names = sorted(p.stem for p in (src / PTBXL_500.split("/", 1)[1]).glob("*.hea"))
    short = set(names[::2])
    for name in names:
        if name in short:
            r = wfdb.rdrecord(str(src / PTBXL_500.split("/", 1)[1] / name))
            wfdb.wrsamp(name, fs=r.fs, units=r.units, sig_name=r.sig_name, p_signal=r.p_signal[: int(7 * r.fs)],
                        fmt=["16"] * r.n_sig, adc_gain=[1000.0] * r.n_sig, baseline=[0] * r.n_sig,
                        write_dir=str(root / "records500" / "00000"))
        else:
            for ext in (".hea", ".dat"):
                target = src / PTBXL_500.split("/", 1)[1] / (name + ext)
                (root / "records500" / "00000" / (name + ext)).symlink_to(target)
    out = root.parent / "corpus"
    cfg = load_config(overrides=["data.shard_records=32"]).data
    build_corpus("ptbxl", root, out, cfg, source_options=cfg.sources.for_source("ptbxl", 0))
    return out, {f"{int(n.split('_')[0])}" for n in short}


@pytest.mark.slow
def test_pretraining_and_finetuning_on_a_corpus_of_short_records(short_corpus, tmp_path):
    from coreecg.data.reading import read_split
    from coreecg.train.fit import fit, plan_run

    corpus, short_ids = short_corpus
    d = read_split(corpus, "train", ["record_id", "signal"])
    padded = np.isnan(d["signal"][:, 0, -1])
    assert padded.sum() >= 20 and (~padded).sum() >= 20
    assert np.isnan(d["signal"][padded]).sum() == padded.sum() * 12 * (2500 - REAL)
    # The manifest counts them, so training keeps the key-padding mask on this corpus.
    from coreecg.data.corpus import load_manifest, unpadded_split

    counts = load_manifest(corpus)["counts"]["padded_windows"]
    assert counts["train"] == int(padded.sum()) and not unpadded_split(corpus, "train")
    pre = fit(plan_run(load_config(overrides=[
        *TINY, f"data.corpus={corpus}", "optim.batch_size=16", "optim.epochs=1", "optim.warmup_epochs=0",
        "train.eval_every_epochs=0", "train.num_workers=1", f"train.storage_path={tmp_path}", "train.name=pre"]),
        "pretrain"))
    losses = [json.loads(x) for x in (pre.run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in losses if "loss" in r and isinstance(r["loss"], float)]
    assert steps and all(np.isfinite(r["loss"]) for r in steps)
    ft = fit(plan_run(load_config(overrides=[
        f"data.corpus={corpus}", f"finetune.encoder={pre.model}", "finetune.allow_overlap=true",
        "finetune.batch_size=16", "finetune.epochs=2", "finetune.bootstrap_resamples=0", "train.num_workers=1",
        "train.checkpoint_every_steps=0", f"train.storage_path={tmp_path}", "train.name=ft"]), "finetune"))
    m = ft.metrics
    for key in ("acc", "f1", "auroc"):
        assert np.isfinite(m["test"][key]), key
    import csv

    with open(ft.run_dir / "predictions.csv") as f:
        rows = list(csv.DictReader(f))
    scored_short = [r for r in rows if r["record_id"] in short_ids]
    assert scored_short and all(np.isfinite(float(v)) for r in scored_short for k, v in r.items() if k.startswith("p_"))
