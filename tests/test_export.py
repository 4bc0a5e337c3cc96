"""Weights out (coreecg.hub, jobs/export.py): an export reloads to the very same model, carries its
input contract and model card, runs in onnxruntime, refuses corrupted weights, and the job's
exit codes."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import coreecg
from coreecg.eval.downstream import eval_offsets
from coreecg.hub import FORMAT_VERSION, export_model, export_onnx, load_classifier, load_encoder, load_model
from coreecg.methods import CoReECG
from coreecg.model.classifier import Classifier
from coreecg.checkpoints import CheckpointError, save_checkpoint, save_encoder
from tests.helpers import tiny_config

REPO = Path(__file__).resolve().parents[1]
# Off the paper defaults on purpose: the contract must follow the config, not repeat the defaults.
SHAPE = ["model.input_samples=1500", "data.crop_samples=1500", "data.preprocess.highpass_hz=0.5",
         "data.preprocess.lowpass_hz=45.0", "data.preprocess.filter_order=2", "data.preprocess.zscore_eps=1e-5"]
CLASSES = ["NORM", "MI", "STTC"]
LEADS = ["I", "II", "V1"]


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A pretraining run folder (encoder.pt written as pretraining writes it), a fine-tuning run
    folder (best.pt as fine-tuning writes it, metrics.json), and their exports."""
    root = tmp_path_factory.mktemp("export")
    torch.manual_seed(0)
    cfg = tiny_config(*SHAPE)
    core = CoReECG(cfg)
    pre = root / "pretrain"
    save_encoder(pre / "encoder.pt", core, cfg, step=4, metrics={"loss": 1.0})

    fcfg = tiny_config(*SHAPE, f"finetune.encoder={pre / 'encoder.pt'}", f"finetune.leads=[{','.join(LEADS)}]",
                       "finetune.eval_crops=3")
    clf = Classifier(load_encoder(pre / "encoder.pt"), len(CLASSES), LEADS, multilabel=True)
    torch.nn.init.normal_(clf.head.bias)      # a non-zero head, as after training
    ft = root / "finetune"
    save_checkpoint(ft / "best.pt", clf.state_dict(), fcfg, task="finetune", epoch=2, step=9, val={"val_auroc": 0.8})
    ci = {k: {"low": lo, "high": hi, "undefined_resamples": 0}
          for k, lo, hi in (("acc", 0.71, 0.83), ("f1", 0.52, 0.66), ("auroc", 0.81, 0.93))}
    (ft / "metrics.json").write_text(json.dumps({
        "method": "CoRe-ECG", "dataset": "ptbxl", "mode": "finetune", "leads": "I,II,V1", "lead_names": LEADS,
        "train_fraction": 1.0, "seed": 0, "multilabel": True, "class_names": CLASSES,
        "selection": {"metric": "validation macro AUROC (one-vs-rest)", "best_epoch": 2, "epochs": 3},
        "test": {"acc": 0.77, "f1": 0.59, "auroc": 0.874, "n": 50, "patients": 41, "ci": ci}}))
    return {"cfg": cfg, "fcfg": fcfg, "encoder": core.encoder.eval(), "classifier": clf.eval(), "pre": pre, "ft": ft,
            "enc_export": export_model(pre, root / "enc-export"), "clf_export": export_model(ft, root / "clf-export")}


@pytest.fixture(scope="module")
def others(tmp_path_factory):
    """Exports of encoders other than the ViT, as pretraining writes them: the plugin tiny ResNet
    (BatchNorm: float and int64 buffers), S4 and xresnet1d -> {arch: (export folder, encoder)}."""
    from coreecg.config import load_config
    from coreecg.methods import build_method
    from tests.test_encoders import ENCODERS, MOCO

    root = tmp_path_factory.mktemp("others")
    made = {}
    for arch, sizes in {"tiny_resnet": ["plugins=[tests.plugin_encoder]", "model.arch=tiny_resnet"],
                        **ENCODERS}.items():
        cfg = load_config(overrides=[*sizes, *MOCO])
        torch.manual_seed(0)
        method = build_method(cfg)
        save_encoder(root / arch / "encoder.pt", method, cfg, step=1)
        made[arch] = (export_model(root / arch, root / f"{arch}-export"), method.encoder)
    return made


