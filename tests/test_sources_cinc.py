"""CPSC2018 (original release and CinC form) and CinC 2021 (incl. SPH) readers on the real
records in ../shared/ecg-data, and the CinC 2021 label maps against the challenge's csvs.

Expected labels were read by hand from REFERENCE.csv and the `#Dx:` header lines.
"""
from __future__ import annotations

import collections
import shutil

import numpy as np
import pytest
import scipy.io

from coreecg.data.record import STANDARD_LEADS, RecordError
from coreecg.data.sources import get_source
from coreecg.data.sources._cinc2021_dx_table import DX_ROWS, EQUIVALENT_CODES
from coreecg.data.sources.cinc2021 import subset_of
from coreecg.data.sources.cinc2021_labels import build_class_map, parse_dx_csvs
from coreecg.data.sources.cpsc2018 import CLASS_NAMES as CPSC_CLASSES


def _by_id(refs):
    return {r.record_id: r for r in refs}


# ------------------------------------------------------------------------- CPSC2018


@pytest.fixture(scope="module")
def cpsc():
    return get_source("cpsc2018")


def test_cpsc_original_release(ecg_data, cpsc):
    refs = _by_id(cpsc.list_records(ecg_data / "cpsc2018-original"))
    assert sorted(refs) == [f"A{n}" for n in range(1980, 1990)]
    # REFERENCE.csv: A1980 -> 6 (PAC), A1983 -> 1 (Normal), A1986 -> 5 (RBBB), A1988 -> 3 (I-AVB)
    expected = {"A1980": ("PAC",), "A1983": ("Normal",), "A1986": ("RBBB",), "A1988": ("I-AVB",)}
    for rid, labels in expected.items():
        rec = cpsc.read(refs[rid])
        assert rec.labels == labels and rec.patient_id is None
        assert rec.lead_names == STANDARD_LEADS and rec.fs == 500
        assert rec.signal.dtype == np.float32 and rec.signal.shape[0] == 12
    rec = cpsc.read(refs["A1980"])
    assert rec.meta["sex"] == "Male" and rec.meta["age"] == 52 and rec.signal.shape == (12, 5000)


def test_cpsc_cinc2020_form(ecg_data, cpsc):
    refs = _by_id(cpsc.list_records(ecg_data / "cpsc2018-cinc2020"))
    assert len(refs) == 75 and all(r.extra["form"] == "cinc" for r in refs.values())
    # '#Dx: RBBB' / 'Normal' / 'PVC' / 'STD' and the one multi-label record '#Dx: AF,RBBB'.
    for rid, labels in {"A0001": ("RBBB",), "A0002": ("Normal",), "A0005": ("PVC",),
                        "A0008": ("STD",), "A0043": ("AF",)}.items():
        assert cpsc.read(refs[rid]).labels == labels
    assert not cpsc.multilabel and cpsc.class_names == CPSC_CLASSES and cpsc.label_view == "first"
    multi = get_source("cpsc2018", label_view="multi")
    assert multi.multilabel and multi.read(refs["A0043"]).labels == ("AF", "RBBB")   # #Dx order
    with pytest.raises(RecordError, match=r"not single-label: classes \[AF, RBBB\]"):
        get_source("cpsc2018", label_view="single").read(refs["A0043"])


def test_cpsc_abbreviation_and_snomed_forms_agree(ecg_data, cpsc):
    """A0001-A0010 exist in CinC 2020 form (abbreviations) and CinC 2021 form (SNOMED)."""
    abbr = _by_id(cpsc.list_records(ecg_data / "cpsc2018-cinc2020"))
    snomed = _by_id(cpsc.list_records(ecg_data / "cinc2021-smoke/CPSC_CPSC-Extra"))
    for rid in [f"A{n:04d}" for n in range(1, 11)]:
        a, s = cpsc.read(abbr[rid]), cpsc.read(snomed[rid])
        assert a.labels == s.labels and len(a.labels) == 1
        assert s.meta["dx"][0].isdigit() and not a.meta["dx"][0].isdigit()
        assert np.array_equal(a.signal, s.signal)


def test_cpsc_original_and_cinc_amplitudes_agree(ecg_data, cpsc):
    """Original .mat (float) and CinC int16/1000 records are both in mV: same QRS scale."""
    def median_p2p(folder):
        refs = cpsc.list_records(ecg_data / folder)[:10]
        return np.median([np.ptp(cpsc.read(r).signal, axis=1).mean() for r in refs])
    orig, cinc = median_p2p("cpsc2018-original"), median_p2p("cpsc2018-cinc2020")
    assert 0.5 < orig < 5 and 0.5 < cinc < 5 and 0.33 < orig / cinc < 3


