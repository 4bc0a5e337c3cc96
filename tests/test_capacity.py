"""bench.capacity on a study that builds its corpora (studies/label_efficiency.yaml): a pretraining
mixture priced by source, downstream corpora priced by source and options, cached linear probes
priced as one embedding pass."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from bench import capacity
from coreecg.config import load_config
from coreecg.study.spec import load_study

REPO = Path(__file__).resolve().parents[1]


def label_efficiency_copy(tmp_path: Path) -> Path:
    """studies/label_efficiency.yaml with its paths absolute."""
    data = yaml.safe_load((REPO / "studies" / "label_efficiency.yaml").read_text())
    data["config"] = str(REPO / "configs" / "paper.yaml")
    data["variants"] = str(REPO / "tune_spaces" / "ablations.yaml")
    path = tmp_path / "label_efficiency.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def price(monkeypatch, capsys, *args: str) -> dict:
    for var in capacity.STAND_INS:      # unset here, restored after the test
        monkeypatch.setenv(var, "x")
        monkeypatch.delenv(var)
    monkeypatch.setattr(sys, "argv", ["capacity", *args])
    capacity.main()
    return json.loads(capsys.readouterr().out)


def test_the_label_efficiency_study_prices_from_its_plan(tmp_path, monkeypatch, capsys, ecg_data):
    study_file = label_efficiency_copy(tmp_path)
    out = price(monkeypatch, capsys, "--study", str(study_file), "--stand-in-data", "--code15-records", "300000",
                "--shared", str(ecg_data))
    study = load_study(study_file)       # --stand-in-data set the folders' variables

    # pretraining: 2 methods x 3 seeds, on the mixture's train windows, priced by source
    assert len(out["pretraining"]) == len(study.pretrain_runs()) == 6
    mixture = {c["source"]: c for c in out["corpus"]["mixture"]}
    assert list(mixture) == ["mimic-iv-ecg", "code15", "cinc2021"]
    assert mixture["code15"]["records"] == 300_000 and "--code15-records" not in mixture["code15"]["assumed"]
    assert "--code15-rate" in mixture["code15"]["assumed"] and "--records" in mixture["mimic-iv-ecg"]["assumed"]
    assert out["preprocessing"]["records"] == 800_000 + 300_000 + 88_253
    assert out["corpus"]["train_windows"] == sum(c["train_windows"] for c in mixture.values())
    assert {r["samples_per_epoch"] for r in out["pretraining"]} == {
        out["corpus"]["train_windows"] // 256 * 256}

    # downstream corpora by source and options, not by name
    ds = out["downstream"]
    assert (ds["ptbxl-super"]["classes"], ds["ptbxl-all"]["classes"], ds["icbeb2018"]["classes"]) == (5, 71, 9)
    assert ds["ptbxl-age"]["classes"] == 1 and ds["ptbxl-age"]["options"]["task"] == "age"   # one regression output
    assert ds["ptbxl-all"]["split"].startswith("official folds")
    assert ds["ptbxl-all"]["train"] == round(ds["ptbxl-all"]["windows"] * 0.8)

    # fine-tuning: every run of the plan, in rows; linear rows cached
    runs = study.finetune_runs()
    assert sum(r["runs"] for r in out["finetuning"]) == len(runs) == out["totals"]["tables_finetuning"]["finetunings"]
    # 4 corpora (age among them) x 3 fractions x 5 seeds x (3 linear rows + Supervised + 2 fine-tuned rows)
    assert len(runs) == 4 * 3 * 5 * 6
    linear = [r for r in out["finetuning"] if r["mode"] == "linear"]
    assert sum(r["runs"] for r in linear) == 4 * 3 * 5 * 3
    assert all(r["features"].startswith("cached") for r in linear)
    assert out["totals"]["tables_pretraining"]["pretrainings"] == 6
    # 1 % of each corpus is under one batch of 256: its grids fine-tune at batch 32, so every run plans
    assert "plan_errors" not in out
    assert {r.fraction for r in runs if "finetune.batch_size=32" in r.set} == {0.01}


def test_a_cached_linear_probe_costs_one_embedding_pass():
    ds = {"train": 16_841, "val": 2_105, "test": 2_105, "classes": 5}
    base = ["finetune.mode=linear"]
    cached = load_config(REPO / "configs" / "paper.yaml", [*base, "finetune.cache_features=true"])
    uncached = load_config(REPO / "configs" / "paper.yaml", [*base, "finetune.cache_features=false"])
    c_train, c_eval = capacity.finetune_cost(cached, ds)
    u_train, u_eval = capacity.finetune_cost(uncached, ds)
    assert c_train + c_eval < u_train + u_eval and c_train < u_train / 10 and c_eval < u_eval
    fwd = capacity.encoder_forward(cached, 12, 5)
    embed = (ds["train"] + ds["val"] + ds["test"]) * cached.finetune.eval_crops * fwd
    assert embed <= c_train + c_eval < 1.01 * embed          # the head's epochs are tiny beside it
    # the whole train split is embedded whatever the fraction: the fraction barely moves the cost
    small = load_config(REPO / "configs" / "paper.yaml", [*base, "finetune.train_fraction=0.1"])
    assert abs(sum(capacity.finetune_cost(small, ds)) - (c_train + c_eval)) < 0.01 * embed
    # uncached, every step embeds its batch's eval_crops crops: per epoch about the train embedding
    assert u_train > 0.9 * cached.finetune.epochs * ds["train"] * cached.finetune.eval_crops * fwd


def test_the_gpu_hours_use_the_measured_utilisation_unless_overridden(monkeypatch, capsys):
    rtx, h100 = "4x RTX 3090", "8x H100 SXM"
    compiled = price(monkeypatch, capsys, "--quick")
    eager = price(monkeypatch, capsys, "--quick", "--mode", "eager")
    given = price(monkeypatch, capsys, "--quick", "--mfu", "0.2", "--mfu-h100", "0.3")
    # defaults: the measured fractions, the RTX 3090 assumed at the H100's; the JSON says where from
    assert {n: p["mfu"] for n, p in compiled["platforms"].items()} == {rtx: 0.149, h100: 0.149}
    assert {n: p["mfu"] for n, p in eager["platforms"].items()} == {rtx: 0.101, h100: 0.101}
    assert compiled["mfu"]["measured"] == capacity.MEASURED_MFU and "H200" in compiled["mfu"]["basis"]
    assert compiled["mfu"]["by_platform"][rtx].startswith("assumed")
    assert compiled["mfu"]["by_platform"][h100].startswith("measured")
    # studies/tiny.yaml's base (configs/quickstart.yaml) keeps short runs eager (train.compile=false):
    # pricing it compiled says so
    assert compiled["mfu"]["study_train_compile"] == [False] and "note" in compiled["mfu"]
    assert "note" not in eager["mfu"]
    # overrides: --mfu for both, --mfu-h100 for one
    assert {n: p["mfu"] for n, p in given["platforms"].items()} == {rtx: 0.2, h100: 0.3}
    assert given["mfu"]["by_platform"] == {rtx: "--mfu", h100: "--mfu-h100"}
    # GPU-hours scale as 1 / MFU
    ratio = eager["totals"]["study"][h100]["gpu_hours"] / compiled["totals"]["study"][h100]["gpu_hours"]
    assert abs(ratio - 0.149 / 0.101) < 0.01


def test_every_encoder_and_cpc_are_priced_and_the_count_meets_the_formula_where_both_exist():
    """pretrain_flops_per_sample: the ViT's MoCo v3 by formula agrees with torch's count of the same
    step within 3 %; CPC and the sequence encoders (no formula) get torch's count, a training step
    costing more than its forward; the fine-tuned S4's forward is its own, not the ViT's."""
    from bench.common import TINY, measured_pretrain_flops, pretrain_flops_per_sample

    vit = load_config(overrides=[*TINY, "pretrain.method=moco_v3"])
    formula, counted = pretrain_flops_per_sample(vit), measured_pretrain_flops(vit)
    assert "source" not in formula and abs(formula["train_step"] / counted["train_step"] - 1) < 0.03
    s4 = ["model.arch=s4", "encoders.s4.d_model=16", "encoders.s4.n_layers=2", "encoders.s4.d_state=8",
          "encoders.s4.stem=[16,16]", "encoders.s4.stem_strides=[5,3]"]
    for sets in (["pretrain.method=cpc", *TINY], ["pretrain.method=cpc", *s4], ["pretrain.method=moco_v3", *s4]):
        f = pretrain_flops_per_sample(load_config(overrides=sets))
        assert f["source"] == "torch" and 0 < f["forward"] < f["train_step"], sets
    cfg = load_config(overrides=[*TINY, *s4])
    assert capacity.encoder_forward(cfg, 12) != capacity.encoder_forward(load_config(overrides=TINY), 12)
    assert capacity.encoder_forward(cfg, 12, 5) - capacity.encoder_forward(cfg, 12) == 2 * 16 * 5   # the head
