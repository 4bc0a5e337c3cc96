"""Downstream fine-tuning: the classifier's lead subsets and frozen mode, the crop rule, the
checks that stop bad input before training, and end-to-end runs on the real PTB-XL records
(from a tiny pretraining on the MIMIC-layout records, in the test) through the shared Ray loop:
metrics.json, predictions.csv that reproduces it, linear/scratch/lead/fraction variants, and
the report tables built from the saved runs."""
from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from coreecg.config import STANDARD_LEADS, load_config
from coreecg.data.subsets import SubsetError
from coreecg.eval.downstream import eval_offsets, load_split, predict, read_predictions, score, to_records
from coreecg.model.classifier import Classifier
from coreecg.model.encoder import Encoder
from coreecg.checkpoints import CheckpointError, load_checkpoint
from coreecg.train.fit import fit, plan_run
from coreecg.train.finetuning import FinetuneError, parse_leads, plan_finetune
from coreecg.train.step import FinetuneStep, Schedule
from tests.helpers import TINY, tiny_config

REPO = Path(__file__).resolve().parents[1]


def _encoder(seed: int = 0) -> Encoder:
    torch.manual_seed(seed)
    return Encoder(n_patches=30, dim=32, depth=2, num_heads=2)


# ---------------------------------------------------------------------------- model, no Ray


def test_lead_subset_feeds_only_its_tokens_and_matches_the_full_model():
    enc = _encoder().eval()
    x12 = torch.randn(3, 12, 2250)
    six = Classifier(enc, 5, STANDARD_LEADS[:6], multilabel=False).eval()
    picked = Classifier(enc, 5, ("V2", "I"), multilabel=False).eval()
    seen = []
    hook = enc.transformer.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape))
    f6 = six.features(x12[:, :6])
    fp = picked.features(x12[:, [7, 0]])
    hook.remove()
    assert seen == [(3, 6 * 30, 32), (3, 2 * 30, 32)]          # only the asked leads' tokens
    # The same features as the 12-lead model's encoder fed the same leads with their lead indices.
    full = Classifier(enc, 5, STANDARD_LEADS, multilabel=False).eval()
    assert torch.allclose(f6, full.encoder.pooled(x12[:, :6], torch.arange(6)), atol=1e-6)
    assert torch.allclose(fp, full.encoder.pooled(x12[:, [7, 0]], torch.tensor([7, 0])), atol=1e-6)
    # Not zero-filling: the 12-lead model on zeroed other leads gives other features.
    zeroed = x12.clone()
    zeroed[:, 6:] = 0
    assert not torch.allclose(f6, full.features(zeroed), atol=1e-3)
    with pytest.raises(ValueError, match="input has 12 leads, the model takes 6"):
        six.features(x12)


def test_linear_mode_trains_only_the_head_and_losses_match_the_task():
    cfg = tiny_config("finetune.lr=1e-2")
    enc = _encoder()
    before = {k: v.clone() for k, v in enc.state_dict().items()}
    model = Classifier(enc, 4, STANDARD_LEADS, multilabel=False, frozen_encoder=True)
    step = FinetuneStep(model, cfg, Schedule(10, 1, 0))
    assert {id(p) for g in step.optimizer.param_groups for p in g["params"]} == {id(p) for p in model.head.parameters()}
    head0 = model.head.weight.detach().clone()
    target = torch.nn.functional.one_hot(torch.tensor([0, 1, 2, 3]), 4).float()
    out = step(torch.randn(4, 12, 2250), target)
    assert torch.isfinite(out["loss"]) and not torch.equal(model.head.weight, head0)
    assert all(torch.equal(before[k], v) for k, v in enc.state_dict().items())
    assert not model.encoder.training and model.training           # frozen encoder: eval mode (no dropout)
    # single-label: cross-entropy on the positive class; multi-label: BCE on every label
    logits = torch.tensor([[2.0, 0.0, -1.0, 0.5]])
    ce = torch.nn.functional.cross_entropy(logits, torch.tensor([0]))
    assert torch.isclose(model.loss(logits, target[:1]), ce)
    multi = Classifier(_encoder(), 4, STANDARD_LEADS, multilabel=True)
    y = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    assert torch.isclose(multi.loss(logits, y), torch.nn.functional.binary_cross_entropy_with_logits(logits, y))


