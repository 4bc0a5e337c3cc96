"""`finetune.encoder=random` ("Random init", the skeptic's rows): a seeded, randomly initialised
encoder of the configured architecture, in every downstream mode; the leakage guard sees no
pretraining; a study's `random` variant plans its runs with it and passes the fairness check."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from coreecg.config import load_config
from coreecg.study.spec import RandomEncoder, load_study
from coreecg.train.finetuning import RANDOM_LABEL, FinetuneError, plan_finetune, random_encoder
from coreecg.tune.spaces import RANDOM, load_space
from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[1]


def _weights(*overrides: str) -> dict[str, torch.Tensor]:
    return random_encoder(load_config(overrides=[*TINY, *overrides])).state_dict()


def test_random_encoder_is_seeded_shaped_and_leaves_other_draws_alone():
    a, b, other = _weights("train.seed=3"), _weights("train.seed=3"), _weights("train.seed=4")
    assert a.keys() == other.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)                        # same seed, same weights
    drawn = [k for k in a if a[k].is_floating_point() and a[k].std() > 0]
    assert drawn and all(not torch.equal(a[k], other[k]) for k in drawn)  # another seed, other weights
    enc = random_encoder(load_config(overrides=[*TINY, "encoders.coreecg.embed_dim=64", "encoders.coreecg.depth=3",
                                                "encoders.coreecg.num_heads=4"]))
    assert enc.dim == 64 and len(enc.transformer.blocks) == 3               # the configured architecture
    # independent of the global RNG, which it leaves as it found it
    torch.manual_seed(0)
    first = _weights("train.seed=3")
    after = torch.rand(3)
    torch.manual_seed(0)
    torch.rand(100)
    assert all(torch.equal(first[k], _weights("train.seed=3")[k]) for k in first)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(3), after)


def test_the_variants_file_has_the_random_row_outside_the_paper_tables():
    space = load_space(REPO / "tune_spaces" / "ablations.yaml")
    assert space.variants["Random init"] == RANDOM
    assert all("Random init" not in rows for rows in space.tables.values())


def _study(tmp_path: Path, ecg_data: Path) -> Path:
    data = {
        "name": "skeptic",
        "config": str(REPO / "configs" / "quickstart.yaml"),
        "set": [*TINY, "train.num_workers=1", f"data.cache_dir={tmp_path / 'cache'}"],
        "variants": str(REPO / "tune_spaces" / "ablations.yaml"),
        "pretrain": {"methods": ["CoRe-ECG"], "seeds": [0, 1], "set": ["optim.epochs=1"]},
        "downstream": {"corpora": {"ptbxl": {"source": "ptbxl", "input": str(ecg_data / "ptbxl")}},
                       "methods": ["Supervised", "Random init", "CoRe-ECG"], "modes": ["finetune", "linear", "frozen"],
                       "seeds": [0, 1], "set": ["finetune.epochs=1"]},
        "report": {"tables": ["comparison", "lead_reduction"]},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_study_plans_random_rows_in_every_mode_and_passes_the_fairness_check(tmp_path, ecg_data):
    from coreecg.eval.fairness import FINETUNING, Entry, check_table, finetune_cell

    study = load_study(_study(tmp_path, ecg_data))           # the fairness check runs here (StudyError)
    random_runs = [r for r in study.finetune_runs() if r.method == "Random init"]
    assert sorted((r.mode, r.seed) for r in random_runs) == sorted(
        (m, s) for m in ("finetune", "linear", "frozen") for s in (0, 1))
    assert all(isinstance(r.encoder, RandomEncoder) for r in random_runs)
    assert {r.mode for r in study.finetune_runs() if r.method == "Supervised"} == {"scratch"}
    assert all(r.encoder is None or r.encoder.name.startswith("random:") or r.method == "CoRe-ECG"
               for r in study.finetune_runs())
    for r in random_runs:
        cfg = load_config(study.config_file, study.finetune_overrides(r, [f"data.corpus={tmp_path}"]))
        assert cfg.finetune.encoder == "random" and cfg.finetune.method == "Random init"
        assert cfg.finetune.mode == r.mode
    rows = study.table_rows()       # checked for fairness by load_study: lead_reduction has it beside CoRe-ECG
    assert "Random init" in rows["lead_reduction"] and "Random init" not in rows["comparison"]   # the paper's rows
    # a pretrained row's runs next to the random row's, one cell: fair (model agrees, the encoder defines it)
    runs = [r for r in study.finetune_runs() if r.mode == "linear" and r.method in ("Random init", "CoRe-ECG")]
    entries = [Entry(r.method, FINETUNING, finetune_cell(r.corpus, r.mode, r.leads, r.fraction),
                     load_config(study.config_file, study.finetune_overrides(r)).to_dict()) for r in runs]
    assert check_table("comparison", entries) == []
    # a pretraining variant cannot name it
    bad = yaml.safe_load(_study(tmp_path, ecg_data).read_text())
    bad["pretrain"]["methods"] = ["Random init"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(Exception, match="has no pretraining"):
        load_study(tmp_path / "bad.yaml")


def test_run_entries_treat_a_random_run_as_having_no_pretraining(tmp_path):
    from types import SimpleNamespace

    from coreecg.eval.fairness import FINETUNING, run_entries

    (tmp_path / "config.yaml").write_text(yaml.safe_dump(load_config(overrides=["finetune.encoder=random"]).to_dict()))
    run = SimpleNamespace(path=str(tmp_path), method="Random init", dataset="ptbxl", mode="linear", leads="12",
                          train_fraction=1.0, record={"encoder": "random"})
    entries, notes = run_entries([run])[tmp_path]
    assert [e.phase for e in entries] == [FINETUNING] and notes == []


# ---------------------------------------------------------------------------- real records, Ray


@pytest.fixture(scope="module")
def ptbxl(ray_session, ecg_data, tmp_path_factory):
    from tests.helpers import build_ptbxl

    return build_ptbxl(tmp_path_factory.mktemp("rnd-corpus"), ecg_data)


def _cfg(tmp: Path, corpus, name: str, *extra: str):
    return load_config(overrides=[*TINY, f"data.corpus={corpus}", "finetune.encoder=random", "finetune.batch_size=16",
                                  "finetune.lr=1e-3", "finetune.epochs=1", "finetune.bootstrap_resamples=0",
                                  "finetune.tsne_max_points=0", "train.num_workers=1", "train.checkpoint_every_steps=0",
                                  f"train.storage_path={tmp}", f"train.name={name}", *extra])


@pytest.mark.slow
def test_a_random_init_run_is_labelled_and_has_no_pretraining(ptbxl, tmp_path):
    from coreecg.train.fit import fit, plan_run

    plan = plan_finetune(_cfg(tmp_path, ptbxl, "x", "finetune.mode=frozen"))
    assert plan.finetune.meta["method"] == RANDOM_LABEL and plan.finetune.meta["encoder"] == "random"
    assert plan.finetune.meta["leakage"]["checked"] is False
    assert "no pretraining" in plan.finetune.meta["leakage"]["reason"]
    assert plan.config.encoders.coreecg.embed_dim == 32                             # the config's architecture
    assert plan_finetune(_cfg(tmp_path, ptbxl, "y", "finetune.mode=finetune",
                              "finetune.method=Untrained")).finetune.meta["method"] == "Untrained"
    with pytest.raises(FinetuneError, match="scratch"):
        plan_finetune(_cfg(tmp_path, ptbxl, "z", "finetune.mode=scratch"))
    result = fit(plan_run(_cfg(tmp_path, ptbxl, "rnd", "finetune.mode=linear"), "finetune"))
    metrics = json.loads((result.run_dir / "metrics.json").read_text())
    assert metrics["method"] == "Random init" and metrics["mode"] == "linear" and metrics["encoder"] == "random"
    assert metrics["test"]["auroc"] is not None
    # the linear probe trained the head only: best.pt's encoder is the seeded random one
    from coreecg.checkpoints import load_checkpoint

    payload, _ = load_checkpoint(result.run_dir / "best.pt", torch.device("cpu"))
    want = _weights("train.seed=0")
    assert all(torch.equal(payload["model"][f"encoder.{k}"], v) for k, v in want.items())


def test_each_random_init_run_is_its_own_replicate(tmp_path):
    from coreecg.eval.significance import _encoder_of

    for seed in (0, 1):
        (tmp_path / f"s{seed}").mkdir()
        (tmp_path / f"s{seed}" / "metrics.json").write_text(json.dumps({"encoder": "random", "seed": seed}))
    # not one shared "encoder" (each seed draws its own weights): the significance test keeps both
    assert _encoder_of(tmp_path / "s0") != _encoder_of(tmp_path / "s1")
