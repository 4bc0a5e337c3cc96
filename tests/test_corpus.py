"""The Parquet corpus on Ray Data: round trips, resume, quarantine, the job's exit codes."""
from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import wfdb

from coreecg.config import DataConfig, PreprocessConfig
from coreecg.data import load_manifest, read_split, verify_corpus
from coreecg.data.pipeline import build_corpus
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import RecordRef
from coreecg.data.sources import get_source
from coreecg.data.splits import SPLITS
from coreecg.files import sha256_file
from tests.helpers import once_settled

REPO = Path(__file__).resolve().parents[1]
PTBXL_500 = "ptbxl/records500/00000"
F16_TOL = 2.0**-10  # float16 storage: relative rounding 2^-11, so |err| <= 2^-11 * |x| (+ subnormals)


def _all_splits(out: Path) -> dict[str, np.ndarray]:
    parts = [read_split(out, s) for s in SPLITS if any(x["split"] == s for x in load_manifest(out)["shards"])]
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
            assert len(read_split(out, split, columns=["record_id"])["record_id"]) == n
    data = _all_splits(out)
    assert len(data["record_id"]) == m["counts"]["windows_total"]
    # No patient in two splits.
    patients: dict[str, set] = {}
    for s in SPLITS:
        if m["counts"]["windows"][s]:
            for p in set(read_split(out, s, columns=["patient_id"])["patient_id"]):
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
    train = read_split(out, "train")
    for i, c in enumerate(m["class_names"]):
        assert m["counts"]["classes"]["train"][c] == int((train["label"] == i).sum())
    assert (train["multihot"].sum(1) == 1).all()


@pytest.mark.parametrize("cache_gb", [2.0, 0.0], ids=["materialised", "streamed"])
def test_the_training_path_feeds_torch_batches(synthetic_corpus, cache_gb):
    """training_dataset -> epoch_batches -> to_model_input, as a worker reads the train split:
    float16 stored windows with their uids, each train window once per epoch (as with drop_last),
    then the epoch's crops as float32."""
    import torch

    from coreecg.train.ingest import ShardFiles, epoch_batches, local_source, to_model_input, training_dataset

    out, *_ = synthetic_corpus
    stored = read_split(out, "train", columns=["signal"], as_stored=True)
    n, batch = len(stored["uid"]), 4
    ds = training_dataset(out, seed=0, cache_in_memory_gb=cache_gb)
    assert isinstance(ds, ShardFiles) == (cache_gb == 0)
    pairs = list(epoch_batches(local_source(ds), batch, 1, 0, 0, 8, torch.device("cpu")))
    assert all(s.dtype == torch.float16 and u.dtype == torch.int64 and len(u) == batch for s, u in pairs)
    signal, uid = torch.cat([s for s, _ in pairs]), torch.cat([u for _, u in pairs])
    assert len(uid) == n - n % batch and len(set(uid.tolist())) == len(uid)
    np.testing.assert_array_equal(signal.numpy(), stored["signal"][uid.numpy()])
    x = to_model_input(signal[:batch], uid[:batch], 0, 1, 2250)
    assert x.dtype == torch.float32 and tuple(x.shape) == (batch, 12, 2250)


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
    _rewrite(ptbxl / "00017_hr", root, "short", seconds=4)   # under min_duration_s=5
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
    ("short", "record is 4 s, shorter than 5 s (2000 samples at 500 Hz, needs 2500)"),
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


# ------------------------------------------------------- data fidelity (one run, many cases)


def _add_comment(rec: Path, comment: str) -> None:
    hea = rec.with_suffix(".hea")
    hea.write_text(hea.read_text() + comment + "\n")