def test_cpsc_original_bad_files(ecg_data, tmp_path, cpsc):
    shutil.copy(ecg_data / "cpsc2018-original/A1981.mat", tmp_path / "A1981.mat")
    mat = scipy.io.loadmat(ecg_data / "cpsc2018-original/A1981.mat")
    mat["ECG"]["data"][0, 0] = mat["ECG"]["data"][0, 0] * 1000       # microvolts
    scipy.io.savemat(tmp_path / "A1982.mat", {"ECG": mat["ECG"]})
    scipy.io.savemat(tmp_path / "A1983.mat", {"val": np.zeros((12, 10))})
    (tmp_path / "A1984.mat").write_bytes(b"not a mat file at all")
    (tmp_path / "REFERENCE.csv").write_text(
        "Recording,First_label,Second_label,Third_label\n"
        "A1982,8,,\nA1983,8,,\nA1984,1,,\nA1985,1,,\n")
    refs = _by_id(cpsc.list_records(tmp_path))
    reasons = {}
    for rid in ("A1981", "A1982", "A1983", "A1984"):
        with pytest.raises(RecordError) as err:
            cpsc.read(refs[rid])
        reasons[rid] = err.value.reason
    assert reasons["A1981"] == "no REFERENCE.csv row: A1981"
    assert reasons["A1982"].startswith("not millivolts: ")
    assert "no struct 'ECG'" in reasons["A1983"]
    assert "unreadable .mat" in reasons["A1984"]


def test_cpsc_original_reference_in_a_parent_folder(ecg_data, tmp_path, cpsc):
    """The release splits .mat files over TrainingSet folders; REFERENCE.csv may sit above them."""
    (tmp_path / "TrainingSet1").mkdir()
    shutil.copy(ecg_data / "cpsc2018-original/A1986.mat", tmp_path / "TrainingSet1/A1986.mat")
    (tmp_path / "REFERENCE.csv").write_text(
        "Recording,First_label,Second_label,Third_label\nA1986,5,2,\n")
    (ref,) = cpsc.list_records(tmp_path)
    assert ref.extra == {"form": "original", "labels": ["RBBB", "AF"], "unrecognised": []}
    assert cpsc.read(ref).labels == ("RBBB",)                      # First_label


def test_cpsc_cinc_bad_labels(ecg_data, tmp_path, cpsc):
    for ext in (".hea", ".mat"):
        shutil.copy(ecg_data / f"cpsc2018-cinc2020/A0001{ext}", tmp_path / f"A0001{ext}")
        (tmp_path / f"A0001{ext}").chmod(0o644)
    hea = tmp_path / "A0001.hea"
    hea.write_text(hea.read_text().replace("#Dx: RBBB", "#Dx: RBBB,XYZ"))
    (ref,) = cpsc.list_records(tmp_path)
    with pytest.raises(RecordError, match=r"unknown CPSC label\(s\) in #Dx: \['XYZ'\]"):
        cpsc.read(ref)
    hea.write_text(hea.read_text().replace("#Dx: RBBB,XYZ", "#Rx: none"))
    with pytest.raises(RecordError, match="no #Dx labels"):
        cpsc.read(ref)


@pytest.mark.parametrize("view, labels", [
    ("first", ("RBBB",)), ("multi", ("RBBB", "AF")), ("single", None), ("none", ())])
def test_cpsc_label_views_keep_the_primary_label_first(ecg_data, tmp_path, view, labels):
    """REFERENCE.csv: First_label RBBB (5), Second_label AF (2). Class order would say AF."""
    shutil.copy(ecg_data / "cpsc2018-original/A1986.mat", tmp_path / "A1986.mat")
    shutil.copy(ecg_data / "cpsc2018-original/A1983.mat", tmp_path / "A1983.mat")
    (tmp_path / "REFERENCE.csv").write_text(
        "Recording,First_label,Second_label,Third_label\nA1986,5,2,\nA1983,1,,\n")
    src = get_source("cpsc2018", label_view=view)
    refs = _by_id(src.list_records(tmp_path))
    if labels is None:
        with pytest.raises(RecordError, match=r"not single-label: classes \[RBBB, AF\]"):
            src.read(refs["A1986"])
    else:
        assert src.read(refs["A1986"]).labels == labels
    assert src.read(refs["A1983"]).labels == (() if view == "none" else ("Normal",))
    assert src.class_names == (() if view == "none" else CPSC_CLASSES) and src.multilabel == (view == "multi")


