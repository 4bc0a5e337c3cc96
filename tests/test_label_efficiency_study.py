"""The label-efficiency studies (issue: does pretraining help?): their grid plans checked without
training, and the tiny study's pretraining data built from real shared records without any record
of the downstream val/test splits."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from coreecg.config import load_config
from coreecg.study.spec import StudyError, load_study
from coreecg.tune.spaces import RANDOM, SCRATCH

REPO = Path(__file__).resolve().parents[1]
ROWS = {("Random init", "linear"), ("Supervised", "scratch"), ("CoRe-ECG", "linear"), ("CoRe-ECG", "finetune"),
        ("ST-MEM-like", "linear"), ("ST-MEM-like", "finetune")}


@pytest.fixture(scope="module")
def tiny():
    return load_study(REPO / "studies" / "label_efficiency_tiny.yaml")


@pytest.fixture(scope="module")
def full(ecg_data):
    stand_ins = {"MIMIC_IV_ECG": "mimic-iv-ecg-layout", "CODE15": "cinc2021", "CINC2021": "cinc2021",
                 "PTBXL": "ptbxl", "CPSC2018": "cpsc2018-cinc2020"}     # folders that exist: the plan reads none
    with pytest.MonkeyPatch.context() as mp:
        for var, folder in stand_ins.items():
            mp.setenv(var, str(ecg_data / folder))
        return load_study(REPO / "studies" / "label_efficiency.yaml")


def _cells(study) -> Counter:
    """(method, mode, corpus, fraction) -> seeds."""
    return Counter((r.method, r.mode, r.corpus, r.fraction) for r in study.finetune_runs())


def _plan_holds(study, corpora: set[str], fractions: set[float], min_seeds: int, min_pretrain_seeds: int) -> None:
    assert study.variants["Random init"] == RANDOM and study.variants["Supervised"] == SCRATCH
    assert {(r.method, r.mode) for r in study.finetune_runs()} == ROWS          # the four rows, both modes
    assert set(study.pretrain_methods) == {"CoRe-ECG", "ST-MEM-like"}
    assert len(study.pretrain_seeds) >= min_pretrain_seeds
    cells = _cells(study)
    assert {c[2] for c in cells} == corpora and {c[3] for c in cells} == fractions
    assert len(cells) == len(ROWS) * len(corpora) * len(fractions)              # every row in every cell
    assert min(cells.values()) >= min_seeds
    # each pretrained encoder's seed is a pretraining this study runs (never the synthetic default)
    for r in study.finetune_runs():
        if r.method in study.pretrain_methods:
            assert r.encoder.variant == r.method and r.encoder.seed in study.pretrain_seeds
    assert "label_efficiency" in study.tables


def test_the_tiny_plan_has_the_four_rows_three_fractions_and_three_seeds(tiny, ecg_data):
    _plan_holds(tiny, {"ptbxl"}, {1.0, 0.1, 0.05}, 3, 3)
    ptbxl = load_config(tiny.config_file, [*tiny.base, *tiny.corpora[0].set, *tiny.extra])
    assert ptbxl.data.sources.ptbxl.label_view == "multi"
    # pretraining: real shared recordings, a mixture of four, each leaving out PTB-XL's val and test
    assert [c.source for c in tiny.pretrain_corpora] == ["mimic-iv-ecg", "cinc2021", "cinc2021", "cpsc2018"]
    for c in tiny.pretrain_corpora:
        assert Path(c.input).is_relative_to(ecg_data.resolve()) and Path(c.input).is_dir()
        assert c.exclude == ("ptbxl",)
    built = {c.name: Path("/built") / c.name for c in tiny.pretrain_corpora}
    for run in tiny.pretrain_runs():
        data = load_config(tiny.config_file, tiny.pretrain_overrides(run, built)).data
        assert data.corpora == tuple(str(p) for p in built.values())             # the mixture, not synthetic


def test_the_full_plan_is_the_issue_grid(full):
    _plan_holds(full, {"ptbxl-super", "ptbxl-all", "icbeb2018", "ptbxl-age"}, {1.0, 0.1, 0.01}, 5, 3)
    sets = {c.name: load_config(full.config_file, [*full.base, *c.set, *full.extra]).data for c in full.corpora}
    assert all(sets[n].sources.ptbxl.split == "folds" for n in ("ptbxl-super", "ptbxl-all"))
    assert sets["ptbxl-super"].sources.ptbxl.task == "superdiagnostic" and sets["ptbxl-all"].sources.ptbxl.task == "all"
    assert [c.source for c in full.corpora if c.name == "icbeb2018"] == ["cpsc2018"]
    assert [c.source for c in full.pretrain_corpora] == ["mimic-iv-ecg", "code15", "cinc2021"]
    assert all(set(c.exclude) == {"ptbxl-super", "ptbxl-all", "icbeb2018", "ptbxl-age"} for c in full.pretrain_corpora)
    # the age curve: PTB-XL age on the same official folds, in its own table beside the label curves
    assert sets["ptbxl-age"].sources.ptbxl.task == "age" and sets["ptbxl-age"].sources.ptbxl.split == "folds"
    assert "regression_label_efficiency" in full.tables


def _with(tmp_path: Path, ecg_data: Path, **pretrain) -> Path:
    data = yaml.safe_load((REPO / "studies" / "label_efficiency_tiny.yaml").read_text())
    data["config"] = str(REPO / "configs" / "quickstart.yaml")
    data["variants"] = str(REPO / "tune_spaces" / "ablations.yaml")
    data["pretrain"]["corpora"] = {"mimic": {"source": "mimic-iv-ecg", "input": str(ecg_data / "mimic-iv-ecg-layout")}}
    data["downstream"]["corpora"]["ptbxl"]["input"] = str(ecg_data / "ptbxl")
    data["pretrain"].update(pretrain)
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("pretrain, message", [
    ({"corpora": {"ptbxl": {"source": "ptbxl", "input": "."}}}, "also a downstream corpus"),
    ({"corpora": {"m": {"source": "mimic-iv-ecg", "input": ".", "exclude": ["cpsc"]}}}, r"unknown corpus \['cpsc'\]"),
    ({"corpora": {"m": {"path": "/somewhere", "exclude": ["ptbxl"]}}}, "is used as built"),
    ({"set": ["data.corpus=corpora/x"]}, "drop data.corpus"),
])
def test_a_bad_pretraining_corpus_entry_is_named(tmp_path, ecg_data, pretrain, message):
    for entry in pretrain.get("corpora", {}).values():
        if entry.get("input") == ".":
            entry["input"] = str(ecg_data / "mimic-iv-ecg-layout")
    path = _with(tmp_path, ecg_data, **pretrain)
    with pytest.raises(StudyError, match=message) as err:
        load_study(path)
    assert str(path) in str(err.value) and "pretrain.corpora" in str(err.value)


@pytest.mark.slow
def test_the_tiny_pretraining_data_holds_no_downstream_val_or_test_record(ray_session, tiny, tmp_path):
    """Built as the study builds it (no training): the guard finds nothing, and the exclusion had
    work to do (the MIMIC layout's copies of PTB-XL's val and test records are gone)."""
    from coreecg.data.corpus import load_manifest
    from coreecg.study.runner import build_corpora, check_leakage
    from coreecg.train.leakage_guard import Pretraining, check_overlap

    corpora = build_corpora(tiny, tmp_path)
    check_leakage(tiny, corpora)                  # every (pretraining, downstream) pair of the plan
    for c in tiny.pretrain_corpora:
        record, overlap = check_overlap(Pretraining(str(corpora[c.name])), corpora["ptbxl"], allow=False)
        assert overlap is None and record["checked"]
    for name in ("mimic-iv-ecg", "cinc2021-smoke"):    # both hold copies of PTB-XL records
        assert load_manifest(corpora[name])["excluded_overlap_with"]["records_removed"] > 0


def test_mixture_weights_are_checked_against_the_pretraining_corpora(tmp_path, ecg_data):
    """The run configs are built with the planned corpora: weights for each of them pass, a list of
    another length is named before Ray."""
    corpora = {"mimic": {"source": "mimic-iv-ecg", "input": str(ecg_data / "mimic-iv-ecg-layout")},
               "cinc": {"source": "cinc2021", "input": str(ecg_data / "cinc2021")}}
    study = load_study(_with(tmp_path, ecg_data, corpora=corpora,
                             set=["optim.epochs=1", "data.corpus_weights=[0.7,0.3]"]))
    built = study.planned_pretrain_corpora()
    overrides = study.pretrain_overrides(study.pretrain_runs()[0], built)
    assert load_config(study.config_file, overrides).data.corpus_weights == (0.7, 0.3)
    with pytest.raises(StudyError, match="corpus_weights"):
        load_study(_with(tmp_path, ecg_data, corpora=corpora, set=["data.corpus_weights=[1.0]"]))
