"""Hugging Face conventions (coreecg.model.pretrained, coreecg.hub): save_pretrained/from_pretrained
round trips are bit-identical, config.json is a Hugging Face config, an export is what
save_pretrained writes plus the contract and the card, files are readable by the group, exports
of format 1 still load, and the card's metadata block; a save refuses a config that describes
another model and carries an export's card and fingerprints only for its own weights; what
push_export and push_to_hub would upload; a missing relative folder is not taken for a Hub id.
No Hub access (HfApi and the downloads are replaced)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import coreecg
from coreecg.checkpoints import CheckpointError
from coreecg.files import sha256_file, write_text
from coreecg.hub import FORMAT_VERSION, export_model, load_model, push_export
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
    enc = Encoder.from_config(cfg).eval()
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
    clf = Classifier(Encoder.from_config(cfg), len(CLASSES), LEADS, multilabel=True).eval()
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
    front = _front(model_card(_classifier_meta(sources)))
    assert front["license"] == licence and front["pipeline_tag"] == "other" and front["library_name"] == "coreecg"
    assert len(front["datasets"]) == len(set(sources)) and "ecg" in front["tags"]
    # "other": the Hub shows license_name and follows license_link (one source's page, else this card)
    link = {"license_link": "README.md"} if licence == "other" else {}
    assert {k: front[k] for k in ("license_link",) if k in front} == link


def test_card_links_a_single_sources_licence():
    front = _front(model_card(_classifier_meta(["cpsc2018"])))
    assert (front["license"], front["license_name"]) == ("other", "cpsc2018-licence")
    assert front["license_link"].startswith("http://2018.icbeb.org")


def test_a_missing_or_corrupted_folder_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such folder"):
        Encoder.from_pretrained(tmp_path / "absent")          # a path: never taken for a Hub id
    with pytest.raises(CheckpointError, match="load_encoder"):
        Encoder.from_pretrained(tmp_path)                     # a folder without config.json (a run folder)
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


def _tiny_classifier(leads=LEADS, head="auto"):
    cfg = tiny_config("model.input_samples=750", "data.crop_samples=750", f"finetune.leads=[{','.join(leads)}]",
                      f"finetune.head={head}")
    torch.manual_seed(0)
    return cfg, Classifier.for_mode(Encoder.from_config(cfg), len(CLASSES), leads, True, "finetune", head)


@pytest.mark.parametrize("change, named", [
    ("finetune.leads=[I,II,III,aVR,aVL,aVF,V1,V2,V3,V4,V5,V6]", "finetune.leads"),   # lead_idx is not in the weights
    ("finetune.head=attention", "finetune.head"),
    ("encoders.coreecg.embed_dim=64", r"\(encoders\.coreecg\.embed_dim\)"),
    ("model.input_samples=1500 data.crop_samples=1500", "model.input_samples"),
])
def test_save_pretrained_refuses_a_config_that_describes_another_model(tmp_path, change, named):
    cfg, clf = _tiny_classifier()
    wrong = tiny_config("model.input_samples=750", "data.crop_samples=750", f"finetune.leads=[{','.join(LEADS)}]",
                        *change.split())
    with pytest.raises(ValueError, match=named):
        clf.save_pretrained(tmp_path / "clf", config=wrong, class_names=CLASSES)
    with pytest.raises(ValueError, match="2 class_names for a head of 3"):
        clf.save_pretrained(tmp_path / "clf", config=cfg, class_names=CLASSES[:2])
    assert not (tmp_path / "clf" / "config.json").exists() and clf.pretrained_info is None
    clf.save_pretrained(tmp_path / "clf", config=cfg, class_names=CLASSES)     # the right one saves


def _classifier_meta(sources: list[str], mode: str = "finetune", pooling: str | None = None) -> dict:
    """A classifier's config.json, from the format-1 encoder export's."""
    meta = json.loads((V1_EXPORT / "config.json").read_text())
    meta["kind"], arch, c = "classifier", meta["architecture"], meta["input"]
    meta["architecture"] = {"encoder": arch, "mode": mode, **({"pooling": pooling} if pooling else {})}
    meta["input"] = {**c, "class_names": CLASSES, "task": "multi-label", "finetuned_leads": LEADS,
                     "aggregation": {"rule": "mean"}}
    meta["provenance"] = {"pretraining": {"label": "CoRe-ECG", "corpus": {"source": sources[0]}},
                          "finetuning": {"dataset": sources[-1], "corpus": {"source": sources[-1]}}}
    return meta


def test_card_describes_the_heads_pooling():
    from coreecg.hub.export import _pooling

    cfg, _ = _tiny_classifier(head="attention")         # finetune mode with an attention-pooling head
    text = model_card(_classifier_meta(["ptbxl"], "finetune", _pooling(cfg)))
    assert "attention pooling: one learned query" in text and "mean over all" not in text
    text = model_card(_classifier_meta(["ptbxl"], "frozen", _pooling(tiny_config("finetune.head=mean"))))
    assert "mean over all (lead, time) token" in text and "attention pooling" not in text


def test_a_save_pretrained_classifier_exports_with_its_pooling(tmp_path):
    cfg, clf = _tiny_classifier(head="attention")
    clf.save_pretrained(tmp_path / "clf", config=cfg, class_names=CLASSES)     # no input contract in it
    exported = export_model(tmp_path / "clf", tmp_path / "export")
    assert "attention pooling: one learned query" in (exported / "README.md").read_text()
    loaded = load_model(exported)
    assert loaded.contract["finetuned_leads"] == LEADS and loaded.model.pool is not None
    changed = Classifier.from_pretrained(exported)
    changed.multilabel = False                           # now softmax: the contract says sigmoid
    with pytest.raises(ValueError, match="multilabel=True but the model has False"):
        changed.save_pretrained(tmp_path / "changed")


def _with_fingerprints(folder: Path) -> str:
    """Name a fingerprint file in an export's provenance, as jobs/export.py does for a real corpus."""
    meta = json.loads((folder / "config.json").read_text())
    (folder / "pretraining_fingerprints.parquet").write_bytes(b"fingerprints")
    meta["provenance"]["pretraining"]["corpus"]["fingerprints"] = {
        "file": "pretraining_fingerprints.parquet", "sha256": sha256_file(folder / "pretraining_fingerprints.parquet")}
    (folder / "config.json").write_text(json.dumps(meta))
    return (folder / "README.md").read_text()