def test_cpsc_records_without_a_cpsc_class_are_refused_and_their_codes_kept(ecg_data, tmp_path):
    """CPSC-Extra records (CinC 2021 form) carry SNOMED codes outside the 9 classes: they were
    written with label -1. A REFERENCE.csv row with no number 1-9 is refused the same way."""
    cpsc = get_source("cpsc2018")
    refs = _by_id(cpsc.list_records(ecg_data / "cinc2021-smoke/CPSC_CPSC-Extra"))
    with pytest.raises(RecordError) as err:
        cpsc.read(refs["Q0002"])                               # #Dx: 164861001
    assert err.value.reason == "no label of the task: #Dx codes [164861001] map to none of the 9 classes"
    assert err.value.unrecognised_codes == ["164861001"]
    q10 = cpsc.read(refs["Q0010"])                             # 427172004 (PVC), 164865005
    assert q10.labels == ("PVC",) and q10.meta["unrecognised_codes"] == ["164865005"]
    assert cpsc.read(refs["A0003"]).labels == ("AF",)
    assert get_source("cpsc2018", label_view="none").read(refs["Q0002"]).labels == ()
    shutil.copy(ecg_data / "cpsc2018-original/A1980.mat", tmp_path / "A1980.mat")
    (tmp_path / "REFERENCE.csv").write_text("Recording,First_label,Second_label,Third_label\nA1980,0,x,\n")
    (ref,) = cpsc.list_records(tmp_path)
    with pytest.raises(RecordError, match=r"no label of the task: REFERENCE.csv labels \[0, x\]") as err:
        cpsc.read(ref)
    assert err.value.unrecognised_codes == ["0", "x"]


def test_cinc2021_reader_refuses_cinc2020_abbreviations_instead_of_empty_labels(ecg_data):
    """CinC 2020 CPSC headers say '#Dx: AF,RBBB': no SNOMED code, so every record had no label."""
    src = get_source("cinc2021")
    refs = _by_id(src.list_records(ecg_data / "cpsc2018-cinc2020"))
    with pytest.raises(RecordError) as err:
        src.read(refs["A0043"])
    assert err.value.reason.startswith("no label of the task: #Dx codes [AF, RBBB] map to none of the 26 classes")
    assert "read those with the cpsc2018 source" in err.value.reason
    assert err.value.unrecognised_codes == ["AF", "RBBB"]
    assert get_source("cinc2021", class_map="none").read(refs["A0043"]).labels == ()   # unlabelled view


# ---------------------------------------------------------------- CinC 2021 label maps


def test_embedded_tables_equal_the_challenge_csvs(ecg_data):
    labels = ecg_data / "labels"
    rows, pairs = parse_dx_csvs(labels / "cinc2021_dx_mapping_scored.csv",
                                labels / "cinc2021_dx_mapping_unscored.csv")
    assert rows == DX_ROWS and pairs == EQUIVALENT_CODES
    assert build_class_map("scored26", rows=rows, pairs=pairs) == build_class_map("scored26")


def test_scored26_merges_the_four_equivalent_pairs(ecg_data):
    cmap = build_class_map("scored26")
    assert len(cmap.class_names) == 26 and len(set(cmap.class_names)) == 26
    assert len(cmap.code_to_class) == 30
    c = cmap.code_to_class
    assert c["733534002"] == c["164909002"] == "LBBB"
    assert c["713427006"] == c["59118001"] == "RBBB"
    assert c["284470004"] == c["63593006"] == "PAC"
    assert c["427172004"] == c["17338001"] == "PVC"
    # The challenge's weights.csv header lists the same 26 classes, pairs joined by '|'.
    header = (ecg_data / "labels/cinc2021_weights.csv").read_text().splitlines()[0].split(",")[1:]
    groups = {frozenset(h.split("|")) for h in header}
    ours = collections.defaultdict(set)
    for code, name in c.items():
        ours[name].add(code)
    assert groups == {frozenset(v) for v in ours.values()}


