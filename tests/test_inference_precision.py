"""Inference precision paths (coreecg.inference.precision, precision_check; docs/inference.md
"Precision"): fp32, bf16 and int8 on real PTB-XL records against float32, the choice `auto`
makes with and without bf16 units (simulated through COREECG_CPU_UNITS: the suite runs as a
processor without them, tests/conftest.py), refusals that say why, batch independence, the
export's check on a held-out split and the predict job's flags.

The models are the tiny pretraining and linear fine-tune of tests/test_predict.py (its fixtures),
trained on the first PTB-XL records of ../shared/ecg-data.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from sklearn.metrics import roc_auc_score

from coreecg.config import load_config
from coreecg.hub import load_model
from coreecg.inference import InferenceError, list_inputs, run_inference
from coreecg.inference.precision import PrecisionError, cpu_units, resolve_precision
from coreecg.inference.precision_check import CHECKS_FILE, paired_auroc, record_checks
from tests.helpers import tiny_config, tiny_models
from tests.test_encoders import XRES
from tests import test_predict

# test_predict's module fixtures (a PTB-XL corpus, a pretraining run and linear fine-tunes), built here anew
ptbxl_refs, corpus, runs, _job = test_predict.ptbxl_refs, test_predict.corpus, test_predict.runs, test_predict._job

# The bounds the paths are held to here: the config's defaults (docs/performance.md measures them).
BOUNDS = load_config().inference
CPU = torch.device("cpu")


@pytest.fixture
def bf16_units(monkeypatch):
    """A processor with bf16 matrix units (simulated where there are none: emulated, still exact to bf16)."""
    monkeypatch.setenv("COREECG_CPU_UNITS", "bf16,int8")


@pytest.fixture(scope="module")
def raw_items(ptbxl_refs, runs):
    """The first 12 raw PTB-XL records as jobs/predict.py lists them."""
    files = [r.path + ".hea" for r in ptbxl_refs[:12]]
    items, failures = list_inputs(files, load_model(runs["ft12"]).config)
    assert not failures and len(items) == 12
    return items


# ---------------------------------------------------------------------------- the choice


def test_units_are_detected_by_torch_or_simulated_and_a_wrong_name_is_refused(monkeypatch):
    monkeypatch.delenv("COREECG_CPU_UNITS")
    real = cpu_units()
    assert real.bf16 == (bool(torch.cpu._is_avx512_bf16_supported()) or bool(torch.cpu._is_amx_tile_supported()))
    assert real.source == "torch.cpu cpuinfo"
    assert not cpu_units("none").bf16 and not cpu_units("none").int8
    assert cpu_units("bf16").bf16 and not cpu_units("bf16").int8
    with pytest.raises(ValueError, match="unknown unit"):
        cpu_units("fp8")


def test_auto_is_fp32_without_bf16_units_and_bf16_with_them():
    none, bf16 = cpu_units("none"), cpu_units("bf16,int8")
    c = resolve_precision("auto", CPU, none)
    assert c.precision == "fp32" and "no bf16 matrix units" in c.reason
    assert resolve_precision("auto", CPU, bf16).precision == "bf16"
    assert resolve_precision("int8", CPU, none).precision == "int8"         # int8: only when asked for
    assert resolve_precision("auto", torch.device("cuda"), none).precision == "bf16"
    with pytest.raises(PrecisionError, match="no bf16 matrix units"):
        resolve_precision("bf16", CPU, none)
    with pytest.raises(PrecisionError, match="CPU path"):
        resolve_precision("int8", torch.device("cuda"), bf16)
    c = resolve_precision("auto", CPU, bf16, refused={"bf16": "AUROC fell"})
    assert c.precision == "fp32" and "AUROC fell" in c.reason
    with pytest.raises(PrecisionError, match="refused for this model: AUROC fell"):
        resolve_precision("bf16", CPU, bf16, refused={"bf16": "AUROC fell"})


def test_auto_scores_in_fp32_where_no_bf16_unit_is_found(runs, raw_items):
    loaded = load_model(runs["ft12"])
    auto = run_inference(loaded, raw_items, precision="auto")      # COREECG_CPU_UNITS=none (conftest)
    fp32 = run_inference(loaded, raw_items, precision="fp32")
    assert auto.precision == "fp32" and "no bf16 matrix units" in auto.precision_reason
    assert np.array_equal(auto.probs, fp32.probs)


# ---------------------------------------------------------------------------- the paths' outputs


@pytest.mark.parametrize("precision", ["bf16", "int8"])
def test_each_path_is_within_its_bounds_of_fp32_on_real_records(runs, raw_items, precision, bf16_units):
    for kind in ("ft12", "encoder"):
        loaded = load_model(runs[kind])
        ref = run_inference(loaded, raw_items, precision="fp32", embeddings=True)
        got = run_inference(loaded, raw_items, precision=precision, embeddings=True)
        assert got.precision == precision and got.record_id == ref.record_id
        rel = np.linalg.norm(got.embeddings - ref.embeddings, axis=1) / np.linalg.norm(ref.embeddings, axis=1)
        assert 0 < rel.max() <= BOUNDS.max_embedding_diff, (kind, rel.max())   # it did change, within bounds
        if kind == "ft12":
            d = np.abs(got.probs - ref.probs).max()
            assert 0 < d <= BOUNDS.max_probability_diff, d
            assert np.allclose(got.probs.sum(1), 1.0)                       # still single-label probabilities


@pytest.mark.parametrize("precision", ["fp32", "bf16", "int8"])
def test_a_record_scores_the_same_whatever_records_share_its_batch(runs, raw_items, precision, bf16_units):
    loaded = load_model(runs["ft12"])
    together = run_inference(loaded, raw_items, precision=precision)
    alone = run_inference(loaded, raw_items[5:6], precision=precision)
    reordered = run_inference(loaded, raw_items[::-1], precision=precision)
    if precision != "int8":
        # exactly the same: every pass has the same shape (run_inference), whatever the weights' dtype
        assert np.array_equal(alone.probs[0], together.probs[5])
        assert np.array_equal(reordered.probs[::-1], together.probs)
    else:
        # dynamic int8 quantises a Linear layer's input with one scale per pass (the whole batch's
        # range): a record moves with its batch mates, within the path's bound, never beyond
        d = max(np.abs(alone.probs[0] - together.probs[5]).max(), np.abs(reordered.probs[::-1] - together.probs).max())
        assert 0 < d <= BOUNDS.max_probability_diff, d


# ---------------------------------------------------------------------------- refusals


def test_int8_is_refused_for_a_convolutional_encoder_saying_why(tmp_path):
    from coreecg.checkpoints import save_encoder
    from coreecg.methods import CoReECG

    cfg = tiny_config(*XRES, "methods.core.latent_decoder.dim=32")
    save_encoder(tmp_path / "encoder.pt", CoReECG(cfg), cfg, step=0)
    loaded = load_model(tmp_path)
    x = np.random.default_rng(0).normal(size=(12, 5000)).astype(np.float32)
    from coreecg.inference import array_record

    with pytest.raises(InferenceError, match=r"Linear layers hold \d+% of its FLOPs"):
        run_inference(loaded, [array_record(x, 500, loaded.config.data.preprocess.leads)], precision="int8")


def test_a_path_over_its_bound_is_refused_on_the_first_pass_and_auto_falls_back(runs, raw_items, bf16_units):
    loaded = load_model(runs["ft12"])
    strict = dataclasses.replace(loaded, config=dataclasses.replace(
        loaded.config, inference=dataclasses.replace(loaded.config.inference, max_embedding_diff=1e-9)))
    with pytest.raises(InferenceError, match="precision bf16 refused for this model on the first 8 windows: "
                                             "embeddings differ"):
        run_inference(strict, raw_items, precision="bf16")
    auto = run_inference(strict, raw_items, precision="auto")
    assert auto.precision == "fp32" and "bf16 refused on the first windows" in auto.precision_reason
    assert np.array_equal(auto.probs, run_inference(loaded, raw_items, precision="fp32").probs)


def test_a_recorded_refusal_is_refused_by_predict_and_skipped_by_auto(bf16_units, tmp_path):
    models = tiny_models(tmp_path)
    folder = models["encoder"]
    record_checks(folder, {"bf16": {"precision": "bf16", "accepted": False, "reason": "AUROC fell 2 points"}})
    loaded = load_model(folder)
    x = np.random.default_rng(0).normal(size=(12, 5000)).astype(np.float32)
    from coreecg.inference import array_record

    item = array_record(x, 500, loaded.config.data.preprocess.leads)
    with pytest.raises(InferenceError, match="bf16 is refused for this model: AUROC fell 2 points"):
        run_inference(loaded, [item], precision="bf16")
    r = run_inference(loaded, [item], precision="auto")
    assert r.precision == "fp32" and "AUROC fell 2 points" in r.precision_reason


# ---------------------------------------------------------------------------- the statistics


def test_an_auroc_drop_refuses_only_where_the_split_tells_it_from_resampling():
    from coreecg.inference.precision_check import verdict

    diffs = {"embedding": {"max": 0.001}, "probability": {"max": 0.001}}
    noise = {"split": "test", "fp32": 0.75, "path": 0.74, "diff": -0.01, "drop": 0.01, "ci": [-0.04, 0.0],
             "records": 17}
    ok, why = verdict({**diffs, "auroc": noise}, BOUNDS.__dict__)
    assert ok and "17 records cannot tell" in why
    real = {**noise, "path": 0.51, "diff": -0.24, "drop": 0.24, "ci": [-0.3, -0.18]}     # int8 collapse
    ok, why = verdict({**diffs, "auroc": real}, BOUNDS.__dict__)
    assert not ok and "a drop of 24.00 points" in why and "max_auroc_drop" in why


def test_paired_auroc_matches_sklearn_and_is_zero_for_equal_scores():
    rng = np.random.default_rng(0)
    y = np.eye(3, dtype=int)[rng.integers(0, 3, 200)]
    p = rng.dirichlet(np.ones(3), 200) + 0.3 * y
    patients = np.repeat(np.arange(100), 2)
    same = paired_auroc(y, p, p, patients, multilabel=False, n_resamples=200)
    assert same["diff"] == 0.0 and same["ci"] == [0.0, 0.0] and same["patients"] == 100
    expected = np.mean([roc_auc_score(y[:, k], p[:, k]) for k in range(3)])
    assert same["fp32"] == pytest.approx(expected, abs=1e-12)
    worse = paired_auroc(y, p, p + rng.normal(0, 0.2, p.shape), patients, multilabel=False, n_resamples=200)
    assert worse["diff"] < 0 and worse["ci"][0] <= worse["diff"] <= worse["ci"][1] and worse["drop"] == -worse["diff"]


# ---------------------------------------------------------------------------- export and the job


def test_export_checks_the_paths_on_the_held_out_split_and_the_card_states_them(runs, corpus, tmp_path, bf16_units,
                                                                                raw_items):
    from coreecg.hub import export_model

    out = export_model(runs["ft12"], tmp_path / "exp", precision="auto")
    checks = json.loads((out / CHECKS_FILE).read_text())
    meta = json.loads((out / "config.json").read_text())
    assert set(checks) == {"bf16", "int8"} and meta["precision"]["default"] == "auto"
    for p, c in checks.items():
        au = c["auroc"]
        assert au["split"] == "test" and au["records"] >= 3 and au["patients"] >= 3
        assert au["ci"][0] <= au["diff"] <= au["ci"][1]
        told = au["drop"] > BOUNDS.max_auroc_drop and au["ci"][1] < 0       # a drop the split can tell
        assert c["accepted"] == (not told and c["probability"]["max"] <= BOUNDS.max_probability_diff
                                 and c["embedding"]["max"] <= BOUNDS.max_embedding_diff)
        assert c["checked_on"].startswith(f"{corpus} test split")
    card = (out / "README.md").read_text()
    assert "## Inference precision" in card
    assert f"| bf16 | {'accepted' if checks['bf16']['accepted'] else 'refused'}" in card
    # the export's recorded check stands for the first-pass one, and is what predict applies
    loaded = load_model(out)
    r = run_inference(loaded, raw_items, precision="bf16")
    assert r.precision == "bf16"


def test_export_without_a_corpus_states_it_is_unchecked(tmp_path, bf16_units):
    from coreecg.hub import export_model

    models = tiny_models(tmp_path)
    out = export_model(models["encoder"], tmp_path / "exp", precision="auto")
    meta = json.loads((out / "config.json").read_text())
    assert meta["precision"]["checks"] == {} and "no corpus" in meta["precision"]["not_checked"]["bf16"]
    assert not (out / CHECKS_FILE).exists()
    assert "not checked here: no corpus" in (out / "README.md").read_text()


def test_predict_job_precision_flag_refuses_bf16_without_units_and_writes_the_path(runs, ptbxl_refs, tmp_path,
                                                                                  capsys):
    files = [r.path + ".hea" for r in ptbxl_refs[:3]]
    assert _job().main(["--model", str(runs["encoder"]), "--input", *files, "--output", str(tmp_path / "a"),
                        "--precision", "bf16"]) == 2
    assert "no bf16 matrix units" in capsys.readouterr().err
    assert _job().main(["--model", str(runs["encoder"]), "--input", *files, "--output", str(tmp_path / "b"),
                        "--precision", "int8", "--threads", "1"]) == 0
    import pyarrow.parquet as pq

    meta = json.loads(pq.read_schema(tmp_path / "b" / "embeddings.parquet").metadata[b"coreecg"])
    assert meta["precision"] == "int8"
    assert "(int8: asked for)" in capsys.readouterr().out


def test_a_path_whose_ops_fail_is_refused_with_the_error_and_auto_goes_on_in_fp32(runs, raw_items, bf16_units,
                                                                                   monkeypatch):
    import coreecg.inference.engine as engine

    class NoKernel(torch.nn.Module):          # a family with an op that has no bf16 kernel (complex S4 kernels)
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def features(self, x):
            raise RuntimeError('"fft_r2c" not implemented for \'BFloat16\'')

    monkeypatch.setattr(engine, "prepare_model", lambda m, *a, **k: (NoKernel(m), "fp32"))
    loaded = load_model(runs["ft12"])
    with pytest.raises(InferenceError, match="precision bf16 refused .* RuntimeError: \"fft_r2c\" not implemented"):
        run_inference(loaded, raw_items, precision="bf16")
    auto = run_inference(loaded, raw_items, precision="auto")
    assert auto.precision == "fp32" and "fft_r2c" in auto.precision_reason
    monkeypatch.undo()
    assert np.array_equal(auto.probs, run_inference(loaded, raw_items, precision="fp32").probs)


def test_int8_takes_a_model_with_a_weight_normed_convolution():
    """HuBERT-ECG's weight-normed (parametrized) convolution: its FLOPs are counted and it is copied
    and quantised (under FlopCounterMode in inference mode, torch 2.13 cannot read its weight)."""
    from torch.nn.utils.parametrizations import weight_norm

    from coreecg.inference.precision import linear_share, prepare_model

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = weight_norm(torch.nn.Conv1d(12, 64, 3))
            self.up, self.down = torch.nn.Linear(64, 4096), torch.nn.Linear(4096, 64)

        def features(self, x):
            return self.down(self.up(self.conv(x).mean(-1)))

    torch.manual_seed(0)
    net, x = Net().eval(), torch.randn(4, 12, 100)
    assert 0.5 < linear_share(net, x[:1]) < 1
    q, _ = prepare_model(net, "int8", CPU, x[:1])
    with torch.inference_mode():
        ref, got = net.features(x), q.features(x)
    assert 0 < (got - ref).abs().max() < 0.05 * ref.abs().max()
    assert isinstance(net.up, torch.nn.Linear) and not isinstance(q.up, torch.nn.Linear)   # a copy was quantised


# ---------------------------------------------------------------------------- the compiled feature pass


def _compile(loaded, mode: bool | str = True, min_records: int = 2000):
    """`loaded` with inference.compile=mode (a copy: the fixture's model stays as it is)."""
    return dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, inference=dataclasses.replace(
        loaded.config.inference, compile=mode, compile_min_windows=min_records)))