def test_save_pretrained_carries_the_exports_card_and_fingerprints_only_for_its_weights(tmp_path):
    exported = export_model(V1_EXPORT, tmp_path / "export")
    card = _with_fingerprints(exported)
    enc = Encoder.from_pretrained(exported)
    enc.save_pretrained(tmp_path / "same")
    for name in ("README.md", "pretraining_fingerprints.parquet"):
        assert (tmp_path / "same" / name).read_bytes() == (exported / name).read_bytes(), name
    assert _fingerprints(tmp_path / "same")["file"] == "pretraining_fingerprints.parquet"
    with torch.no_grad():
        next(enc.parameters()).add_(1.0)
    enc.save_pretrained(tmp_path / "same")            # changed weights: neither file describes them
    assert not (tmp_path / "same" / "pretraining_fingerprints.parquet").exists()
    assert (tmp_path / "same" / "README.md").read_text() != card       # the mixin's generic card
    fp = _fingerprints(tmp_path / "same")
    assert fp["file"] is None and "jobs/export.py" in fp["note"]


def _fingerprints(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text())["provenance"]["pretraining"]["corpus"]["fingerprints"]


def test_push_export_uploads_the_whole_export_and_push_to_hub_the_card(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo",
                        lambda self, repo_id, **kw: (calls.append(("create", repo_id, kw))
                                                     or SimpleNamespace(repo_id=repo_id)))

    def upload(self, *, folder_path, allow_patterns=None, **kw):
        files = sorted(p.name for p in Path(folder_path).iterdir()
                       if allow_patterns is None or p.name in allow_patterns)
        calls.append(("upload", kw["repo_id"], files, (Path(folder_path) / "README.md").read_text()))
        return "commit"

    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload)
    exported = export_model(V1_EXPORT, tmp_path / "export")
    card = _with_fingerprints(exported)
    assert push_export(exported, "user/ecg") == "commit"
    assert calls[0][:2] == ("create", "user/ecg") and calls[0][2]["exist_ok"]
    assert calls[1][:3] == ("upload", "user/ecg", ["README.md", "config.json", "model.safetensors",
                                                    "pretraining_fingerprints.parquet"])
    # push_to_hub (the mixin's: save_pretrained into a temporary folder) keeps coreecg's card too
    Encoder.from_pretrained(exported).push_to_hub("user/ecg2")
    assert calls[-1][2] == calls[1][2] and calls[-1][3] == card
    with pytest.raises(TypeError, match="config must be a coreecg Config"):
        Encoder.from_pretrained(exported).save_pretrained(tmp_path / "other", config={"dim": 3})   # never ignored
    assert not (tmp_path / "other").exists()
    (exported / "pretraining_fingerprints.parquet").unlink()
    with pytest.raises(CheckpointError, match="missing pretraining_fingerprints.parquet"):
        push_export(exported, "user/ecg")


def test_a_missing_relative_folder_is_not_mistaken_for_a_hub_id(tmp_path, monkeypatch):
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    def offline(*a, **kw):
        raise LocalEntryNotFoundError("offline")

    monkeypatch.setattr(huggingface_hub.hub_mixin, "hf_hub_download", offline)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "exports").mkdir()
    with pytest.raises(FileNotFoundError, match="exports/ being a local folder") as e:
        Encoder.from_pretrained("exports/core-mimic")       # never reaches the Hub
    assert str(tmp_path / "exports" / "core-mimic") in str(e.value)
    with pytest.raises(FileNotFoundError, match=r"neither a local folder .*user/repo does not exist.*offline"):
        Encoder.from_pretrained("user/repo")                # the Hub tried and failed: both named
