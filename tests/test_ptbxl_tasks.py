"""PTB-XL as the field uses it: the benchmark's six tasks and the strat_fold split.

Every expectation is computed here, independently of the reader, straight from the shared
ptbxl_database.csv and scp_statements.csv with pandas (the benchmark's
compute_label_aggregations: every statement of scp_codes counts, whatever its likelihood).
"""
from __future__ import annotations

import ast
import csv

import numpy as np
import pandas as pd
import pytest

from coreecg.config import ConfigError, DataConfig, load_config
from coreecg.data import load_manifest, read_split
from coreecg.data.pipeline import build_corpus
from coreecg.data.record import RecordError
from coreecg.data.sources import get_source
from coreecg.data.splits import SPLITS
from coreecg.data.sources import dataset_key as dataset_name

TASKS = ("superdiagnostic", "subdiagnostic", "diagnostic", "form", "rhythm", "all")
SIZES = {"superdiagnostic": 5, "subdiagnostic": 23, "diagnostic": 44, "form": 19, "rhythm": 12, "all": 71}


@pytest.fixture(scope="module")
def expected(ecg_data) -> dict[str, dict[str, set[str]]]:
    """task -> ecg_id -> the record's label set, from the two csvs alone."""
    db = pd.read_csv(ecg_data / "ptbxl" / "ptbxl_database.csv")
    scp = pd.read_csv(ecg_data / "ptbxl" / "scp_statements.csv", index_col=0)
    codes = pd.DataFrame([(str(e), c) for e, s in zip(db.ecg_id, db.scp_codes) for c in ast.literal_eval(s)],
                         columns=["ecg_id", "code"]).join(scp, on="code")
    diag = codes[codes.diagnostic == 1]
    label = {"superdiagnostic": diag.diagnostic_class, "subdiagnostic": diag.diagnostic_subclass,
             "diagnostic": diag.code, "form": codes.code[codes.form == 1],
             "rhythm": codes.code[codes.rhythm == 1], "all": codes.code}
    out = {}
    for task, col in label.items():
        rows = codes.loc[col.index, ["ecg_id"]].assign(label=col).dropna()
        sets = rows.groupby("ecg_id")["label"].agg(set).to_dict()
        out[task] = {str(e): sets.get(str(e), set()) for e in db.ecg_id}
    return out


@pytest.mark.parametrize("task", TASKS)
def test_task_labels_equal_an_independent_computation(ecg_data, expected, task):
    refs = get_source("ptbxl", task=task).list_records(ecg_data / "ptbxl")
    multi, single = get_source("ptbxl", label_view="multi", task=task), get_source("ptbxl", task=task)
    assert len(multi.class_names) == SIZES[task] and multi.class_names == single.class_names
    seen = set()
    for ref in refs:
        want = expected[task][ref.record_id]
        seen |= want
        for src, usable in ((multi, len(want) >= 1), (single, len(want) == 1)):
            if usable:
                got = src.labels_for(ref)
                assert set(got) == want and list(got) == [c for c in src.class_names if c in want]
            else:
                with pytest.raises(RecordError):
                    src.labels_for(ref)
    assert seen <= set(multi.class_names)
    assert sum(bool(v) for v in expected[task].values()) > 0


def test_superdiagnostic_is_the_default_and_keeps_its_order(ecg_data):
    src = get_source("ptbxl")
    assert (src.task, src.split_rule, src.class_names) == ("superdiagnostic", "patients",
                                                          ("NORM", "MI", "STTC", "CD", "HYP"))
    assert list(get_source("ptbxl", task="form").class_names) == sorted(get_source("ptbxl", task="form").class_names)


def test_min_likelihood_applies_to_every_task(ecg_data):
    refs = {r.record_id: r for r in get_source("ptbxl", task="all", min_likelihood=50)
            .list_records(ecg_data / "ptbxl")}
    assert refs["8"].extra["task_labels"] == []            # IMI 35, ABQRS 0, SR 0
    assert refs["3"].extra["task_labels"] == ["NORM"]      # NORM 100, SR 0


def test_records_without_a_task_label_are_refused_by_name(ecg_data):
    ref = {r.record_id: r for r in get_source("ptbxl", task="rhythm").list_records(ecg_data / "ptbxl")}["8"]
    ref = type(ref)(ref.source, ref.record_id, ref.path, {**ref.extra, "task_labels": []})
    with pytest.raises(RecordError, match="no rhythm label"):
        get_source("ptbxl", task="rhythm", label_view="multi").read(ref)


def test_statements_other_than_ptbxl_s_are_an_error_naming_the_file(ecg_data, tmp_path):
    root = tmp_path / "ptbxl"
    root.mkdir()
    (root / "ptbxl_database.csv").write_text((ecg_data / "ptbxl" / "ptbxl_database.csv").read_text())
    scp = pd.read_csv(ecg_data / "ptbxl" / "scp_statements.csv", index_col=0)
    scp.loc["NORM", "diagnostic_subclass"] = "NORMAL"
    scp.to_csv(root / "scp_statements.csv")
    with pytest.raises(ValueError, match=r"scp_statements\.csv: the subdiagnostic statements .*NORMAL"):
        get_source("ptbxl", task="subdiagnostic").list_records(root)
    assert get_source("ptbxl", task="form").list_records(root)      # the other tasks are unaffected