@pytest.fixture(scope="module")
def fidelity_corpus(ecg_data, tmp_path_factory, ray_session):
    """The generic reader over a folder of real records with the issue's cases, in one run."""
    root = tmp_path_factory.mktemp("fid") / "records"
    root.mkdir()
    ptbxl = ecg_data / PTBXL_500
    for name, src, comment in (("p1a", "00003_hr", "# Patient ID: P1"), ("p1b", "00004_hr", "# Patient ID: P1"),
                               ("p2", "00005_hr", "#Subject: P2"), ("nopat", "00006_hr", "# Age: 50")):
        _add_comment(_copy_record(ptbxl / src, root, name), comment)
    # CinC 2020 Georgia: the record line names the data file.
    georgia = (ecg_data / "cinc2021-smoke/G12EC/E00001.hea").read_text().replace("E00001", "E00009")
    (root / "E00009.hea").write_text(georgia.replace("E00009 ", "E00009.mat ", 1))
    shutil.copy(ecg_data / "cinc2021-smoke/G12EC/E00001.mat", root / "E00009.mat")
    # A non-ASCII record name (CPSC A0022, 27 s).
    (root / "Ü0022.hea").write_text((ecg_data / "cpsc2018-cinc2020/A0022.hea").read_text().replace("A0022", "Ü0022"))
    shutil.copy(ecg_data / "cpsc2018-cinc2020/A0022.mat", root / "Ü0022.mat")
    bad = _copy_record(ptbxl / "00007_hr", root, "B0019")          # rate 'abc': wfdb read 250 Hz
    hea = bad.with_suffix(".hea")
    hea.write_text(hea.read_text().replace("B0019 12 500 5000", "B0019 12 abc 5000"))
    gain0 = _copy_record(ptbxl / "00008_hr", root, "gain0")       # wfdb turned gain 0 into 200
    hea = gain0.with_suffix(".hea")
    hea.write_text(hea.read_text().replace("1000.0(0)/mV", "0(0)/mV", 1))
    shutil.copy(ecg_data / "cpsc2018-cinc2020/A0003.mat", root / "lonely.mat")  # no header
    _rewrite(ptbxl / "00010_hr", root, "short4999", seconds=4.998)   # 2,499 samples: 1 short of 5 s
    out = tmp_path_factory.mktemp("fidout") / "corpus"
    result = build_corpus("wfdb", root, out, DataConfig(shard_records=4))
    return root, out, result


def test_fidelity_run_writes_the_readable_and_quarantines_the_rest(fidelity_corpus):
    root, out, result = fidelity_corpus
    m = _manifest_consistent(out)
    c = m["counts"]
    assert c["records_listed"] == 10 == c["records_written"] + c["records_quarantined"]
    assert set(_all_splits(out)["record_id"]) == {"p1a", "p1b", "p2", "nopat", "E00009", "Ü0022"}
    q = _quarantine(out)
    assert set(q) == {"B0019", "gain0", "lonely.mat", "short4999"}
    assert q["B0019"].startswith("unparseable sampling rate in header: 'abc'")
    assert q["gain0"] == "uncalibrated signal (ADC gain 0 for lead I in header)"
    assert q["lonely.mat"].startswith("no header: lonely.mat has no lonely.hea")
    assert q["short4999"] == "record is 4.998 s, shorter than 5 s (2499 samples at 500 Hz, needs 2500)"
    assert m["notes"]["header corrected: record line names the data file"] == 1
    assert m["notes"]["header corrected: non-ASCII characters in record or signal lines"] == 1


def test_fidelity_run_georgia_and_non_ascii_records_equal_their_originals(fidelity_corpus, ecg_data):
    _, out, _ = fidelity_corpus
    data = _all_splits(out)
    for rid, original, source in (("E00009", "cinc2021-smoke/G12EC/E00001", "cinc2021"),
                                  ("Ü0022", "cpsc2018-cinc2020/A0022", "cpsc2018")):
        src = get_source(source)
        ref = next(r for r in src.list_records(ecg_data / Path(original).parent) if r.path.endswith(original))
        direct = preprocess_record(src.read(ref), PreprocessConfig())
        rows = np.flatnonzero(data["record_id"] == rid)
        stored = data["signal"][rows[np.argsort(data["window_index"][rows])]]
        np.testing.assert_allclose(stored, direct, atol=1e-4, rtol=F16_TOL)


