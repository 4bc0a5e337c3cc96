"""CODE-15% reader on real PTB-XL records re-written in the release layout (bench/code15_layout.py)."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.code15_layout import ptbxl_at_400hz, write_code15
from coreecg.config import STANDARD_LEADS, ConfigError, load_config
from coreecg.data.record import RecordError
from coreecg.data.sources import get_source
from coreecg.data.sources.code15 import CLASS_NAMES, _exam_index, trim_padding

REPO = Path(__file__).resolve().parents[1]
SEVEN_S = 7 * 400

# exam_id: (trace_file, seconds, labels). 203 is in exams.csv but not in its hdf5; 301's part
# was not downloaded (not listed); 202 has none of the 7 classes.
PLAN = {
    101: ("exams_part0.hdf5", 10, ("normal_ecg",)),
    102: ("exams_part0.hdf5", 10, ("1dAVb", "RBBB")),
    103: ("exams_part0.hdf5", 7, ("AF",)),
    201: ("exams_part1.hdf5", 10, ("SB", "ST")),
    202: ("exams_part1.hdf5", 10, ()),
    203: ("exams_part1.hdf5", 10, ("LBBB",)),
    301: ("exams_part2.hdf5", 10, ("AF",)),
}


@pytest.fixture(scope="module")
def layout(tmp_path_factory, ecg_data):
    """(root, exam_id -> written 400 Hz signal (12, n)) of a CODE-15 folder made from real records."""
    root = tmp_path_factory.mktemp("code15")
    real = ptbxl_at_400hz(len(PLAN), ecg_data / "ptbxl")
    exams = []
    for (exam_id, (trace_file, seconds, labels)), (ecg_id, sig) in zip(PLAN.items(), real):
        exams.append({"exam_id": exam_id, "patient_id": f"p{ecg_id}", "trace_file": trace_file,
                      "signal": sig[:, :seconds * 400], "labels": labels})
    # rows out of exam_id order, as in the release; 203 and part 2 absent on purpose
    write_code15(root, exams, {"exams_part0.hdf5": [103, 101, 102], "exams_part1.hdf5": [202, 201]})
    return root, {e["exam_id"]: e for e in exams}


def test_listing_follows_exams_csv_and_present_parts(layout):
    root, _ = layout
    refs = get_source("code15").list_records(root)
    assert sorted(r.record_id for r in refs) == ["101", "102", "103", "201", "202", "203"]
    assert {r.record_id: Path(r.path).name for r in refs}["203"] == "exams_part1.hdf5"
    assert 0 not in _exam_index(root / "exams_part0.hdf5")  # the padding row
    assert _exam_index(root / "exams_part0.hdf5") == {103: 0, 101: 1, 102: 2}


def test_a_part_not_downloaded_is_said_once_not_dropped_silently(layout, tmp_path, caplog):
    import shutil

    root, _ = layout
    part = tmp_path / "part0-only"
    shutil.copytree(root, part)
    (part / "exams_part1.hdf5").unlink()
    with caplog.at_level("WARNING", logger="coreecg.data.sources.code15"):
        refs = get_source("code15").list_records(part)
    assert sorted(r.record_id for r in refs) == ["101", "102", "103"]
    # the fixture's exams.csv also names exams_part2.hdf5, never written (one exam)
    assert "4 exam(s) of exams.csv are not listed" in caplog.text
    assert "(exams_part1.hdf5, exams_part2.hdf5)" in caplog.text


def test_non_integer_exam_id_is_a_value_error_naming_the_csv(tmp_path):
    (tmp_path / "exams.csv").write_text("exam_id,patient_id,trace_file," + ",".join(CLASS_NAMES) + "\n"
                                        "x7,9,exams_part0.hdf5,False,False,False,False,False,True,False\n")
    with pytest.raises(ValueError, match=r"exams.csv: exam_id not a whole number in 1 row\(s\), e.g. 'x7'"):
        get_source("code15").list_records(tmp_path)


def test_read_trims_padding_and_keeps_labels_and_patients(layout):
    root, exams = layout
    src = get_source("code15")
    for ref in src.list_records(root):
        if ref.record_id in ("202", "203"):
            continue
        rec = src.read(ref)
        e = exams[int(ref.record_id)]
        np.testing.assert_array_equal(rec.signal, e["signal"])  # exact: float32 in, float32 out
        assert rec.signal.dtype == np.float32 and rec.fs == 400.0 and rec.lead_names == STANDARD_LEADS
        assert rec.labels == tuple(c for c in CLASS_NAMES if c in e["labels"])
        assert rec.patient_id == e["patient_id"]
    short = src.read(next(r for r in src.list_records(root) if r.record_id == "103"))
    assert short.signal.shape == (12, SEVEN_S) and short.meta["padding_samples"] == [648, 648]


def test_missing_exam_and_unlabelled_exam_are_record_errors(layout):
    root, _ = layout
    src = get_source("code15")
    refs = {r.record_id: r for r in src.list_records(root)}
    with pytest.raises(RecordError, match=r"exam_id 203 not in exams_part1.hdf5") as err:
        src.read(refs["203"])
    assert err.value.path.endswith("exams_part1.hdf5")
    with pytest.raises(RecordError, match="no label of the task"):
        src.read(refs["202"])
    unlabelled = get_source("code15", label_view="none").read(refs["202"])
    assert unlabelled.labels == () and unlabelled.signal.shape == (12, 4000)


def test_bad_tracings_shape_names_the_file(tmp_path):
    import h5py

    with h5py.File(tmp_path / "exams_part0.hdf5", "w") as f:
        f["tracings"] = np.ones((1, 4096, 8), np.float32)
        f["exam_id"] = np.array([5])
    (tmp_path / "exams.csv").write_text("exam_id,patient_id,trace_file," + ",".join(CLASS_NAMES) + "\n"
                                        "5,9,exams_part0.hdf5,False,False,False,False,False,True,False\n")
    src = get_source("code15")
    with pytest.raises(RecordError, match=r"tracings has shape \(1, 4096, 8\)") as err:
        src.read(src.list_records(tmp_path)[0])
    assert err.value.path.endswith("exams_part0.hdf5")


def test_a_rewritten_file_is_read_afresh(tmp_path):
    """Handles stay open per process (Ray workers live long): a new file must not be read through one."""
    import h5py

    (tmp_path / "exams.csv").write_text("exam_id,patient_id,trace_file," + ",".join(CLASS_NAMES) + "\n"
                                        "5,9,exams_part0.hdf5,False,False,False,False,False,True,False\n")
    src = get_source("code15")
    for value in (1.0, 2.0):  # written beside and moved in: HDF5 cannot truncate a file it holds open
        with h5py.File(tmp_path / "new.hdf5", "w") as f:
            f["tracings"] = np.full((1, 4096, 12), value, np.float32)
            f["exam_id"] = np.array([5])
        os.replace(tmp_path / "new.hdf5", tmp_path / "exams_part0.hdf5")
        assert src.read(src.list_records(tmp_path)[0]).signal[0, 0] == value


def test_trim_padding_keeps_interior_zeros_and_refuses_an_all_zero_exam():
    x = np.zeros((10, 12), np.float32)
    x[2, 0], x[6, 3] = 1.0, -1.0      # samples 3-5 are zero on every lead but inside the exam
    sig, lead, trail = trim_padding(x, "f.hdf5", "1")
    assert sig.shape == (12, 5) and (lead, trail) == (2, 3)
    with pytest.raises(RecordError, match="all zero"):
        trim_padding(np.zeros((10, 12), np.float32), "f.hdf5", "1")


def test_missing_exams_csv_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="no exams.csv"):
        get_source("code15").list_records(tmp_path)


def test_label_view_is_typed_config():
    sources = load_config(overrides=["data.sources.code15.label_view=none"]).data.sources
    src = get_source("code15", **sources.for_source("code15", 10))
    assert src.class_names == () and not src.multilabel
    assert get_source("code15", **load_config().data.sources.for_source("code15", 10)).class_names == CLASS_NAMES
    with pytest.raises(ConfigError, match=r"data\.sources\.code15\.label_view"):
        load_config(overrides=["data.sources.code15.label_view=single"])


def read_split_all(corpus):
    """Every split's record_id and signal (float32, NaN padding kept)."""
    from coreecg.data.reading import read_split, splits_of

    parts = [read_split(corpus, split, ["record_id", "signal"]) for split in splits_of(corpus)]
    return {k: np.concatenate([p[k] for p in parts]) for k in ("record_id", "signal")}


