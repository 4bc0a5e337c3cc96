"""Per-layer linear probes (issue 64): every block's pooled features from one forward pass (the last
is the encoder's own pooled output), a probe per layer chosen on val, the job's table and figure
with one row per layer, and the sweep objective that takes the best layer's probe; a regression task's
corpus (age) probed by a ridge per layer, MAE per layer, the best the lowest val MAE."""
from __future__ import annotations

import csv
import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import mean_absolute_error

from coreecg.encoders.build import build_encoder
from coreecg.eval.layer_probe import best_layer, probe_layers
from coreecg.eval.objectives import OBJECTIVES, Embeddings, compute_objectives, needs_layers
from coreecg.eval.probe import ProbeData, ProbeSplit
from coreecg.model.layer_features import encoder_blocks, pooled_layers
from coreecg.tune.sweep import check_objective, metric_overrides
from coreecg.config import load_config
from coreecg.data.reading import read_split
from tests.helpers import TINY, build_synthetic, tiny_config

ENCODERS = {
    "coreecg": ["encoders.coreecg.depth=3"],
    "s4": ["encoders.s4.d_model=16", "encoders.s4.n_layers=3", "encoders.s4.stem=[16]", "encoders.s4.stem_strides=[5]",
           "encoders.s4.d_state=8"],
    "xresnet1d": ["encoders.xresnet1d.layers=[1,1,1,1]", "encoders.xresnet1d.widths=[8,8,16,16]",
                  "encoders.xresnet1d.stem=[8,8,8]"],
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """240 synthetic records: enough val and test patients of several classes to score AUROC."""
    return build_synthetic(tmp_path_factory.mktemp("layers") / "corpus", 240, 3)


@pytest.mark.parametrize("arch", list(ENCODERS))
def test_each_layer_is_pooled_once_and_the_last_is_the_encoders_own(arch):
    torch.manual_seed(0)
    enc = build_encoder(tiny_config(f"model.arch={arch}", *ENCODERS[arch])).eval()
    x = torch.randn(3, 12, 2250)
    x[1, :, 1800:] = float("nan")                  # a short record: its padding is left out of every mean
    with torch.no_grad():
        layers = pooled_layers(enc, x)
        own = enc.pooled(x)
    assert len(layers) == len(encoder_blocks(enc)[0]) == {"coreecg": 3, "s4": 3, "xresnet1d": 4}[arch]
    assert all(f.shape[0] == 3 and f.ndim == 2 and torch.isfinite(f).all() for f in layers)
    assert layers[-1].shape == own.shape
    torch.testing.assert_close(layers[-1], own, rtol=0, atol=0)
    assert not torch.allclose(layers[0][:, :8], layers[-1][:, :8])     # not one output repeated
    with torch.no_grad():                          # the padded sample's features are those of its real part
        alone = pooled_layers(enc, x[1:2])
    torch.testing.assert_close(alone[0], layers[0][1:2], rtol=1e-4, atol=1e-5)


def test_an_encoder_without_blocks_is_refused_by_name():
    with pytest.raises(ValueError, match=r"torch.nn.modules.linear.Linear exposes no blocks.*coreecg, s4, xresnet1d"):
        pooled_layers(torch.nn.Linear(4, 4), torch.zeros(1, 12, 100))


def test_probes_per_layer_are_deterministic_and_choose_on_val(corpus):
    torch.manual_seed(1)
    enc = build_encoder(tiny_config(*ENCODERS["coreecg"]))
    enc.train()                                    # the probe puts it in eval mode and back
    runs = [probe_layers(enc, corpus, 2250, 2, torch.device("cpu"), n_resamples=40, seed=3) for _ in range(2)]
    assert enc.training
    a, b = runs
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert [r["layer"] for r in a["layers"]] == [1, 2, 3] and a["n_layers"] == 3
    assert all(0.0 <= r["val_auroc"] <= 1.0 and r["low"] <= r["test_auroc"] <= r["high"] for r in a["layers"])
    best = max(a["layers"], key=lambda r: r["val_auroc"])
    assert a["best_layer"] == best["layer"] and a["best"] == best
    other = probe_layers(enc, corpus, 2250, 2, torch.device("cpu"), n_resamples=40, seed=4)
    assert [r["low"] for r in other["layers"]] != [r["low"] for r in a["layers"]]      # the seed is the bootstrap's


def test_the_best_layer_is_the_first_highest_val_score():
    rows = [{"layer": 1, "val_auroc": 0.7}, {"layer": 2, "val_auroc": 0.9}, {"layer": 3, "val_auroc": None},
            {"layer": 4, "val_auroc": 0.9}, {"layer": 5, "val_auroc": math.nan}]
    assert best_layer(rows) == 2
    errors = [{"layer": 1, "val_mae": 9.0}, {"layer": 2, "val_mae": 7.5}, {"layer": 3, "val_mae": math.nan},
              {"layer": 4, "val_mae": 7.5}, {"layer": 5, "val_mae": None}]
    assert best_layer(errors, "val_mae", lower=True) == 2 and best_layer(errors, "val_mae") == 1
    with pytest.raises(ValueError, match="no layer has a val_auroc"):
        best_layer([{"layer": 1, "val_auroc": None}])


def test_the_job_writes_a_row_per_layer_and_a_figure_and_refuses_a_missing_model(corpus, tmp_path, capsys):
    import jobs.probe_layers as job

    out = tmp_path / "out"
    sets = [x for o in (*TINY, "encoders.coreecg.depth=3", "finetune.bootstrap_resamples=30") for x in ("--set", o)]
    assert job.main(["--model", "random", "--corpus", str(corpus), "--output", str(out), "--seed", "2", *sets]) == 0
    with open(out / "layer_probe.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["layer"] for r in rows] == ["1", "2", "3"]
    assert list(rows[0]) == ["layer", "val_auroc", "test_auroc", "low", "high"]
    result = json.loads((out / "layer_probe.json").read_text())
    assert result["model"] == "random" and result["bootstrap_resamples"] == 30
    assert [float(r["test_auroc"]) for r in rows] == pytest.approx([r["test_auroc"] for r in result["layers"]])
    assert (out / "figures" / "layer_probe.png").stat().st_size > 1000
    assert f"best by val layer {result['best_layer']}" in capsys.readouterr().out

    missing = tmp_path / "no-such-run"
    code = job.main(["--model", str(missing), "--corpus", str(corpus), "--output", str(tmp_path / "u"), *sets])
    assert code == 2 and str(missing) in capsys.readouterr().err
    assert not (tmp_path / "u").exists()


def _probe_data(rng: np.random.Generator, n: int = 60) -> tuple[ProbeData, np.ndarray, np.ndarray]:
    label = np.arange(n) % 2
    multihot = np.eye(2, dtype=np.float32)[label]
    split = ProbeSplit(np.zeros((n, 1, 1), np.float32), multihot, label)
    return ProbeData(split, split, ["a", "b"], False, "synthetic"), label, rng.standard_normal((n, 4))


def test_the_objective_takes_the_best_layers_probe_and_only_where_layers_were_embedded():
    rng = np.random.default_rng(0)
    data, label, noise = _probe_data(rng)
    informative = noise + 3.0 * label[:, None]                 # layer 2 separates the classes
    layers = [(noise, noise[::-1].copy()), (informative, informative), (noise * 2, noise)]
    e = Embeddings(noise, noise, data, per_class=10, n_subsets=2, layers=layers)
    got = compute_objectives(e)
    assert got["layer_probe_best_layer"] == 2.0 and got["layer_probe_auroc"] > 0.95
    assert got["layer_probe_auroc"] > got["probe_auroc"]        # the last-layer probe sees noise only
    assert "layer_probe_auroc" not in compute_objectives(Embeddings(noise, noise, data, 10, 2))
    assert OBJECTIVES["layer_probe_auroc"].direction == "max" and needs_layers("layer_probe_auroc")
    assert not needs_layers("probe_auroc")


def test_a_sweep_on_the_layer_probe_is_accepted_and_its_trials_embed_every_layer():
    cfg = load_config()
    assert check_objective("layer_probe_auroc", cfg, ["methods.core.masking.p_time"]) == "max"
    assert metric_overrides("layer_probe_auroc") == ["data.probe_layers=true"]
    assert metric_overrides("probe_auroc") == []
    assert load_config(overrides=metric_overrides("layer_probe_auroc")).data.probe_layers


def test_a_pretraining_evaluation_reports_the_layer_probe_only_when_asked(corpus, tmp_path):
    from coreecg.data import synthetic_windows
    from coreecg.eval.probe import load_probe_data
    from coreecg.train.pretraining import pretrain_local

    windows, _ = synthetic_windows(16, seed=0)
    probe = load_probe_data(corpus, 40)
    reported = {}
    for asked in (True, False):
        cfg = load_config(overrides=[*TINY, "encoders.coreecg.depth=3", "optim.batch_size=8", "optim.epochs=1",
                                     "optim.warmup_epochs=0", "train.figures=false", "train.device=cpu",
                                     "train.checkpoint_every_steps=0", f"data.probe_layers={str(asked).lower()}"])
        run = tmp_path / f"run-{asked}"
        pretrain_local(cfg, windows, run, probe=probe)
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        reported[asked] = next(x for x in lines if x.get("kind") == "epoch")
    on, off = reported[True], reported[False]
    assert on["layer_probe_best_layer"] in (1.0, 2.0, 3.0)
    assert on["layer_probe_auroc"] >= on["probe_auroc"] - 1e-12      # the best layer, the last among them
    assert "layer_probe_auroc" not in off and off["probe_auroc"] == pytest.approx(on["probe_auroc"], abs=1e-9)


@pytest.fixture(scope="module")
def age_corpus(ptbxl_age_corpus):
    """The session's age (regression) corpus of the shared PTB-XL records (tests/conftest.py)."""
    out, manifest = ptbxl_age_corpus
    assert manifest["task"]["kind"] == "regression"
    return out


def test_a_regression_corpus_gets_a_ridge_per_layer_scored_by_mae_chosen_by_the_lowest_val_mae(age_corpus):
    torch.manual_seed(1)
    enc = build_encoder(tiny_config(*ENCODERS["coreecg"]))
    got = probe_layers(enc, age_corpus, 2250, 2, torch.device("cpu"), n_resamples=40, seed=3)
    assert [r["layer"] for r in got["layers"]] == [1, 2, 3] and got["n_layers"] == 3
    assert got["metric"] == "mae" and got["best_by"] == "val MAE (lower is better)"
    assert got["task"] == {"name": "age", "kind": "regression", "unit": "years"}
    assert "val_auroc" not in got["layers"][0]
    best = min(got["layers"], key=lambda r: r["val_mae"])
    assert got["best_layer"] == best["layer"] and got["best"] == best
    train = read_split(age_corpus, "train", ["record_id", "target"])
    ages = np.array(list(dict(zip(train["record_id"], train["target"].astype(np.float64))).values()))
    assert got["target_scaler"]["mean"] == pytest.approx(ages.mean())
    assert got["target_scaler"]["sd"] == pytest.approx(ages.std(ddof=1))
    for split in ("val", "test"):
        p = got["predictions"][split]
        assert len(p["layers"]) == 3 and len(p["record_id"]) == len(set(p["record_id"])) == len(p["target"])
        for r, pred in zip(got["layers"], p["layers"]):
            assert r[f"{split}_mae"] == pytest.approx(mean_absolute_error(p["target"], pred), rel=1e-9)
    assert all(r["low"] <= r["test_mae"] <= r["high"] and r["alpha"] in got["ridge_alphas"] for r in got["layers"])
    preds = np.concatenate(got["predictions"]["test"]["layers"])          # in years, not standardised units
    assert abs(preds.mean() - ages.mean()) < ages.std(ddof=1)
    again = probe_layers(enc, age_corpus, 2250, 2, torch.device("cpu"), n_resamples=40, seed=3)
    assert json.dumps(again, sort_keys=True) == json.dumps(got, sort_keys=True)


def test_the_job_on_a_regression_corpus_writes_mae_per_layer_and_every_layers_predictions(age_corpus, tmp_path,
                                                                                          capsys):
    import jobs.probe_layers as job

    out = tmp_path / "age"
    sets = [x for o in (*TINY, "encoders.coreecg.depth=3", "finetune.bootstrap_resamples=30") for x in ("--set", o)]
    assert job.main(["--model", "random", "--corpus", str(age_corpus), "--output", str(out), "--seed", "2",
                     *sets]) == 0
    with open(out / "layer_probe.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["layer", "val_mae", "test_mae", "low", "high"]
    assert [r["layer"] for r in rows] == ["1", "2", "3"]
    result = json.loads((out / "layer_probe.json").read_text())
    assert "predictions" not in result and result["best_by"] == "val MAE (lower is better)"
    table = pd.read_csv(out / "layer_predictions.csv", dtype={"record_id": str, "patient_id": str})
    assert list(table.columns) == ["split", "record_id", "patient_id", "target", "layer_1", "layer_2", "layer_3"]
    test = table[table["split"] == "test"]
    for r in rows:
        mae = mean_absolute_error(test["target"], test[f"layer_{r['layer']}"])
        assert float(r["test_mae"]) == pytest.approx(mae, rel=1e-5)
    assert (out / "figures" / "layer_probe.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert f"best by val layer {result['best_layer']}" in printed and "lower is better" in printed
