"""Published encoders (coreecg.model.published): ST-MEM's released checkpoint formats, read as data,
reproduce the official features; the architecture comes from the weights; foreign files are named
errors; and the weights go through fine-tuning, best.pt, load_classifier, predict and export.

Fixtures: ../shared/fixtures/st-mem (README.md there): random-weight checkpoints made by ST-MEM's
official code, its inputs and its forward_encoding features.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import coreecg
from coreecg.checkpoints import CheckpointError, load_checkpoint
from coreecg.config import PreprocessConfig, load_config
from coreecg.data.preprocess import zscore
from coreecg.loading import load_classifier, load_encoder, open_source
from coreecg.model.published import FAMILIES, build_encoder
from coreecg.model.published.st_mem import STMemEncoder, read_architecture, recognise
from tests.helpers import InProcessDataset

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO.parent / "shared" / "fixtures" / "st-mem"
RECORDS = 90           # 30 synthetic patients, 60/20/20 by patient


@pytest.fixture(scope="module")
def fx() -> SimpleNamespace:
    if not FIXTURES.is_dir():
        pytest.fail(f"ST-MEM fixtures not found at {FIXTURES}")
    return SimpleNamespace(encoder=FIXTURES / "encoder.pth", full=FIXTURES / "full.pth",
                           x=torch.from_numpy(np.load(FIXTURES / "input.npy")),
                           features=torch.from_numpy(np.load(FIXTURES / "features_12lead.npy")),
                           arch=json.loads((FIXTURES / "architecture.json").read_text()))


# ---------------------------------------------------------------------------- the official features


@pytest.mark.parametrize("which", ["encoder", "full"])
def test_both_published_formats_reproduce_the_official_features(fx, which):
    encoder = coreecg.load_encoder(getattr(fx, which))
    assert isinstance(encoder, STMemEncoder) and not encoder.training
    assert all(p.dtype == torch.float32 for p in encoder.parameters())
    with torch.no_grad():
        pooled = encoder.pooled(fx.x)
    assert pooled.dtype == torch.float32 and pooled.shape == fx.features.shape == (3, 128)
    torch.testing.assert_close(pooled, fx.features, atol=1e-5, rtol=0)
    # tokens: (B, C * N, D) on the (12, 30) grid, every patch visible
    with torch.no_grad():
        out = encoder(fx.x)
    assert out.tokens.shape == (3, 12 * 30, 128) and out.grid == (12, 30) and out.valid is None


def test_the_encoder_and_the_full_checkpoint_hold_the_same_encoder(fx):
    a, b = open_source(fx.encoder), open_source(fx.full)
    assert a.kind == b.kind == "encoder" and a.entries["published"] == b.entries["published"] == "st_mem"
    assert a.state.keys() == b.state.keys() and not any(k.startswith(("decoder", "mask_")) for k in b.state)
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    m, v = a.config.model, a.config.encoders.st_mem          # sizes: ST-MEM's own section
    assert a.config.encoder is v
    assert (m.arch, v.embed_dim, v.depth, v.num_heads, v.patch_size, m.input_samples, m.n_leads) == (
        "st_mem", fx.arch["width"], fx.arch["depth"], fx.arch["heads"], fx.arch["patch_size"], fx.arch["seq_len"],
        fx.arch["num_leads"])
    assert v.mlp_ratio * v.embed_dim == fx.arch["mlp_dim"]
    # the input contract: ST-MEM's, not coreecg's defaults
    p = a.config.data.preprocess
    assert (p.sampling_rate, p.highpass_hz, p.lowpass_hz, p.standardize) == (250, 0.67, 40.0, "record")
    assert a.config.data.crop_samples == 2250 and a.config.method_label == "ST-MEM"


# ---------------------------------------------------------------------------- the architecture is read


@pytest.mark.parametrize("recorded", [True, False])
def test_the_architecture_is_read_from_the_state_dict(tmp_path, recorded):
    """Another size than the fixture's (and than ViT-B/S): width 192, depth 3, 3 heads of 64,
    patch 50, 40 patches, MLP x2; heads from the checkpoint's config entry, else width / 64."""
    torch.manual_seed(0)
    made = STMemEncoder(n_leads=12, n_patches=40, patch_size=50, dim=192, depth=3, num_heads=3, mlp_ratio=2.0).eval()
    payload = {"epoch": 7, "model": made.state_dict()}
    if recorded:
        payload["config"] = {"model_name": "st_mem_vit_custom", "width": 192, "depth": 3, "heads": 3}
    else:                                         # the full format: encoder.* plus a decoder
        payload["model"] = {**{f"encoder.{k}": v for k, v in made.state_dict().items()},
                            "decoder_head.weight": torch.zeros(50, 64), "mask_embedding": torch.zeros(1, 1, 64)}
    torch.save(payload, tmp_path / "other.pth")
    loaded = load_encoder(tmp_path / "other.pth")
    assert (loaded.dim, loaded.depth, loaded.patch_size, loaded.n_patches, loaded.n_leads) == (192, 3, 50, 40, 12)
    config = open_source(tmp_path / "other.pth").config
    assert (config.encoder.num_heads, config.model.input_samples, config.encoder.mlp_ratio) == (3, 2000, 2.0)
    x = torch.randn(2, 12, 2000)
    with torch.no_grad():
        torch.testing.assert_close(loaded.pooled(x), made.pooled(x), atol=1e-6, rtol=0)
    # the heads rule when a checkpoint records none: attention width / 64
    assert read_architecture(recognise(made.state_dict())).encoders.st_mem.num_heads == 3
    assert read_architecture(recognise(made.state_dict()), {"heads": 6}).encoders.st_mem.num_heads == 6


