"""What a sweep ranks trials by (issue 56): a loss whose scale a swept key moves is refused as the
objective, naming the key and what stays comparable; trials are compared at equal budget, so a
trial ASHA stopped early never wins over trials that ran further, however high its early score."""
from __future__ import annotations

import math

import numpy as np

import pytest

from coreecg.config import load_config
from coreecg.tune.sweep import SweepError, best_row, check_objective, rank_rows


@pytest.mark.parametrize("method, metric, key", [
    ("core", "loss_con", "methods.core.loss.tau"),
    ("core", "loss", "methods.core.loss.alpha"),
    ("moco_v3", "loss_con", "methods.moco_v3.temperature"),
    ("cpc", "loss_con", "methods.cpc.temperature"),
    ("core", "loss_rec", "pretrain.method"),
])
def test_a_loss_whose_scale_a_swept_key_moves_is_refused(method, metric, key):
    cfg = load_config(overrides=[f"pretrain.method={method}"])
    with pytest.raises(SweepError, match=rf"--metric {metric}: the sweep varies {key}, which changes the scale of "
                                         rf"{metric} itself.*comparable: probe_auroc, probe_auroc_full"):
        check_objective(metric, cfg, ["methods.core.masking.p_time", key])


def test_comparable_objectives_are_accepted_with_any_swept_key():
    cfg = load_config()
    swept = ["methods.core.loss.tau", "methods.core.masking.p_time"]
    assert check_objective("probe_auroc", cfg, swept) == "max"
    # the reconstruction term's scale does not move with tau or the mask rates: still an objective
    assert check_objective("loss_rec", cfg, swept) == "min"
    assert check_objective("loss_con", cfg, ["methods.core.masking.p_time"]) == "min"


def test_trials_are_ranked_at_equal_budget():
    """ASHA stopped trial a after one epoch with the highest score seen; b and c ran all 4 epochs:
    the best is the better of b and c at epoch 4, and a has no rank."""
    rows = [{"trial_id": "a", "epochs": 1, "probe_auroc": 0.95},
            {"trial_id": "b", "epochs": 4, "probe_auroc": 0.81},
            {"trial_id": "c", "epochs": 4, "probe_auroc": 0.86},
            {"trial_id": "d", "epochs": 4, "probe_auroc": math.nan}]          # an error: no score
    assert best_row(rows)["trial_id"] == "c"
    assert [(r["trial_id"], r["rank"], r["compared_at_epoch"]) for r in rows] == [
        ("a", None, 4), ("b", 2, 4), ("c", 1, 4), ("d", None, 4)]
    assert [r["trial_id"] for r in rank_rows(rows, "loss", "min")] == []          # no trial has that column
    losses = [{"trial_id": "a", "epochs": 2, "loss": 0.1}, {"trial_id": "b", "epochs": 2, "loss": 0.3}]
    assert best_row(losses, "loss", "min")["trial_id"] == "a"


def test_rankme_is_its_hand_computation():
    from coreecg.eval.objectives import RANKME_EPS, rankme

    assert abs(rankme(np.eye(16)) - 16) < 1e-3                     # every direction alike: full rank
    one = np.outer(np.arange(1, 9), np.ones(5))                       # rank 1
    assert abs(rankme(one) - 1) < 1e-3
    x = np.random.default_rng(0).standard_normal((40, 6))
    s = np.linalg.svd(x, compute_uv=False)
    p = s / s.sum() + RANKME_EPS
    assert rankme(x) == pytest.approx(float(np.exp(-(p * np.log(p)).sum())), rel=1e-12)
    assert rankme(np.zeros((4, 3))) == 1.0


def test_the_knn_probe_is_scikit_learns():
    """Single-label: the class shares among the k nearest (cosine) train windows are
    KNeighborsClassifier's probabilities with uniform weights."""
    from sklearn.neighbors import KNeighborsClassifier

    from coreecg.eval.objectives import knn_scores

    rng = np.random.default_rng(1)
    train_x, val_x = rng.standard_normal((60, 8)), rng.standard_normal((15, 8))
    label = rng.integers(0, 3, 60)
    ours = knn_scores(train_x, np.eye(3)[label], val_x, k=7)
    ref = KNeighborsClassifier(7, metric="cosine", algorithm="brute").fit(train_x, label).predict_proba(val_x)
    np.testing.assert_allclose(ours, ref)


def _embeddings(train_x, val_x, k=3):
    from coreecg.eval.objectives import Embeddings
    from coreecg.eval.probe import ProbeData, ProbeSplit

    def split(n):
        return ProbeSplit(np.zeros((n, 1, 1), np.float32), np.eye(k, dtype=np.float32)[np.arange(n) % k],
                          np.arange(n) % k)

    return Embeddings(train_x, val_x, ProbeData(split(len(train_x)), split(len(val_x)), [f"c{i}" for i in range(k)],
                                                False, "mem"), per_class=2, n_subsets=2)


def test_a_plugin_objective_is_one_module_a_sweep_can_optimise():
    import tests.plugin_objective  # noqa: F401  (what `plugins: [tests.plugin_objective]` does)
    from coreecg.eval.objectives import compute_objectives

    rng = np.random.default_rng(0)
    scores = compute_objectives(_embeddings(rng.standard_normal((30, 8)), rng.standard_normal((12, 8))))
    assert {"probe_auroc", "probe_auroc_full", "knn_auroc", "rankme", "top_pc_share"} <= set(scores)
    cfg = load_config(overrides=["plugins=[tests.plugin_objective]"])
    assert check_objective("top_pc_share", cfg, ["methods.core.loss.tau"]) == "min"


