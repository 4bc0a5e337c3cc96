"""HL7 aECG reader on FDA's minimal aECG files (tests/data/hospital/aecg), checked against a hand
decode of the same text, plus synthetic files for the edge cases those files lack."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from coreecg.data.record import RecordError
from coreecg.data.sources.aecg import AecgOptions, AecgSource
from coreecg.data.sources.registry import dataset_labels, label_free_options, source_spec

DATA = Path(__file__).resolve().parent / "data" / "hospital" / "aecg"
FDA_FILES = ("FDA_minimum_aecg.xml", "FDA_minimum_aecg_effectiveTime_interval.xml", "FDA_minimum_aecg_nouuid.xml")
SUBJECT = "2.16.840.1.113883.3.456/SBJ-123"


def hand_decode(path: Path) -> tuple[np.ndarray, float]:
    """(samples,) mV and fs of a one-lead aECG from its text alone (no XML parser): origin and scale
    in uV, increment in s."""
    text = path.read_text()
    digits = np.array(re.search(r"<digits>(.*?)</digits>", text, re.S).group(1).split(), dtype=float)
    origin = float(re.search(r'<origin value="([^"]+)" unit="uV"', text).group(1))
    scale = float(re.search(r'<scale value="([^"]+)" unit="uV"', text).group(1))
    increment = float(re.search(r'<increment value="([^"]+)" unit="s"', text).group(1))
    return (origin + scale * digits) / 1000.0, 1.0 / increment


# ---------------------------------------------------------------------------- synthetic files

SUBJECT_XML = """<componentOf><timepointEvent><componentOf><subjectAssignment><subject><trialSubject>
  {id}
  <subjectDemographicPerson><name>Clark Kent</name><birthTime value="19530508"/></subjectDemographicPerson>