def test_an_input_longer_than_the_position_table_names_the_file(fx):
    encoder = load_encoder(fx.encoder)
    with pytest.raises(ValueError, match=r"encoder\.pth.*2400 samples is 32 patches.*1\.\.30 patches"):
        encoder.pooled(torch.randn(1, 12, 2400))
    with torch.no_grad():                         # shorter inputs: fewer patches, the trailing SEP last
        assert encoder.pooled(torch.randn(1, 12, 1500)).shape == (1, 128)


# ---------------------------------------------------------------------------- foreign files


def test_foreign_and_garbled_files_are_checkpoint_errors_naming_the_file(fx, tmp_path, monkeypatch):
    garbled = tmp_path / "garbled.pth"
    garbled.write_bytes(fx.encoder.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="garbled.pth"):
        load_encoder(garbled)
    foreign = tmp_path / "foreign.pth"
    torch.save({"model": {"conv1.weight": torch.zeros(3)}}, foreign)
    with pytest.raises(CheckpointError, match=r"foreign\.pth: neither a coreecg checkpoint.*st_mem.*conv1\.weight"):
        load_encoder(foreign)
    # the keys of ST-MEM with shapes that do not fit: named, not a crash
    state = dict(torch.load(fx.encoder, weights_only=True)["model"])
    state["block0.attn.fn.to_qkv.weight"] = torch.zeros(3 * 96, 128)
    torch.save({"model": state}, tmp_path / "odd.pth")
    with pytest.raises(CheckpointError, match=r"odd\.pth: keys of a published encoder.*attention width 96"):
        load_encoder(tmp_path / "odd.pth")
    # code is never run: a pickled object that is not plain data becomes an inert placeholder (the
    # unpickler of coreecg.model.published.files), so the file is read as data and then refused
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "code.pth")
    with pytest.raises(CheckpointError, match=r"code\.pth: neither a coreecg checkpoint.*it holds \['model'\]"):
        load_encoder(tmp_path / "code.pth")
    calls = []
    real = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: calls.append(k.get("weights_only")) or real(*a, **k))
    load_encoder(fx.full)
    assert calls == [True]


# ---------------------------------------------------------------------------- the Encoder interface