def test_a_collapsed_encoder_is_a_named_warning(tmp_path, caplog):
    """An encoder whose embeddings are one point: the evaluation says so in the console and in
    metrics.jsonl, and reports collapsed = 1 (what train.stop_on_collapse stops a sweep's trial on)."""
    import json
    import logging

    import torch

    from coreecg.data import synthetic_windows
    from coreecg.eval.probe import load_probe_data
    from coreecg.train.pretraining import pretrain_local
    from tests.helpers import TINY, build_synthetic

    corpus = build_synthetic(tmp_path / "probe", 64, 4)
    cfg = load_config(overrides=[*TINY, "optim.batch_size=8", "optim.epochs=1", "optim.warmup_epochs=0",
                                 "train.figures=false", "train.device=cpu", "train.checkpoint_every_steps=0",
                                 "data.probe_max_windows=40"])
    windows, _ = synthetic_windows(16, seed=0)
    from coreecg.model.encoder import Encoder

    with caplog.at_level(logging.WARNING), pytest.MonkeyPatch.context() as mp:
        # every embedding the same point (the probe reads pooled features; training is untouched)
        mp.setattr(Encoder, "pooled", lambda self, x, lead_idx=None: torch.ones(len(x), self.dim))
        pretrain_local(cfg, windows, tmp_path / "run", probe=load_probe_data(corpus, 40))
    assert any("collapse at epoch 1: embeddings collapsed" in r.getMessage() for r in caplog.records)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(x.get("event") == "collapse" for x in lines)
    assert [x["collapsed"] for x in lines if x.get("kind") == "epoch"] == [1.0]


def test_validation_picks_the_best_and_worst_at_equal_budget_and_correlates_each_objective(tmp_path):
    """--validate 2: the two best and two worst trials that ran the full budget; each objective's rho
    against the fine-tuned AUROC read from the study's runs (the mask-rate study's closed form)."""
    import json

    from coreecg.study.validate import chosen_trials, validation_rows, validation_study

    import shutil

    from tests.helpers import tiny_models

    encoder = tiny_models(tmp_path / "models")["encoder"] / "encoder.pt"        # a real one: the study opens it
    rows = []
    for i, (epochs, auroc, knn) in enumerate([(4, .60, .50), (4, .70, .65), (1, .99, .9), (4, .80, .70),
                                              (4, .90, .80), (4, .75, .60)]):
        run = tmp_path / "trials" / f"t{i}"
        run.mkdir(parents=True)
        shutil.copy(encoder, run / "encoder.pt") if i != 3 else None    # t3: its checkpoint only
        (run / "checkpoint_step000000010").mkdir()
        shutil.copy(encoder, run / "checkpoint_step000000010" / "checkpoint.pt")
        rows.append({"trial_id": f"t{i}", "epochs": epochs, "probe_auroc": auroc, "knn_auroc": knn,
                     "rankme": [10.0, 15.0, 12.0, 11.0, 9.0, 13.0][i], "run_dir": str(run)})
    compared = rank_rows(rows)
    picked = chosen_trials(compared, 2)
    assert [r["trial_id"] for r in picked] == ["t4", "t3", "t1", "t0"]      # t2 stopped after 1 epoch: never picked
    from tests.helpers import build_synthetic

    corpus = build_synthetic(tmp_path / "corpus", 16, 5)
    from coreecg.cli import shipped

    data = validation_study(tmp_path, picked, config=None, overrides=[], finetune=[str(corpus)],
                            variants=shipped("tune_spaces/ablations.yaml"))
    assert data["pretrain"] == {"methods": []}
    assert data["downstream"]["methods"] == [f"trial t{i}" for i in (4, 3, 1, 0)]
    assert data["downstream"]["encoders"]["trial t4"] == str(tmp_path / "trials" / "t4" / "encoder.pt")
    from coreecg.study.reader import study_from_dict

    study = study_from_dict(data, tmp_path / "validation.yaml")          # a valid study, checked before Ray
    assert sorted(r.method for r in study.finetune_runs()) == sorted(data["downstream"]["methods"])
    assert data["downstream"]["encoders"]["trial t3"] == str(tmp_path / "trials" / "t3" / "checkpoint_step000000010"
                                                             / "checkpoint.pt")

    class Run:                                   # what study.finetune_runs() yields, as far as this reads
        def __init__(self, method):
            self.method, self.corpus, self.name = method, "synthetic", method.replace(" ", "-")

    class Study:
        def finetune_runs(self):
            return [Run(m) for m in data["downstream"]["methods"]]

    for trial, auroc in {"t4": 0.9, "t3": 0.8, "t1": 0.7, "t0": 0.6}.items():
        d = tmp_path / "validation" / "runs" / "finetune" / f"trial-{trial}"
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps({"test": {"auroc": auroc}}))
    out = {r["objective"]: r for r in validation_rows(Study(), tmp_path, picked)}
    assert out["probe_auroc"]["rho"] == pytest.approx(1.0) and out["probe_auroc"]["cells"] == 4
    assert out["rankme"]["rho"] == pytest.approx(-0.4)              # by hand: 1 - 6 x 14 / (4 x 15)
    assert "loss" not in out                                         # not recorded by these trials