def test_ningbo25_and_frequent_maps():
    ningbo = build_class_map("ningbo25")
    assert len(ningbo.class_names) == 25
    assert set(build_class_map("scored26").class_names) - set(ningbo.class_names) == {"AF"}
    freq = build_class_map("frequent", min_count=1000)
    assert {"STach", "OldMI", "STD", "LVH"} <= set(freq.class_names)
    assert "Brady" not in freq.class_names                      # 295 records in total
    assert freq.class_names.index("STach") < freq.class_names.index("OldMI")
    # 30 scored + 103 unscored codes, 4 pairs merged; every code occurs at least once.
    assert len(build_class_map("frequent", min_count=1).class_names) == 133 - 4
    assert build_class_map("none").class_names == ()
    with pytest.raises(ValueError, match="count column"):
        build_class_map("frequent", count_column="Mars")


# ---------------------------------------------------------------------- CinC 2021 data


def test_subset_from_record_id():
    assert [subset_of(i) for i in ("A0001", "Q0001", "I0001", "S0001", "HR00001", "E00001",
                                   "JS00001", "JS10646", "JS10647", "JS45551", "SPH00001", "X1")] == [
        "CPSC", "CPSC-Extra", "StPetersburg", "PTB", "PTB-XL", "Georgia",
        "Chapman-Shaoxing", "Chapman-Shaoxing", "Ningbo", "Ningbo", "SPH", "unknown"]


def test_cinc2021_smoke_subsets_and_labels(ecg_data):
    src = get_source("cinc2021")
    refs = _by_id(src.list_records(ecg_data / "cinc2021-smoke"))
    counts = collections.Counter(r.extra["subset"] for r in refs.values())
    assert counts == {"CPSC": 10, "CPSC-Extra": 10, "Georgia": 10, "PTB": 10, "PTB-XL": 10,
                      "Chapman-Shaoxing": 10, "Ningbo": 10, "SPH": 10}
    expected = {
        "JS00001": ("AF", "RBBB", "TAb"),        # 164889003,59118001,164934002 (Chapman)
        "Q0001": ("STach",),                     # 164867002 (OldMI, unscored), 427084000
        "S0001": ("LQRSV", "NSR"),               # 251146004,426783006
    }
    for rid, labels in expected.items():
        rec = src.read(refs[rid])
        assert rec.labels == labels and rec.meta["subset"] == refs[rid].extra["subset"]
    with pytest.raises(RecordError) as err:      # 106068003 only: unscored, no label of the task
        src.read(refs["JS45551"])
    assert err.value.reason == "no label of the task: #Dx codes [106068003] map to none of the 26 classes"
    assert err.value.unrecognised_codes == []    # the code is in the unscored table
    assert get_source("cinc2021", class_map="frequent").read(refs["JS45551"]).meta["unmapped_codes"] == []
    ptb = src.read(refs["S0001"])                # PTB at 1000 Hz, 38.4 s
    assert ptb.fs == 1000 and ptb.signal.shape == (12, 38400) and ptb.meta["subset"] == "PTB"
    assert ptb.patient_id is None and ptb.meta["age"] == 81 and ptb.meta["sex"] == "Female"


def test_cinc2021_frequent_map_keeps_unscored_codes(ecg_data):
    src = get_source("cinc2021", class_map="frequent", min_count=1000)
    (ref,) = [r for r in src.list_records(ecg_data / "cinc2021-smoke") if r.record_id == "Q0001"]
    assert src.read(ref).labels == ("STach", "OldMI")


def test_cinc2021_ningbo_task(ecg_data):
    src = get_source("cinc2021", class_map="ningbo25", subsets=["Ningbo"])
    refs = _by_id(src.list_records(ecg_data / "cinc2021"))
    assert len(refs) == 20 and all(r.startswith("JS2") for r in refs)
    assert len(src.class_names) == 25 and "AF" not in src.class_names
    # JS20000: 284470004 PAC, 427084000 STach, 698252002 NSIVCB, 55930002 (STC, unscored)
    rec = src.read(refs["JS20000"])
    assert rec.labels == ("NSIVCB", "PAC", "STach") and rec.meta["unmapped_codes"] == ["55930002"]
    # JS20003: PAC, STach, 55827005 (unlisted), TAb, 427172004 PVC
    assert src.read(refs["JS20003"]).labels == ("PAC", "PVC", "STach", "TAb")
    for r in list(refs.values())[:8]:
        rec = src.read(r)
        assert set(rec.labels) <= set(src.class_names) and rec.signal.shape == (12, 5000)


