"""Tasks as registered modules (coreecg.data.tasks): regression and binary targets from a source's metadata,
their corpora on the shared PTB-XL records, the regression metrics and an age fine-tuning end to end."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import mean_absolute_error, r2_score

from coreecg.config import load_config
from coreecg.data.record import Record, RecordError
from coreecg.data.reading import read_split
from coreecg.data.sources import get_source
from coreecg.eval.regression import regression_bootstrap_ci, regression_metrics, resample_regression
from coreecg.model.classifier import Classifier
from coreecg.data.tasks import TaskSource, register_task, task_spec
from tests.helpers import TINY


def _record(**meta) -> Record:
    return Record("ptbxl", "1", np.zeros((12, 5000), np.float32), 500.0, ("I",) * 12, "p1", (), "/x/1", meta)


def test_a_target_is_read_checked_and_never_imputed():
    age = task_spec("age")
    assert age.apply(_record(age=63.0)).meta["target"] == 63.0
    assert age.apply(_record(age=63.0)).labels == ("age",)
    with pytest.raises(RecordError, match=r"missing target: no age"):
        age.apply(_record(age=None))
    with pytest.raises(RecordError, match=r"missing target: no age"):
        age.apply(_record(age=float("nan")))
    # PTB-XL's 300 (every patient over 89) and a negative weight are quarantined, not clipped
    with pytest.raises(RecordError, match=r"implausible age: 300 years outside \[0, 120\]"):
        age.apply(_record(age=300))
    with pytest.raises(RecordError, match=r"implausible weight: -4 kg"):
        task_spec("weight").apply(_record(weight=-4.0))
    sex = task_spec("sex")
    assert sex.apply(_record(sex=0)).labels == ("male",) and sex.apply(_record(sex=1)).labels == ("female",)
    assert sex.apply(_record(sex="Female")).labels == ("female",)
    assert sex.apply(_record(is_male=True)).labels == ("male",)       # CODE-15%'s column
    with pytest.raises(RecordError, match="missing target"):
        sex.apply(_record(sex="Unknown"))


def test_registering_a_task_checks_its_definition():
    with pytest.raises(ValueError, match="kind"):
        register_task("bad_kind", kind="ordinal", meta_keys=("x",))
    with pytest.raises(ValueError, match="two classes"):
        register_task("bad_binary", kind="binary", meta_keys=("x",), classes=("a",))
    with pytest.raises(ValueError, match="where its targets come from"):
        register_task("bad_source", kind="regression")
    with pytest.raises(ValueError, match="already registered"):
        register_task("age", kind="regression", meta_keys=("age",), unit="months")
    with pytest.raises(ValueError, match="unknown task 'agee'"):
        get_source("cinc2021", task="agee")
    with pytest.raises(ValueError, match="task must be one of"):
        load_config(overrides=["data.sources.ptbxl.task=agee"])


def test_a_task_source_is_the_readers_label_free_view_with_the_tasks_classes():
    source = get_source("ptbxl", task="age")
    assert isinstance(source, TaskSource) and source.label_view == "none"
    assert source.class_names == ("age",) and source.multilabel is False
    sex = get_source("ptbxl", **load_config(overrides=["data.sources.ptbxl.task=sex"]).data.sources.for_source(
        "ptbxl", 0))
    assert sex.class_names == ("female", "male")
    assert not isinstance(get_source("ptbxl"), TaskSource)        # the statement tasks stay the reader's own


@pytest.fixture(scope="module")
def task_corpora(ray_session, ecg_data, ptbxl_age_corpus, tmp_path_factory):
    """{"age": the session's age corpus, "sex": a sex corpus} of the shared PTB-XL records, as
    (root, manifests): root / task is each corpus's folder."""
    from coreecg.data.pipeline import build_corpus

    root = tmp_path_factory.mktemp("task-corpora")
    (root / "age").symlink_to(ptbxl_age_corpus[0], target_is_directory=True)
    data = load_config(overrides=["data.shard_records=64"]).data
    sex = build_corpus("ptbxl", ecg_data / "ptbxl", root / "sex", data, source_options={"task": "sex"},
                       log_warnings=False)
    return root, {"age": ptbxl_age_corpus[1], "sex": sex}


def test_an_age_corpus_holds_each_records_stated_age_and_counts_the_missing(task_corpora, ecg_data):
    root, manifests = task_corpora
    db = pd.read_csv(ecg_data / "ptbxl" / "ptbxl_database.csv").set_index("ecg_id")
    m = manifests["age"]
    assert m["class_names"] == ["age"] and m["multilabel"] is False and m["dataset_key"] == "ptbxl-age"
    assert m["task"]["name"] == "age" and m["task"]["unit"] == "years" and m["task"]["kind"] == "regression"
    stated = db["age"].notna()
    assert m["task"]["missing_targets"] == int((~stated).sum()) > 0
    assert m["counts"]["records_written"] == int(stated.sum())
    with open(root / "age" / "quarantine.csv") as f:
        missing = {r["record_id"] for r in csv.DictReader(f) if r["reason"].startswith("missing target: no age")}
    assert missing == {str(i) for i in db.index[~stated]}
    seen = {}
    for split in ("train", "val", "test"):
        d = read_split(root / "age", split, ["record_id", "labels", "target"])
        assert d["target"].dtype == np.float32 and (d["multihot"] == 1).all()
        seen.update(zip(d["record_id"], d["target"]))
        stats = m["task"]["targets"][split]
        ages = np.array([db.loc[int(r), "age"] for r in set(d["record_id"])])
        assert stats["n"] == len(ages) and stats["mean"] == pytest.approx(ages.mean())
        assert stats["sd"] == pytest.approx(ages.std(ddof=1))
    assert {int(r): float(v) for r, v in seen.items()} == {int(i): float(a) for i, a in db["age"][stated].items()}


def test_a_sex_corpus_is_a_two_class_task_of_the_databases_sex(task_corpora, ecg_data):
    root, manifests = task_corpora
    db = pd.read_csv(ecg_data / "ptbxl" / "ptbxl_database.csv").set_index("ecg_id")
    m = manifests["sex"]
    assert m["class_names"] == ["female", "male"] and m["task"]["kind"] == "binary"
    for split in ("train", "val", "test"):
        d = read_split(root / "sex", split, ["record_id", "labels"])
        want = np.array([1 if db.loc[int(r), "sex"] == 0 else 0 for r in d["record_id"]])   # PTB-XL: 0 = male
        assert (d["label"] == want).all()
    assert sum(m["counts"]["classes"][s]["male"] for s in ("train", "val", "test")) == int((db["sex"] == 0).sum())


def test_regression_metrics_and_their_bootstrap_are_what_the_definitions_give():
    rng = np.random.default_rng(0)
    y = rng.normal(50, 15, 40)
    pred = y + rng.normal(0, 5, 40)
    m = regression_metrics(y, pred, sd=15.0, unit="years", patient_ids=np.arange(40) // 2)
    assert m["mae"] == pytest.approx(mean_absolute_error(y, pred)) and m["mae_sd"] == pytest.approx(m["mae"] / 15)
    assert m["r2"] == pytest.approx(r2_score(y, pred)) and m["pearson_r"] == pytest.approx(np.corrcoef(y, pred)[0, 1])
    assert m["rmse"] == pytest.approx(np.sqrt(np.mean((y - pred) ** 2))) and m["patients"] == 20
    # a weighted copy's metrics are those of the materialised copy
    w = rng.integers(0, 3, size=(3, 40)).astype(float)
    fast = resample_regression(y, pred, 15.0, w)
    for b in range(3):
        rows = np.repeat(np.arange(40), w[b].astype(int))
        ref = regression_metrics(y[rows], pred[rows], 15.0)
        for key in ("mae", "rmse", "r2", "pearson_r"):
            assert fast[key][b] == pytest.approx(ref[key]), key
    ci = regression_bootstrap_ci(y, pred, np.arange(40) // 2, 15.0, n_resamples=300, seed=1)
    assert ci["mae"]["low"] < m["mae"] < ci["mae"]["high"]
    assert ci == regression_bootstrap_ci(y, pred, np.arange(40) // 2, 15.0, n_resamples=300, seed=1)


def test_a_regression_head_standardises_its_target_and_reports_it_in_its_unit():
    from coreecg.encoders.build import build_encoder

    cfg = load_config(overrides=TINY)
    model = Classifier(build_encoder(cfg), 1, cfg.finetune.leads, False, regression=True)
    model.set_scaler([50.0], [20.0])
    logits = torch.tensor([[0.0], [1.0]])
    assert torch.allclose(model.probabilities(logits), torch.tensor([[50.0], [70.0]]))
    assert model.loss(torch.tensor([[1.0]]), torch.tensor([[70.0]])).item() == pytest.approx(0.0)
    assert {"target_mean", "target_std"} <= set(model.state_dict())
    labels = Classifier(build_encoder(cfg), 5, cfg.finetune.leads, False)
    assert not any(k.startswith("target_") for k in labels.state_dict())     # label checkpoints keep their keys
    with pytest.raises(ValueError, match="constant target"):
        model.set_scaler([50.0], [0.0])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["linear", "finetune"])
def test_age_regression_end_to_end_with_its_scaler_saved_and_its_mae_recomputable(task_corpora, tmp_path, mode):
    from coreecg.eval.downstream import load_split, predict
    from coreecg.loading import load_finetuned
    from coreecg.train.fit import fit, plan_run

    root, _ = task_corpora
    extra = [f"finetune.mode={mode}", "finetune.encoder=random"]
    cfg = load_config(overrides=[*TINY, f"data.corpus={root / 'age'}", "finetune.batch_size=16", "finetune.lr=1e-3",
                                 "finetune.bootstrap_resamples=100", "train.num_workers=1", "finetune.epochs=2",
                                 "train.checkpoint_every_steps=0", f"train.storage_path={tmp_path}",
                                 f"train.name=age-{mode}", *extra])
    run = fit(plan_run(cfg, "finetune"))
    m = run.metrics
    assert m["task"]["name"] == "age" and m["selection"]["metric"].startswith("validation MAE")
    scaler = m["target_scaler"]
    train = read_split(root / "age", "train", ["record_id", "target"])
    ages = np.array(list(dict(zip(train["record_id"], train["target"].astype(float))).values()))
    assert scaler["mean"] == pytest.approx(ages.mean()) and scaler["sd"] == pytest.approx(ages.std(ddof=1))
    table = pd.read_csv(run.run_dir / "predictions.csv", dtype={"record_id": str})
    assert list(table.columns) == ["record_id", "patient_id", "target", "prediction"]
    assert m["test"]["mae"] == pytest.approx(mean_absolute_error(table["target"], table["prediction"]), rel=1e-6)
    assert m["test"]["mae_sd"] == pytest.approx(m["test"]["mae"] / scaler["sd"])
    assert m["test"]["ci"]["mae"]["low"] <= m["test"]["mae"] <= m["test"]["ci"]["mae"]["high"]
    assert "auroc" not in m["test"]
    # the scaler travels in best.pt: a fresh load predicts the saved values in years
    tuned = load_finetuned(run.run_dir)
    assert tuned.config.finetune.task == "age" and tuned.model.regression
    assert tuned.model.target_mean.item() == pytest.approx(scaler["mean"])
    test = load_split(root / "age", "test")
    probs, _ = predict(tuned.model, test.signal, list(range(12)), cfg.data.crop_samples, cfg.finetune.eval_crops,
                       torch.device("cpu"))
    by_record = pd.DataFrame({"r": test.record_id, "p": probs[:, 0]}).groupby("r", sort=False)["p"].mean()
    assert np.allclose(by_record.loc[table["record_id"]].to_numpy(), table["prediction"], atol=1e-4)
    epochs = [json.loads(x) for x in (run.run_dir / "metrics.jsonl").read_text().splitlines() if '"kind": "epoch"' in x]
    assert all("val_mae" in e for e in epochs)
    if mode == "linear":      # the scaler through an export and a fresh-process predict, in years
        _export_and_predict(run.run_dir, root / "age", table, tmp_path)


def _export_and_predict(run_dir, corpus, table, tmp_path):
    repo = Path(__file__).resolve().parents[1]
    export = subprocess.run([sys.executable, "jobs/export.py", "--model", str(run_dir), "--output",
                             str(tmp_path / "export"), "--precision", "fp32"],
                            cwd=repo, capture_output=True, text=True, timeout=300)
    assert export.returncode == 0, export.stderr[-2000:]
    out = tmp_path / "pred.csv"
    done = subprocess.run([sys.executable, "jobs/predict.py", "--model", str(tmp_path / "export"), "--corpus",
                           str(corpus), "--split", "test", "--output", str(out), "--precision", "fp32"],
                          cwd=repo, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    pred = pd.read_csv(out, dtype={"record_id": str}).set_index("record_id")
    assert "pred_age" in pred.columns
    assert np.allclose(pred.loc[table["record_id"], "pred_age"].to_numpy(), table["prediction"], atol=1e-4)


def test_a_labels_csv_column_is_a_regression_task_of_a_hospitals_exports(ray_session, ecg_data, tmp_path):
    """EDF exports of the shared PTB-XL records and a labels CSV with an LVEF column: task=column:lvef
    stores each file's value; an empty and a non-numeric cell are left out as missing, named."""
    import wfdb

    from coreecg.data.pipeline import build_corpus
    from tests.test_hospital_exports import write_edf

    raw = tmp_path / "exports"
    raw.mkdir()
    rows, want = ["record_id,lvef"], {}
    for i, hea in enumerate(sorted((ecg_data / "ptbxl").rglob("records500/*/*.hea"))[:12]):
        rec = wfdb.rdrecord(str(hea.with_suffix("")))
        write_edf(raw / f"e{i:02d}.edf", rec.p_signal.T, float(rec.fs), list(rec.sig_name))
        cell = "" if i == 3 else "n/a" if i == 7 else f"{40 + i * 1.5:g}"
        rows.append(f"e{i:02d}.edf,{cell}")
        if cell and cell != "n/a":
            want[f"e{i:02d}.edf"] = float(cell)
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    data = load_config(overrides=["data.split_ratios=[0.5,0.25,0.25]"]).data
    m = build_corpus("edf", raw, tmp_path / "lvef", data, log_warnings=False,
                     source_options={"labels": str(tmp_path / "labels.csv"), "task": "column:lvef"})
    assert m["task"]["name"] == "column:lvef" and m["task"]["kind"] == "regression" and m["class_names"] == ["lvef"]
    assert m["counts"]["records_written"] == 10 and m["task"]["missing_targets"] == 2
    with open(tmp_path / "lvef" / "quarantine.csv") as f:
        reasons = [r["reason"] for r in csv.DictReader(f)]
    assert sorted(reasons) == ["missing target: lvef 'n/a' is not a number",
                               "missing target: no lvef (column 'lvef' not stated)"]
    stored = []
    for split in ("train", "val", "test"):
        d = read_split(tmp_path / "lvef", split, ["target"])
        stored += list(d["target"])
    assert sorted(stored) == pytest.approx(sorted(want.values()))


PLUGIN = '''
from coreecg.data.tasks import register_task

register_task("age_months", kind="regression", unit="months", plausible=(0.0, 1500.0),
              target=lambda record: None if record.meta.get("age") is None else 12.0 * record.meta["age"],
              description="age in months: a plugin's own rule")
'''


@pytest.mark.slow
def test_a_plugin_task_in_one_file_builds_fine_tunes_and_predicts_in_a_fresh_process(ray_session, ecg_data,
                                                                                     tmp_path):
    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "age_months.py").write_text(PLUGIN)

    def job(name: str, *args: str) -> subprocess.CompletedProcess:
        done = subprocess.run([sys.executable, str(repo / "jobs" / f"{name}.py"), *args], cwd=tmp_path,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    plug = ["--set", "plugins=[age_months]"]
    job("preprocess", "--source", "ptbxl", "--input", str(ecg_data / "ptbxl"), "--output", "corpus", *plug,
        "--set", "data.sources.ptbxl.task=age_months")
    manifest = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    assert manifest["task"]["name"] == "age_months" and manifest["task"]["unit"] == "months"
    tiny = [x for o in TINY for x in ("--set", o)]
    job("finetune", "--encoder", "none", "--mode", "scratch", "--corpus", "corpus", "--output", "run", *plug, *tiny,
        "--set", "finetune.epochs=1", "--set", "finetune.batch_size=16", "--set", "train.num_workers=1",
        "--set", "finetune.bootstrap_resamples=50")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["task"]["name"] == "age_months" and metrics["target_scaler"]["unit"] == "months"
    # a fresh process: the run's config names the plugin, which registers the task and its head
    job("predict", "--model", "run", "--corpus", "corpus", "--split", "test", "--output", "pred.csv")
    pred = pd.read_csv(tmp_path / "pred.csv", dtype={"record_id": str}).set_index("record_id")
    table = pd.read_csv(tmp_path / "run" / "predictions.csv", dtype={"record_id": str})
    assert np.allclose(pred.loc[table["record_id"], "pred_age_months"].to_numpy(), table["prediction"], atol=1e-3)
    assert metrics["test"]["mae"] == pytest.approx(mean_absolute_error(table["target"], table["prediction"]),
                                                   rel=1e-6)


def test_cinc2021_headers_give_age_and_sex_as_their_lines_state(ecg_data):
    """Every shared CinC 2021 record through the task sources: the value of its header's # Age and
    # Sex lines, or a missing-target error where the header says nothing usable."""
    import re

    ages, sexes = get_source("cinc2021", task="age"), get_source("cinc2021", task="sex")
    refs = ages.list_records(ecg_data / "cinc2021")
    checked = 0
    for ref in refs:
        hea = Path(ref.path + ".hea")
        if not hea.is_file():
            continue
        text = hea.read_text()
        age = re.search(r"#\s*Age:\s*(\S+)", text)
        sex = re.search(r"#\s*Sex:\s*(\S+)", text)
        try:
            got = ages.read(ref).meta["target"]
            assert got == float(age.group(1))
        except RecordError as e:
            assert e.reason.startswith("missing target") and (age is None or not age.group(1)[0].isdigit())
        try:
            assert sexes.read(ref).labels == (sex.group(1).lower(),)
        except RecordError as e:
            assert e.reason.startswith("missing target") and (sex is None or sex.group(1).lower() not in
                                                               ("male", "female"))
        checked += 1
    assert checked >= 40


@pytest.mark.slow
def test_a_plugin_task_runs_through_a_study_to_its_regression_table(ray_session, ecg_data, tmp_path):
    import yaml

    repo = Path(__file__).resolve().parents[1]
    (tmp_path / "age_months.py").write_text(PLUGIN)
    study = {
        "name": "age-months",
        "config": str(repo / "configs" / "quickstart.yaml"),
        "set": [*TINY, "plugins=[age_months]", "data.synthetic_records=64", "train.num_workers=1",
                "train.eval_every_epochs=0", "train.figures=false", "report.bootstrap_resamples=50"],
        "variants": str(repo / "tune_spaces" / "ablations.yaml"),
        "pretrain": {"methods": ["CoRe-ECG"], "seeds": [0],
                     "set": ["optim.epochs=1", "optim.batch_size=16", "optim.warmup_epochs=0"]},
        "downstream": {"corpora": {"ptbxl-age-months": {"source": "ptbxl", "input": str(ecg_data / "ptbxl"),
                                                        "set": ["data.sources.ptbxl.task=age_months"]}},
                       "methods": ["Supervised", "CoRe-ECG"], "leads": ["12"], "modes": ["finetune"],
                       "set": ["finetune.epochs=1", "finetune.batch_size=16", "finetune.bootstrap_resamples=50",
                               "finetune.tsne_max_points=0", "finetune.warmup_epochs=0"]},
        "report": {"tables": ["regression"], "figures": []},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(study, sort_keys=False))
    done = subprocess.run([sys.executable, str(repo / "jobs" / "study.py"), "study.yaml", "--output", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = sorted((tmp_path / "out").rglob("metrics.json"))
    tasks = {json.loads(m.read_text()).get("task", {}).get("name") for m in metrics}
    assert tasks == {"age_months"} and len(metrics) == 2
    table = next((tmp_path / "out").rglob("regression.csv"))
    text = table.read_text()
    assert "Supervised" in text and "CoRe-ECG" in text
