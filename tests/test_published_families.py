"""The eight published families through the two public calls an outside check makes
(docs/published_encoders.md):

    coreecg.load_encoder(FILE).pooled(model_input)  == the original model's embedding.npy
    coreecg.model_input(FILE, raw, fs, leads)[0]    == the original pipeline's model_input.npy

for every file each fixture folder's fixture.json pairs (../shared/fixtures/published/<family>/,
made by each original project's own code: README.md there). Then the refusals: a truncated file,
a missing key and a wrong shape, each a CheckpointError naming the file and the reason; and that
nothing a file names is ever called.

Tolerances (float32 throughout):
- model input: the same scipy/resampy calls on the same float64 input, so ~1e-6 of the signal's
  scale (ECG-CPC's resampy: 7e-7 measured); MODEL_INPUT_ATOL below.
- embedding: the same arithmetic in another order (SDPA, fused convolutions, BatchNorm folded or
  not) differs by float32 rounding, growing with depth: 1e-4 relative to the embedding's scale,
  EMBEDDING_RTOL below; the measured figures are in docs/published_encoders.md.
"""
from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

import coreecg
from coreecg.checkpoints import CheckpointError
from coreecg.loading import open_source
from coreecg.model.published import FAMILIES
from coreecg.model.published.files import Inert, read_published

PUBLISHED = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "published"
FAMILY_NAMES = ("ecgfounder", "merl", "ecgfm_ked", "hubert_ecg", "xecg", "ecg_fm", "ecg_jepa", "ecg_cpc")
MODEL_INPUT_ATOL = 1e-5          # relative to max |model_input|
EMBEDDING_RTOL = 1e-4            # relative to max |embedding|


def _cases() -> list[tuple[str, dict]]:
    out = []
    for name in FAMILY_NAMES:
        meta = json.loads((PUBLISHED / name / "fixture.json").read_text())
        out += [(name, entry) for entry in meta["files"]]
    return out


CASES = _cases()
IDS = [f"{n}:{e['weights']}" for n, e in CASES]


def _raw(folder: Path) -> tuple[np.ndarray, float, list[str]]:
    meta = json.loads((folder / "raw.json").read_text())
    return np.load(folder / "raw.npy"), float(meta["fs"]), list(meta["leads"])


def _weights(name: str, entry: dict) -> Path:
    return (PUBLISHED / name / entry["weights"]).resolve()


def test_every_family_is_registered():
    assert set(FAMILY_NAMES) | {"st_mem"} <= set(FAMILIES)
    for name in FAMILY_NAMES:
        fam = FAMILIES[name]
        assert fam.contract is not None and fam.licence and fam.pretraining and fam.pretrained_on, name


@pytest.mark.parametrize("name,entry", CASES, ids=IDS)
def test_the_loader_reproduces_the_original_embedding(name, entry):
    folder = PUBLISHED / name
    x = torch.from_numpy(np.load(folder / entry["model_input"]))
    expected = np.load(folder / entry["embedding"])
    encoder = coreecg.load_encoder(_weights(name, entry))
    assert not encoder.training and all(p.dtype == torch.float32 for p in encoder.parameters())
    with torch.no_grad():
        got = encoder.pooled(x).numpy()
    assert got.shape == expected.shape and got.dtype == np.float32
    scale = float(np.abs(expected).max())
    assert np.abs(got - expected).max() <= EMBEDDING_RTOL * max(scale, 1e-3), (name, np.abs(got - expected).max())