def test_compile_is_chosen_for_long_cpu_runs_only_and_never_for_int8():
    from coreecg.config import ConfigError
    from coreecg.inference.compiled import COMPILED, EAGER, MEASURED, compile_choice, keep_compiled

    auto = load_config().inference
    assert auto.compile == "auto"
    mode, why = compile_choice(auto, CPU, "bf16", 2000)
    assert mode == MEASURED and why.startswith("2000 windows (inference.compile=auto, at least 2000)")
    mode, why = compile_choice(auto, CPU, "bf16", 1999)
    assert mode == EAGER and "under inference.compile_min_windows=2000" in why
    assert compile_choice(auto, torch.device("cuda"), "bf16", 10 ** 6)[0] == EAGER
    always, never = (dataclasses.replace(auto, compile=m) for m in (True, False))
    assert compile_choice(always, CPU, "fp32", 1)[0] == COMPILED
    assert compile_choice(never, CPU, "fp32", 10 ** 6)[0] == EAGER
    assert compile_choice(always, CPU, "int8", 10 ** 6) == (EAGER, "eager: the int8 path (dynamic quantisation) "
                                                                   "is not compiled")
    assert keep_compiled([0.5, 0.3, 0.9], [0.4, 0.35]) and not keep_compiled([0.5, 0.4], [0.4, 0.6])
    with pytest.raises(ConfigError, match="compile_min_windows=0 must be >= 1"):
        load_config(overrides=["inference.compile_min_windows=0"])
    with pytest.raises(ConfigError, match="compile"):
        load_config(overrides=["inference.compile=sometimes"])


