"""The leakage guard (docs/leakage.md) on real shared PTB-XL records: copies written in CinC 2021's
format (.mat + .hea) under other names, another gain, shuffled (and, for two, mislabelled) leads
are found by jobs/overlap.py; a fine-tuning whose encoder was pretrained on them is refused (exit
2) naming records; --allow-overlap records the overlap; an export carries the fingerprints so the
check works when the corpus is gone; corpora without copies show none."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
import wfdb

from coreecg.checkpoints import save_encoder
from coreecg.config import STANDARD_LEADS, load_config
from coreecg.data.fingerprints import FINGERPRINT_FILE, corpus_fingerprints, fingerprint_stamp, window_fingerprints
from coreecg.data.overlap import LeakageError, compare
from coreecg.data.reading import read_split
from coreecg.files import sha256_file
from tests.helpers import TINY, tiny_config

REPO = Path(__file__).resolve().parents[1]
COPIES = 16                   # copied records: val/test records of the PTB-XL corpus first, then train
MISLABELLED = 2               # of them, leads permuted in the data but named in the standard order


def write_cinc_copy(record: Path, folder: Path, name: str, order: np.ndarray, names: list[str]) -> None:
    """A shared PTB-XL record as CinC 2021 stores one: int16 `val` in a MATLAB v4 file (the
    WFDB format '16+24'), here at 500 adu/mV (PTB-XL: 1000) and in the lead `order`, its leads
    named `names` in the header."""
    rec = wfdb.rdrecord(str(record))
    digital = np.round(rec.p_signal[:, order].T * 500.0).astype(np.int16)
    scipy.io.savemat(folder / f"{name}.mat", {"val": digital}, format="4")
    lines = [f"{name} 12 {rec.fs:g} {digital.shape[1]}"]
    lines += [f"{name}.mat 16+24 500/mV 16 0 {int(digital[i, 0])} 0 0 {names[i]}" for i in range(12)]
    lines += ["# Age: 50", "# Sex: Male", "# Dx: 426783006", "# Rx: Unknown", "# Hx: Unknown", "# Sx: Unknown"]
    (folder / f"{name}.hea").write_text("\n".join(lines) + "\n")


def _ptbxl_file(ecg_data: Path, record_id: str) -> Path:
    i = int(record_id)
    return ecg_data / "ptbxl" / "records500" / f"{i // 1000 * 1000:05d}" / f"{i:05d}_hr"


@pytest.fixture(scope="module")
def corpora(ray_session, ecg_data, tmp_path_factory):
    """ptbxl (the shared records), copies (CinC-format copies of some under other names) and
    cpsc2018 (no PTB-XL record), built as jobs/preprocess.py builds them."""
    from coreecg.data.pipeline import build_corpus

    root = tmp_path_factory.mktemp("leak")
    cfg = load_config(overrides=["data.shard_records=64"]).data
    build_corpus("ptbxl", ecg_data / "ptbxl", root / "ptbxl", cfg, source_options=cfg.sources.for_source("ptbxl", 0))
    ids = {s: list(dict.fromkeys(read_split(root / "ptbxl", s, ["record_id"])["record_id"]))
           for s in ("val", "test", "train")}
    chosen = (ids["val"][:5] + ids["test"][:5] + ids["train"])[:COPIES]
    raw = root / "cinc-copies"
    raw.mkdir()
    rng = np.random.default_rng(0)
    for i, rid in enumerate(chosen):
        order = rng.permutation(12)
        names = list(STANDARD_LEADS) if i < MISLABELLED else [STANDARD_LEADS[j] for j in order]
        write_cinc_copy(_ptbxl_file(ecg_data, rid), raw, f"E9{i:04d}", order, names)
    build_corpus("cinc2021", raw, root / "copies", cfg, source_options={"class_map": "none"})
    build_corpus("cpsc2018", ecg_data / "cpsc2018-cinc2020", root / "cpsc", cfg,
                 source_options=cfg.sources.for_source("cpsc2018", 0))
    # what the guard must name: val/test records of ptbxl whose copy is in the copies' train split
    # (pretraining trains on that split only)
    trained = set(read_split(root / "copies", "train", ["record_id"])["record_id"])
    guarded = [rid for i, rid in enumerate(chosen) if rid in ids["val"] + ids["test"] and f"E9{i:04d}" in trained]
    assert guarded, "no copy of a val/test record in the copies' train split: pick other records"
    return {"root": root, "chosen": chosen, "guarded": guarded}


def _encoder(folder: Path, corpus: Path | str) -> Path:
    """An encoder.pt as pretraining writes it, its config naming `corpus` (no training needed)."""
    from coreecg.methods import CoReECG

    torch.manual_seed(0)
    cfg = tiny_config(f"data.corpus={corpus}")
    return save_encoder(folder / "encoder.pt", CoReECG(cfg), cfg, step=1)


def _ft_config(tmp: Path, corpus: Path, encoder: Path | str, *extra: str):
    return load_config(overrides=[*TINY, f"data.corpus={corpus}", f"finetune.encoder={encoder}", "finetune.epochs=1",
                                  "finetune.batch_size=16", "finetune.bootstrap_resamples=0",
                                  "finetune.tsne_max_points=0", "train.num_workers=1", "train.checkpoint_every_steps=0",
                                  "train.figures=false", f"train.storage_path={tmp}", "train.name=ft", *extra])


def _env() -> dict[str, str]:
    # PYTHONPATH: the job imports this checkout's coreecg; RAY_ADDRESS (set by ray_session): the
    # session's cluster, not a start-up of its own.
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_fingerprints_are_blind_to_gain_offset_and_lead_order_but_not_to_another_window():
    x = np.random.default_rng(0).standard_normal((2, 12, 2500)).astype(np.float32)
    keys, feats = window_fingerprints(x)
    scaled_keys, scaled = window_fingerprints(3.0 * x + 0.5)
    assert (scaled_keys == keys).all() and np.abs(scaled.astype(int) - feats).max() <= 1
    perm = np.random.default_rng(1).permutation(12)
    assert sorted(window_fingerprints(x[:, perm])[0][0]) == sorted(keys[0])
    assert len(set(keys[0]) & set(keys[1])) == 0
    flat_keys, _ = window_fingerprints(np.zeros((1, 12, 2500), np.float32))
    assert (flat_keys == 0).all()            # a flat lead has no key, so flat leads never match


def test_fingerprints_are_written_with_the_corpus_and_recomputed_when_stale(corpora):
    ptbxl = corpora["root"] / "ptbxl"
    path = ptbxl / FINGERPRINT_FILE
    stamp = fingerprint_stamp(path)
    assert stamp["manifest_sha256"] == sha256_file(ptbxl / "manifest.json")
    before = corpus_fingerprints(ptbxl)
    assert before.num_rows == sum(json.loads((ptbxl / "manifest.json").read_text())["counts"]["windows"].values())
    path.unlink()                         # a corpus from before fingerprints: computed on first use, cached
    assert corpus_fingerprints(ptbxl).equals(before) and path.is_file()


def test_cinc_format_copies_under_other_names_are_found_by_the_overlap_job(corpora, tmp_path):
    root = corpora["root"]
    done = subprocess.run([sys.executable, "jobs/overlap.py", str(root / "copies"), str(root / "ptbxl"),
                           "--output", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=_env())
    assert done.returncode == 0, done.stderr
    assert f"records of B sharing with A: {COPIES} (a patient: 0, a recording: {COPIES})" in done.stdout
    assert "shared patients (same database): 0" in done.stdout
    rows = list(csv.DictReader(open(tmp_path / "overlap.csv")))
    pairs = {(r["a_record"], r["b_record"]) for r in rows}
    assert pairs == {(f"E9{i:04d}", rid) for i, rid in enumerate(corpora["chosen"])}
    assert {r["kind"] for r in rows} == {"signal"} and min(float(r["similarity"]) for r in rows) > 0.98
    # every guarded (val/test) record copied is counted under its split
    per_split = {line.split(":")[0].strip(): line for line in done.stdout.splitlines() if line.startswith("  ")}
    assert per_split["val"].startswith("  val: 5 of") and per_split["test"].startswith("  test: 5 of")


def test_corpora_without_copies_show_no_overlap(corpora, ecg_data):
    root = corpora["root"]
    ptbxl = corpus_fingerprints(root / "ptbxl")
    assert compare(corpus_fingerprints(root / "cpsc"), ptbxl, "cpsc", "ptbxl").counts["b_records"] == 0
    # pretraining on PTB-XL's own train split leaves its val/test splits clean (patient-level splits)
    same = compare(ptbxl, ptbxl, "ptbxl", "ptbxl", splits=("val", "test"), a_splits=("train",))
    assert same.counts["b_records"] == 0
    # ... while the whole corpus against itself is all patient and signal matches
    assert compare(ptbxl, ptbxl, "a", "b").counts["signal_records"] == len(ptbxl.column("record_id").unique())
    assert "warning" not in same.counts
    # fingerprints of corpora preprocessed differently are other numbers: the comparison says so
    meta = dict(ptbxl.schema.metadata)
    meta[b"preprocess"] = meta[b"preprocess"].replace(b'"lowpass_hz": 40.0', b'"lowpass_hz": 45.0')
    other = compare(ptbxl, ptbxl.replace_schema_metadata(meta), "a", "b")
    assert "preprocessed differently (lowpass_hz: 40.0 vs 45.0)" in other.counts["warning"]


def test_finetuning_from_an_encoder_pretrained_on_copies_is_refused_before_training(corpora, tmp_path):
    from coreecg.train.finetuning import plan_finetune

    root = corpora["root"]
    encoder = _encoder(tmp_path / "pre", root / "copies")
    with pytest.raises(LeakageError) as err:
        plan_finetune(_ft_config(tmp_path, root / "ptbxl", encoder))
    message = str(err.value)
    assert f"{len(corpora['guarded'])} record(s) of {root / 'ptbxl'}" in message and "--allow-overlap" in message
    assert all(rid in message for rid in corpora["guarded"])
    assert not (tmp_path / "ft").exists()
    plan = plan_finetune(_ft_config(tmp_path, root / "ptbxl", encoder, "finetune.allow_overlap=true"))
    leak = plan.finetune.meta["leakage"]
    assert (leak["overlap"], leak["allowed"], leak["b_records"]) == (True, True, len(corpora["guarded"]))
    assert set(leak["examples"]) == set(corpora["guarded"])
    assert plan.finetune.overlap_csv.count("\n") == leak["b_records"] + 1
    assert any("warning" in line and "overlap.csv" in line for line in plan.describe())
    clean = plan_finetune(_ft_config(tmp_path, root / "ptbxl", _encoder(tmp_path / "pre-cpsc", root / "cpsc")))
    assert clean.finetune.meta["leakage"]["checked"] and not clean.finetune.meta["leakage"]["overlap"]
    scratch = plan_finetune(_ft_config(tmp_path, root / "ptbxl", "", "finetune.mode=scratch"))
    assert scratch.finetune.meta["leakage"]["checked"] is False        # no encoder, nothing to compare


def test_an_export_carries_the_fingerprints_so_the_check_survives_a_moved_corpus(corpora, tmp_path):
    from coreecg.hub import export_model
    from coreecg.train.finetuning import plan_finetune

    root = corpora["root"]
    moved = tmp_path / "copies"
    shutil.copytree(root / "copies", moved)
    run = tmp_path / "pre"
    _encoder(run, moved)
    export = export_model(run, tmp_path / "export")
    meta = json.loads((export / "config.json").read_text())
    fp = meta["provenance"]["pretraining"]["corpus"]["fingerprints"]
    assert meta["provenance"]["pretraining"]["corpus"]["path"] == str(moved)
    assert fp["sha256"] == sha256_file(export / fp["file"]) and fp["windows"] == COPIES
    shutil.rmtree(moved)                                  # the corpus is gone; the export still knows it
    with pytest.raises(LeakageError, match=f"{len(corpora['guarded'])} record"):
        plan_finetune(_ft_config(tmp_path, root / "ptbxl", export))
    with pytest.raises(LeakageError, match="not here and no fingerprint file travels"):
        plan_finetune(_ft_config(tmp_path, root / "ptbxl", run))
    unchecked = plan_finetune(_ft_config(tmp_path, root / "ptbxl", run, "finetune.allow_overlap=true"))
    assert unchecked.finetune.meta["leakage"]["checked"] is False
    assert any("not checked" in line for line in unchecked.describe())


def test_finetune_job_exits_2_naming_records_and_allow_overlap_records_the_overlap(corpora, tmp_path):
    root = corpora["root"]
    encoder = _encoder(tmp_path / "pre", root / "copies")
    base = [sys.executable, "jobs/finetune.py", "--encoder", str(encoder), "--corpus", str(root / "ptbxl"),
            "--output", str(tmp_path / "ft"), "--set", "finetune.epochs=1", "--set", "finetune.batch_size=16",
            "--set", "finetune.bootstrap_resamples=0", "--set", "finetune.tsne_max_points=0",
            "--set", "train.num_workers=1", "--set", "train.figures=false"]
    refused = subprocess.run(base, cwd=REPO, capture_output=True, text=True, timeout=300, env=_env())
    assert refused.returncode == 2 and corpora["guarded"][0] in refused.stderr, refused.stderr
    assert not (tmp_path / "ft").exists()
    done = subprocess.run([*base, "--allow-overlap"], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    metrics = json.loads((tmp_path / "ft" / "metrics.json").read_text())
    assert metrics["leakage"]["overlap"] and metrics["leakage"]["b_records"] == len(corpora["guarded"])
    listed = {r["b_record"] for r in csv.DictReader(open(tmp_path / "ft" / "overlap.csv"))}
    assert listed == set(corpora["guarded"])
    from coreecg.eval.report import write_report

    table = write_report([tmp_path / "ft"], tmp_path / "tables")[0].read_text()
    assert "‡" in table and "trained with --allow-overlap" in table


def test_a_study_is_stopped_before_training_when_a_pretraining_corpus_leaks(corpora, tmp_path):
    from coreecg.study.runner import check_leakage
    from coreecg.study.spec import study_from_dict

    root = corpora["root"]
    data = {"name": "leaky", "set": [*TINY], "variants": str(REPO / "tune_spaces" / "ablations.yaml"),
            "pretrain": {"methods": ["CoRe-ECG"], "seeds": [0], "set": [f"data.corpus={root / 'copies'}"]},
            "downstream": {"corpora": {"ptbxl": {"path": str(root / "ptbxl")}}, "methods": ["CoRe-ECG"]},
            "report": {"tables": ["comparison"]}}
    with pytest.raises(LeakageError, match=corpora["guarded"][0]):
        check_leakage(study_from_dict(data, tmp_path / "study.yaml"), {"ptbxl": root / "ptbxl"})
    allowed = study_from_dict(data, tmp_path / "study.yaml", ["finetune.allow_overlap=true"])
    check_leakage(allowed, {"ptbxl": root / "ptbxl"})            # each fine-tuning records it instead
    clean = {**data, "pretrain": {**data["pretrain"], "set": [f"data.corpus={root / 'cpsc'}"]}}
    check_leakage(study_from_dict(clean, tmp_path / "study.yaml"), {"ptbxl": root / "ptbxl"})


def test_the_overlap_job_names_a_folder_that_is_not_a_corpus(tmp_path):
    done = subprocess.run([sys.executable, "jobs/overlap.py", str(tmp_path), str(tmp_path), "--output", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 2 and f"not a coreecg corpus (no manifest.json): {tmp_path}" in done.stderr
    assert not (tmp_path / "overlap.csv").exists()


def test_a_pretraining_run_record_names_its_corpus_and_fingerprint_file(corpora, tmp_path):
    from coreecg.run_record import sessions
    from coreecg.train.plan import RunPlan, write_run_folder

    corpus = corpora["root"] / "copies"
    cfg = load_config(overrides=[*TINY, f"data.corpus={corpus}", "optim.batch_size=4",
                                 f"train.storage_path={tmp_path}", "train.name=pre"])
    write_run_folder(RunPlan("pretrain", cfg, corpus, 8, 2))
    data = sessions(tmp_path / "pre")[-1]["data"]
    assert data["corpus"] == str(corpus) and data["fingerprints"] == str(corpus / FINGERPRINT_FILE)
    assert data["fingerprints_sha256"] == sha256_file(corpus / FINGERPRINT_FILE)
    assert data["manifest_sha256"] == sha256_file(corpus / "manifest.json")


def test_an_empty_side_compares_to_no_overlap_instead_of_failing():
    """A downstream corpus without val/test rows (or a pretraining corpus without train rows)
    leaves one side empty: no overlap, and the fine-tuning's own checks speak."""
    import numpy as np
    import pyarrow as pa

    from coreecg.data.fingerprints import BLOCKS, META_COLUMNS, decode_fingerprints, fingerprint_table
    from coreecg.data.overlap import compare

    empty = fingerprint_table(pa.table({c: pa.array([], pa.string()) for c in META_COLUMNS}),
                              np.zeros((0, 12), np.uint32), np.zeros((0, 12, BLOCKS), np.int8))
    keys, features = decode_fingerprints(empty)
    assert keys.shape == (0, 12) and features.shape == (0, 12, BLOCKS)
    counts = compare(empty, empty, "a", "b").counts
    assert counts["b_records"] == 0 and counts["signal_records"] == 0 and counts["patient_records"] == 0