@pytest.mark.parametrize("name,entry", CASES, ids=IDS)
def test_the_contract_reproduces_the_original_model_input(name, entry):
    folder = PUBLISHED / name
    raw, fs, leads = _raw(folder)
    expected = np.load(folder / entry["model_input"])
    windows = coreecg.model_input(_weights(name, entry), raw, fs, leads)
    assert windows.dtype == np.float32 and windows.shape[1:] == expected.shape[1:]
    scale = float(np.abs(expected).max())
    assert np.abs(windows[:1] - expected).max() <= MODEL_INPUT_ATOL * scale
    # the contract's own account of itself matches what it does
    described = coreecg.load_model(_weights(name, entry)).contract["encoder"]["input"]
    assert described["shape"][1:] == list(expected.shape[1:])
    # the leads are picked by name: the same recording in another row order gives the same windows
    order = np.random.default_rng(0).permutation(len(leads))
    shuffled = coreecg.model_input(_weights(name, entry), raw[order], fs, [leads[i] for i in order])
    np.testing.assert_array_equal(shuffled, windows)


# ---------------------------------------------------------------------------- refusals


def _copy(name: str, entry: dict, tmp: Path) -> Path:
    """The fixture's weights (file and sidecar yaml, or the folder) copied under tmp."""
    src = _weights(name, entry)
    if src.is_dir():
        dst = tmp / name
        shutil.copytree(src, dst)
        return dst
    for f in src.parent.glob(f"config_{src.stem}*.yaml"):
        shutil.copy(f, tmp / f.name)
    shutil.copy(src, tmp / src.name)
    return tmp / src.name


def _inert(v) -> bool:
    return isinstance(v, Inert) or (isinstance(v, type) and issubclass(v, Inert))


def _plain(obj):
    """A payload with its inert placeholders (and references to their classes) dropped: what
    torch.save can write again."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items() if not _inert(v)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(v) for v in obj if not _inert(v))
    return obj


def _rewrite(path: Path, edit) -> None:
    """Rewrite the tensors of a published file or folder with `edit(state) -> state`, in its container."""
    if path.is_dir():
        file = path / "model.safetensors"
        save_file(edit(load_file(str(file))), str(file))
        return
    entries = _plain(read_published(path).entries)
    # the container: the dict entry holding the most tensors (state_dict, model, encoder), or the file itself
    holders = [k for k, v in entries.items() if isinstance(v, dict)
               and sum(torch.is_tensor(t) for t in v.values()) > 0]
    if holders:
        key = max(holders, key=lambda k: sum(torch.is_tensor(t) for t in entries[k].values()))
        entries[key] = edit(dict(entries[key]))
    else:
        entries = edit(entries)
    torch.save(entries, path)


def _encoder_keys(path: Path) -> list[str]:
    return list(open_source(path).state)


@pytest.mark.parametrize("name,entry", CASES, ids=IDS)
def test_a_truncated_file_a_missing_key_and_a_wrong_shape_are_refused_by_name(name, entry, tmp_path):
    path = _copy(name, entry, tmp_path)
    keys = _encoder_keys(path)
    # a key deep in the backbone: its full name in the file ends with the encoder's name for it
    target = keys[len(keys) // 2]

    def drop(state):
        hit = [k for k in state if k == target or k.endswith("." + target)]
        assert hit, target
        return {k: v for k, v in state.items() if k != hit[0]}

    def widen(state):
        hit = [k for k in state if (k == target or k.endswith("." + target))]
        t = state[hit[0]]
        return {**state, hit[0]: torch.zeros(t.shape[0] + 3, *t.shape[1:]) if t.ndim else torch.zeros(3)}

    _rewrite(path, drop)
    with pytest.raises(CheckpointError) as e:
        coreecg.load_encoder(path)
    message = str(e.value)
    assert str(path if path.is_file() else path / "model.safetensors") in message or str(path) in message
    assert target.split(".")[-2] in message or "issing" in message, message

    (tmp_path / "shape").mkdir()
    path = _copy(name, entry, tmp_path / "shape")
    _rewrite(path, widen)
    with pytest.raises(CheckpointError) as e:
        coreecg.load_encoder(path)
    assert str(path) in str(e.value) and ("shape" in str(e.value) or "size" in str(e.value)), str(e.value)

    trunc = tmp_path / "trunc"
    trunc.mkdir()
    cut = _copy(name, entry, trunc)
    file = cut / "model.safetensors" if cut.is_dir() else cut
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="unreadable"):
        coreecg.load_encoder(cut)


def test_nothing_a_file_names_is_called(tmp_path):
    """A pickle that would run a command, beside real tensors: read as data (an inert placeholder),
    then refused; the command never runs."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (shutil.copy, (__file__, str(marker)))

    entries = {"state_dict": {"w": torch.zeros(2)}, "hook": Evil()}
    (tmp_path / "evil.pth").write_bytes(b"")
    torch.save(entries, tmp_path / "evil.pth", pickle_module=pickle)
    read = read_published(tmp_path / "evil.pth")
    assert "shutil.copy" in read.inert and isinstance(read.entries["hook"], Inert)
    with pytest.raises(CheckpointError, match="evil.pth: neither a coreecg checkpoint"):
        coreecg.load_encoder(tmp_path / "evil.pth")
    assert not marker.exists()