def test_a_compiled_pass_scores_as_the_eager_one_whatever_shares_its_batch(runs, raw_items):
    loaded = load_model(runs["ft12"])
    eager = run_inference(loaded, raw_items, precision="fp32", embeddings=True)
    assert not eager.compiled and "under inference.compile_min_windows" in eager.compile_reason
    compiled = _compile(loaded)
    together = run_inference(compiled, raw_items, precision="fp32", embeddings=True)
    assert together.compiled and "checked against eager on the first pass" in together.compile_reason
    rel = np.linalg.norm(together.embeddings - eager.embeddings, axis=1) / np.linalg.norm(eager.embeddings, axis=1)
    assert rel.max() <= 1e-4, rel.max()                    # the same float32 sums, fused and reordered
    assert np.abs(together.probs - eager.probs).max() <= 1e-5
    alone = run_inference(compiled, raw_items[5:6], precision="fp32")   # the graph is reused: one shape
    assert alone.compiled and np.array_equal(alone.probs[0], together.probs[5])


def test_a_compiler_failure_or_a_compiled_pass_over_the_bounds_leaves_the_run_eager(runs, raw_items, monkeypatch):
    import coreecg.inference.engine as engine

    loaded = load_model(runs["ft12"])
    eager = run_inference(loaded, raw_items, precision="fp32")

    class Broken(torch.nn.Module):
        def __init__(self, model):
            raise RuntimeError("inductor: no C++ compiler")

    class Off(torch.nn.Module):                            # a compiled graph whose outputs are wrong
        def __init__(self, model):
            super().__init__()
            self.inner, self.encoder, self.head, self.probabilities = model, model.encoder, model.head, \
                model.probabilities

        def features(self, x):
            return self.inner.features(x) + 1.0

    for wrapper, why in ((Broken, "eager instead: the compiler failed (RuntimeError: inductor: no C++ compiler)"),
                         (Off, "eager instead: compiled outputs against eager fp32: embeddings differ")):
        monkeypatch.setattr(engine, "CompiledFeatures", wrapper)
        got = run_inference(_compile(load_model(runs["ft12"])), raw_items, precision="fp32")
        assert not got.compiled and why in got.compile_reason, got.compile_reason
        assert np.array_equal(got.probs, eager.probs)      # every record scored, eagerly


