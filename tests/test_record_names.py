"""Record ids made from file and folder names carry no identifier into a corpus (issue 53): archives
name exports by record number, accession number or subject (`subject1_0.xml`), so a corpus of
hospital exports stores each record id as a salted key, names no input file in its manifest or
quarantine, and writes the map back to the files outside the corpus, owner-only. A labels table
keyed by file name still labels its records; the same salt gives the same keys on a rebuild; the
manifest's quarantine counts group by the reason's kind.
"""
from __future__ import annotations

import csv
import json
import re
import shutil
import stat
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from coreecg.config import load_config
from tests.helpers import InProcessDataset
from tests.test_hospital_exports import GUANGXI_DCM, GUANGXI_XML, MUSE_PHI, _job

# What the files are named by: a subject folder, the FDA's eCTD example name, record and accession numbers.
NAMES = ("SBJ-778201", "subject1", "subject1_0", "4471902", "4471903", "ACC20261127")


@pytest.fixture(scope="module")
def named(tmp_path_factory) -> dict:
    """Exports in nested folders named by subject, record and accession numbers; a labels table keyed
    by the file names (one file has no row: quarantined "unlabelled", a reason that would name it)."""
    root = tmp_path_factory.mktemp("named") / "archive"
    (root / "SBJ-778201" / "ACC20261127").mkdir(parents=True)
    (root / "subject1").mkdir()
    shutil.copy(GUANGXI_XML, root / "SBJ-778201" / "4471902.xml")
    shutil.copy(GUANGXI_DCM, root / "SBJ-778201" / "ACC20261127" / "4471903")        # DICOM: no suffix
    shutil.copy(MUSE_PHI, root / "subject1" / "subject1_0.xml")                          # no labels row
    (root / "SBJ-778201" / "4471902-report.xml").write_text('<?xml version="1.0"?>\n<Report>x</Report>\n')
    labels = root.parent / "labels.csv"
    labels.write_text("record_id,labels\nSBJ-778201/4471902.xml,AF\nSBJ-778201/ACC20261127/4471903,SR\n")
    return {"root": root, "labels": labels}


def _build(named: dict, out: Path, salt: Path, capsys) -> tuple[dict, dict]:
    """jobs/preprocess.py --source auto on the archive -> (the manifest, the job's printed summary)."""
    capsys.readouterr()
    rc = _job("preprocess").main(["--source", "auto", "--input", str(named["root"]), "--output", str(out),
                                  "--salt-file", str(salt), "--set", f"data.sources.auto.labels={named['labels']}"])
    assert rc == 0
    return json.loads((out / "manifest.json").read_text()), json.loads(capsys.readouterr().out)


def _texts(folder: Path) -> dict[Path, str]:
    """Every file of a corpus folder as text: Parquet files by every column but the signal (pages are
    compressed), and their raw bytes (footers and statistics are not); others as they are."""
    out = {}
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        text = f.read_bytes().decode("utf-8", errors="replace")
        if f.suffix == ".parquet":
            table = pq.read_table(f)
            text += json.dumps(table.drop([c for c in table.column_names if c == "signal"]).to_pylist(), default=str)
        out[f] = text
    return out