# ---------------------------------------------------------------------------- the contract in fine-tuning

RECORDS = 60
LAYOUTS = ("ecg_jepa", "merl", "xecg", "hubert_ecg")   # a lead subset, another lead order, time-major, flat


def _contract_corpus(out: Path, family: str) -> Path:
    """A small labelled synthetic corpus built under `family`'s contract, without a cluster."""
    import ray.data

    from coreecg.config import load_config
    from coreecg.data.pipeline import build_corpus
    from tests.helpers import InProcessDataset

    cfg = load_config(overrides=["data.shard_records=30", "data.split_ratios=[0.6,0.2,0.2]",
                                 f"data.preprocess.contract={family}"]).data
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        build_corpus("synthetic", None, out, cfg, source_options=cfg.sources.for_source("synthetic", RECORDS),
                     log_warnings=False)
    return out


@pytest.mark.parametrize("name", LAYOUTS)
def test_fine_tuning_feeds_the_encoder_its_own_contract(name, tmp_path):
    """A corpus built with data.preprocess.contract=<family> stores the contract's windows (float16),
    and the fine-tuning plan and classifier feed them to the encoder exactly as the original pipeline's
    model input: the same pooled feature as encoder.pooled(model_input) on that record."""
    from coreecg.config import load_config
    from coreecg.data.corpus import decode_signals, read_shard, split_files
    from coreecg.data.sources import get_source
    from coreecg.model.classifier import Classifier
    from coreecg.train.finetune_plan import FinetuneError, plan_finetune, preprocess_mismatch

    entry = dict(CASES)[name]
    weights = _weights(name, entry)
    fam = FAMILIES[name]
    corpus = _contract_corpus(tmp_path / "corpus", name)
    manifest = json.loads((corpus / "manifest.json").read_text())
    assert manifest["preprocess"]["contract"] == name and manifest["signal"]["leads"] == list(fam.contract.leads)
    assert manifest["signal"]["shape"] == [len(fam.contract.leads), fam.contract.stored_samples()]
    # the stored windows are the contract's on the raw record (float16 storage)
    source = get_source("synthetic", **load_config().data.sources.for_source("synthetic", RECORDS))
    table = read_shard(split_files(corpus, "train")[0], ["record_id", "signal"])
    stored = decode_signals(table["signal"], manifest["signal"]["shape"])[0]
    ref = next(r for r in source.list_records(None) if r.record_id == table["record_id"][0].as_py())
    record = source.read(ref)
    raw_windows = fam.contract.windows(record.signal, record.fs, record.lead_names)
    np.testing.assert_allclose(stored, raw_windows[0], atol=1e-3 * max(1.0, float(np.abs(raw_windows).max())))

    plan = plan_finetune(load_config(overrides=[f"data.corpus={corpus}", f"finetune.encoder={weights}",
                                                f"train.storage_path={tmp_path}", "train.name=ft",
                                                "finetune.batch_size=8", "train.num_workers=1"]))
    assert plan.config.finetune.leads == fam.contract.leads and plan.config.finetune.eval_crops == 1
    assert plan.config.data.crop_samples == fam.contract.stored_samples()
    encoder = coreecg.load_encoder(weights)
    classifier = Classifier(encoder, 3, plan.config.finetune.leads, True).eval()
    x = torch.from_numpy(stored[None])
    with torch.no_grad():
        via_corpus = classifier.features(x)
        direct = encoder.pooled(torch.from_numpy(fam.contract.to_model(stored[None])))
    torch.testing.assert_close(via_corpus, direct, atol=1e-5, rtol=0)

    # a corpus of coreecg's own preprocessing is refused, naming the build that fixes it
    standard = {**manifest, "preprocess": load_config().data.preprocess.settings()}
    with pytest.raises(FinetuneError, match=f"coreecg's preprocessing.*--set data.preprocess.contract={name}"):
        preprocess_mismatch(open_source(weights).config.data.preprocess, standard, corpus)