</trialSubject></subject></subjectAssignment></componentOf></timepointEvent></componentOf>
<pertainsTo><subjectFindingComment><text>Subject felt dizzy before the ECG</text></subjectFindingComment>
</pertainsTo>"""


def time_seq(increment: str = '<increment value="0.002" unit="s"/>', code: str = "TIME_ABSOLUTE",
             kind: str = "GLIST_TS") -> str:
    return (f'<component><sequence><code code="{code}" codeSystem="2.16.840.1.113883.5.4"/>'
            f'<value xsi:type="{kind}"><head value="20021122091000"/>{increment}</value></sequence></component>')


def lead_seq(lead: str, digits: str, scale: str = '<scale value="2.5" unit="uV"/>',
             origin: str = '<origin value="0" unit="uV"/>') -> str:
    return (f'<component><sequence><code code="MDC_ECG_LEAD_{lead}" codeSystem="2.16.840.1.113883.6.24"/>'
            f'<value xsi:type="SLIST_PQ">{origin}{scale}<digits>{digits}</digits></value></sequence></component>')


def series(code: str, *sets: str) -> str:
    body = "".join(f"<component><sequenceSet>{s}</sequenceSet></component>" for s in sets)
    return (f'<component><series><code code="{code}" codeSystem="2.16.840.1.113883.5.4"/>{body}'
            '<subjectOf><annotationSet><component><annotation><text>Sinus rhythm, says the cart</text>'
            '</annotation></component></annotationSet></subjectOf></series></component>')


def write_aecg(path: Path, *series_xml: str, subject_id: str = '<id root="2.16.1.2" extension="SBJ-9"/>') -> Path:
    path.write_text('<?xml version="1.0" encoding="UTF-8"?>\n<!-- synthetic -->\n'
                    '<AnnotatedECG xmlns="urn:hl7-org:v3" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">'
                    '<id root="1.2.3"/><code code="93000" codeSystem="2.16.840.1.113883.6.12"/>'
                    + SUBJECT_XML.format(id=subject_id) + "".join(series_xml) + "</AnnotatedECG>\n")
    return path


def rhythm(*sequences: str) -> str:
    return series("RHYTHM", "".join(sequences))


def read_one(path: Path, **options):
    src = AecgSource(**options)
    return src.read(src.list_records(path)[0])


# ---------------------------------------------------------------------------- real files


@pytest.mark.parametrize("name", FDA_FILES)
def test_fda_minimum_files_match_a_hand_decode(name):
    expected, fs = hand_decode(DATA / name)
    rec = read_one(DATA / name)
    assert rec.source == "aecg" and rec.record_id == name
    assert rec.signal.dtype == np.float32 and rec.signal.shape == (1, 13)
    np.testing.assert_allclose(rec.signal[0], expected, rtol=1e-6, atol=1e-9)
    assert rec.signal[0, 0] == pytest.approx(-0.005)        # -2 digits x 2.5 uV
    assert rec.fs == fs == 500.0 and rec.lead_names == ("II",)
    assert rec.patient_id == SUBJECT and rec.labels == ()
    assert rec.meta["waveform"] == "RHYTHM" and rec.meta["series"] == 1 and rec.meta["sequence_sets"] == 1
    assert rec.meta["time_sequence"] == "TIME_ABSOLUTE" and rec.meta["scale_units"] == ["uV"]
    assert rec.meta["format"] == "aecg"


def test_registered_with_label_free_view_and_table_label():
    spec = source_spec("aecg")
    assert spec.cls is AecgSource and spec.options is AecgOptions
    assert dataset_labels()["aecg"] == "HL7 aECG"
    assert label_free_options()["aecg"] == {"labels": "", "class_map": ""}
    with pytest.raises(ValueError, match="class_map without labels"):
        AecgOptions(class_map="map.csv")


def test_lists_by_content_and_quarantines_other_xml(tmp_path):
    shutil.copy(DATA / FDA_FILES[0], tmp_path / "ecg0001")            # no suffix
    shutil.copy(DATA / FDA_FILES[0], tmp_path / "ecg0002.txt")        # another suffix
    (tmp_path / "notes.xml").write_text('<?xml version="1.0"?>\n<Patient><x/></Patient>\n')
    (tmp_path / "muse.xml").write_text("<RestingECG><Waveform/></RestingECG>\n")
    (tmp_path / "readme.txt").write_text("not an ECG\n")
    src = AecgSource()
    refs = {r.record_id: r for r in src.list_records(tmp_path)}
    assert set(refs) == {"ecg0001", "ecg0002.txt", "notes.xml", "muse.xml"}
    for rid in ("ecg0001", "ecg0002.txt"):
        assert src.read(refs[rid]).signal.shape == (1, 13)
    with pytest.raises(RecordError, match=r"neither GE MUSE .* root <Patient>"):
        src.read(refs["notes.xml"])
    with pytest.raises(RecordError, match="a GE MUSE XML file, not HL7 aECG"):
        src.read(refs["muse.xml"])


def test_read_export_refuses_a_file_that_is_not_an_aecg(tmp_path):
    src = AecgSource()
    (tmp_path / "a.xml").write_text("<Patient><AnnotatedECG/></Patient>")
    with pytest.raises(RecordError, match=r"not an HL7 aECG: root <Patient>"):
        src.read_export(str(tmp_path / "a.xml"))
    (tmp_path / "b.xml").write_text('<AnnotatedECG xmlns="urn:hl7-org:v3"><component><series>')
    with pytest.raises(RecordError, match="malformed XML"):
        src.read_export(str(tmp_path / "b.xml"))


def test_labels_from_a_table(tmp_path):
    for name in FDA_FILES[:2]:
        shutil.copy(DATA / name, tmp_path / name)
    table = tmp_path / "labels.csv"
    table.write_text("record_id,labels\nFDA_minimum_aecg,NORM;SR\n")      # suffix left out: still found
    src = AecgSource(labels=str(table))
    refs = {r.record_id: r for r in src.list_records(tmp_path)}
    assert src.class_names == ("NORM", "SR") and src.multilabel
    assert src.read(refs["FDA_minimum_aecg.xml"]).labels == ("NORM", "SR")
    with pytest.raises(RecordError, match="unlabelled: no row for 'FDA_minimum_aecg_effectiveTime_interval.xml'"):
        src.read(refs["FDA_minimum_aecg_effectiveTime_interval.xml"])


# ---------------------------------------------------------------------------- synthetic edge cases


def test_no_name_birth_date_or_free_text_in_the_record(tmp_path):
    path = write_aecg(tmp_path / "e.xml", rhythm(time_seq(), lead_seq("I", "1 2 3")))
    rec = read_one(path)
    seen = repr({k: v for k, v in vars(rec).items() if k != "signal"})
    assert rec.patient_id == "2.16.1.2/SBJ-9" and rec.signal.shape == (1, 3)
    for secret in ("Clark", "Kent", "19530508", "1953", "dizzy", "Sinus rhythm"):
        assert secret not in seen


@pytest.mark.parametrize("subject_id, expected", [
    ('<id root="2.16.1.2" extension="SBJ-9"/>', "2.16.1.2/SBJ-9"),
    ('<id extension="106_ABC"/>', "106_ABC"),
    ('<id root="3484B72F-B3BC"/>', "3484B72F-B3BC"),
    ("<id/>", None),
    ("", None),
], ids=["root-and-extension", "extension", "root", "empty-id", "no-subject"])
def test_patient_id_is_the_trial_subject_id(tmp_path, subject_id, expected):
    path = write_aecg(tmp_path / "e.xml", rhythm(time_seq(), lead_seq("I", "1 2 3")), subject_id=subject_id)
    assert read_one(path).patient_id == expected


def test_lead_names_units_and_relative_time(tmp_path):
    codes = ["I", "II", "III", "AVR", "AVL", "AVF", "V1", "V2", "V3", "V4", "V5", "V6", "V7", "V3R", "X", "aVF"]
    leads = [lead_seq(c, "0 10 -4") for c in codes[:-1]]
    leads.append(lead_seq("aVF", "0 10 -4", scale='<scale value="0.005" unit="mV"/>',
                          origin='<origin value="100"/>'))          # origin in the scale's unit
    other = ('<component><sequence><code code="MDC_ECG_CTL_VBL_PACER" codeSystem="2.16.840.1.113883.6.24"/>'
             '<value xsi:type="SLIST_PQ"><digits>1 1 1</digits></value></sequence></component>')
    path = write_aecg(tmp_path / "e.xml", rhythm(time_seq('<increment value="2" unit="ms"/>', "TIME_RELATIVE",
                                                          "GLIST_PQ"), *leads[:-1], other, leads[-1]))
    src = AecgSource()
    export = src.read_export(str(path))
    assert export.leads == ("I", "II", "III", "aVR", "aVL", "aVF", "V1", "V2", "V3", "V4", "V5", "V6",
                            "V7", "V3R", "X", "aVF")
    assert export.fs == 500.0 and export.meta["time_sequence"] == "TIME_RELATIVE"
    np.testing.assert_allclose(export.signal[0], [0.0, 0.025, -0.01])
    np.testing.assert_allclose(export.signal[-1], [100.0, 100.05, 99.98])
    assert export.meta["scale_units"] == ["mV", "uV"] and export.meta["other_sequences"] == 1


def test_the_rhythm_is_read_and_a_representative_beat_alone_is_refused(tmp_path):
    beat = series("REPRESENTATIVE_BEAT", time_seq('<increment value="0.001" unit="s"/>') + lead_seq("I", "4 4"))
    both = write_aecg(tmp_path / "both.xml", beat,
                      series("RHYTHM", time_seq() + lead_seq("I", "1 2 3"), time_seq() + lead_seq("I", "9 9 9 9")))
    rec = read_one(both)
    assert rec.meta["waveform"] == "RHYTHM" and rec.fs == 500.0
    assert rec.meta["series"] == 2 and rec.meta["series_codes"] == ["REPRESENTATIVE_BEAT", "RHYTHM"]
    assert rec.meta["sequence_sets"] == 2                       # the first set is read
    np.testing.assert_allclose(rec.signal[0], np.array([1, 2, 3]) * 2.5e-3, rtol=1e-6)
    with pytest.raises(RecordError, match=r"no RHYTHM series \(series codes: REPRESENTATIVE_BEAT\)"):
        AecgSource().read_export(str(write_aecg(tmp_path / "beat.xml", beat)))   # a median beat is no recording


@pytest.mark.parametrize("body, reason", [
    (rhythm(time_seq('<increment value="0" unit="s"/>'), lead_seq("I", "1 2")), r"sampling increment 0 s: not > 0"),
    (rhythm(time_seq(""), lead_seq("I", "1 2")), "sampling increment missing"),
    (rhythm(time_seq('<increment value="2" unit="min"/>'), lead_seq("I", "1 2")), "sampling increment in 'min'"),
    (rhythm(time_seq(kind="SLIST_TS"), lead_seq("I", "1 2")), "time sequence of type SLIST_TS"),
    (rhythm(lead_seq("I", "1 2")), "no time sequence"),
    (rhythm(time_seq(), lead_seq("I", "1 2", scale='<scale value="2.5"/>')), "units missing: the scale of lead I"),
    (rhythm(time_seq(), lead_seq("I", "1 2", scale='<scale value="2.5" unit="mmHg"/>')), "unknown units 'mmHg'"),
    (rhythm(time_seq(), lead_seq("I", "1 2", scale="")), "lead I: no <scale>"),
    (rhythm(time_seq(), lead_seq("I", "1 x")), "lead I: <digits> that are not numbers"),
    (rhythm(time_seq()), "leads missing"),
    (rhythm(time_seq(), lead_seq("I", "1 2 3"), lead_seq("II", "1 2")), "leads of different lengths: I 3, II 2"),
    (series("RHYTHM"), "the RHYTHM series has no sequenceSet"),
    (series("OTHER", time_seq() + lead_seq("I", "1 2")),
     r"no RHYTHM series \(series codes: OTHER\)"),
    ("", "series codes: none"),
], ids=["increment-0", "no-increment", "time-unit", "time-not-evenly-sampled", "no-time", "no-scale-unit",
        "unknown-unit", "no-scale", "bad-digits", "no-leads", "lengths-differ", "no-sequence-set",
        "no-rhythm-or-beat", "no-series"])
def test_unusable_files_are_record_errors(tmp_path, body, reason):
    path = write_aecg(tmp_path / "bad.xml", body)
    src = AecgSource()
    with pytest.raises(RecordError, match=reason) as err:
        src.read(src.list_records(path)[0])
    assert err.value.path == str(path)


def test_empty_digits_are_refused_by_the_shared_check(tmp_path):
    path = write_aecg(tmp_path / "e.xml", rhythm(time_seq(), lead_seq("I", " ")))
    with pytest.raises(RecordError, match="no samples"):
        read_one(path)