def _section(card: str, title: str) -> str:
    return card.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def _same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_encoder_export_reloads_bit_identical(made):
    out, ref = made["enc_export"], made["encoder"]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    x = torch.randn(3, 12, 1500)
    for enc in (load_encoder(out), coreecg.load_encoder(out), coreecg.load_encoder(made["pre"])):
        assert not enc.training
        _same_state(enc, ref)
        with torch.no_grad():
            assert torch.equal(enc(x).tokens, ref(x).tokens)
            assert torch.equal(enc.pooled(x[:, :6]), ref.pooled(x[:, :6]))     # a lead subset too
    loaded = load_model(out)
    assert loaded.kind == "encoder" and loaded.source == out and loaded.config == made["cfg"]
    assert loaded.contract == json.loads((out / "config.json").read_text())["input"]
    assert load_model(made["pre"] / "encoder.pt").contract == loaded.contract     # source and export agree


def test_the_contract_follows_the_corpus_the_weights_saw(made, tmp_path):
    """A corpus built under other preprocessing settings than the run's config: its manifest wins,
    in the contract and in the exported config alike; the card names the corpus's source."""
    import dataclasses

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    built = dataclasses.replace(made["cfg"].data.preprocess, highpass_hz=0.3, filter_order=3)
    (corpus / "manifest.json").write_text(json.dumps({
        "source": "ptbxl", "class_names": CLASSES, "multilabel": True, "preprocess": dataclasses.asdict(built),
        "signal": {"shape": [12, built.window_samples]}, "counts": {"records_written": 21}}))
    cfg = tiny_config(*SHAPE, f"data.corpus={corpus}")
    save_encoder(tmp_path / "run" / "encoder.pt", CoReECG(cfg), cfg)
    loaded = load_model(tmp_path / "run")
    assert loaded.config.data.preprocess == built
    assert (loaded.contract["bandpass"]["highpass_hz"], loaded.contract["bandpass"]["order"]) == (0.3, 3)
    out = export_model(tmp_path / "run", tmp_path / "export")
    assert load_model(out).contract == loaded.contract and load_model(out).config == loaded.config
    assert "| PTB-XL | CC BY 4.0 | https://physionet.org/content/ptb-xl/ | yes |" in (out / "README.md").read_text()


def test_a_pretraining_checkpoint_with_a_head_is_an_encoder(tmp_path):
    """CMSC's projection is called head too: the checkpoint's task, not its keys, decides."""
    from coreecg.methods import build_method

    cfg = tiny_config(*SHAPE, "pretrain.method=cmsc")
    method = build_method(cfg)
    assert any(k.startswith("head.") for k in method.state_dict())
    path = save_checkpoint(tmp_path / "checkpoint.pt", method, cfg, task="pretrain", epoch=0)
    loaded = load_model(path)
    assert loaded.kind == "encoder"
    _same_state(loaded.model, method.encoder)


def test_classifier_export_reloads_bit_identical_with_its_task(made):
    out, ref = made["clf_export"], made["classifier"]
    x = torch.randn(2, len(LEADS), 1500)
    with torch.no_grad():
        want = ref(x)["logits"]
        for clf in (load_classifier(out), coreecg.load_classifier(made["ft"]), load_classifier(made["ft"] / "best.pt")):
            assert not clf.training and clf.leads == tuple(LEADS) and clf.multilabel
            _same_state(clf, ref)
            assert torch.equal(clf(x)["logits"], want)
        assert torch.equal(load_encoder(out).pooled(x, ref.lead_idx), ref.encoder.pooled(x, ref.lead_idx))
    loaded = coreecg.load_model(out)
    c = loaded.contract
    assert loaded.kind == "classifier" and c["class_names"] == CLASSES and c["task"] == "multi-label"
    assert c["finetuned_leads"] == LEADS and c["leads"] == LEADS
    assert c["aggregation"]["eval_crops"] == 3 and c["aggregation"]["crop_offsets"] == eval_offsets(2500, 1500, 3)
    with pytest.raises(CheckpointError, match="not a fine-tuned classifier"):
        load_classifier(made["enc_export"])


