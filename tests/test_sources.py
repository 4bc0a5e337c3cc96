"""Source readers on the real records in ../shared/ecg-data: registry, PTB-XL, MIMIC-IV-ECG
layout, generic WFDB (PTB Diagnostic), and damaged copies of real records.

Expected labels were checked by hand against ptbxl_database.csv / scp_statements.csv.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from coreecg.data.record import Record, RecordError
from coreecg.data.sources import SOURCES, get_source
from coreecg.data.sources.base import Source
from coreecg.data.sources.wfdb_io import read_wfdb

READERS = ["ptbxl", "cpsc2018", "cinc2021", "mimic-iv-ecg", "wfdb"]


# ------------------------------------------------------------------------- registry


def test_registry_knows_all_sources_and_rejects_unknown_names():
    assert set(READERS) | {"synthetic"} <= set(SOURCES)
    with pytest.raises(ValueError, match="ptbxl.*wfdb|known: .*cinc2021"):
        get_source("no-such-db")
    for name in READERS:
        src = get_source(name)
        assert isinstance(src, Source) and src.name == name


def test_options_are_validated():
    with pytest.raises(ValueError, match="label_view"):
        get_source("ptbxl", label_view="both")
    with pytest.raises(ValueError, match="rate"):
        get_source("ptbxl", rate=250)
    with pytest.raises(ValueError, match="class_map"):
        get_source("cinc2021", class_map="scored27")
    with pytest.raises(ValueError, match="subsets"):
        get_source("cinc2021", subsets=["Narnia"])


@pytest.mark.parametrize("name", READERS)
def test_missing_root_and_empty_folder(name, tmp_path):
    src = get_source(name)
    missing = tmp_path / "not-here"
    with pytest.raises(FileNotFoundError, match="not-here"):
        src.list_records(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no records"):
        src.list_records(tmp_path / "empty")


@pytest.mark.parametrize("name,folder", [
    ("ptbxl", "ptbxl"), ("cpsc2018", "cpsc2018-original"), ("cpsc2018", "cpsc2018-cinc2020"),
    ("cinc2021", "cinc2021-smoke"), ("mimic-iv-ecg", "mimic-iv-ecg-layout"), ("wfdb", "ptb-diagnostic"),
])
def test_listing_is_sorted_deterministic_and_json_serialisable(ecg_data, name, folder):
    src = get_source(name)
    refs = src.list_records(ecg_data / folder)
    assert refs == src.list_records(ecg_data / folder)
    assert [r.path for r in refs] == sorted(r.path for r in refs)
    assert len({r.record_id for r in refs}) == len(refs)
    json.dumps([r.extra for r in refs])
    assert all(r.source == name for r in refs)


# --------------------------------------------------------------------------- PTB-XL


@pytest.fixture(scope="module")
def ptbxl_refs(ecg_data):
    return {r.record_id: r for r in get_source("ptbxl").list_records(ecg_data / "ptbxl")}


def test_ptbxl_index_fields(ptbxl_refs):
    assert len(ptbxl_refs) == 250
    ref = ptbxl_refs["8"]  # csv: patient 11275.0, fold 9, {'IMI': 35.0, 'ABQRS': 0.0, 'SR': 0.0}
    assert ref.extra["patient_id"] == "11275" and ref.extra["strat_fold"] == 9
    assert ref.extra["scp_codes"] == {"IMI": 35.0, "ABQRS": 0.0, "SR": 0.0}
    assert ref.path.endswith("records500/00000/00008_hr")


@pytest.mark.parametrize("ecg_id,single,multi", [
    ("3", ("NORM",), ("NORM",)),                 # NORM 100, SR (rhythm)
    ("8", ("MI",), ("MI",)),                     # IMI 35 counts: no likelihood threshold
    ("39", None, ("MI", "STTC")),                # IMI; LNGQT, NST_, DIG are STTC
    ("146", None, ("MI", "STTC", "HYP")),        # IMI, ISCLA, SEHYP
    ("420", None, ("NORM", "CD")),               # NORM + IRBBB
    ("17", None, None),                          # AFLT, ABQRS, AFIB: rhythm/form only
])
def test_ptbxl_superclasses_checked_by_hand(ptbxl_refs, ecg_id, single, multi):
    ref = ptbxl_refs[ecg_id]
    for view, expected in (("single", single), ("multi", multi)):
        src = get_source("ptbxl", label_view=view)
        if expected is None:
            with pytest.raises(RecordError) as err:
                src.read(ref)
            reason = err.value.reason
            assert ("no diagnostic superclass" in reason) if multi is None else \
                (reason == f"not single-label: superclasses [{', '.join(multi)}]")
        else:
            assert src.labels_for(ref) == expected


def test_ptbxl_view_counts(ptbxl_refs):
    def usable(view):
        src, n = get_source("ptbxl", label_view=view), 0
        for ref in ptbxl_refs.values():
            try:
                src.labels_for(ref)
                n += 1
            except RecordError:
                pass
        return n
    # 212 records with one superclass, 29 with several, 9 with none (counted from the csvs).
    assert (usable("single"), usable("multi"), usable("none")) == (212, 241, 250)
    assert get_source("ptbxl", label_view="multi").multilabel
    assert get_source("ptbxl", label_view="none").class_names == ()


def test_ptbxl_min_likelihood_drops_weak_codes(ptbxl_refs, ecg_data):
    refs = {r.record_id: r for r in get_source("ptbxl", min_likelihood=50).list_records(ecg_data / "ptbxl")}
    assert refs["8"].extra["superclasses"] == []          # IMI only at 35
    assert refs["3"].extra["superclasses"] == ["NORM"]


def test_ptbxl_read_500_and_100_hz(ptbxl_refs, ecg_data):
    hi = get_source("ptbxl").read(ptbxl_refs["3"])
    ref_lo = {r.record_id: r for r in get_source("ptbxl", rate=100).list_records(ecg_data / "ptbxl")}["3"]
    lo = get_source("ptbxl", rate=100).read(ref_lo)
    assert isinstance(hi, Record)
    assert hi.signal.shape == (12, 5000) and hi.fs == 500 and hi.signal.dtype == np.float32
    assert lo.signal.shape == (12, 1000) and lo.fs == 100 and lo.duration_s == 10
    assert hi.lead_names[3:6] == ("AVR", "AVL", "AVF")  # as the file spells them
    assert hi.patient_id == "20372" and hi.labels == ("NORM",) and hi.meta["strat_fold"] == 5
    # mV: a QRS complex spans about 0.5-3 mV in lead II; the 100 Hz file is the same signal.
    assert 0.3 < np.ptp(hi.signal[1]) < 5
    assert np.allclose(hi.signal[1, ::5].mean(), lo.signal[1].mean(), atol=0.05)


def test_ptbxl_row_without_files_raises_naming_the_file(ecg_data, tmp_path):
    root = tmp_path / "ptbxl"
    (root / "records500" / "00000").mkdir(parents=True)
    for f in ("ptbxl_database.csv", "scp_statements.csv"):
        shutil.copy(ecg_data / "ptbxl" / f, root / f)
    for f in ("00003_hr.hea", "00003_hr.dat"):
        shutil.copy(ecg_data / "ptbxl/records500/00000" / f, root / "records500/00000" / f)
    src = get_source("ptbxl")
    refs = {r.record_id: r for r in src.list_records(root)}
    assert len(refs) == 250                   # listed from the csv, not from the disk
    assert src.read(refs["3"]).labels == ("NORM",)
    with pytest.raises(RecordError, match="missing header file: 00004_hr.hea"):
        src.read(refs["4"])


# ------------------------------------------------------------- MIMIC-IV-ECG, generic WFDB


def test_mimic_layout(ecg_data):
    src = get_source("mimic-iv-ecg")
    refs = src.list_records(ecg_data / "mimic-iv-ecg-layout")
    assert len(refs) == 60 and src.class_names == ()
    # record_list.csv row: 10020372,40000003,40000003,1984-11-15 12:49:10,files/p1002/p10020372/s40000003/40000003
    ref = next(r for r in refs if r.record_id == "40000003")
    rec = src.read(ref)
    assert rec.patient_id == "10020372" and rec.labels == ()
    assert rec.lead_names == ("I", "II", "III", "aVR", "aVF", "aVL", "V1", "V2", "V3", "V4", "V5", "V6")
    assert rec.signal.shape == (12, 5000) and rec.fs == 500
    # It is PTB-XL ecg_id 3 re-written: aVF (file row 4) equals PTB-XL's AVF (row 5).
    ptb = get_source("ptbxl").read(
        next(r for r in get_source("ptbxl").list_records(ecg_data / "ptbxl") if r.record_id == "3"))
    assert np.allclose(rec.signal[4], ptb.signal[5], atol=1e-3)
    for r in refs:
        assert f"/p{r.extra['subject_id']}/" in r.path


def test_wfdb_folder_reads_15_lead_ptb_diagnostic(ecg_data):
    src = get_source("wfdb")
    (ref,) = src.list_records(ecg_data / "ptb-diagnostic")
    rec = src.read(ref)
    assert rec.record_id == "s0010_re" and rec.fs == 1000
    assert rec.signal.shape == (15, 38400)
    assert rec.lead_names == ("i", "ii", "iii", "avr", "avl", "avf", "v1", "v2", "v3", "v4",
                              "v5", "v6", "vx", "vy", "vz")
    assert "Reason for admission: Myocardial infarction" in rec.meta["comments"]
    # No units in this header: WFDB's default (mV) applies; gain 2000/mV.
    assert 0.3 < np.ptp(rec.signal[1]) < 6
    # Einthoven: II = I + III holds for the 12 standard leads read from the .dat file.
    assert np.abs(rec.signal[1] - rec.signal[0] - rec.signal[2]).max() < 0.01


# ------------------------------------------------------------------ damaged records


@pytest.fixture
def ptbxl_copy(ecg_data, tmp_path):
    """A writable copy of PTB-XL record 00008_hr; returns its path without extension."""
    for ext in (".hea", ".dat"):
        dst = tmp_path / f"00008_hr{ext}"
        shutil.copy(ecg_data / f"ptbxl/records500/00000/00008_hr{ext}", dst)
        dst.chmod(0o644)
    return tmp_path / "00008_hr"


def _edit_header(path: Path, old: str, new: str) -> None:
    hea = path.with_name(path.name + ".hea")
    text = hea.read_text()
    assert old in text
    hea.write_text(text.replace(old, new, 1))


def test_intact_copy_reads(ptbxl_copy):
    assert read_wfdb(ptbxl_copy).signal.shape == (12, 5000)


def test_truncated_data_file(ptbxl_copy):
    dat = ptbxl_copy.with_suffix(".dat")
    with open(dat, "r+b") as f:
        f.truncate(dat.stat().st_size - 1000)
    with pytest.raises(RecordError, match="truncated data file: 00008_hr.dat") as err:
        read_wfdb(ptbxl_copy)
    # The pipeline counts reasons by their text before ":" / " (": keep that part stable.
    assert err.value.reason.split(" (")[0].split(":")[0] == "truncated data file"


def test_header_sample_count_larger_and_smaller(ptbxl_copy):
    _edit_header(ptbxl_copy, "12 500 5000", "12 500 6000")
    with pytest.raises(RecordError, match="truncated data file.*6000 samples"):
        read_wfdb(ptbxl_copy)
    _edit_header(ptbxl_copy, "12 500 6000", "12 500 4000")
    with pytest.raises(RecordError, match="header/data mismatch.*4000 samples"):
        read_wfdb(ptbxl_copy)


def test_header_lead_count_differs_from_file(ptbxl_copy):
    hea = ptbxl_copy.with_suffix(".hea")
    lines = hea.read_text().splitlines()
    lines[0] = lines[0].replace("00008_hr 12", "00008_hr 11")
    hea.write_text("\n".join(lines[:12]) + "\n")       # drop the V6 signal line
    with pytest.raises(RecordError, match="header/data mismatch.*11 leads"):
        read_wfdb(ptbxl_copy)


def test_missing_files_and_garbage_header(ptbxl_copy):
    ptbxl_copy.with_suffix(".dat").unlink()
    with pytest.raises(RecordError, match="missing data file: 00008_hr.dat"):
        read_wfdb(ptbxl_copy)
    ptbxl_copy.with_suffix(".hea").write_text("this is not a header\n")
    with pytest.raises(RecordError, match="unparseable header"):
        read_wfdb(ptbxl_copy)
    ptbxl_copy.with_suffix(".hea").unlink()
    with pytest.raises(RecordError, match="missing header file: 00008_hr.hea"):
        read_wfdb(ptbxl_copy)


def test_units_are_converted_or_rejected(ptbxl_copy):
    mv = read_wfdb(ptbxl_copy).signal
    _edit_header(ptbxl_copy, "1000.0(0)/mV", "1000.0(0)/uV")   # first lead only
    uv = read_wfdb(ptbxl_copy).signal
    assert np.allclose(uv[0], mv[0] / 1000) and np.array_equal(uv[1:], mv[1:])
    _edit_header(ptbxl_copy, "1000.0(0)/uV", "1000.0(0)/mmHg")
    with pytest.raises(RecordError, match="unknown units: 'mmHg' for lead I"):
        read_wfdb(ptbxl_copy)


@pytest.mark.parametrize("old, new, reason", [
    ("00008_hr 12 500 5000", "00008_hr 12 abc 5000", "unparseable sampling rate in header: 'abc'"),
    ("00008_hr 12 500 5000", "00008_hr 12 0 5000", "zero sampling rate in header"),
    ("00008_hr 12 500 5000", "00008_hr 12", "no sampling rate in header"),
    ("00008_hr 12 500 5000", "00008_hr 12 500 5k", "unparseable sample count in header: '5k'"),
    ("00008_hr 12 500 5000", "00008_hr 12 500 0", "zero sample count in header"),
    ("1000.0(0)/mV", "0(0)/mV", "uncalibrated signal (ADC gain 0 for lead I in header)"),
    ("1000.0(0)/mV", "x(0)/mV", "unparseable ADC gain in header: 'x(0)/mV' in signal line 1"),
    ("1000.0(0)/mV 16 0 -40 12319 0 I", "", "no ADC gain in header: signal line 1"),
])
def test_rate_count_and_gain_are_checked_on_the_header_text(ptbxl_copy, old, new, reason):
    """wfdb reads 'abc' Hz as 250 Hz and gain 0 as 200/mV: the header text decides."""
    _edit_header(ptbxl_copy, old, new)
    with pytest.raises(RecordError) as err:
        read_wfdb(ptbxl_copy)
    assert err.value.reason.startswith(reason)


def _copy_renamed(src: Path, dst_dir: Path, name: str, record_line_name: str | None = None) -> Path:
    """Copy a CinC record (.hea + .mat) under a new name; the record line may name something else."""
    text = src.with_suffix(".hea").read_text().replace(src.name, name)
    if record_line_name is not None:
        first, rest = text.split("\n", 1)
        text = first.replace(name, record_line_name, 1) + "\n" + rest
    (dst_dir / f"{name}.hea").write_text(text, encoding="utf-8")
    shutil.copy(src.with_suffix(".mat"), dst_dir / f"{name}.mat")
    return dst_dir / name


def test_cinc2020_georgia_record_line_naming_the_data_file_is_read(ecg_data, tmp_path):
    """CinC 2020 Georgia headers: 'E00009.mat 12 500 5000 ...' (wfdb: invalid syntax in record line)."""
    original = ecg_data / "cinc2021-smoke/G12EC/E00001"
    rec = _copy_renamed(original, tmp_path, "E00009", record_line_name="E00009.mat")
    assert rec.with_suffix(".hea").read_text().startswith("E00009.mat 12 500 5000")
    sig = read_wfdb(rec)
    assert sig.quirks == ["record line names the data file (E00009.mat)"]
    want = read_wfdb(original)
    assert np.array_equal(sig.signal, want.signal) and sig.fs == 500 and sig.lead_names == want.lead_names
    src = get_source("cinc2021")
    (ref,) = src.list_records(tmp_path)
    got = src.read(ref)
    assert got.labels == src.read(src.list_records(original.parent)[0]).labels != ()
    assert got.meta["subset"] == "Georgia" and got.meta["header_quirks"] == sig.quirks


def test_non_ascii_record_and_unit_names_are_read_as_written(ecg_data, tmp_path):
    """wfdb decodes headers as ASCII: 'Ü0022.mat' became '0022.mat' (missing), 'µV' became 'V' (x1e6)."""
    original = ecg_data / "cpsc2018-cinc2020/A0022"
    rec = _copy_renamed(original, tmp_path, "Ü0022")
    want = read_wfdb(original).signal
    sig = read_wfdb(rec)
    assert np.array_equal(sig.signal, want)
    assert sig.quirks == ["non-ASCII characters in record or signal lines"]
    hea = rec.with_suffix(".hea")
    lines = hea.read_text().splitlines()
    lines[1] = lines[1].replace("/mV", "/µV")                       # lead I in microvolts
    hea.write_text("\n".join(lines) + "\n", encoding="utf-8")
    sig = read_wfdb(rec)
    assert sig.units[0] == "µV" and np.allclose(sig.signal[0], want[0] / 1000)
    assert np.array_equal(sig.signal[1:], want[1:])
    (ref,) = get_source("wfdb").list_records(tmp_path)
    assert ref.record_id == "Ü0022" and get_source("wfdb").read(ref).signal.shape == want.shape


# ------------------------------------------------- listing: headerless files, known layouts


def test_data_file_without_header_is_listed_and_refused_by_every_wfdb_reader(ecg_data, tmp_path):
    cinc = ecg_data / "cpsc2018-cinc2020"
    for n in ("A0001", "A0002"):
        for ext in (".hea", ".mat"):
            shutil.copy(cinc / f"{n}{ext}", tmp_path / f"{n}{ext}")
    shutil.copy(cinc / "A0003.mat", tmp_path / "A0003.mat")            # its header is missing
    (tmp_path / "A0004.dat").write_bytes(b"\0" * 64)                  # so is this one's
    for name in ("wfdb", "cinc2021", "cpsc2018"):
        src = get_source(name, **({"class_map": "none"} if name == "cinc2021" else {}))
        refs = {r.record_id: r for r in src.list_records(tmp_path)}
        assert set(refs) == {"A0001", "A0002", "A0003.mat", "A0004.dat"}, name
        for orphan in ("A0003.mat", "A0004.dat"):
            with pytest.raises(RecordError, match=f"no header: {orphan} has no {orphan[:5]}.hea"):
                src.read(refs[orphan])
        assert src.read(refs["A0002"]).signal.shape[0] == 12               # the others are unaffected


def test_a_data_file_named_by_another_header_is_not_an_orphan(ecg_data, tmp_path):
    text = (ecg_data / "ptbxl/records500/00000/00008_hr.hea").read_text()
    (tmp_path / "rec.hea").write_text(text.replace("00008_hr.dat", "samples.dat").replace("00008_hr", "rec"))
    shutil.copy(ecg_data / "ptbxl/records500/00000/00008_hr.dat", tmp_path / "samples.dat")
    (ref,) = get_source("wfdb").list_records(tmp_path)
    assert ref.record_id == "rec" and get_source("wfdb").read(ref).signal.shape == (12, 5000)


@pytest.mark.parametrize("folder, source", [
    ("ptbxl", "ptbxl"), ("mimic-iv-ecg-layout", "mimic-iv-ecg"), ("cpsc2018-original", "cpsc2018")])
def test_generic_reader_refuses_a_known_layout_naming_its_source(ecg_data, folder, source):
    """The generic reader on PTB-XL listed records100/ and records500/ as two records of each ECG."""
    with pytest.raises(ValueError, match=f"marks a {source} folder: read it with --source {source}"):
        get_source("wfdb").list_records(ecg_data / folder)


def test_known_layout_markers_are_specific(ecg_data, tmp_path):
    """A REFERENCE.csv without First_label (e.g. CinC 2017) does not mark a CPSC2018 folder."""
    shutil.copy(ecg_data / "ptb-diagnostic/s0010_re.hea", tmp_path)
    shutil.copy(ecg_data / "ptb-diagnostic/s0010_re.dat", tmp_path)
    (tmp_path / "REFERENCE.csv").write_text("A00001,N\n")
    assert [r.record_id for r in get_source("wfdb").list_records(tmp_path)] == ["s0010_re"]
    (tmp_path / "sub").mkdir()
    shutil.copy(ecg_data / "cpsc2018-original/REFERENCE.csv", tmp_path / "sub")
    with pytest.raises(ValueError, match="cpsc2018"):
        get_source("wfdb").list_records(tmp_path)


def test_same_record_id_twice_keeps_the_first_and_quarantines_the_other(ecg_data, tmp_path):
    from coreecg.data.pipeline import plan

    for sub in ("a", "b"):
        (tmp_path / sub).mkdir()
        for ext in (".hea", ".mat"):
            shutil.copy(ecg_data / f"cinc2021/E07500{ext}", tmp_path / sub)
    refs = get_source("cinc2021").list_records(tmp_path)
    assert [r.record_id for r in refs] == ["E07500", "E07500"]
    shards, dupes = plan(refs, shard_records=8)
    assert [r["path"] for s in shards for r in s] == [str(tmp_path / "a/E07500")]
    assert dupes == [{"record_id": "E07500", "path": str(tmp_path / "b/E07500"),
                      "reason": f"duplicate record id, first seen at {tmp_path / 'a/E07500'}"}]


# -------------------------------------------------------------------- patient ids


@pytest.mark.parametrize("comment, patient", [
    ("# Patient ID: 1234567", "1234567"),          # CODE-15% headers
    ("#Patient: P-17", "P-17"),
    ("# subject_id: 42", "42"),
    ("#Subject: S9", "S9"),
    ("# Patient ID: Unknown", None),
    ("# Age: 40", None),
])
def test_patient_id_from_header_comments(ptbxl_copy, comment, patient):
    hea = ptbxl_copy.with_suffix(".hea")
    hea.write_text(hea.read_text() + comment + "\n")
    src = get_source("wfdb")
    (ref,) = src.list_records(ptbxl_copy.parent)
    assert src.read(ref).patient_id == patient
    for name in ("cinc2021", "cpsc2018"):                    # the CinC readers look too
        hea.write_text(hea.read_text() + "# Dx: 426783006\n")
        (ref,) = get_source(name).list_records(ptbxl_copy.parent)
        assert get_source(name).read(ref).patient_id == patient, name