def test_no_file_or_folder_name_reaches_the_corpus_and_the_owner_can_map_back(named, ray_session, tmp_path, capsys):
    from coreecg.data.patient_ids import PatientIdPolicy, read_record_map

    out, salt = tmp_path / "corpus", tmp_path / "owner" / "salt"
    m, summary = _build(named, out, salt, capsys)
    texts = _texts(out)
    assert {"manifest.json", "quarantine.csv", "fingerprints.parquet"} <= {f.name for f in texts}
    for f, text in texts.items():
        for name in NAMES:
            assert name not in text, (name, f)
    assert m["input"] is None and m["patient_ids"]["record_ids"].startswith("hmac-sha256")
    assert m["source_options"]["labels"].startswith("sha256:")            # the table by content, not its name

    # the owner's map: outside the corpus, owner-only, from every key back to its file
    map_file = PatientIdPolicy(salt_file=str(salt)).map_file(out)
    assert summary["record_map"] == str(map_file)
    assert out not in map_file.parents and map_file.parent.parent == salt.parent
    assert stat.S_IMODE(map_file.stat().st_mode) == 0o600 and stat.S_IMODE(map_file.parent.stat().st_mode) == 0o700
    names = read_record_map(map_file)
    table = pq.ParquetDataset(sorted(out.glob("*/shard-*.parquet"))).read(["record_id", "labels"]).to_pylist()
    labels = {names[r["record_id"]]["record_id"]: r["labels"] for r in table}
    classes = m["class_names"]
    # labelled by the table keyed by file name, although the corpus knows only the keys
    assert {k: [classes[i] for i in v] for k, v in labels.items()} == {
        "SBJ-778201/4471902.xml": ["AF"], "SBJ-778201/ACC20261127/4471903": ["SR"]}
    with open(out / "quarantine.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    by_file = {names[r["record_id"]]["record_id"]: r for r in rows}
    assert set(by_file) == {"subject1/subject1_0.xml", "SBJ-778201/4471902-report.xml"}
    unlabelled = by_file["subject1/subject1_0.xml"]
    assert unlabelled["path"] == "" and re.match(rf"unlabelled: no row for '{unlabelled['record_id']}'",
                                                 unlabelled["reason"]), unlabelled
    assert Path(names[unlabelled["record_id"]]["path"]) == named["root"] / "subject1" / "subject1_0.xml"
    assert m["counts"]["quarantine_reasons"] == {"unlabelled": 1, "an XML that is neither GE MUSE": 1}

    # a rebuild with the same salt gives the same keys (resume, the leakage guard, tables keyed by id)
    again = tmp_path / "again"
    _build(named, again, salt, capsys)
    ids = [set(pq.ParquetDataset(sorted(c.glob("*/shard-*.parquet"))).read(["record_id"]).column(0).to_pylist())
           for c in (out, again)]
    assert ids[0] == ids[1] and all(re.fullmatch(r"r-[0-9a-f]{24}", k) for k in ids[0])
    # the job resumed on the same folder keeps every shard (its key did not move)
    _, resumed = _build(named, out, salt, capsys)
    assert resumed["shards_skipped"] == resumed["shards"] == summary["shards"] > 0


def test_keep_flags_keep_the_names_and_the_manifest_says_so(named, tmp_path):
    import ray.data

    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus

    cfg = load_config(overrides=[f"data.sources.auto.labels={named['labels']}"]).data
    options = cfg.sources.for_source("auto")
    got = {}
    for name, policy in (("kept", PatientIdPolicy(keep=True, salt_file=str(tmp_path / "salt"))),
                         ("records", PatientIdPolicy(keep_record_ids=True, salt_file=str(tmp_path / "salt")))):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
            m = build_corpus("auto", named["root"], tmp_path / name, cfg, source_options=options,
                             log_warnings=False, patient_ids=policy)
        t = pq.ParquetDataset(sorted((tmp_path / name).glob("*/shard-*.parquet"))).read(["record_id", "patient_id"])
        got[name] = (m, set(t.column("record_id").to_pylist()), set(t.column("patient_id").to_pylist()))
    m, ids, patients = got["kept"]
    assert ids == {"SBJ-778201/4471902.xml", "SBJ-778201/ACC20261127/4471903"} and "00000000" in patients
    assert m["patient_ids"]["record_ids"] == "as read" and m["input"] == str(named["root"])
    m, ids, patients = got["records"]
    assert ids == {"SBJ-778201/4471902.xml", "SBJ-778201/ACC20261127/4471903"}
    assert all(p.startswith("p-") for p in patients) and m["patient_ids"]["record_ids"] == "as read"
    assert m["run"]["record_map"] is None and not (tmp_path / "record-maps").exists()


def test_the_record_map_stays_out_of_the_corpus(named, tmp_path):
    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus

    with pytest.raises(ValueError, match="record map .* lies inside the corpus folder"):
        build_corpus("auto", named["root"], tmp_path / "c", load_config().data,
                     patient_ids=PatientIdPolicy(salt_file=str(tmp_path / "salt"),
                                                 record_map=str(tmp_path / "c" / "map.csv")))


def test_keys_and_redaction():
    from coreecg.data.patient_ids import Keys, pseudonym, record_key

    salt = bytes(range(32))
    assert record_key(salt, "a/0001.xml") == record_key(salt, "a/0001.xml") != record_key(bytes(32), "a/0001.xml")
    assert record_key(salt, "MRN7") != pseudonym(salt, "MRN7")           # a record's key is not a patient's
    keys = Keys(salt, key_records=True)
    key = keys.record("sub7/0001.xml")
    row = keys.quarantine_row("sub7/0001.xml", ("/data/sub7/0001.xml",),
                              "unreadable (OSError: /data/sub7/0001.xml: bad); no row for 'sub7/0001' nor 0001.xml")
    assert row == {"record_id": key, "path": "",
                   "reason": f"unreadable (OSError: {key}: bad); no row for '{key}' nor {key}"}
    assert Keys(salt).quarantine_row("a", ("p",), "r") == {"record_id": "a", "path": "p", "reason": "r"}


@pytest.mark.parametrize("reason, kind", [
    ("lead I: LeadDataCRC32 mismatch (stored 12, the decoded samples give 13)", "LeadDataCRC32 mismatch"),
    ("SOP class 1.2.840.10008.5.1.4.1.1.2 (CT Image Storage) is not an ECG waveform (12-lead ECG or General "
     "ECG Waveform Storage)", "SOP class is not an ECG waveform"),
    ("record is 6.00 s, shorter than 10 s (1500 samples at 250 Hz, needs 2500)", "record is N s, shorter than N s"),
    ("missing lead(s) V5, V6; file has I, II, III", "missing lead(s)"),
    ("lead aVR is flat (constant 0 mV)", "lead is flat"),
    ("unlabelled: no row for 'r-0123' in labels.csv", "unlabelled"),
    ("member 'x' is truncated at row 7", "member is truncated at row N"),
    ("no lead names for signals.npy", "no lead names for signals.npy"),
])
def test_reason_kinds_group_by_what_went_wrong(reason, kind):
    from coreecg.data.pipeline import reason_kind

    assert reason_kind(reason) == kind


def test_what_a_reader_notes_is_counted_in_the_manifest(tmp_path):
    """A MUSE file whose writer computed no checksums (LeadDataCRC32 0 on every lead) is written, and
    the manifest's notes count it; a non-zero mismatch stays a quarantine, of its reason's kind."""
    import ray.data

    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus

    muse = GUANGXI_XML.read_text(encoding="iso-8859-1")
    (tmp_path / "in").mkdir()
    zero = re.sub(r"<LeadDataCRC32>[^<]*</LeadDataCRC32>", "<LeadDataCRC32>0</LeadDataCRC32>", muse)
    (tmp_path / "in" / "no_crc.xml").write_text(zero, encoding="iso-8859-1")
    rhythm = muse.index("<WaveformType>Rhythm")                  # the median beats come first, unchecked
    wrong = muse[:rhythm] + re.sub(r"<LeadDataCRC32>[^<]*</LeadDataCRC32>", "<LeadDataCRC32>12345</LeadDataCRC32>",
                                   muse[rhythm:], count=1)
    (tmp_path / "in" / "damaged.xml").write_text(wrong, encoding="iso-8859-1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        m = build_corpus("muse", tmp_path / "in", tmp_path / "c", load_config().data, log_warnings=False,
                         patient_ids=PatientIdPolicy(salt_file=str(tmp_path / "salt")))
    assert m["counts"]["records_written"] == 1
    assert m["notes"].get("no checksum: LeadDataCRC32 0 on every lead") == 1, m["notes"]
    assert m["counts"]["quarantine_reasons"] == {"LeadDataCRC32 mismatch": 1}