def test_fidelity_run_patient_ids_from_headers_and_counted_fallbacks(fidelity_corpus):
    _, out, result = fidelity_corpus
    data = _all_splits(out)
    patient = dict(zip(data["record_id"], data["patient_id"]))
    split = dict(zip(data["record_id"], data["split"]))
    assert patient["p1a"] == patient["p1b"] == "P1" and split["p1a"] == split["p1b"]
    assert patient["p2"] == "P2" and patient["nopat"] == "record:nopat"
    assert result["counts"]["patient_id_fallbacks"] == 3             # nopat, E00009, Ü0022
    assert any("3 of 6 written record(s) have no patient id" in w for w in result["warnings"])


def test_cpsc_run_first_label_view_and_unrecognised_codes(ecg_data, tmp_path, ray_session, caplog):
    """CPSC-Extra records (no CPSC class) were written with label -1; A0043 (#Dx: AF,RBBB) as multi-label."""
    src = get_source("cpsc2018")
    refs = (src.list_records(ecg_data / "cinc2021-smoke/CPSC_CPSC-Extra")
            + [r for r in src.list_records(ecg_data / "cpsc2018-cinc2020") if r.record_id == "A0043"])
    out = tmp_path / "cpsc"
    with caplog.at_level("WARNING", logger="coreecg.data.pipeline"):
        result = build_corpus("cpsc2018", None, out, DataConfig(shard_records=8), refs=refs)
    m = _manifest_consistent(out)
    assert m["label_view"] == "first" and m["multilabel"] is False
    # By hand from the #Dx lines: Q0010 (427172004 = PVC) is the only CPSC-Extra record with a class.
    no_class = {"Q0001", "Q0002", "Q0003", "Q0004", "Q0005", "Q0006", "Q0007", "Q0011", "Q0012"}
    q = _quarantine(out)
    assert set(q) == no_class and all(r.startswith("no label of the task: #Dx codes [") for r in q.values())
    assert m["counts"]["records_written"] == 21 - len(no_class)
    data = _all_splits(out)
    labels = {rid: [m["class_names"][i] for i in np.flatnonzero(hot)]
              for rid, hot in zip(data["record_id"], data["multihot"])}
    assert labels["A0043"] == ["AF"] and labels["Q0010"] == ["PVC"] and labels["A0001"] == ["RBBB"]
    assert all(len(v) == 1 for v in labels.values())
    assert m["unrecognised_codes"] == {"428750005": 5, "164867002": 3, "164861001": 2, "427084000": 1,
                                       "164865005": 1, "164930006": 1, "413844008": 1, "426627000": 1}
    assert result["warnings"][0].startswith("15 diagnosis code(s) not recognised by the cpsc2018 reader")
    assert result["warnings"][0] in caplog.text


# ---------------------------------------------------------------------------- the job


def _job_command(*args: str) -> list[str]:
    return [sys.executable, str(REPO / "jobs" / "preprocess.py"), *args]


def _job_env(ray_address: str | None = None) -> dict[str, str]:
    # PYTHONPATH: the job must import this checkout's coreecg, not whichever one is installed.
    # RAY_ADDRESS: the job joins the session's cluster (ray_session) instead of starting its own.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return {**env, "RAY_ADDRESS": ray_address} if ray_address else env


