"""Hugging Face conventions (coreecg.model.pretrained, coreecg.hub): save_pretrained/from_pretrained
round trips are bit-identical, config.json is a Hugging Face config, an export is what
save_pretrained writes plus the contract and the card, files are readable by the group, exports
of format 1 still load, and the card's metadata block. No Hub access."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import yaml

import coreecg
from coreecg.checkpoints import CheckpointError
from coreecg.files import sha256_file, write_text
from coreecg.hub import FORMAT_VERSION, export_model, load_model
from coreecg.hub.card import model_card
from coreecg.model.classifier import Classifier
from coreecg.model.encoder import Encoder
from tests.helpers import tiny_config

V1_EXPORT = Path(__file__).parent / "data" / "export-v1-encoder"     # written by coreecg's format-1 exporter
CLASSES = ["NORM", "MI", "STTC"]
LEADS = ["I", "II", "V1"]


@pytest.fixture
def umask022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _x(leads: int = 12, samples: int = 750) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, leads, samples, generator=g)


def _front(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_encoder_round_trip_is_bit_identical(tmp_path, umask022):
    torch.manual_seed(0)
    cfg = tiny_config("model.input_samples=750", "data.crop_samples=750")
    enc = Encoder.from_config(cfg.model).eval()
    enc.save_pretrained(tmp_path / "enc")           # a bare encoder: coreecg's config from its constructor
    assert sorted(p.name for p in (tmp_path / "enc").iterdir()) == ["README.md", "config.json", "model.safetensors"]
    for p in (tmp_path / "enc").iterdir():
        assert p.stat().st_mode & 0o777 == 0o644, p.name
    meta = json.loads((tmp_path / "enc" / "config.json").read_text())
    assert meta["model_type"] == "coreecg" and meta["architectures"] == ["Encoder"]
    assert (meta["dim"], meta["depth"], meta["num_heads"], meta["n_patches"]) == (32, 2, 2, 10)
    assert meta["format_version"] == FORMAT_VERSION and meta["kind"] == "encoder"
    assert meta["weights"]["sha256"] == sha256_file(tmp_path / "enc" / "model.safetensors")
    again = Encoder.from_pretrained(tmp_path / "enc")
    assert type(again) is Encoder and not again.training
    x = _x()
    with torch.no_grad():
        assert torch.equal(again(x).tokens, enc(x).tokens)
        assert torch.equal(again.pooled(x[:, :6]), enc.pooled(x[:, :6]))
    card = _front((tmp_path / "enc" / "README.md").read_text())
    assert card["library_name"] == "coreecg" and card["pipeline_tag"] == "feature-extraction"


def test_classifier_round_trip_keeps_its_task(tmp_path, umask022):
    torch.manual_seed(0)
    cfg = tiny_config("model.input_samples=750", "data.crop_samples=750", f"finetune.leads=[{','.join(LEADS)}]")
    clf = Classifier(Encoder.from_config(cfg.model), len(CLASSES), LEADS, multilabel=True).eval()
    torch.nn.init.normal_(clf.head.bias)
    with pytest.raises(ValueError, match="class_names"):
        clf.save_pretrained(tmp_path / "bare")       # a task needs its class names
    clf.save_pretrained(tmp_path / "clf", config=cfg, class_names=CLASSES)
    meta = json.loads((tmp_path / "clf" / "config.json").read_text())
    assert meta["architectures"] == ["Classifier"] and meta["kind"] == "classifier"
    assert meta["id2label"] == {"0": "NORM", "1": "MI", "2": "STTC"} and meta["leads"] == LEADS
    again = Classifier.from_pretrained(tmp_path / "clf")
    x = _x(len(LEADS))
    with torch.no_grad():
        assert torch.equal(again(x)["logits"], clf(x)["logits"])
    # a loaded model saves the same folder again (its config and task travel with it)
    again.save_pretrained(tmp_path / "clf2")
    assert sha256_file(tmp_path / "clf2" / "model.safetensors") == sha256_file(tmp_path / "clf" / "model.safetensors")
    assert json.loads((tmp_path / "clf2" / "config.json").read_text()) == meta
    # the classifier's encoder alone, from the same folder
    with torch.no_grad():
        assert torch.equal(Encoder.from_pretrained(tmp_path / "clf").pooled(x), clf.encoder.pooled(x))


def test_an_export_is_save_pretrained_plus_contract_and_card(tmp_path, umask022):
    exported = export_model(V1_EXPORT, tmp_path / "export")
    for p in exported.iterdir():
        assert p.stat().st_mode & 0o777 == 0o644, p.name     # safetensors alone would write 0600
    saved = tmp_path / "saved"
    Encoder.from_pretrained(exported).save_pretrained(saved)
    assert sha256_file(saved / "model.safetensors") == sha256_file(exported / "model.safetensors")
    meta, plain = (json.loads((d / "config.json").read_text()) for d in (exported, saved))
    assert plain == meta                             # the loaded export carries contract and provenance
    assert meta["input"]["tensor"]["shape"] == [None, 12, 750] and meta["format_version"] == FORMAT_VERSION
    front = _front((exported / "README.md").read_text())
    assert {"license", "datasets", "tags", "pipeline_tag", "library_name"} <= front.keys()


def test_format_1_exports_still_load():
    """The fixture is an export written by the format-1 exporter (before the Hugging Face keys);
    its pooled embedding of a fixed input was recorded with it."""
    assert json.loads((V1_EXPORT / "config.json").read_text())["format_version"] == 1
    ref = json.loads((V1_EXPORT.parent / "export-v1-encoder.pooled.json").read_text())
    x = torch.sin(torch.arange(2 * 12 * 750, dtype=torch.float32).reshape(2, 12, 750) / 37.0)
    for enc in (Encoder.from_pretrained(V1_EXPORT), coreecg.load_encoder(V1_EXPORT), load_model(V1_EXPORT).model):
        with torch.no_grad():
            torch.testing.assert_close(enc.pooled(x), torch.tensor(ref["pooled"]), rtol=1e-5, atol=1e-6)
    assert load_model(V1_EXPORT).contract["window_samples"] == 750


@pytest.mark.parametrize("sources, licence", [(["ptbxl"], "cc-by-4.0"), (["ptbxl", "cinc2021"], "cc-by-4.0"),
                                              (["ptbxl", "mimic-iv-ecg"], "other"), (["mimic-iv-ecg"], "odbl"),
                                              (["synthetic"], "other")])
def test_card_licence_follows_the_training_data(sources, licence):
    meta = json.loads((V1_EXPORT / "config.json").read_text())
    meta["kind"], arch, c = "classifier", meta["architecture"], meta["input"]
    meta["architecture"] = {"encoder": arch, "mode": "finetune"}
    meta["input"] = {**c, "class_names": CLASSES, "task": "multi-label", "finetuned_leads": LEADS,
                     "aggregation": {"rule": "mean"}}
    meta["provenance"] = {"pretraining": {"label": "CoRe-ECG", "corpus": {"source": sources[0]}},
                          "finetuning": {"dataset": sources[-1], "corpus": {"source": sources[-1]}}}
    front = _front(model_card(meta))
    assert front["license"] == licence and front["pipeline_tag"] == "other" and front["library_name"] == "coreecg"
    assert len(front["datasets"]) == len(set(sources)) and "ecg" in front["tags"]


def test_a_missing_or_corrupted_folder_is_named(tmp_path):
    with pytest.raises(CheckpointError, match="no such folder"):
        Encoder.from_pretrained(tmp_path / "absent")          # a path: never taken for a Hub id
    folder = tmp_path / "enc"
    Encoder(n_patches=10, dim=32, depth=1, num_heads=2).save_pretrained(folder)
    data = bytearray((folder / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (folder / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted weights"):
        Encoder.from_pretrained(folder)
    with pytest.raises(CheckpointError, match="holds an encoder"):
        Classifier.from_pretrained(V1_EXPORT)


def test_written_files_follow_the_umask_like_open(tmp_path):
    old = os.umask(0o027)
    try:
        mode = write_text(tmp_path / "a.txt", "x").stat().st_mode & 0o777
        with open(tmp_path / "b.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    assert mode == 0o640 == (tmp_path / "b.txt").stat().st_mode & 0o777