def _plain_wrapper(built: list, delay_s: float = 0.0):
    """The engine's wrapper without the compiler (the same numbers as eager), `delay_s` slower a pass."""
    import time

    class Plain(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            built.append(model)
            self.inner, self.encoder, self.head, self.probabilities = model, model.encoder, model.head, \
                model.probabilities

        def features(self, x):
            time.sleep(delay_s)
            return self.inner.features(x)

    return Plain


def test_auto_compiles_from_compile_min_windows_and_keeps_the_faster_pass(runs, raw_items, corpus, monkeypatch):
    import pyarrow.parquet as pq

    import coreecg.inference.engine as engine
    from coreecg.inference import list_corpus
    from coreecg.inference.compiled import windows_ahead

    shards = list_corpus(corpus)                     # a shard counts its stored windows, a file one
    stored = sum(pq.read_table(s.path, columns=["record_id"]).num_rows for s in shards)
    assert windows_ahead(shards) == stored > len(shards) and windows_ahead(raw_items) == len(raw_items)

    built: list = []
    monkeypatch.setattr(engine, "CompiledFeatures", _plain_wrapper(built))
    loaded = _compile(load_model(runs["ft12"]), "auto", min_records=len(raw_items))
    assert not run_inference(loaded, raw_items[:-1], precision="fp32").compiled and not built
    got = run_inference(loaded, raw_items, precision="fp32")        # 2 passes: the trial has not ended
    assert got.compiled and len(built) == 1 and got.compile_reason.startswith(f"{len(raw_items)} windows")
    assert "the run ended before the trial did: compiled" in got.compile_reason
    int8 = run_inference(_compile(load_model(runs["ft12"]), "auto", 1), raw_items, precision="int8")
    assert not int8.compiled and "int8" in int8.compile_reason and len(built) == 1

    # a compiled pass slower than the eager one: timed 3 passes each, then eager for the rest
    monkeypatch.setattr(engine, "CompiledFeatures", _plain_wrapper(built, delay_s=0.3))
    eager = run_inference(_compile(load_model(runs["ft12"]), False), raw_items, precision="fp32", batch_size=1)
    slow = run_inference(_compile(load_model(runs["ft12"]), "auto", 1), raw_items, precision="fp32", batch_size=1)
    assert not slow.compiled and "kept eager: a pass took" in slow.compile_reason, slow.compile_reason
    assert np.array_equal(slow.probs, eager.probs)
