"""The Parquet corpus on Ray Data: round trips, resume, quarantine, the job's exit codes."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import wfdb

from coreecg.config import DataConfig, PreprocessConfig
from coreecg.data import load_manifest, open_corpus, read_corpus_numpy, verify_corpus
from coreecg.data.pipeline import build_corpus
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import RecordRef
from coreecg.data.sources import get_source
from coreecg.data.splits import SPLITS

REPO = Path(__file__).resolve().parents[1]
PTBXL_500 = "ptbxl/records500/00000"
F16_TOL = 2.0**-10  # float16 storage: relative rounding 2^-11, so |err| <= 2^-11 * |x| (+ subnormals)


def _all_splits(out: Path) -> dict[str, np.ndarray]:
    parts = [read_corpus_numpy(out, s) for s in SPLITS if any(x["split"] == s for x in load_manifest(out)["shards"])]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _quarantine(out: Path) -> dict[str, str]:
    with open(out / "quarantine.csv") as f:
        return {Path(r["path"]).name or r["path"]: r["reason"] for r in csv.DictReader(f)}


def _check_against_direct(out: Path, source, refs: list[RecordRef], cfg: PreprocessConfig) -> int:
    """Every stored window equals direct preprocessing of its record (to float16 rounding)."""
    data = _all_splits(out)
    by_id = {r.record_id: r for r in refs}
    checked = 0
    for rid in sorted(set(data["record_id"])):
        direct = preprocess_record(source.read(by_id[rid]), cfg)
        rows = np.flatnonzero(data["record_id"] == rid)
        stored = data["signal"][rows[np.argsort(data["window_index"][rows])]]
        assert stored.shape == direct.shape
        np.testing.assert_allclose(stored, direct, atol=1e-4, rtol=F16_TOL)
        checked += 1
    return checked


def _manifest_consistent(out: Path) -> dict:
    m = load_manifest(out)
    assert verify_corpus(out) == []
    for split in SPLITS:
        n = m["counts"]["windows"][split]
        if n:
            assert len(read_corpus_numpy(out, split, columns=["record_id"])["record_id"]) == n
    data = _all_splits(out)
    assert len(data["record_id"]) == m["counts"]["windows_total"]
    # No patient in two splits.
    patients: dict[str, set] = {}
    for s in SPLITS:
        if m["counts"]["windows"][s]:
            for p in set(read_corpus_numpy(out, s, columns=["patient_id"])["patient_id"]):
                patients.setdefault(p, set()).add(s)
    assert all(len(v) == 1 for v in patients.values())
    return m


# ---------------------------------------------------------------------------- synthetic


@pytest.fixture(scope="module")
def synthetic_corpus(tmp_path_factory, ray_session):
    out = tmp_path_factory.mktemp("syn") / "corpus"
    cfg = DataConfig(shard_records=6)
    src_opts = {"n_records": 30, "seed": 4}
    result = build_corpus("synthetic", None, out, cfg, source_options=src_opts)
    return out, cfg, src_opts, result


def test_synthetic_round_trip(synthetic_corpus):
    out, cfg, opts, result = synthetic_corpus
    m = _manifest_consistent(out)
    assert m["counts"]["records_written"] == 30 and m["counts"]["windows_total"] == 30
    assert m["class_names"] == list(get_source("synthetic").class_names)
    assert m["preprocess"]["highpass_hz"] == 0.65 and m["signal"]["shape"] == [12, 2500]
    assert len(m["shards"]) >= 5 and all(len(s["sha256"]) == 64 for s in m["shards"])
    src = get_source("synthetic", **opts)
    assert _check_against_direct(out, src, src.list_records(None), cfg.preprocess) == 30
    # Class counts in the manifest match the stored labels.
    train = read_corpus_numpy(out, "train")
    for i, c in enumerate(m["class_names"]):
        assert m["counts"]["classes"]["train"][c] == int((train["label"] == i).sum())
    assert (train["multihot"].sum(1) == 1).all()


def test_open_corpus_feeds_torch_batches(synthetic_corpus):
    out, *_ = synthetic_corpus
    m = load_manifest(out)
    ds = open_corpus(out, "train")
    n = 0
    for batch in ds.iter_torch_batches(batch_size=8):
        assert tuple(batch["signal"].shape[1:]) == (12, 2500)
        assert str(batch["signal"].dtype) == "torch.float32" and str(batch["label"].dtype) == "torch.int64"
        assert tuple(batch["multihot"].shape[1:]) == (6,)
        n += len(batch["label"])
    assert n == m["counts"]["windows"]["train"]


def test_resume_skips_finished_shards_and_rebuilds_a_deleted_one(synthetic_corpus):
    out, cfg, opts, first = synthetic_corpus
    again = build_corpus("synthetic", None, out, cfg, source_options=opts)
    assert again["run"]["shards_skipped"] == again["run"]["shards"] == first["run"]["shards"]
    victim = first["shards"][0]
    (out / victim["path"]).unlink()
    third = build_corpus("synthetic", None, out, cfg, source_options=opts)
    assert third["run"]["shards_skipped"] == third["run"]["shards"] - 1
    assert third["shards"] == first["shards"]  # rebuilt byte-identically (same sha256)
    assert verify_corpus(out) == []


def test_resume_rebuilds_everything_when_a_setting_changes(synthetic_corpus, tmp_path):
    out, cfg, opts, first = synthetic_corpus
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    changed = DataConfig(shard_records=cfg.shard_records, preprocess=PreprocessConfig(highpass_hz=0.5))
    result = build_corpus("synthetic", None, copy, changed, source_options=opts)
    assert result["run"]["shards_skipped"] == 0
    assert load_manifest(copy)["preprocess"]["highpass_hz"] == 0.5
    assert {s["sha256"] for s in result["shards"]}.isdisjoint({s["sha256"] for s in first["shards"]})


# ---------------------------------------------------------------------------- real data


def test_ptbxl_round_trip(ecg_data, tmp_path, ray_session):
    src = get_source("ptbxl", label_view="multi")
    refs = src.list_records(ecg_data / "ptbxl")[:12]
    out = tmp_path / "ptbxl"
    result = build_corpus("ptbxl", ecg_data / "ptbxl", out, DataConfig(shard_records=5),
                          source_options={"label_view": "multi"}, refs=refs)
    m = _manifest_consistent(out)
    assert m["counts"]["records_written"] + m["counts"]["records_quarantined"] == 12
    assert m["counts"]["records_written"] >= 8
    assert _check_against_direct(out, src, refs, PreprocessConfig()) == m["counts"]["records_written"]
    assert m["multilabel"] and result["run"]["shards"] == 3


def test_cpsc_round_trip_and_duplicate_record_ids(ecg_data, tmp_path, ray_session):
    root = tmp_path / "cpsc"
    for sub, names in (("a", ["A0001", "A0002", "A0003"]), ("b", ["A0002", "A0004"])):
        (root / sub).mkdir(parents=True)
        for n in names:
            for ext in (".hea", ".mat"):
                shutil.copy(ecg_data / "cpsc2018-cinc2020" / (n + ext), root / sub)
    out = tmp_path / "corpus"
    build_corpus("cpsc2018", root, out, DataConfig(shard_records=2))
    m = _manifest_consistent(out)
    q = _quarantine(out)
    assert q == {"A0002": f"duplicate record id, first seen at {root / 'a' / 'A0002'}"}
    assert m["counts"]["records_written"] == 4 and m["counts"]["records_quarantined"] == 1
    # CPSC2018 has no patient ids: each record is its own patient.
    ids = _all_splits(out)
    assert all(p == f"record:{r}" for p, r in zip(ids["patient_id"], ids["record_id"]))
    src = get_source("cpsc2018")
    assert _check_against_direct(out, src, src.list_records(root), PreprocessConfig()) == 4


def _copy_record(src: Path, dst_dir: Path, name: str) -> Path:
    """Copy a WFDB record under a new name (header's record and file names rewritten)."""
    old = src.name
    text = src.with_suffix(".hea").read_text().replace(old, name)
    (dst_dir / f"{name}.hea").write_text(text)
    shutil.copy(src.with_suffix(".dat"), dst_dir / f"{name}.dat")
    return dst_dir / name


def _rewrite(src: Path, dst_dir: Path, name: str, *, fs=None, seconds=None, drop=None) -> None:
    r = wfdb.rdrecord(str(src))
    sig, names = r.p_signal, list(r.sig_name)
    if drop:
        keep = [i for i, n in enumerate(names) if n != drop]
        sig, names = sig[:, keep], [names[i] for i in keep]
    if seconds:
        sig = sig[: int(seconds * r.fs)]
    wfdb.wrsamp(name, fs=fs or r.fs, units=["mV"] * len(names), sig_name=names, p_signal=sig,
                fmt=["16"] * len(names), adc_gain=[1000.0] * len(names), baseline=[0] * len(names),
                write_dir=str(dst_dir))


@pytest.fixture(scope="module")
def quarantine_corpus(ecg_data, tmp_path_factory, ray_session):
    """A folder of WFDB records, most of them broken in one way each."""
    root = tmp_path_factory.mktemp("bad") / "records"
    root.mkdir()
    ptbxl = ecg_data / PTBXL_500
    _copy_record(ptbxl / "00003_hr", root, "good1")
    _copy_record(ptbxl / "00004_hr", root, "good2")
    trunc = _copy_record(ptbxl / "00005_hr", root, "truncated")
    data = trunc.with_suffix(".dat").read_bytes()
    trunc.with_suffix(".dat").write_bytes(data[: len(data) // 2])
    mism = _copy_record(ptbxl / "00006_hr", root, "mismatch")
    hea = mism.with_suffix(".hea")
    hea.write_text(hea.read_text().replace("mismatch 12 500 5000", "mismatch 12 500 4000"))
    for name, src, lead, value in (("nanlead", "00007_hr", 7, -32768), ("zerolead", "00008_hr", 9, 0)):
        rec = _copy_record(ptbxl / src, root, name)
        d = np.memmap(rec.with_suffix(".dat"), dtype="<i2", mode="r+").reshape(-1, 12)
        d[(slice(100, 200) if value == -32768 else slice(None)), lead] = value  # -32768: WFDB's NaN
        d.flush()
        del d
    _rewrite(ptbxl / "00012_hr", root, "missinglead", drop="V3")
    _rewrite(ptbxl / "00010_hr", root, "oddrate", fs=257.3)
    _rewrite(ptbxl / "00017_hr", root, "short", seconds=6)
    frank = root / "ptb"
    frank.mkdir()
    for ext in (".hea", ".dat", ".xyz"):
        shutil.copy(ecg_data / "ptb-diagnostic" / f"s0010_re{ext}", frank)
    out = tmp_path_factory.mktemp("badout") / "corpus"
    result = build_corpus("wfdb", root, out, DataConfig(shard_records=4))
    return root, out, result


@pytest.mark.parametrize("name, reason", [
    ("truncated", "truncated"),                      # the reader's wording; it names the byte counts
    ("mismatch", "header/data mismatch"),
    ("nanlead", "NaN or infinite samples in lead V2"),
    ("zerolead", "lead V4 is flat"),
    ("missinglead", "missing lead(s) V3"),
    ("oddrate", "cannot resample 257.3 Hz to 250 Hz with an exact rational factor"),
    ("short", "record is 6 s, shorter than 10 s (3000 samples at 500 Hz, needs 5000)"),
])
def test_each_bad_record_is_quarantined_with_its_reason(quarantine_corpus, name, reason):
    _, out, _ = quarantine_corpus
    q = _quarantine(out)
    assert name in q, q
    assert reason in q[name]


def test_good_records_survive_a_bad_batch(quarantine_corpus):
    root, out, result = quarantine_corpus
    m = _manifest_consistent(out)
    assert m["counts"]["records_listed"] == 10
    assert m["counts"]["records_quarantined"] == 7 and m["counts"]["records_written"] == 3
    ids = set(_all_splits(out)["record_id"])
    assert ids == {"good1", "good2", "ptb/s0010_re"}
    assert m["notes"] == {"dropped extra lead VX": 1, "dropped extra lead VY": 1, "dropped extra lead VZ": 1}
    src = get_source("wfdb")
    assert _check_against_direct(out, src, src.list_records(root), PreprocessConfig()) == 3


def test_mimic_empty_study_folder_is_quarantined_and_order_is_fixed(ecg_data, tmp_path, ray_session):
    """MIMIC stores aVF before aVL: its copy of PTB-XL record 3 must equal PTB-XL's windows."""
    layout = ecg_data / "mimic-iv-ecg-layout"
    rows = list(csv.DictReader(open(layout / "record_list.csv")))[:3]
    root = tmp_path / "mimic"
    for r in rows[:2]:
        dst = root / Path(r["path"]).parent
        dst.mkdir(parents=True)
        for ext in (".hea", ".dat"):
            shutil.copy(layout / (r["path"] + ext), dst)
    (root / Path(rows[2]["path"]).parent).mkdir(parents=True)  # an empty study folder
    with open(root / "record_list.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    out = tmp_path / "corpus"
    build_corpus("mimic-iv-ecg", root, out, DataConfig())
    m = _manifest_consistent(out)
    q = _quarantine(out)
    assert list(q) == [Path(rows[2]["path"]).name] and "missing header file" in next(iter(q.values()))
    assert m["counts"]["records_written"] == 2 and m["class_names"] == []
    data = _all_splits(out)
    ptb = get_source("ptbxl", label_view="none")
    ref3 = next(r for r in ptb.list_records(ecg_data / "ptbxl") if r.record_id == "3")
    direct = preprocess_record(ptb.read(ref3), PreprocessConfig())
    stored = data["signal"][list(data["record_id"]).index(rows[0]["study_id"])]
    assert rows[0]["study_id"] == "40000003"
    np.testing.assert_allclose(stored, direct[0], atol=1e-4, rtol=F16_TOL)


# ---------------------------------------------------------------------------- the job


def _job(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "jobs" / "preprocess.py"), *args],
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


@pytest.mark.parametrize("args, message", [
    (["--source", "ptbxl", "--input", "/nonexistent/ptbxl"], "data root not found"),
    (["--source", "nope", "--input", "."], "unknown source 'nope'"),
    (["--source", "ptbxl"], "--input is required"),
    (["--source", "synthetic", "--set", "data.preprocess.highpass_hz=50"], "highpass_hz"),
    (["--source", "synthetic", "--set", "data.sources.ptbxl.label_veiw=multi"], "data.sources.ptbxl.label_veiw"),
])
def test_job_bad_arguments_exit_nonzero_with_a_message(tmp_path, args, message):
    p = _job(*args, "--output", str(tmp_path / "out"))
    assert p.returncode == 2
    assert message in p.stderr and "Traceback" not in p.stderr


def test_job_empty_input_folder(tmp_path):
    (tmp_path / "empty").mkdir()
    p = _job("--source", "cpsc2018", "--input", str(tmp_path / "empty"), "--output", str(tmp_path / "out"))
    assert p.returncode == 2 and "no records" in p.stderr


@pytest.mark.slow
def test_job_builds_the_embedded_synthetic_corpus(tmp_path):
    out = tmp_path / "syn"
    p = _job("--source", "synthetic", "--output", str(out), "--set", "data.synthetic_records=12",
             "--set", "data.shard_records=6", timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout[p.stdout.index("{"):])
    assert summary["records_written"] == 12 and summary["shards"] == 2
    assert load_manifest(out)["counts"]["windows_total"] == 12