def _job(*args: str, timeout: int = 120, ray_address: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_job_command(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO,
                          env=_job_env(ray_address))


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


def test_job_cinc2021_on_cinc2020_abbreviations_quarantines_and_warns(ecg_data, tmp_path):
    """The cinc2021 reader on CinC 2020 CPSC headers ('#Dx: RBBB') wrote every record unlabelled."""
    root = tmp_path / "in"
    root.mkdir()
    for folder, name in (("cpsc2018-cinc2020", "A0001"), ("cpsc2018-cinc2020", "A0043"), ("cinc2021", "E07500")):
        for ext in (".hea", ".mat"):
            shutil.copy(ecg_data / folder / f"{name}{ext}", root)
    out = tmp_path / "out"
    p = _job("--source", "cinc2021", "--input", str(root), "--output", str(out), timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout[p.stdout.index("{"):])
    assert summary["records_written"] == 1 and summary["records_quarantined"] == 2
    assert summary["quarantine_reasons"] == {"no label of the task": 2}
    assert summary["unrecognised_codes"] == {"RBBB": 2, "AF": 1}
    assert "warning: 3 diagnosis code(s) not recognised by the cinc2021 reader" in p.stderr
    assert "read those with the cpsc2018 source" in _quarantine(out)["A0001"]
    assert read_split(out, summary_split(out))["record_id"].tolist() == ["E07500"]


def summary_split(out: Path) -> str:
    return next(s["split"] for s in load_manifest(out)["shards"])


# ---------------------------------------------------------------------------- killed and resumed


def _markers(out: Path) -> dict[str, dict]:
    """The shard markers on disk: {name: {"mtime_ns", "files": {path: (sha256 in the marker, file mtime_ns)}}}."""
    found = {}
    for m in sorted((out / "_state").glob("shard-*.json")):
        files = json.loads(m.read_text())["files"]      # written atomically: never half a marker
        found[m.name] = {"mtime_ns": m.stat().st_mtime_ns,
                         "files": {f["path"]: (f["sha256"], (out / f["path"]).stat().st_mtime_ns) for f in files}}
    return found


@pytest.mark.slow
def test_job_killed_part_way_resumes_without_losing_or_rewriting_a_shard(tmp_path, ray_session):
    """SIGKILLed once 8 of 32 shards are done, then re-run: the done shards are skipped and their
    files left alone (same mtime and sha256), the others built; each shard exactly once, each
    record in one file. bench/large_corpus.py does the same at 100,000 records."""
    records, shard_records, n_shards, kill_at = 2000, 64, 32, 8   # one window per synthetic record
    out = tmp_path / "syn"
    args = ["--source", "synthetic", "--output", str(out), "--set", f"data.synthetic_records={records}",
            "--set", f"data.shard_records={shard_records}"]
    address = ray_session.get_runtime_context().gcs_address
    proc = subprocess.Popen(_job_command(*args), cwd=REPO, env=_job_env(address),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(_markers(out)) < kill_at and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    at_kill = _markers(out)
    assert kill_at <= len(at_kill) < n_shards, f"{len(at_kill)} of {n_shards} shards done at the kill"
    done = once_settled(lambda: _markers(out), f"{out}: shard markers")   # the dead job's tasks may finish a shard
    assert done.items() >= at_kill.items()

    p = _job(*args, ray_address=address)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout[p.stdout.index("{"):])
    assert summary["shards"] == n_shards and summary["shards_skipped"] == len(done)
    after = _markers(out)
    assert sorted(after) == [f"shard-{i:05d}.json" for i in range(n_shards)]
    assert {name: after[name] for name in done} == done          # not rewritten: same mtimes
    assert all(sha256_file(out / path) == sha for m in done.values() for path, (sha, _) in m["files"].items())

    manifest = load_manifest(out)
    listed = [s["path"] for s in manifest["shards"]]
    on_disk = [str(f.relative_to(out)) for split in SPLITS for f in (out / split).glob("shard-*.parquet")]
    assert len(set(listed)) == len(listed) and sorted(listed) == sorted(on_disk)
    assert verify_corpus(out) == []
    assert not list(out.rglob(".*.tmp-*"))          # a write the kill cut short leaves no temporary file
    rows = sum(pq.ParquetFile(out / f).metadata.num_rows for f in listed)
    assert rows == manifest["counts"]["windows_total"] == records
    files_per_record = Counter(rid for f in listed
                               for rid in set(pq.read_table(out / f, columns=["record_id"])["record_id"].to_pylist()))
    assert len(files_per_record) == records and max(files_per_record.values()) == 1