def test_the_ningbo_subset_alone_reads_the_25_class_task_by_default():
    """A build that names only subsets=[Ningbo] (studies/paper.yaml's) gets ningbo25, not the
    26-class map with an output that is never positive; any other selection keeps scored26, and
    an explicit class_map is kept."""
    from coreecg.config import load_config

    def opts(*sets):
        return load_config(overrides=list(sets)).data.sources.for_source("cinc2021", 0)

    assert opts("data.sources.cinc2021.subsets=[Ningbo]")["class_map"] == "ningbo25"
    assert len(get_source("cinc2021", **opts("data.sources.cinc2021.subsets=[Ningbo]")).class_names) == 25
    assert opts()["class_map"] == "scored26"
    assert opts("data.sources.cinc2021.subsets=[Ningbo, Georgia]")["class_map"] == "scored26"
    assert opts("data.sources.cinc2021.subsets=[Ningbo]",
                "data.sources.cinc2021.class_map=scored26")["class_map"] == "scored26"


def test_cinc2021_georgia_and_ptbxl(ecg_data):
    src = get_source("cinc2021")
    refs = _by_id(src.list_records(ecg_data / "cinc2021"))
    e = src.read(refs["E07500"])                 # 67741000119109 (LAE, unscored), 426177001 SB
    assert e.labels == ("SB",) and e.meta["subset"] == "Georgia"
    hr = src.read(refs["HR06001"])              # 426783006 NSR, 55930002 STC; header units 'mv'
    assert hr.labels == ("NSR",) and hr.meta["subset"] == "PTB-XL"
    assert 0.3 < np.ptp(hr.signal[1]) < 5


def test_sph_records(ecg_data):
    src = get_source("cinc2021", subsets=["SPH"])
    refs = _by_id(src.list_records(ecg_data / "cinc2021-smoke"))
    assert len(refs) == 10
    # metadata.csv: SPH00001.h5,22;23,S00001,55,M,5000,...,500,"426177001,427393009",0
    rec = src.read(refs["SPH00001"])
    assert rec.labels == ("SA", "SB") and rec.patient_id == "S00001"
    assert rec.meta["aha_codes"] == ["22", "23"] and rec.fs == 500 and rec.signal.shape == (12, 5000)
    assert rec.lead_names == STANDARD_LEADS and rec.signal.dtype == np.float32
    x = rec.signal.astype(np.float64)            # the stated order obeys Einthoven/Goldberger
    assert np.abs(x[1] - x[0] - x[2]).max() < 0.01
    assert np.abs(x[3] + (x[0] + x[1]) / 2).max() < 0.01
    assert np.abs(x[4] - (x[0] - x[2]) / 2).max() < 0.01
    assert np.abs(x[5] - (x[1] + x[2]) / 2).max() < 0.01
    assert src.read(refs["SPH00007"]).labels == ("RBBB",)        # 59118001
    with pytest.raises(RecordError, match="no metadata.csv row: SPH00005"):
        src.read(refs["SPH00005"])                               # .h5 without a metadata row


def test_sph_bad_files(ecg_data, tmp_path):
    sph = ecg_data / "cinc2021-smoke/SPH"
    for n in ("SPH00001", "SPH00002"):
        shutil.copy(sph / f"{n}.h5", tmp_path / f"{n}.h5")
    (tmp_path / "SPH00001.h5").chmod(0o644)
    with open(tmp_path / "SPH00001.h5", "r+b") as f:
        f.truncate(2000)
    lines = (sph / "metadata.csv").read_text().splitlines()
    lines[2] = lines[2].replace(",6000,", ",5000,")           # SPH00002 really has 6000
    (tmp_path / "metadata.csv").write_text("\n".join(lines[:3]) + "\n")
    src = get_source("cinc2021")
    refs = _by_id(src.list_records(tmp_path))
    with pytest.raises(RecordError, match="unreadable h5"):
        src.read(refs["SPH00001"])
    with pytest.raises(RecordError, match="h5 has 6000 samples, metadata.csv says N=5000"):
        src.read(refs["SPH00002"])


def test_cinc2021_truncated_mat(ecg_data, tmp_path):
    for ext in (".hea", ".mat"):
        shutil.copy(ecg_data / f"cinc2021/JS20000{ext}", tmp_path / f"JS20000{ext}")
    (tmp_path / "JS20000.mat").chmod(0o644)
    with open(tmp_path / "JS20000.mat", "r+b") as f:
        f.truncate(5000)
    src = get_source("cinc2021")
    (ref,) = src.list_records(tmp_path)
    with pytest.raises(RecordError, match="truncated data file: JS20000.mat has 5000 bytes, header needs 120024"):
        src.read(ref)
