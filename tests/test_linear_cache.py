"""Linear probing on cached features (finetune.mode=linear, finetune.cache_features): the head
trains on the frozen encoder's evaluation-crop features, computed once per encoder and corpus and
kept in the run folder; the metrics equal the uncached path's (the same features computed every
step); a resumed run reuses them, another encoder recomputes them."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config import STANDARD_LEADS, load_config
from coreecg.eval.downstream import crop_features, eval_offsets, predict, predict_features
from coreecg.model.classifier import Classifier
from coreecg.model.encoder import Encoder
from coreecg.train.features import FOLDER, feature_key, load_or_compute
from tests.helpers import TINY


def test_head_on_the_mean_feature_is_the_crop_rule():
    torch.manual_seed(0)
    model = Classifier(Encoder(n_patches=30, dim=32, depth=2, num_heads=2), 4, STANDARD_LEADS[:6],
                       multilabel=False, frozen_encoder=True)
    windows = np.random.default_rng(0).standard_normal((5, 12, 2500)).astype(np.float16)
    windows[1, :, 1500:] = np.nan                              # a short record: its last crop is not scored
    probs, feats = predict(model, windows, list(range(6)), 2250, 3, torch.device("cpu"), batch_size=2)
    assert np.allclose(predict_features(model, torch.from_numpy(feats)), probs, atol=1e-6)
    f, _ = crop_features(model.eval(), torch.from_numpy(windows[:, :6]), eval_offsets(2500, 2250, 3), 2250)
    assert np.allclose(f.numpy(), feats, atol=1e-6)
    # and the pooled forward is the head alone
    assert torch.allclose(model(torch.from_numpy(feats), pooled=True)["logits"], model.head(torch.from_numpy(feats)))


def test_features_are_reused_for_their_key_and_recomputed_for_another(tmp_path):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "manifest.json").write_text("{}")
    key = lambda sha: feature_key(encoder="random", encoder_sha256=sha, corpus=tmp_path / "corpus",  # noqa: E731
                                  leads=["I"], crop=2250, offsets=[0, 125, 250], precision="auto")
    calls = []

    def compute(value):
        def run():
            calls.append(value)
            return np.arange(3), np.full((3, 2), value, np.float32)
        return run

    out, info = load_or_compute(tmp_path / "run", key("a"), {"train": compute(1.0)})
    assert not info["reused"] and calls == [1.0] and (tmp_path / "run" / FOLDER / "meta.json").is_file()
    out, info = load_or_compute(tmp_path / "run", key("a"), {"train": compute(2.0)})
    assert info["reused"] and calls == [1.0] and out["train"][1][0, 0] == 1.0
    out, info = load_or_compute(tmp_path / "run", key("b"), {"train": compute(3.0)})      # another encoder
    assert not info["reused"] and out["train"][1][0, 0] == 3.0
    assert json.loads((tmp_path / "run" / FOLDER / "meta.json").read_text())["key"]["encoder_sha256"] == "b"
    (tmp_path / "corpus" / "manifest.json").write_text('{"other": 1}')                # another corpus
    assert not load_or_compute(tmp_path / "run", key("b"), {"train": compute(4.0)})[1]["reused"]


# ---------------------------------------------------------------------------- real records, Ray


@pytest.fixture(scope="module")
def ptbxl(ray_session, ecg_data, tmp_path_factory):
    from tests.helpers import build_ptbxl

    return build_ptbxl(tmp_path_factory.mktemp("lin-corpus"), ecg_data)


def _cfg(tmp: Path, corpus: Path, name: str, *extra: str):
    return load_config(overrides=[*TINY, f"data.corpus={corpus}", "finetune.encoder=random", "finetune.mode=linear",
                                  "finetune.batch_size=16", "finetune.linear_lr=1e-2", "finetune.epochs=4",
                                  "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0",
                                  "train.num_workers=1", "train.checkpoint_every_steps=0",
                                  f"train.storage_path={tmp}", f"train.name={name}", *extra])


def _metrics(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.json").read_text())


@pytest.mark.slow
def test_cached_and_uncached_probes_agree_and_the_cache_is_reused_on_resume(ptbxl, tmp_path):
    from coreecg.train.fit import fit, plan_run

    cached = fit(plan_run(_cfg(tmp_path, ptbxl, "cached"), "finetune")).run_dir
    uncached = fit(plan_run(_cfg(tmp_path, ptbxl, "uncached", "finetune.cache_features=false"), "finetune")).run_dir
    a, b = _metrics(cached), _metrics(uncached)
    assert a["probe"]["cached_features"] and not b["probe"]["cached_features"] and a["probe"]["crops"] == "eval"
    assert not a["probe"]["features_reused"] and not (uncached / FOLDER).exists()
    assert a["test"]["auroc"] is not None and abs(a["test"]["auroc"] - b["test"]["auroc"]) <= 1e-4
    assert abs(a["val"]["auroc"] - b["val"]["auroc"]) <= 1e-4
    assert a["selection"]["best_epoch"] == b["selection"]["best_epoch"]
    meta = json.loads((cached / FOLDER / "meta.json").read_text())
    assert meta["key"]["encoder"] == "random" and meta["key"]["corpus"] == str(ptbxl)
    assert meta["key"]["offsets"] == [0, 125, 250] and set(meta["splits"]) == {"train", "val", "test"}
    assert meta["splits"]["train"]["rows"] == a["counts"]["train_windows"] + a["counts"][
        "train_unlabelled_windows_skipped"] and meta["splits"]["train"]["dim"] == 32

    # resumed (the last checkpoint is there; the run had not written its metrics): features reused
    stamp = (cached / FOLDER / "train.npy").stat().st_mtime_ns
    (cached / "metrics.json").unlink()
    fit(plan_run(_cfg(tmp_path, ptbxl, "cached"), "finetune"))
    again = _metrics(cached)
    assert again["probe"]["features_reused"] and (cached / FOLDER / "train.npy").stat().st_mtime_ns == stamp
    assert again["test"]["auroc"] == a["test"]["auroc"]

    # another encoder (the random encoder of another seed) in a folder holding these features: recomputed
    other = tmp_path / "other"
    shutil.copytree(cached / FOLDER, other / FOLDER)
    fit(plan_run(_cfg(tmp_path, ptbxl, "other", "train.seed=1"), "finetune"))
    assert not _metrics(other)["probe"]["features_reused"]
    other_key = json.loads((other / FOLDER / "meta.json").read_text())["key"]
    assert other_key["encoder_sha256"] != meta["key"]["encoder_sha256"]