def test_crop_rule_averages_the_logits_of_three_evenly_spaced_crops():
    assert eval_offsets(2500, 2250, 3) == [0, 125, 250]
    assert eval_offsets(2500, 2250, 1) == [125]                    # one crop: the centre
    assert eval_offsets(2500, 2500, 3) == [0]                      # the whole window: once, not 3 times
    model = Classifier(_encoder(), 3, STANDARD_LEADS[:6], multilabel=False)
    windows = np.random.default_rng(0).standard_normal((5, 12, 2500)).astype(np.float16)
    probs, feats = predict(model, windows, list(range(6)), 2250, 3, torch.device("cpu"), batch_size=2)
    x = torch.from_numpy(windows[:, :6]).float()
    with torch.no_grad():
        logits = torch.stack([model(x[..., o:o + 2250])["logits"] for o in (0, 125, 250)]).mean(0)
    assert np.allclose(probs, torch.softmax(logits, -1).numpy(), atol=1e-5)
    assert feats.shape == (5, 32) and np.allclose(probs.sum(1), 1.0)


def test_lead_names():
    assert parse_leads("12") == STANDARD_LEADS and parse_leads("6") == STANDARD_LEADS[:6]
    assert parse_leads("1") == ("I",) and parse_leads("i, avr,V2") == ("I", "aVR", "V2")
    with pytest.raises(FinetuneError, match="V7"):
        parse_leads("I,V7")


# ---------------------------------------------------------------------------- real records, Ray


@pytest.fixture(scope="module")
def corpora(ray_session, ecg_data, tmp_path_factory):
    from coreecg.data.pipeline import build_corpus

    root = tmp_path_factory.mktemp("ft-corpora")
    cfg = load_config(overrides=["data.shard_records=32"]).data
    build_corpus("mimic-iv-ecg", ecg_data / "mimic-iv-ecg-layout", root / "mimic", cfg)
    build_corpus("ptbxl", ecg_data / "ptbxl", root / "ptbxl", cfg, source_options=cfg.sources.for_source("ptbxl", 0))
    build_corpus("ptbxl", ecg_data / "ptbxl", root / "ptbxl-multi", cfg,
                 source_options={**cfg.sources.for_source("ptbxl", 0), "label_view": "multi"})
    return root


@pytest.fixture(scope="module")
def encoder(corpora, tmp_path_factory) -> Path:
    """A tiny pretraining on the MIMIC-layout records, in the test."""
    from coreecg.train.fit import fit, plan_run

    tmp = tmp_path_factory.mktemp("ft-pre")
    cfg = load_config(overrides=[*TINY, f"data.corpus={corpora / 'mimic'}", "optim.batch_size=8", "optim.epochs=1",
                                 "optim.warmup_epochs=0", "train.eval_every_epochs=0", "train.num_workers=1",
                                 f"train.storage_path={tmp}", "train.name=pre", "train.variant=TinyCoRe"])
    return fit(plan_run(cfg, "pretrain")).model


def _ft(tmp: Path, name: str, corpora: Path, *extra: str):
    # The MIMIC-layout records are PTB-XL records re-written: the leakage guard (tests/test_leakage.py)
    # would refuse this encoder on PTB-XL; these tests are about fine-tuning itself, so they allow it.
    return load_config(overrides=["finetune.allow_overlap=true", f"data.corpus={corpora / 'ptbxl'}",
                                  "finetune.batch_size=16", "finetune.lr=1e-3",
                                  "finetune.bootstrap_resamples=200", "train.num_workers=2", "train.log_every=2",
                                  "train.checkpoint_every_steps=0", f"train.storage_path={tmp}",
                                  f"train.name={name}", *extra])