def test_preprocess_job_builds_a_corpus_and_quarantines_with_reasons(layout, tmp_path):
    root, _ = layout
    out = tmp_path / "corpus"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    p = subprocess.run([sys.executable, str(REPO / "jobs" / "preprocess.py"), "--source", "code15",
                        "--input", str(root), "--output", str(out)],
                       capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads(p.stdout[p.stdout.index("{"):])
    # the 7 s exam 103 is kept under min_duration_s=5: one window, its last 2.7 s NaN padding
    assert summary["records_written"] == 4 and summary["records_quarantined"] == 2
    with open(out / "quarantine.csv") as f:
        reasons = {r["record_id"]: r["reason"] for r in csv.DictReader(f)}
    assert "103" not in reasons
    d = read_split_all(out)
    short = d["signal"][d["record_id"] == "103"]
    assert short.shape == (1, 12, 2500)
    assert int(np.isnan(short).sum()) == 12 * (2500 - 7 * 250) and not np.isnan(short[..., :7 * 250]).any()
    assert reasons["202"].startswith("no label of the task")
    assert reasons["203"].startswith("exam_id 203 not in exams_part1.hdf5")


def test_age_and_sex_tasks_read_exams_csv_and_never_impute(tmp_path, ecg_data):
    """CODE-15%'s age and is_male columns as the age (regression) and sex (binary) tasks: each exam's
    stated value; an empty cell is a missing target and age 300 an implausible one, never 50 or female."""
    plan = {11: (63, True), 12: (71.5, False), 13: ("", ""), 14: (300, True)}
    real = ptbxl_at_400hz(len(plan), ecg_data / "ptbxl")
    exams = [{"exam_id": i, "patient_id": f"p{ecg_id}", "trace_file": "exams_part0.hdf5", "signal": sig,
              "labels": ("AF",), "age": age, "is_male": male}
             for (i, (age, male)), (ecg_id, sig) in zip(plan.items(), real)]
    write_code15(tmp_path, exams, {"exams_part0.hdf5": list(plan)})
    ages, sexes = get_source("code15", task="age"), get_source("code15", task="sex")
    got_age, got_sex = {}, {}
    for ref in ages.list_records(tmp_path):
        for source, got in ((ages, got_age), (sexes, got_sex)):
            try:
                rec = source.read(ref)
                got[ref.record_id] = rec.meta["target"] if source is ages else rec.labels
            except RecordError as e:
                got[ref.record_id] = e.reason
    assert got_age["11"] == 63.0 and got_age["12"] == 71.5
    assert got_age["13"].startswith("missing target") and got_age["14"].startswith("implausible age: 300")
    assert got_sex["11"] == ("male",) and got_sex["12"] == ("female",)
    assert got_sex["13"].startswith("missing target") and got_sex["14"] == ("male",)