def test_config_json_carries_the_contract_from_the_config_and_the_card_names_method_and_licences(made):
    meta = json.loads((made["enc_export"] / "config.json").read_text())
    p = made["cfg"].data.preprocess
    c = meta["input"]
    assert meta["kind"] == "encoder" and meta["format_version"] == FORMAT_VERSION
    assert meta["coreecg_version"] == coreecg.__version__
    assert (c["sampling_rate"], c["window_samples"]) == (p.sampling_rate, 1500)
    assert c["window_seconds"] == 1500 / p.sampling_rate
    assert (c["stored_window_samples"], c["patch_size"]) == (p.window_samples, made["cfg"].patch_size)
    assert c["leads"] == list(p.leads)
    assert (c["bandpass"]["highpass_hz"], c["bandpass"]["lowpass_hz"], c["bandpass"]["order"]) == (0.5, 45.0, 2)
    assert c["normalisation"]["method"] == "z-score" and c["normalisation"]["eps"] == 1e-5
    arch = meta["architecture"]         # the encoder's own sizes beside its class, title and width
    assert arch["options"]["embed_dim"] == arch["width"] == 32 and arch["title"].startswith("CoRe-ECG ViT")
    assert meta["config"] == made["cfg"].to_dict()

    card = (made["enc_export"] / "README.md").read_text()
    assert "CoRe-ECG" in card and "pretrain.method=core" in card
    assert "Not a medical device" in card
    for licence in ("CC BY 4.0", "ODbL 1.0"):
        assert licence in card
    fcard = (made["clf_export"] / "README.md").read_text()
    assert "| AUROC (macro, one-vs-rest) | 87.4 | [81.0, 93.0] |" in fcard     # metrics.json's test + ci
    assert "NORM, MI, STTC" in fcard and "pretrain.method=core" in fcard      # read from the encoder's own config


@pytest.mark.filterwarnings("ignore::FutureWarning")      # torch.export's own internals
@pytest.mark.parametrize("kind", ["encoder", "classifier"])
def test_onnx_matches_pytorch_for_any_batch_size(made, tmp_path, kind):
    import onnxruntime as ort

    if kind == "encoder":
        model = made["encoder"]
        file = export_onnx(model, tmp_path / "model.onnx", "encoder")
        forward = lambda x: (model.pooled(x), model(x).tokens)                  # noqa: E731
    else:
        model = made["classifier"]
        file = export_onnx(made["clf_export"], tmp_path / "model.onnx", "classifier")   # from the export folder
        forward = lambda x: (model(x)["logits"],)                               # noqa: E731
    session = ort.InferenceSession(str(file), providers=["CPUExecutionProvider"])
    leads = 12 if kind == "encoder" else len(LEADS)
    for batch in (1, 3):
        x = torch.randn(batch, leads, 1500)
        got = session.run(None, {"ecg": x.numpy()})
        with torch.no_grad():
            want = forward(x)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape) and g.shape[0] == batch
            np.testing.assert_allclose(g, w.numpy(), atol=1e-4, rtol=0)


