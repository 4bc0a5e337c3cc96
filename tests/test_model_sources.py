"""Models in (coreecg.loading): every source of the same weights gives the same model, loading draws
no random numbers, and so fine-tuning from a pretraining run folder, its encoder.pt or an export
of it is bit-identical under one seed.

The fine-tunings run in this process (`run_local`, no Ray) on a small synthetic labelled corpus
built by the real pipeline, its Ray Data map run here as in tests/test_predict.py.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from coreecg.checkpoints import BEST_FILE, CheckpointError, load_checkpoint, save_checkpoint, save_encoder
from coreecg.config import load_config
from coreecg.hub import export_model
from coreecg.loading import load_classifier, load_encoder, open_source
from coreecg.methods import CoReECG
from coreecg.model.classifier import Classifier
from tests.helpers import TINY, InProcessDataset

# Small inputs (120 tokens for 12 leads), as in tests/test_predict.py: cheap on 2 CPU cores.
SMALL = [*TINY, "model.input_samples=1500", "data.crop_samples=1500", "encoders.coreecg.patch_size=150"]
RECORDS = 90           # 30 synthetic patients, 60/20/20 by patient: val and test get windows of their own


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    """One pretrained encoder as three sources: its run folder, its encoder.pt, its export."""
    root = tmp_path_factory.mktemp("sources")
    cfg = load_config(overrides=SMALL)
    torch.manual_seed(0)
    save_encoder(root / "pre" / "encoder.pt", CoReECG(cfg), cfg, step=3)
    return {"run folder": root / "pre", "encoder.pt": root / "pre" / "encoder.pt",
            "export": export_model(root / "pre", root / "export")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    import ray.data

    from coreecg.data.pipeline import build_corpus

    out = tmp_path_factory.mktemp("sources-corpus") / "synthetic"
    cfg = load_config(overrides=["data.shard_records=45", "data.split_ratios=[0.6,0.2,0.2]"]).data
    with pytest.MonkeyPatch.context() as mp:          # no cluster: the shards run here, one by one
        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        build_corpus("synthetic", None, out, cfg, source_options=cfg.sources.for_source("synthetic", RECORDS),
                     log_warnings=False)
    return out


def _state(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def test_every_source_loads_the_same_encoder_and_draws_no_random_numbers(sources):
    states = []
    for name, path in sources.items():
        torch.manual_seed(7)
        encoder = load_encoder(path)
        after = torch.rand(4)                 # the draw right after loading
        torch.manual_seed(7)
        assert torch.equal(after, torch.rand(4)), f"loading {name} consumed the global RNG"
        assert not encoder.training
        states.append(_state(encoder))
    for other in states[1:]:
        assert other.keys() == states[0].keys()
        assert all(torch.equal(other[k], states[0][k]) for k in states[0])


def test_a_classifier_source_opens_as_its_encoder_without_its_task(tmp_path, sources):
    """load_encoder of a fine-tuning checkpoint needs no class names (its run's metrics.json and
    corpus may be gone); load_classifier of it does, and says where it looked."""
    encoder = load_encoder(sources["encoder.pt"])
    cfg = load_config(overrides=SMALL)
    clf = Classifier(encoder, 3, ["I", "II"], multilabel=False)
    save_checkpoint(tmp_path / "checkpoint_step000000004" / "checkpoint.pt", clf.state_dict(), cfg, task="finetune",
                    epoch=0)
    file = tmp_path / "checkpoint_step000000004" / "checkpoint.pt"
    src = open_source(file, kind="encoder")
    assert (src.kind, src.class_names) == ("encoder", None) and not any(k.startswith("head.") for k in src.state)
    assert all(torch.equal(v, _state(load_encoder(file))[k]) for k, v in _state(encoder).items())
    with pytest.raises(CheckpointError, match=r"checkpoint\.pt: no class names for its 3 outputs"):
        load_classifier(file)


def _finetune(source: Path, corpus: Path, root: Path, name: str) -> Path:
    from coreecg.data.reading import read_split
    from coreecg.train.finetuning import FinetuneTask, plan_finetune
    from coreecg.train.loop import run_local

    cfg = load_config(overrides=[
        *SMALL, f"data.corpus={corpus}", f"finetune.encoder={source}", "finetune.mode=finetune",
        "finetune.epochs=2", "finetune.warmup_epochs=0", "finetune.batch_size=16", "finetune.lr=0.01",
        "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0", "train.num_workers=1", "train.device=cpu",
        "train.checkpoint_every_steps=0", "train.figures=false", f"train.storage_path={root}", f"train.name={name}"])
    plan = plan_finetune(cfg)
    train = read_split(corpus, "train", ["signal"], as_stored=True)["signal"]
    run_local(plan, FinetuneTask(plan, torch.device("cpu")), train)
    return plan.run_dir


@pytest.fixture(scope="module")
def finetuned(sources, corpus, tmp_path_factory) -> dict[str, Path]:
    """The same fine-tuning (seed, data, schedule) from each source of the same encoder."""
    root = tmp_path_factory.mktemp("finetuned")
    return {name: _finetune(path, corpus, root, name.replace(" ", "-").replace(".", "-"))
            for name, path in sources.items()}


def test_finetuning_from_a_run_folder_its_encoder_pt_or_its_export_is_bit_identical(finetuned):
    best = {name: load_checkpoint(run / BEST_FILE)[0] for name, run in finetuned.items()}
    first = next(iter(best.values()))
    # The head is drawn after the encoder is loaded: it and every trained weight must agree.
    assert not torch.equal(first["model"]["head.weight"], torch.zeros_like(first["model"]["head.weight"]))
    for name, payload in best.items():
        assert payload["epoch"] == first["epoch"], name
        for key, value in first["model"].items():
            assert torch.equal(payload["model"][key], value), f"{name}: {key}"
    predictions = {name: (run / "predictions.csv").read_text() for name, run in finetuned.items()}
    assert len(set(predictions.values())) == 1, "test predictions differ between sources"


def test_an_export_names_the_pretraining_of_any_encoder_source(finetuned, tmp_path):
    """The model card's pretraining comes from the encoder source itself, a folder included."""
    for name, run in finetuned.items():
        meta = json.loads((export_model(run, tmp_path / run.name) / "config.json").read_text())
        pre = meta["provenance"]["pretraining"]
        assert (pre["method"], pre["label"]) == ("core", "CoRe-ECG"), name
        assert pre["checkpoint"].endswith(("encoder.pt", "model.safetensors")) and "note" not in pre, name