def test_every_record_s_fold_split(ecg_data):
    db = pd.read_csv(ecg_data / "ptbxl" / "ptbxl_database.csv")
    want = {str(e): "train" if f <= 8 else ("val" if f == 9 else "test") for e, f in zip(db.ecg_id, db.strat_fold)}
    assert set(want.values()) == set(SPLITS)
    assert db.groupby("patient_id").strat_fold.nunique().max() == 1   # folds keep a patient together
    src = get_source("ptbxl", label_view="none", rate=100, split="folds")
    for ref in src.list_records(ecg_data / "ptbxl"):
        assert src.read(ref).meta["split"] == want[ref.record_id]
    hashed = get_source("ptbxl", label_view="none", rate=100)
    assert "split" not in hashed.read(hashed.list_records(ecg_data / "ptbxl")[0]).meta


def test_options_are_typed_config(ecg_data):
    s = load_config(overrides=["data.sources.ptbxl.task=rhythm", "data.sources.ptbxl.split=folds"]).data.sources
    src = get_source("ptbxl", **s.for_source("ptbxl", 0))
    assert (src.task, src.split_rule) == ("rhythm", "folds")
    for bad in ("data.sources.ptbxl.task=superclass", "data.sources.ptbxl.split=fold"):
        with pytest.raises(ConfigError, match=bad.split("=")[0].replace(".", r"\.")):
            load_config(overrides=[bad])
    with pytest.raises(ValueError, match="task must be one of"):
        get_source("ptbxl", task="superclass")


def test_a_fold_corpus_has_the_fold_splits_and_says_so(ecg_data, expected, tmp_path, ray_session):
    db = pd.read_csv(ecg_data / "ptbxl" / "ptbxl_database.csv")
    fold = dict(zip(db.ecg_id.astype(str), db.strat_fold))
    options = {**DataConfig().sources.for_source("ptbxl", 0), "label_view": "multi", "task": "rhythm",
               "split": "folds"}
    src = get_source("ptbxl", **options)
    refs = src.list_records(ecg_data / "ptbxl")
    # a few records of every split, and one without a rhythm label (quarantined, like the
    # benchmark's select_data drops it)
    picked = [r for f in (1, 8, 9, 10) for r in [x for x in refs if fold[x.record_id] == f][:3]]
    picked.append(next(r for r in refs if not expected["rhythm"][r.record_id]))
    out = tmp_path / "folds"
    build_corpus("ptbxl", ecg_data / "ptbxl", out, DataConfig(shard_records=4), source_options=options, refs=picked)
    m = load_manifest(out)
    assert m["split_rule"] == "folds" and m["source_options"]["split"] == "folds"
    assert m["class_names"] == list(src.class_names) and len(m["class_names"]) == 12
    assert dataset_name(m) == "ptbxl-rhythm-folds"      # the report's tables keep it apart
    stored = {}
    for split in SPLITS:
        part = read_split(out, split, columns=["record_id", "labels"])
        for rid, hot in zip(part["record_id"], part["multihot"]):
            stored[rid] = (split, {c for c, h in zip(m["class_names"], hot) if h})
    for rid, (split, labels) in stored.items():
        assert split == ("train" if fold[rid] <= 8 else "val" if fold[rid] == 9 else "test")
        assert labels == expected["rhythm"][rid]
    unlabelled = picked[-1].record_id
    assert set(stored) == {r.record_id for r in picked} - {unlabelled}
    assert {s for s, _ in stored.values()} == set(SPLITS)
    assert sum(m["counts"]["records"].values()) == len(stored)
    with open(out / "quarantine.csv") as f:
        reasons = {row["record_id"]: row["reason"] for row in csv.DictReader(f)}
    assert list(reasons) == [unlabelled] and reasons[unlabelled].startswith("no rhythm label")


def test_record_split_prefers_the_source_s_fixed_split():
    from coreecg.data.record import Record
    from coreecg.data.splits import assign_split, fold_split, record_split

    rec = Record("ptbxl", "8", np.zeros((12, 10), np.float32), 500, (), "11275", (), "x/00008_hr", {})
    assert record_split(rec, (0.8, 0.1, 0.1)) == assign_split("ptbxl", "11275", "8")
    rec.meta["split"] = "test"
    assert record_split(rec, (0.8, 0.1, 0.1)) == "test"
    rec.meta["split"] = "holdout"
    with pytest.raises(ValueError, match="x/00008_hr: the source fixed split 'holdout'"):
        record_split(rec, (0.8, 0.1, 0.1))
    assert [fold_split(f, "p") for f in (1, 8, 9, 10)] == ["train", "train", "val", "test"]
    with pytest.raises(RecordError, match="strat_fold 11 is not 1-10"):
        fold_split(11, "p")


def test_report_dataset_names_the_task_and_split():
    def name(split_rule=None, **options):
        return dataset_name({"source": "ptbxl", "source_options": options,
                             **({"split_rule": split_rule} if split_rule else {})})
    assert name() == name("patients", task="superdiagnostic", label_view="multi") == "ptbxl"   # the paper's
    assert (name("folds"), name(task="form"), name("folds", task="all")) == ("ptbxl-folds", "ptbxl-form",
                                                                             "ptbxl-all-folds")