# ---------------------------------------------------------------------------- the study of the field's models

STUDIES = Path(__file__).resolve().parents[1] / "studies"


def test_the_foundation_model_studies_hold_every_family():
    """Both study files name every family (and ST-MEM and coreecg's own rows) and read before Ray:
    every weights file opened, each published encoder's contract a declared difference."""
    from coreecg.study.spec import load_study

    tiny = load_study(STUDIES / "foundation_models_tiny.yaml")
    archs = {coreecg.load_model(p).config.model.arch for p in tiny.encoders.values()}
    assert archs == set(FAMILY_NAMES) | {"st_mem"}
    assert {"Supervised", "CoRe-ECG"} <= set(tiny.methods) and {g.modes for g in tiny.grids} == {
        ("linear", "frozen", "finetune")}
    allowed = {v for a in tiny.allow if "data.preprocess.*" in a.keys for v in a.variants}
    assert allowed == {n for n, p in tiny.encoders.items() if coreecg.load_model(p).config.data.preprocess.contract}


@pytest.mark.slow
def test_the_tiny_study_runs_to_its_report_with_the_declared_overlap_marked(ray_session, tmp_path):
    """A cut of studies/foundation_models_tiny.yaml (CI time): ECG-FM's fine-tuned weights (declared
    on PhysioNet/CinC 2021, which holds PTB-XL), MERL's (MIMIC-IV-ECG; its own lead order) and
    ECG-JEPA's (8 leads) on PTB-XL superdiagnostic, linear probe; each on its own contract corpus,
    built once by the study."""
    import os
    import subprocess
    import sys

    import yaml

    spec = yaml.safe_load((STUDIES / "foundation_models_tiny.yaml").read_text())
    spec.pop("pretrain")
    keep = ["ECG-FM (fine-tuned)", "MERL (ResNet18)", "ECG-JEPA"]
    spec["downstream"]["encoders"] = {k: str((STUDIES / v).resolve()) for k, v in spec["downstream"]["encoders"].items()
                                      if k in keep}
    spec["downstream"].update(methods=keep, modes=["linear"])
    spec["downstream"]["corpora"] = {"ptbxl-super": {**spec["downstream"]["corpora"]["ptbxl-super"],
                                                     "input": str((STUDIES / "../../shared/ecg-data/ptbxl").resolve())}}
    spec["config"] = str((STUDIES / spec["config"]).resolve())
    spec["variants"] = str((STUDIES / spec["variants"]).resolve())
    spec["report"]["published"] = [str((STUDIES / p).resolve()) for p in spec["report"]["published"]]
    path = tmp_path / "fm.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    out = tmp_path / "out"
    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    done = subprocess.run([sys.executable, "jobs/study.py", str(path), "--output", str(out)], cwd=STUDIES.parent,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in (out / "corpora").iterdir()) == ["ptbxl-super", "ptbxl-super@ecg_fm",
                                                                   "ptbxl-super@ecg_jepa", "ptbxl-super@merl"]
    table = (out / "report" / "tables" / "benchmark.md").read_text()
    fm = next(line for line in table.splitlines() if line.startswith("| ECG-FM (fine-tuned) |"))
    merl = next(line for line in table.splitlines() if line.startswith("| MERL (ResNet18) |"))
    assert fm.rstrip(" |").endswith("‡") and not merl.rstrip(" |").endswith("‡")
    assert "‡ ECG-FM (fine-tuned): declared overlap" in table and "contains the downstream ptbxl" in table
    assert "each published encoder is fed its own input contract (" in table and "MERL (ResNet18): merl" in table
    # ECG-JEPA's 8 leads are every lead its model takes: its row is in the 12-lead table, said so
    assert any(line.startswith("| ECG-JEPA |") for line in table.splitlines())
    assert "ECG-JEPA: I,II,V1,V2,V3,V4,V5,V6" in table
    for run in (out / "runs" / "finetune").iterdir():
        metrics = json.loads((run / "metrics.json").read_text())
        family = {"ECG-FM (fine-tuned)": "ecg_fm", "MERL (ResNet18)": "merl", "ECG-JEPA": "ecg_jepa"}[metrics["method"]]
        assert metrics["corpus"].endswith(f"ptbxl-super@{family}")
        assert metrics["lead_names"] == list(FAMILIES[family].contract.leads)


