"""The encoder x objective studies (issue 55): their plans checked without training (load_study,
no Ray): every encoder with its own Supervised and Random-init rows, every grid fine-tuning the
encoder its rows were pretrained as, 3 seeds per cell, and the fairness check passing on the
declared encoder difference and refusing an undeclared one."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import yaml

from coreecg.config import load_config
from coreecg.eval.tables.benchmark import load_published
from coreecg.study.spec import StudyError, load_study, study_from_dict
from coreecg.tune.spaces import RANDOM, SCRATCH

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "studies" / "encoders_tiny.yaml"
VARIANTS = REPO / "tune_spaces" / "encoders.yaml"
ENCODERS = {"ViT": "coreecg", "xresnet1d": "xresnet1d", "S4": "s4"}


@pytest.fixture(scope="module")
def tiny():
    return load_study(TINY)


@pytest.fixture(scope="module")
def full(ecg_data):
    stand_ins = {"MIMIC_IV_ECG": "mimic-iv-ecg-layout", "CODE15": "cinc2021", "CINC2021": "cinc2021",
                 "PTBXL": "ptbxl"}     # folders that exist: the plan reads none
    with pytest.MonkeyPatch.context() as mp:
        for var, folder in stand_ins.items():
            mp.setenv(var, str(ecg_data / folder))
        return load_study(REPO / "studies" / "encoders.yaml")


def _arch(study, overrides) -> str:
    return load_config(study.config_file, list(overrides)).model.arch


def _plan_holds(study, objectives: dict[str, set[str]]) -> None:
    """Per encoder: its objectives pretrained with 3 seeds; Random init and each objective under the
    linear probe, Supervised and each objective fine-tuned, each cell with 3 seeds; every run of a
    row trained as its encoder (pretraining and fine-tuning configs alike)."""
    assert set(study.pretrain_methods) == {f"{e} {o}" for e, objs in objectives.items() for o in objs}
    assert len(study.pretrain_seeds) == 3
    rows = Counter((r.method, r.mode, r.corpus) for r in study.finetune_runs())
    assert set(rows.values()) == {3}                                   # 3 seeds in every cell
    for encoder, objs in objectives.items():
        assert study.variants[f"{encoder} Supervised"] == SCRATCH and study.variants[f"{encoder} Random init"] == RANDOM
        for corpus in (c.name for c in study.corpora):
            assert (f"{encoder} Random init", "linear", corpus) in rows and (f"{encoder} Supervised", "scratch",
                                                                             corpus) in rows
            assert all((f"{encoder} {o}", mode, corpus) in rows for o in objs for mode in ("linear", "finetune"))
    for run in study.pretrain_runs():
        assert _arch(study, study.pretrain_overrides(run)) == ENCODERS[run.variant.split(" ")[0]]
    for run in study.finetune_runs():
        assert _arch(study, study.finetune_overrides(run)) == ENCODERS[run.method.split(" ")[0]], run.name
        if run.method in study.pretrain_methods:          # seed s fine-tunes the encoder pretrained with seed s
            assert run.encoder.variant == run.method and run.encoder.seed == run.seed
    assert study.tables == ("encoder_objective",)
    published = load_published(study.published[0])
    assert {"ECG-CPC (S4, CPC)", "supervised S4 (S4, from scratch)"} <= set(published.rows)


def test_the_tiny_plan_is_the_full_grid_at_cpu_scale(tiny, ecg_data):
    objectives = {"MoCo V3", "CMSC", "CPC"}
    _plan_holds(tiny, {"ViT": objectives | {"CoRe-ECG"}, "xresnet1d": objectives, "S4": objectives})
    # pretraining: real shared recordings (never the synthetic corpus), without PTB-XL's val and test
    assert [c.source for c in tiny.pretrain_corpora] == ["mimic-iv-ecg", "cinc2021", "cinc2021", "cpsc2018"]
    assert all(Path(c.input).is_relative_to(ecg_data.resolve()) and c.exclude == ("ptbxl-super",)
               for c in tiny.pretrain_corpora)
    cfg = load_config(tiny.config_file, [*tiny.base, *tiny.extra])
    assert (cfg.encoders.xresnet1d.widths, cfg.encoders.s4.d_model, cfg.methods.cpc.steps) == ((16, 32), 16, 3)


def test_the_full_plan_is_the_issue_grid(full):
    objectives = {"MoCo V3", "CMSC", "CPC"}
    _plan_holds(full, {"ViT": objectives | {"CoRe-ECG"}, "xresnet1d": objectives, "S4": objectives})
    data = {c.name: load_config(full.config_file, [*full.base, *c.set, *full.extra]).data for c in full.corpora}
    assert set(data) == {"ptbxl-super", "ptbxl-all"}
    assert all(d.sources.ptbxl.split == "folds" and d.sources.ptbxl.label_view == "multi" for d in data.values())
    assert [c.source for c in full.pretrain_corpora] == ["mimic-iv-ecg", "code15", "cinc2021"]
    assert len(full.pretrain_runs()) == 30 and len(full.finetune_runs()) == 156      # the header's counts


def test_the_published_rows_are_the_benchmarks_numbers():
    """studies/published/encoders.yaml repeats ecg_fm_benchmark.yaml's rows under names that say
    their encoder and objective: the same numbers, the same declared shares."""
    mine = load_published(REPO / "studies" / "published" / "encoders.yaml")
    theirs = load_published(REPO / "studies" / "published" / "ecg_fm_benchmark.yaml")
    for row, name in (("ECG-CPC (S4, CPC)", "ECG-CPC"), ("supervised S4 (S4, from scratch)", "supervised S4"),
                      ("ST-MEM (ViT, masked reconstruction)", "ST-MEM")):
        assert mine.rows[row] == {d: theirs.rows[name][d] for d in mine.rows[row]}
    assert all(mine.shares[d] == theirs.shares[d] for d in mine.shares)
    assert (mine.source, mine.mode) == (theirs.source, theirs.mode)


def _with_variants(tmp_path: Path, edit) -> Path:
    """The tiny study reading a copy of its variants file changed by `edit(data)`."""
    variants = yaml.safe_load(VARIANTS.read_text())
    edit(variants)
    (tmp_path / "variants.yaml").write_text(yaml.safe_dump(variants, sort_keys=False))
    study = yaml.safe_load(TINY.read_text())
    study["variants"] = str(tmp_path / "variants.yaml")
    return study


def test_the_fairness_check_needs_the_encoder_declared(tmp_path):
    study = _with_variants(tmp_path, lambda v: v.pop("allow"))
    with pytest.raises(StudyError, match=r"(?s)table .encoder_objective.*model\.arch"):
        study_from_dict(study, TINY)


def test_the_fairness_check_refuses_an_undeclared_difference(tmp_path):
    def faster(variants):
        variants["variants"]["S4 CPC"] = [*variants["variants"]["S4 CPC"], "optim.lr=3.0e-3"]
    with pytest.raises(StudyError, match=r"(?s)S4 CPC differs from .* in optim\.lr"):
        study_from_dict(_with_variants(tmp_path, faster), TINY)
