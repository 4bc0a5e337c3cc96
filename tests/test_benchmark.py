"""The benchmark study (issue 29): external encoders as rows, the frozen-encoder mode with its
attention-pooling head, the benchmark table beside published numbers, and its protocol check."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
import yaml

from coreecg.eval.benchmark import (PublishedError, benchmark_table, cell_text, check_benchmark, load_published,
                                    table_markdown, write_benchmark)
from coreecg.eval.fairness import UnfairTableError
from coreecg.eval.report import load_run
from coreecg.model.classifier import AttentionPool, Classifier
from coreecg.model.encoder import Encoder
from coreecg.study.spec import ExternalEncoder, StudyError, load_study
from tests.test_report import make_run

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------- frozen mode


def test_frozen_mode_trains_only_an_attention_pooling_head():
    torch.manual_seed(0)
    enc = Encoder(n_patches=4, patch_size=25, dim=64, depth=1, num_heads=2)
    model = Classifier.for_mode(enc, 3, ["I", "II"], multilabel=True, mode="frozen").train()
    assert model.frozen_encoder and isinstance(model.pool, AttentionPool) and not enc.training
    out = model(torch.randn(5, 2, 100), torch.randint(0, 2, (5, 3)).float())
    out["loss"].backward()
    assert all(p.grad is None for p in enc.parameters())
    assert model.pool.query.grad.abs().sum() > 0 and model.head.weight.grad.abs().sum() > 0
    linear = Classifier.for_mode(Encoder(n_patches=4, patch_size=25, dim=64, depth=1), 3, ["I"], True, "linear")
    assert linear.pool is None and linear.frozen_encoder


def test_attention_pool_ignores_masked_tokens_and_weighs_tokens():
    torch.manual_seed(0)
    pool = AttentionPool(64)
    tokens = torch.randn(2, 6, 64)
    valid = torch.tensor([[True] * 4 + [False] * 2, [True] * 6])
    changed = tokens.clone()
    changed[0, 4:] = 100.0                        # masked tokens: any values
    a, b = pool(tokens, valid), pool(changed, valid)
    assert torch.allclose(a[0], b[0], atol=1e-5)
    assert torch.allclose(a[0], pool(tokens[:1, :4])[0], atol=1e-5)   # = the sample without them
    # an all-padding sample (a crop of padding only) stays finite; the others are unchanged
    none = torch.tensor([[False] * 6, [True] * 6])
    out = pool(tokens, none)
    assert torch.isfinite(out).all() and torch.allclose(out[1], a[1], atol=1e-5)
    # not a mean: two token sets with the same mean pool differently
    moved = tokens[1:].clone()
    shift = 3.0 * torch.randn(64)                  # not a constant: the pool's LayerNorm removes those
    moved[0, 0] += shift
    moved[0, 1] -= shift
    assert torch.allclose(moved.mean(1), tokens[1:].mean(1), atol=1e-5)
    assert not torch.allclose(pool(moved), pool(tokens[1:]), atol=1e-3)


# ---------------------------------------------------------------------------- the table


def _runs(root: Path) -> list[Path]:
    root.mkdir()
    ci = lambda a: {"auroc": {"low": a - 0.03, "high": a + 0.02}}     # noqa: E731
    out = []
    for name, method, dataset, mode, seed, auroc, extra in [
        ("a", "CoRe-ECG", "ptbxl-super", "finetune", 0, 0.90, {}),
        ("b", "CoRe-ECG", "ptbxl-super", "frozen", 0, 0.85, {}),
        ("c", "CoRe-ECG", "ptbxl-super", "linear", 0, 0.80, {}),
        ("d", "Supervised", "ptbxl-super", "scratch", 0, 0.88, {}),
        ("e", "ST-MEM (published)", "ptbxl-super", "finetune", 0, 0.89, {}),
        ("f", "ST-MEM (published)", "ptbxl-super", "finetune", 1, 0.91, {}),
        ("g", "CoRe-ECG", "cpsc2018", "finetune", 0, 0.95, {}),
        ("h", "CoRe-ECG", "ptbxl-super", "finetune", 1, 0.70, {"leads": "1"}),     # not 12 leads: left out
    ]:
        run = make_run(root, name, method=method, dataset=dataset, mode=mode, seed=seed, auroc=auroc, **extra)
        record = json.loads((run / "metrics.json").read_text())
        record["test"]["ci"].update(ci(auroc))
        (run / "metrics.json").write_text(json.dumps(record))
        out.append(run)
    return out


def test_benchmark_table_places_every_encoder_per_corpus_and_mode(tmp_path):
    runs = [load_run(r) for r in _runs(tmp_path / "runs")]
    pub = load_published(REPO / "studies" / "published" / "ecg_fm_benchmark.yaml")
    table = benchmark_table(runs, [pub])
    # cpsc2018 is read as icbeb2018 (the report's alias), in runs and published numbers alike
    assert table.columns == [("ptbxl-super", "finetune"), ("ptbxl-super", "frozen"), ("ptbxl-super", "linear"),
                             ("icbeb2018", "finetune")]
    assert table.left_out == 1
    assert list(table.cells) == ["CoRe-ECG", "Supervised", "ST-MEM (published)"]
    assert [r.mode for r in table.cells["Supervised"][("ptbxl-super", "finetune")]] == ["scratch"]
    assert cell_text(table.cells["CoRe-ECG"][("ptbxl-super", "frozen")]) == "85.0 [82.0, 87.0]"
    assert cell_text(table.cells["ST-MEM (published)"][("ptbxl-super", "finetune")]) == "90.0 ± 1.4 (2 runs)"
    assert pub.rows["ST-MEM"]["icbeb2018"] == 0.946
    md = table_markdown(table)
    # the runs' split rule is the patient hash: the published PTB-XL numbers share the classes, not the
    # test records; CPSC2018's share the classes (its own folds)
    assert "| *published*: shares with the measured rows* | classes, not test records |  |  | " \
           "classes, not test records |" in md
    assert "| ST-MEM* | 90.1 |  |  | 94.6 |" in md              # published: only under its mode's columns
    assert "Published, not run here" in md and "2.5 s crops" in md
    assert "| Supervised | 88.0 [85.0, 90.0] | n/a | n/a | – |" in md       # scratch: no frozen or linear run
    files = write_benchmark(table, tmp_path / "out")
    rows = list(csv.DictReader(open(files[1])))
    assert sum(r["source"] == "measured" for r in rows) == 7
    assert {r["method"] for r in rows if r["source"].startswith("published")} >= {"ECG-CPC", "ST-MEM"}


@pytest.mark.parametrize("text, needle", [
    ("rows: {A: {ptbxl-super: 93.5}}", "not an AUROC"),
    ("mode: probe\nrows: {A: {x: 0.9}}", "mode 'probe'"),
    ("source: x\nnumbers: {}", "needs a mapping"),
    ("rows: {A: {x: 0.9}}\nshares: {x: {test_split: folds, classes: some}}", r"shares\.x: needs"),
])
def test_a_bad_published_file_is_named(tmp_path, text, needle):
    path = tmp_path / "pub.yaml"
    path.write_text(text)
    with pytest.raises(PublishedError, match=needle) as err:
        load_published(path)
    assert str(path) in str(err.value)


def test_each_column_says_what_its_published_numbers_share_and_the_rest_is_context(tmp_path):
    """PTB-XL runs on strat_fold 10 share the published PTB-XL numbers' test records and classes;
    Chapman's published numbers share neither (their own folds, another label set): no column
    holds them, a context block does."""
    rows = []
    (tmp_path / "runs").mkdir()
    for name, dataset, split in [("a", "ptbxl-super", "folds"), ("b", "chapman", "patients")]:
        run = make_run(tmp_path / "runs", name, method="CoRe-ECG", dataset=dataset, mode="finetune", seed=0, auroc=0.9,
                       split_rule=split)
        rows.append(load_run(run))
    pub = load_published(REPO / "studies" / "published" / "ecg_fm_benchmark.yaml")
    assert pub.shares["chapman"] == {"test_split": "own", "classes": "other"}
    md = table_markdown(benchmark_table(rows, [pub]))
    assert "| *published*: shares with the measured rows* | test records and classes |  |" in md
    assert "| ST-MEM* | 90.1 |  |" in md                        # PTB-XL in its column, Chapman not
    context = md.split("Context: published numbers that share neither")[1]
    assert "fine-tuned* (shares neither): ECGFounder 96.8, ECG-CPC 96.2" in context
    assert "ST-MEM 94.8" in context
    # a file that does not declare a dataset: context too, and it says so
    bare = tmp_path / "bare.yaml"
    bare.write_text("source: s\nprotocol: p\nrows: {X: {ptbxl-super: 0.5}}\n")
    md = table_markdown(benchmark_table(rows, [load_published(bare)]))
    assert "| *published*: shares with the measured rows* |  |  |" in md
    assert "(not declared in its file): X 50.0" in md


def test_benchmark_rows_may_differ_in_the_encoder_but_not_the_fine_tuning(tmp_path):
    runs = _runs(tmp_path / "runs")
    base = {"finetune": {"lr": 8e-5, "epochs": 80}, "model": {"embed_dim": 256}, "train": {"seed": 0}}
    for run in runs:
        (run / "config.yaml").write_text(yaml.safe_dump(base))
    (runs[4] / "config.yaml").write_text(yaml.safe_dump({**base, "model": {"embed_dim": 768}}))
    table = benchmark_table([load_run(r) for r in runs])
    notes = check_benchmark(table)
    assert any("different encoders" in n for n in notes)
    (runs[4] / "config.yaml").write_text(yaml.safe_dump({**base, "finetune": {"lr": 1e-3, "epochs": 80}}))
    with pytest.raises(UnfairTableError, match="finetune.lr"):
        check_benchmark(benchmark_table([load_run(r) for r in runs]))


# ---------------------------------------------------------------------------- the study


def _bench_study(tmp_path: Path, ecg_data: Path, encoders: dict, **report) -> Path:
    data = yaml.safe_load((REPO / "studies" / "benchmark_tiny.yaml").read_text())
    data["config"] = str(REPO / "configs" / "quickstart.yaml")
    data["variants"] = str(REPO / "tune_spaces" / "ablations.yaml")
    data["downstream"]["corpora"] = {"ptbxl-super": {"source": "ptbxl", "input": str(ecg_data / "ptbxl"),
                                                     "set": ["data.sources.ptbxl.split=folds"]}}
    data["downstream"]["encoders"] = encoders
    data["downstream"]["methods"] = ["Supervised", "CoRe-ECG", *encoders]
    data["report"] = {"tables": ["benchmark"], **report}
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_study_fine_tunes_external_encoders_as_rows(tmp_path, ecg_data):
    enc = tmp_path / "encoder.pt"
    from torch import nn

    from coreecg.checkpoints import save_encoder
    from coreecg.config import load_config

    cfg = load_config(REPO / "configs" / "quickstart.yaml",
                      ["encoders.coreecg.embed_dim=32", "encoders.coreecg.depth=1", "encoders.coreecg.num_heads=2"])
    holder = nn.Module()
    holder.encoder = Encoder.from_config(cfg)
    save_encoder(enc, holder, cfg)
    study = load_study(_bench_study(tmp_path, ecg_data, {"Mine": str(enc)},
                                    published=[str(REPO / "studies" / "published" / "ecg_fm_benchmark.yaml")]))
    runs = {(r.method, r.mode): r for r in study.finetune_runs()}
    assert set(runs) == {("Supervised", "scratch"), *((m, mode) for m in ("CoRe-ECG", "Mine")
                                                       for mode in ("finetune", "frozen", "linear"))}
    assert runs["Mine", "frozen"].encoder == ExternalEncoder("Mine", str(enc))
    assert len(study.published) == 1


@pytest.mark.parametrize("change, needle", [
    ({"encoders": {"Mine": "/nowhere/encoder.pt"}}, "downstream.encoders.Mine"),
    ({"encoders": {"CoRe-ECG": "x.pt"}}, "also a variant"),
    ({"published": ["pub.yaml"], "tables": ["comparison"]}, "report.published"),
])
def test_a_bad_encoder_or_published_entry_is_named_before_ray(tmp_path, ecg_data, change, needle):
    encoders = change.pop("encoders", {})
    path = _bench_study(tmp_path, ecg_data, encoders)
    data = yaml.safe_load(path.read_text())
    data["report"].update(change)
    if "published" in change:
        (tmp_path / "pub.yaml").write_text("rows: {A: {ptbxl-super: 0.9}}\n")
        data["report"]["published"] = [str(tmp_path / "pub.yaml")]
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(StudyError, match=needle) as err:
        load_study(path)
    assert str(path) in str(err.value)


def test_the_shipped_benchmark_studies_are_valid_and_tiny_is_the_same_protocol(tmp_path, monkeypatch):
    from torch import nn

    from coreecg.checkpoints import save_encoder
    from coreecg.config import load_config

    cfg = load_config(REPO / "configs" / "paper.yaml", [])
    holder = nn.Module()
    holder.encoder = Encoder.from_config(cfg)
    save_encoder(tmp_path / "encoder.pt", holder, cfg)
    monkeypatch.setenv("COREECG_ENCODER", str(tmp_path / "encoder.pt"))
    monkeypatch.setenv("STMEM_WEIGHTS", str(REPO.parent / "shared" / "fixtures" / "st-mem" / "full.pth"))
    full, tiny = load_study(REPO / "studies" / "benchmark.yaml"), load_study(REPO / "studies" / "benchmark_tiny.yaml")
    assert full.tables == tiny.tables == ("benchmark",) and len(full.published) == len(tiny.published) == 2
    assert [c.name for c in full.corpora] == [c.name for c in tiny.corpora]
    assert {g.modes for g in full.grids} == {g.modes for g in tiny.grids} == {("finetune", "frozen", "linear")}
    assert all(isinstance(r.encoder, ExternalEncoder) for r in full.finetune_runs() if r.mode != "scratch")
    # every PTB-XL task of the benchmark, on the official folds, multi-label
    ptbxl = [c for c in tiny.corpora if c.source == "ptbxl"]
    assert len(ptbxl) == 6 and all({"data.sources.ptbxl.split=folds", "data.sources.ptbxl.label_view=multi"}
                                   <= set(c.set) for c in ptbxl)