@pytest.mark.parametrize("name", ["hubert_ecg", "ecgfounder"])
def test_an_export_states_the_family_contract_licence_and_commercial_use(name, tmp_path):
    """The contract travels into an export: config.json's input names the family's steps (not
    coreecg's filter) and whether the weights may be used commercially; the card says the same."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("export_job", STUDIES.parent / "jobs" / "export.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    entry = dict(CASES)[name]
    assert job.main(["--model", str(_weights(name, entry)), "--output", str(tmp_path / "exp")]) == 0
    meta = json.loads((tmp_path / "exp" / "config.json").read_text())
    enc = meta["input"]["encoder"]
    fam = FAMILIES[name]
    assert enc["arch"] == name and enc["commercial_use"] is fam.commercial_use is False
    assert enc["input"]["steps"] == [s.describe() for s in fam.contract.steps]
    bandpass = meta["input"]["bandpass"]
    assert bandpass["highpass_hz"] is None and "declared contract" in bandpass["filter"]
    card = (tmp_path / "exp" / "README.md").read_text()
    assert "non-commercial weights" in card and fam.contract.steps[0].describe() in card
    assert "Butterworth, order 4 per stage" not in card
    # the export loads back as the same family, its contract intact
    assert coreecg.load_model(tmp_path / "exp").contract["encoder"]["input"] == enc["input"]


def test_a_published_models_own_lead_set_enters_the_12_lead_tables(tmp_path):
    """ECG-JEPA's 8 leads are every lead its model takes: its runs sit in the label-efficiency and
    benchmark tables' 12-lead columns, said under them; an 8-lead run of another encoder does not."""
    from coreecg.eval.runs import Run
    from coreecg.eval.tables.benchmark import benchmark_table, table_markdown
    from coreecg.eval.tables.label_efficiency import contract_leads_note, label_efficiency_runs

    jepa_leads = ",".join(FAMILIES["ecg_jepa"].contract.leads)
    record = {"test": {"auroc": 0.7, "ci": {}}, "contract_leads": True}
    jepa = Run(tmp_path / "a", "ECG-JEPA", "ptbxl-super", "linear", jepa_leads, 1.0, 0, record)
    subset = Run(tmp_path / "b", "CoRe-ECG", "ptbxl-super", "linear", jepa_leads, 1.0, 0, {"test": {"auroc": 0.6}})
    kept = label_efficiency_runs([jepa, subset])
    assert [(r.method, r.leads) for r in kept] == [("ECG-JEPA", "12")]
    assert contract_leads_note([jepa, subset]) == [f"Leads: every lead the model takes, by its own input contract: "
                                                   f"ECG-JEPA: {jepa_leads}."]
    table = benchmark_table([jepa, subset])
    assert list(table.cells) == ["ECG-JEPA"] and table.left_out == 1
    assert f"ECG-JEPA: {jepa_leads}" in table_markdown(table)