def test_corrupted_weights_are_refused_naming_the_file(made, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(made["enc_export"], bad)
    weights = bad / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF           # one flipped byte inside a tensor: still parses as safetensors
    weights.write_bytes(bytes(data))
    for load in (load_model, load_encoder):
        with pytest.raises(CheckpointError, match="corrupted") as e:
            load(bad)
        assert str(weights) in str(e.value)


def _job(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "jobs/export.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=180)


def test_export_job_exit_codes_and_output(made, tmp_path):
    missing = tmp_path / "no-such-run"
    done = _job("--model", str(missing), "--output", str(tmp_path / "x"))
    assert done.returncode == 2 and str(missing) in done.stderr
    assert not (tmp_path / "x").exists()

    out = tmp_path / "exported"
    done = _job("--model", str(made["ft"]), "--output", str(out))
    assert done.returncode == 0, done.stderr
    assert str(out / "model.safetensors") in done.stdout
    assert json.loads((out / "config.json").read_text())["input"]["class_names"] == CLASSES
    with torch.no_grad():
        x = torch.randn(2, len(LEADS), 1500)
        assert torch.equal(load_classifier(out)(x)["logits"], made["classifier"](x)["logits"])


def test_the_parameter_count_is_the_parameters_and_the_buffers_are_apart(made, others):
    """BatchNorm's running statistics are in the file but are not parameters (a plugin CNN's card
    counted them as such)."""
    for folder, model in [others["tiny_resnet"], others["xresnet1d"], (made["clf_export"], made["classifier"])]:
        weights = json.loads((folder / "config.json").read_text())["weights"]
        params = sum(p.numel() for p in model.parameters())
        norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        buffers = sum(2 * m.num_features + 1 for m in norms)       # running mean, variance; a step counter
        assert weights["parameters"] == params
        assert weights["buffers"] == buffers
        line = (folder / "README.md").read_text().split("Weights: `model.safetensors`")[1].split("\n")[0]
        assert f", {params:,} parameters" in line
        assert (f"{buffers:,} buffer values" in line) == (buffers > 0), line


def test_the_docs_state_the_dtypes_an_export_writes(others):
    """docs/export.md's model.safetensors row against a plugin CNN's file: parameters, float
    buffers and integer buffers (BatchNorm's num_batches_tracked) each at the dtype the docs give."""
    from safetensors.torch import load_file

    folder, model = others["tiny_resnet"]
    state = load_file(folder / "model.safetensors")
    named = dict(model.named_parameters())
    kinds: dict[str, set[str]] = {"parameters": set(), "float buffers": set(), "integer buffers": set()}
    for key, tensor in state.items():
        kind = ("parameters" if key in named else "float buffers" if tensor.is_floating_point()
                else "integer buffers")
        kinds[kind].add(str(tensor.dtype).removeprefix("torch."))
    assert all(len(dtypes) == 1 for dtypes in kinds.values()), kinds     # the file holds each kind
    docs = (REPO / "docs" / "export.md").read_text()
    row = next(line for line in docs.splitlines() if line.startswith("| `model.safetensors` |"))
    for kind, (dtype,) in kinds.items():
        assert f"{kind} `{dtype}`" in row, (kind, dtype, row)
    assert "num_batches_tracked" in row and state["blocks.0.conv.1.num_batches_tracked"].dtype == torch.int64
    meta = json.loads((folder / "config.json").read_text())
    assert meta["weights"]["dtypes"] == sorted(set().union(*kinds.values()))


def test_a_plugin_models_card_says_its_module_must_be_importable(made, others, monkeypatch):
    """The card names the plugin module (config.json's config.plugins) and the failure a loader
    without it gives; that failure is the loader's."""
    folder, _ = others["tiny_resnet"]
    meta = json.loads((folder / "config.json").read_text())
    assert meta["config"]["plugins"] == ["tests.plugin_encoder"]
    assert meta["architecture"]["class"] == "tests.plugin_encoder.TinyResNet"
    how = _section((folder / "README.md").read_text(), "How to load").lstrip()
    assert how.startswith("**Code outside coreecg.**")                 # before the code that needs it
    assert "`tests.plugin_encoder`, which defines the encoder `tests.plugin_encoder.TinyResNet`" in how
    assert "importable" in how and "PYTHONPATH" in how and "pip install" in how and "from_pretrained" in how
    quoted = how.split("loading stops with `")[1].split("`")[0]
    monkeypatch.setitem(sys.modules, "tests.plugin_encoder", None)        # not importable here
    with pytest.raises(CheckpointError) as e:
        load_encoder(folder)
    assert quoted in str(e.value) and quoted == "plugins: cannot import 'tests.plugin_encoder'"
    for built_in in (made["enc_export"], others["s4"][0]):
        assert "Code outside coreecg" not in (built_in / "README.md").read_text()


@pytest.mark.parametrize("arch", ["coreecg", "classifier", "tiny_resnet", "s4", "xresnet1d"])
def test_the_card_states_each_size_once(made, others, arch):
    """The encoder's sentence gives its own sizes once each (the plugin's card said "width 16"
    twice); the input's crop and rate are stated once (the preprocessing and a classifier's record
    rule used to repeat them)."""
    folder = {"coreecg": made["enc_export"], "classifier": made["clf_export"]}.get(arch) or others[arch][0]
    card = (folder / "README.md").read_text()
    meta = json.loads((folder / "config.json").read_text())
    sentence = card.split("\n# ", 1)[1].split("\n\n")[1]
    if arch in ("coreecg", "classifier"):
        assert sentence.count("width") == 1 and "transformer" in sentence
    else:
        assert re.findall(r"; (\w+) ", sentence) == list(meta["architecture"]["options"]), sentence
    c, section = meta["input"], _section(card, "Input")
    assert section.count(str(c["window_samples"])) == 1 and section.count(f"{c['sampling_rate']} Hz") == 1
    assert section.count(str(c["stored_window_samples"])) == 1 and "resampling to the input's rate" in section
    if arch == "classifier":                     # the record rule is there, by its offsets
        assert f"offsets {c['aggregation']['crop_offsets']}" in section