def test_lead_subsets_pick_their_own_lead_embeddings(fx):
    encoder = load_encoder(fx.encoder)
    x = fx.x[:, [0, 6, 11]]
    with torch.no_grad():
        a = encoder.pooled(x, torch.tensor([0, 6, 11]))
        b = encoder.pooled(x[:, [2, 0, 1]], torch.tensor([11, 0, 6]))       # any row order, same leads
        c = encoder.pooled(x)                                               # default: I, II, III
    torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert (a - c).abs().max() > 1e-3


def test_visible_tokens_only_enter_the_transformer(fx):
    encoder = load_encoder(fx.encoder)
    with torch.no_grad():
        full = encoder(fx.x)
        every = encoder(fx.x, visible=torch.ones(3, 12, 30, dtype=torch.bool))
        torch.testing.assert_close(every.tokens, full.tokens, atol=1e-5, rtol=0)
        assert torch.equal(every.index, full.index)
        visible = torch.rand(3, 12, 30, generator=torch.Generator().manual_seed(0)) < 0.5
        part = encoder(fx.x, visible=visible)
        counts = visible.reshape(3, -1).sum(1)
        assert part.tokens.shape[1] == counts.max() and part.valid is not None
        assert torch.equal(part.valid.sum(1), counts)
        for b in range(3):                       # each kept token sits at a visible grid position
            idx = part.index[b][part.valid[b]]
            assert visible.reshape(3, -1)[b, idx].all() and len(set(idx.tolist())) == counts[b]
        # hiding a patch changes the others: it is left out of attention, not zeroed in the pool
        assert (part.tokens[0, 0] - full.tokens[0, part.index[0, 0]]).abs().max() > 1e-4


def test_the_registry_builds_by_arch():
    from coreecg.config import Config, ModelConfig
    from coreecg.model.encoder import Encoder

    assert "st_mem" in FAMILIES and isinstance(build_encoder(Config()), Encoder)
    with pytest.raises(TypeError, match="the whole Config"):      # a model section alone drops the sizes
        build_encoder(ModelConfig())
    # the config reads the encoder registry (coreecg.encoders): an unknown name is refused there,
    # naming the registered ones and where a plugin goes
    from coreecg.config import ConfigError

    with pytest.raises(ConfigError, match="model.arch='No Such' is not a registered encoder"):
        load_config(overrides=["model.arch=No Such"])
    with pytest.raises(ConfigError, match="model.arch='nope' is not a registered encoder; known: .*st_mem.*plugins"):
        load_config(overrides=["model.arch=nope", "finetune.mode=scratch"])


# ---------------------------------------------------------------------------- the input contract


def test_record_standardisation_is_over_leads_and_time():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(2, 12, 2500)) * np.arange(1, 13)[None, :, None] + 3.0
    rec = zscore(w, 1e-6, "record")
    assert np.allclose(rec.mean(axis=(1, 2)), 0, atol=1e-9) and np.allclose(rec.std(axis=(1, 2)), 1)
    assert rec[:, 11].std() > 3 * rec[:, 0].std()         # leads keep their relative amplitudes
    lead = zscore(w, 1e-6)
    assert np.allclose(lead.std(axis=2), 1)                # today's default: per lead
    assert np.array_equal(zscore(np.zeros((1, 12, 10)), 1e-6, "record"), np.zeros((1, 12, 10)))
    # corpora built before the key existed still match the default settings
    assert "standardize" not in PreprocessConfig().settings()
    assert PreprocessConfig(standardize="record").settings()["standardize"] == "record"


def test_a_corpus_preprocessed_otherwise_is_a_warning_and_another_rate_an_error(fx):
    from coreecg.train.finetuning import FinetuneError, preprocess_mismatch

    contract = open_source(fx.encoder).config.data.preprocess
    corpus = {"preprocess": PreprocessConfig().settings()}      # coreecg's defaults: per lead, 0.65 Hz
    lines = preprocess_mismatch(contract, corpus, Path("c"))
    assert lines == ["highpass_hz: encoder 0.67, corpus 0.65", "standardize: encoder record, corpus lead"]
    assert preprocess_mismatch(contract, {"preprocess": contract.settings()}, Path("c")) == []
    with pytest.raises(FinetuneError, match="500 Hz"):
        preprocess_mismatch(contract, {"preprocess": {**contract.settings(), "sampling_rate": 500}}, Path("c"))