@pytest.mark.slow
def test_bad_input_is_refused_before_training(corpora, encoder, tmp_path):
    with pytest.raises(FinetuneError, match="no labels"):
        plan_finetune(load_config(overrides=[f"data.corpus={corpora / 'mimic'}", f"finetune.encoder={encoder}"]))
    other = load_config(overrides=[*TINY, "encoders.coreecg.embed_dim=64", f"data.corpus={corpora / 'ptbxl'}",
                                   f"finetune.encoder={encoder}"])
    with pytest.raises(CheckpointError,
                       match=r"another shape.*encoders\.coreecg\.embed_dim: 32 in the checkpoint, 64 asked"):
        plan_finetune(other)
    broken = tmp_path / "broken.pt"
    broken.write_bytes(Path(encoder).read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="broken.pt"):
        plan_finetune(_ft(tmp_path, "x", corpora, f"finetune.encoder={broken}"))
    with pytest.raises(FinetuneError, match="needs an encoder"):
        plan_finetune(_ft(tmp_path, "x", corpora))
    with pytest.raises(FinetuneError, match="scratch"):
        plan_finetune(_ft(tmp_path, "x", corpora, "finetune.mode=scratch", f"finetune.encoder={encoder}"))
    with pytest.raises(SubsetError, match="too few"):   # 0.01 of ~140 patients: 1 patient for 5 classes
        plan_finetune(_ft(tmp_path, "x", corpora, f"finetune.encoder={encoder}", "finetune.train_fraction=0.01"))
    job = subprocess.run([sys.executable, "jobs/finetune.py", "--encoder", str(encoder), "--corpus",
                          str(corpora / "ptbxl"), "--leads", "I,V9", "--output", str(tmp_path / "y")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert job.returncode == 2 and "V9" in job.stderr and not (tmp_path / "y").exists()


@pytest.fixture(scope="module")
def runs(corpora, encoder, tmp_path_factory):
    """Fine-tune (12 leads), linear (6 leads, half the patients), scratch (lead I) on PTB-XL's
    single-label task, and a linear probe of its multi-label task."""
    tmp = tmp_path_factory.mktemp("ft-runs")
    full = fit(plan_run(_ft(tmp, "ft", corpora, f"finetune.encoder={encoder}", "finetune.epochs=12",
                            "finetune.lr=3e-3"), "finetune"))
    linear = fit(plan_run(_ft(tmp, "lin", corpora, f"finetune.encoder={encoder}", "finetune.mode=linear",
                              "finetune.leads=[I,II,III,aVR,aVL,aVF]", "finetune.train_fraction=0.5",
                              "finetune.epochs=2"), "finetune"))
    scratch = fit(plan_run(_ft(tmp, "sup", corpora, *TINY, "finetune.mode=scratch", "finetune.leads=[I]",
                           "finetune.epochs=2"), "finetune"))
    multi = fit(plan_run(_ft(tmp, "multi", corpora, f"data.corpus={corpora / 'ptbxl-multi'}", "finetune.mode=linear",
                         f"finetune.encoder={encoder}", "finetune.epochs=2"), "finetune"))
    return {"ft": full, "lin": linear, "sup": scratch, "multi": multi}


@pytest.mark.slow
def test_finetune_end_to_end_on_real_ptbxl(runs, corpora, encoder):
    r = runs["ft"]
    m, run = r.metrics, r.run_dir
    assert (m["method"], m["dataset"], m["mode"], m["leads"], m["train_fraction"]) == \
        ("TinyCoRe", "ptbxl", "finetune", "12", 1.0)
    assert m["class_names"] == ["NORM", "MI", "STTC", "CD", "HYP"] and m["multilabel"] is False
    assert m["split_rule"] == "patients"          # the corpus's (manifest split_rule)
    assert m["encoder"] == str(Path(encoder).resolve()) and len(m["encoder_config_hash"]) == 16
    assert "3 evenly spaced 2250-sample crops" in m["crop_rule"] and m["test"]["auroc_kind"] == "one-vs-rest"
    for key in ("acc", "f1", "auroc"):
        ci = m["test"]["ci"][key]
        assert ci["low"] <= m["test"][key] <= ci["high"], key
    epochs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"kind": "epoch"' in x]
    assert len(epochs) == 12 and all("val_auroc" in e for e in epochs)
    best = max(range(12), key=lambda i: (epochs[i]["val_auroc"], -i))
    assert m["selection"]["best_epoch"] == best + 1
    assert m["selection"]["val_auroc"] == pytest.approx(epochs[best]["val_auroc"])
    assert (run / "figures" / "tsne.png").stat().st_size > 10_000
    assert any(f.name.startswith("events.out.tfevents") for f in (run / "tensorboard").iterdir())
    saved = load_config(run / "config.yaml")
    assert saved.encoders.coreecg.embed_dim == 32 and saved.finetune.encoder == m["encoder"]

    # The selected weights fit the training set well above chance (macro AUROC over the classes
    # with at least 5 training records: this subset has one HYP record, whose AUROC is noise).
    payload, cfg = load_checkpoint(r.model)
    assert payload["epoch"] == best + 1                               # epochs count from 1
    assert payload["class_names"] == ["NORM", "MI", "STTC", "CD", "HYP"] and payload["multilabel"] is False
    model = Classifier(Encoder.from_config(cfg), 5, STANDARD_LEADS, multilabel=False)
    model.load_state_dict(payload["model"])
    train = load_split(corpora / "ptbxl", "train")
    probs, feats = predict(model, train.signal, list(range(12)), 2250, 3, torch.device("cpu"))
    fit = score(to_records(train, probs, feats), False, m["class_names"])["per_class"]
    scored = [c["auroc"] for c in fit.values() if c["positives"] >= 5]
    assert len(scored) == 4 and np.mean(scored) > 0.72, fit


@pytest.mark.slow
def test_predictions_csv_reproduces_metrics_json(runs):
    for r in runs.values():
        m = r.metrics
        rows = list(csv.DictReader(open(r.run_dir / "predictions.csv")))
        assert list(rows[0]) == ["record_id", "patient_id", "labels", *(f"p_{c}" for c in m["class_names"])]
        assert len(rows) == m["test"]["n"] and len({x["record_id"] for x in rows}) == len(rows)
        again = score(read_predictions(r.run_dir / "predictions.csv", m["class_names"]), m["multilabel"],
                      m["class_names"], m["bootstrap_resamples"], m["seed"])
        for key in ("acc", "f1", "f1_argmax", "auroc"):
            assert again.get(key) == pytest.approx(m["test"].get(key), abs=1e-6), key
        assert again["ci"]["auroc"]["low"] == pytest.approx(m["test"]["ci"]["auroc"]["low"], abs=1e-6)


@pytest.mark.slow
def test_linear_scratch_leads_and_fraction_runs(runs, encoder):
    lin, sup = runs["lin"], runs["sup"]
    assert (lin.metrics["mode"], lin.metrics["leads"]) == ("linear", "6")
    pre, _ = load_checkpoint(encoder)
    best, _ = load_checkpoint(lin.model)
    for k, v in pre["model"].items():                 # linear probing leaves the encoder untouched
        assert torch.equal(best["model"][k], v), k
    assert (sup.metrics["method"], sup.metrics["mode"], sup.metrics["leads"]) == ("Supervised", "scratch", "1")
    assert sup.metrics["encoder"] is None and sup.metrics["encoder_config_hash"] is None
    s = lin.metrics["train_subset"]
    assert s["patients_kept"] == round(0.5 * s["patients_full"])
    assert all(s["class_patients_kept"][c] >= 1 for c, n in s["class_patients_full"].items() if n)
    kept = (lin.run_dir / "train_subset.csv").read_text().split()[1:]
    assert len(kept) == s["patients_kept"]
    assert lin.metrics["counts"]["train_windows"] == s["rows_kept"] < sup.metrics["counts"]["train_windows"]


@pytest.mark.slow
def test_multilabel_task_uses_sigmoid_and_per_label_accuracy(runs):
    r = runs["multi"]
    m = r.metrics
    assert m["multilabel"] is True and "f1_argmax" not in m["test"]
    pred = read_predictions(r.run_dir / "predictions.csv", m["class_names"])
    assert (pred.y.sum(1) > 1).any()                                # records with several labels
    assert not np.allclose(pred.probs.sum(1), 1.0)                  # sigmoid, not softmax
    assert m["test"]["acc"] == pytest.approx(((pred.probs >= 0.5) == (pred.y > 0)).mean())   # micro per label


@pytest.mark.slow
def test_finished_run_is_returned_without_training(runs):
    r = runs["lin"]
    before = (r.run_dir / "metrics.json").stat().st_mtime_ns
    again = fit(plan_run(load_config(r.run_dir / "config.yaml"), "finetune"))
    assert again.metrics == r.metrics and (r.run_dir / "metrics.json").stat().st_mtime_ns == before


@pytest.mark.slow
def test_report_builds_the_tables_from_saved_runs(runs, tmp_path):
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "jobs/report.py", *(str(r.run_dir) for r in runs.values()),
                           "--output", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    comparison = (out / "comparison.md").read_text()
    assert "TinyCoRe" in comparison and "Supervised" not in comparison      # scratch ran on lead I only
    leads = {row["method"]: row for row in csv.DictReader(open(out / "lead_reduction.csv"))}
    assert set(leads) == {"Supervised"}            # as the paper's Table 2: only methods run beyond 12 leads
    one_lead = [k for k in leads["Supervised"] if k.endswith(" n") and leads["Supervised"][k] == "1"]
    assert one_lead and all("1" in k for k in one_lead)          # Supervised has only 1-lead cells
    all_runs = list(csv.DictReader(open(out / "all_runs.csv")))
    assert sorted(x["mode"] for x in all_runs) == ["finetune", "linear", "linear", "scratch"]