# ---------------------------------------------------------------------------- jobs


def _job(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_job", REPO / "jobs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _synthetic_corpus(out: Path, *overrides: str) -> Path:
    """A small labelled synthetic corpus, built without a cluster."""
    import ray.data

    from coreecg.data.pipeline import build_corpus

    cfg = load_config(overrides=["data.shard_records=45", "data.split_ratios=[0.6,0.2,0.2]", *overrides]).data
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        build_corpus("synthetic", None, out, cfg, source_options=cfg.sources.for_source("synthetic", RECORDS),
                     log_warnings=False)
    return out


@pytest.fixture(scope="module")
def stmem_corpus(tmp_path_factory) -> Path:
    """Built to ST-MEM's contract (0.67 Hz, standardised over leads and time)."""
    return _synthetic_corpus(tmp_path_factory.mktemp("stmem-corpus") / "synthetic",
                             "data.preprocess.highpass_hz=0.67", "data.preprocess.standardize=record")


def _ft_args(fx, corpus: Path, out: Path) -> list[str]:
    return ["--encoder", str(fx.encoder), "--corpus", str(corpus), "--output", str(out),
            "--set", "finetune.epochs=1", "--set", "finetune.batch_size=8", "--set", "finetune.eval_crops=1",
            "--set", "finetune.bootstrap_resamples=10", "--set", "finetune.tsne_max_points=0",
            "--set", "train.num_workers=1", "--set", "train.checkpoint_every_steps=0"]


def test_finetuning_starts_from_the_published_weights(fx, stmem_corpus, tmp_path):
    """The real task's build (what every worker runs before step 1) holds ST-MEM's weights."""
    from coreecg.train.finetuning import FinetuneTask, plan_finetune

    cfg = load_config(overrides=[f"data.corpus={stmem_corpus}", f"finetune.encoder={fx.encoder}",
                                 f"train.storage_path={tmp_path}", "train.name=plan", "finetune.batch_size=8",
                                 "train.num_workers=1",
                                 "encoders.coreecg.embed_dim=32", "encoders.coreecg.depth=2"])   # a study's model
    plan = plan_finetune(cfg)
    assert plan.config.model == open_source(fx.encoder).config.model and plan.config.data.crop_samples == 2250
    assert plan.finetune.meta["method"] == "ST-MEM" and "preprocess_mismatch" not in plan.finetune.meta
    assert "published ST-MEM" in plan.finetune.meta["leakage"]["reason"]
    task = FinetuneTask(plan, torch.device("cpu"))
    ctx = SimpleNamespace(steps_per_epoch=plan.steps_per_epoch, device=torch.device("cpu"), wrap=lambda m: m)
    model, _ = task.build(ctx)
    published = torch.load(fx.encoder, weights_only=True)["model"]
    state = model.encoder.state_dict()
    assert state.keys() == published.keys()
    assert all(torch.equal(state[k], published[k]) for k in published)
    assert not any("warning: the corpus is preprocessed otherwise" in line for line in plan.describe())

    # a corpus built to coreecg's defaults: planned, with the difference said and recorded
    other = _synthetic_corpus(tmp_path / "default-corpus")
    plan = plan_finetune(load_config(overrides=[f"data.corpus={other}", f"finetune.encoder={fx.encoder}",
                                                f"train.storage_path={tmp_path}", "train.name=other",
                                                "finetune.batch_size=8", "train.num_workers=1"]))
    assert plan.finetune.meta["preprocess_mismatch"] == ["highpass_hz: encoder 0.67, corpus 0.65",
                                                         "standardize: encoder record, corpus lead"]
    assert any(line.startswith("warning: the corpus is preprocessed otherwise than the encoder's input contract "
                               "(highpass_hz") for line in plan.describe())


@pytest.mark.slow
def test_finetune_predict_and_export_from_the_published_weights(fx, stmem_corpus, tmp_path, ray_session):
    run = tmp_path / "ft"
    assert _job("finetune").main(_ft_args(fx, stmem_corpus, run)) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["method"] == "ST-MEM" and metrics["encoder"] == str(fx.encoder.resolve())
    payload, config = load_checkpoint(run / "best.pt")
    assert config.model.arch == "st_mem" and "encoder.sep_embedding" in payload["model"]

    # best.pt round-trips: load_classifier rebuilds the ST-MEM classifier with the same outputs
    classifier = load_classifier(run)
    assert isinstance(classifier.encoder, STMemEncoder)
    assert all(torch.equal(classifier.state_dict()[k], v) for k, v in payload["model"].items())
    x = fx.x[:2]
    from coreecg.model.classifier import Classifier

    rebuilt = Classifier(STMemEncoder.from_config(config), len(metrics["class_names"]), config.finetune.leads,
                         metrics["multilabel"]).eval()
    rebuilt.load_state_dict(payload["model"])
    with torch.no_grad():
        torch.testing.assert_close(classifier(x)["logits"], rebuilt(x)["logits"], atol=0, rtol=0)
        # fine-tuning moved the weights off ST-MEM's (the run trained)
        assert not torch.equal(classifier.encoder.state_dict()["norm.weight"],
                               torch.load(fx.encoder, weights_only=True)["model"]["norm.weight"])

    # export: the classifier's and the encoder's, each stating ST-MEM's input contract
    assert _job("export").main(["--model", str(run), "--output", str(tmp_path / "exp-ft")]) == 0
    assert _job("export").main(["--model", str(fx.encoder), "--output", str(tmp_path / "exp-enc")]) == 0
    for name in ("exp-ft", "exp-enc"):
        meta = json.loads((tmp_path / name / "config.json").read_text())
        c = meta["input"]
        assert c["bandpass"]["highpass_hz"] == 0.67 and c["sampling_rate"] == 250 and c["window_samples"] == 2250
        assert c["normalisation"]["axis"].startswith("over leads and time") and c["encoder"]["arch"] == "st_mem"
        enc = meta["architecture"]["encoder"] if meta["kind"] == "classifier" else meta["architecture"]
        assert enc["class"].endswith("STMemEncoder") and enc["arch"] == "st_mem"
        assert "over leads and time together" in (tmp_path / name / "README.md").read_text()
    with torch.no_grad():
        again = load_classifier(tmp_path / "exp-ft")(x)["logits"]
        torch.testing.assert_close(again, classifier(x)["logits"], atol=0, rtol=0)
        torch.testing.assert_close(coreecg.load_encoder(tmp_path / "exp-enc").pooled(fx.x), fx.features,
                                   atol=1e-5, rtol=0)


def test_predict_embeds_records_with_the_published_encoder(fx, ecg_data, tmp_path):
    """jobs/predict.py on ST-MEM's encoder.pth: ST-MEM's preprocessing, its pooled feature."""
    import pyarrow.parquet as pq

    from coreecg.data.preprocess import preprocess_record
    from coreecg.eval.downstream import eval_offsets
    from coreecg.hub import load_model
    from coreecg.inference import input_spec, list_inputs

    files = [str(ecg_data / "cpsc2018-cinc2020" / f"{r}.hea") for r in ("A0002", "A0005")]
    assert _job("predict").main(["--model", str(fx.encoder), "--input", *files, "--output", str(tmp_path)]) == 0
    emb = np.asarray(pq.read_table(tmp_path / "embeddings.parquet").column("embedding").to_pylist(), np.float32)
    assert emb.shape == (2, 128)
    loaded = load_model(fx.encoder)
    spec = input_spec(loaded)
    assert spec.preprocess.standardize == "record" and spec.preprocess.highpass_hz == 0.67
    items, _ = list_inputs(files[:1], loaded.config)
    w = preprocess_record(items[0].source.read(items[0].ref), spec.preprocess).astype(np.float16)
    assert np.allclose(w.astype(np.float64).std(axis=(1, 2)), 1, atol=1e-2)
    x = torch.from_numpy(w).float()
    offsets = eval_offsets(x.shape[-1], 2250, spec.n_crops)
    with torch.no_grad():
        oracle = torch.stack([loaded.model.pooled(x[..., o:o + 2250]) for o in offsets]).mean((0, 1))
    np.testing.assert_allclose(emb[0], oracle.numpy(), atol=2e-3)


# ---------------------------------------------------------------------------- studies


def test_a_study_fine_tunes_a_given_published_encoder_as_a_method(fx, tmp_path, ecg_data):
    from coreecg.study.spec import ExternalEncoder, StudyError, load_study
    from tests.test_study import _study

    encoders = {"ST-MEM": str(fx.encoder)}
    study = load_study(_study(tmp_path, ecg_data, downstream__methods=["ST-MEM", "CoRe-ECG"],
                              downstream__encoders=encoders))
    runs = [r for r in study.finetune_runs() if r.method == "ST-MEM"]
    assert runs and all(r.encoder == ExternalEncoder("ST-MEM", str(fx.encoder)) for r in runs)
    assert {r.mode for r in runs} == {"finetune"}
    assert "ST-MEM" not in study.pretrain_methods and "ST-MEM" in study.table_rows()["comparison"]
    # its own architecture is a declared difference of its row, not an unfair table
    assert any(a.covers("ST-MEM", "encoders.st_mem.embed_dim") for a in study.allow)
    assert not any(a.covers("CoRe-ECG", "encoders.coreecg.embed_dim") for a in study.allow)
    with pytest.raises(StudyError, match=r"downstream\.encoders\.ST-MEM: .*nowhere\.pth: no such file"):
        load_study(_study(tmp_path, ecg_data, downstream__methods=["ST-MEM"],
                          downstream__encoders={"ST-MEM": str(tmp_path / "nowhere.pth")}))
    with pytest.raises(StudyError, match="also a variant"):
        load_study(_study(tmp_path, ecg_data, downstream__encoders={"CoRe-ECG": str(fx.encoder)}))


def test_a_short_records_padding_never_reaches_st_mem_features(fx):
    """A padded window (NaN after the real samples, docs/data_pipeline.md "Short records"): its
    padded patches are neither attended to nor pooled, so the feature equals ST-MEM's own
    computation on the real part alone, SEP tokens included."""
    enc = load_encoder(fx.encoder).eval()
    x = fx.x
    padded = x.clone()
    padded[..., 1500:] = float("nan")                   # 20 real patches of 30
    with torch.no_grad():
        feature = enc.pooled(padded)
        alone = enc.pooled(x[..., :1500])               # the same 20 patches, no padding at all
        out = enc(padded)
    assert torch.isfinite(feature).all()
    torch.testing.assert_close(feature, alone, atol=1e-5, rtol=1e-5)
    assert out.valid.shape == (3, 12 * 30) and out.valid.sum(1).tolist() == [12 * 20] * 3



def test_published_weights_stay_published_once_exported(fx, tmp_path):
    """An export of ST-MEM's weights is still ST-MEM's: the leakage guard says its pretraining
    data is not here (not "the embedded synthetic corpus"), and its pretraining config is not
    compared as if coreecg had pretrained it."""
    from coreecg.hub.export import export_model
    from coreecg.loading import open_source
    from coreecg.train.leakage_guard import pretraining_of

    folder = export_model(fx.encoder, tmp_path / "export")
    src = open_source(folder, kind="encoder")
    assert src.entries.get("published") == "st_mem"
    pre = pretraining_of(src)
    assert pre.corpus is None and "ST-MEM" in pre.note and "synthetic" not in pre.note
