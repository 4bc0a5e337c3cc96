"""The GE MUSE XML reader (coreecg/data/sources/muse.py) on two real MUSE files, checked against a
hand decode of their base64 and against the same ECG written as 12-lead DICOM; edge cases on small
MUSE files written here."""
from __future__ import annotations

import base64
import re
import shutil
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

import numpy as np
import pytest

from coreecg.config import STANDARD_LEADS
from coreecg.data.leads import select_leads
from coreecg.data.record import RecordError
from coreecg.data.sources import get_source, source_spec
from coreecg.data.sources.muse import MuseOptions, MuseSource  # importing it registers "muse"

HOSPITAL = Path(__file__).resolve().parent / "data" / "hospital"
GUANGXI = HOSPITAL / "muse" / "guangxi_teaching_sinus_rhythm.xml"
MUSEPHI = HOSPITAL / "muse" / "musePHI_muse_ecg1.xml"
GUANGXI_DICOM = HOSPITAL / "dicom" / "guangxi_teaching_sinus_rhythm.dcm"
AECG = HOSPITAL / "aecg" / "FDA_minimum_aecg.xml"
STORED = ("I", "II", "V1", "V2", "V3", "V4", "V5", "V6")
UV_PER_BIT = 4.88


def read_file(path: Path, **options):
    """The Record of one file, listed and read as the pipeline does."""
    src = MuseSource(**options)
    (ref,) = src.list_records(path)
    return src.read(ref)


def rhythm_leads_by_hand(path: Path) -> dict[str, tuple[bytes, int]]:
    """{lead: (decoded bytes, stored CRC32)} of the rhythm waveform, found with regular expressions
    (not the reader's ElementTree walk)."""
    text = path.read_text(encoding="latin-1")
    rhythm = text[text.index("<WaveformType>Rhythm</WaveformType>"):]
    out = {}
    for block in re.findall(r"<LeadData>(.*?)</LeadData>", rhythm, re.S):
        lead = re.search(r"<LeadID>(\w+)</LeadID>", block).group(1)
        crc = int(re.search(r"<LeadDataCRC32>(\d+)</LeadDataCRC32>", block).group(1))
        b64 = re.search(r"<WaveFormData>(.*?)</WaveFormData>", block, re.S).group(1)
        out[lead] = (base64.b64decode("".join(b64.split())), crc)
    return out


# ---------------------------------------------------------------------------- real files


@pytest.mark.parametrize("path, patient", [(GUANGXI, "00000000"), (MUSEPHI, "JAX01234")])
def test_real_files_match_a_hand_decode_and_their_crcs(path, patient):
    rec = read_file(path)
    assert rec.fs == 500.0 and rec.signal.shape == (12, 5000) and rec.duration_s == 10.0
    assert rec.signal.dtype == np.float32
    assert rec.lead_names == STORED + ("III", "aVR", "aVL", "aVF")
    assert rec.patient_id == patient
    assert rec.meta["derived_leads"] == ["III", "aVR", "aVL", "aVF"]
    assert rec.meta["crc32_checked_leads"] == 8 and rec.meta["amplitude_units"] == ["MICROVOLTS"]
    by_hand = rhythm_leads_by_hand(path)
    assert tuple(by_hand) == STORED
    for row, lead in enumerate(STORED):
        data, crc = by_hand[lead]
        assert len(data) == 10000 and zlib.crc32(data) == crc
        expected = np.frombuffer(data, "<i2") * UV_PER_BIT * 1e-3
        np.testing.assert_allclose(rec.signal[row], expected, rtol=1e-6, atol=1e-7)
    i, ii = (np.frombuffer(by_hand[k][0], "<i2") * UV_PER_BIT * 1e-3 for k in ("I", "II"))
    np.testing.assert_allclose(rec.signal[8], ii - i, atol=1e-6)          # III
    np.testing.assert_allclose(rec.signal[9], -(i + ii) / 2, atol=1e-6)   # aVR
    assert np.abs(rec.signal).max() > 0.2    # a real ECG in mV, not counts or volts


def _dicom_leads_mv(path: Path) -> dict[str, np.ndarray]:
    """{lead: (n,) mV} of the DICOM's rhythm group, read by pydicom."""
    pydicom = pytest.importorskip("pydicom")
    ds = pydicom.dcmread(path)
    group = next(i for i, w in enumerate(ds.WaveformSequence) if w.MultiplexGroupLabel == "Rhythm")
    wave = ds.waveform_array(group)      # sensitivity x correction factor applied: in the channels' units
    out = {}
    for k, ch in enumerate(ds.WaveformSequence[group].ChannelDefinitionSequence):
        assert ch.ChannelSensitivityUnitsSequence[0].CodeValue == "uV"
        meaning = ch.ChannelSourceSequence[0].CodeMeaning          # "Lead I", "aVR, augmented voltage, right"
        name = meaning.split(",")[0].removeprefix("Lead ").strip()
        out[name] = wave[:, k] * 1e-3
    return out


def test_guangxi_matches_the_same_ecg_written_as_12_lead_dicom():
    """ecg2dcm wrote the 8 stored leads as they are and the 4 derived ones rounded to whole 4.88 uV
    counts (int16): stored leads and III (a difference of counts) agree exactly, aVR/aVL/aVF
    (half counts) within half a count."""
    rec = read_file(GUANGXI)
    dicom = _dicom_leads_mv(GUANGXI_DICOM)
    assert set(dicom) == set(STANDARD_LEADS)
    ours = dict(zip(rec.lead_names, rec.signal))
    half_count_mv = 0.5 * UV_PER_BIT * 1e-3
    for lead in STANDARD_LEADS:
        tol = half_count_mv if lead in ("aVR", "aVL", "aVF") else 0.0
        np.testing.assert_allclose(ours[lead], dicom[lead], rtol=0, atol=tol + 1e-5, err_msg=lead)
    # the half-count rounding is real (the tolerance is needed, and no larger than it)
    assert np.abs(ours["aVR"] - dicom["aVR"]).max() == pytest.approx(half_count_mv, abs=1e-5)


def test_no_name_birth_date_or_statement_reaches_the_record():
    for path in (GUANGXI, MUSEPHI):
        root = ET.parse(path).getroot()
        private = [root.findtext(f"PatientDemographics/{t}") for t in ("PatientLastName", "PatientFirstName",
                                                                       "DateofBirth")]
        private += [e.text for e in root.iter() if e.tag in ("StmtText", "TestReason", "ReasonForTest",
                                                             "SiteName", "OverreaderLastName")]
        private = [p.strip() for p in private if p and len(p.strip()) >= 4]
        assert len(private) >= 3, path
        rec = read_file(path)
        seen = " ".join([str(rec.meta), " ".join(rec.lead_names), str(rec.patient_id), rec.record_id])
        leaked = [p for p in private if p in seen]
        assert not leaked, (path.name, leaked)


# ---------------------------------------------------------------------------- listing and labels


def test_listing_is_by_content_and_other_xml_is_listed_as_its_reason(tmp_path):
    (tmp_path / "ecg").mkdir()
    shutil.copy(GUANGXI, tmp_path / "ecg" / "0001.xml")
    shutil.copy(MUSEPHI, tmp_path / "ecg" / "0002")                 # no suffix: listed by content
    shutil.copy(MUSEPHI, tmp_path / "ecg" / "0003.txt")             # a wrong suffix: still MUSE
    (tmp_path / "ecg" / "notes.xml").write_text('<?xml version="1.0"?>\n<Report><Line>x</Line></Report>\n')
    shutil.copy(AECG, tmp_path / "aecg.xml")
    shutil.copy(GUANGXI_DICOM, tmp_path / "ecg.dcm")                # another format: not this reader's
    src = MuseSource()
    refs = {r.record_id: r for r in src.list_records(tmp_path)}
    assert sorted(refs) == ["aecg.xml", "ecg/0001.xml", "ecg/0002", "ecg/0003.txt", "ecg/notes.xml"]
    assert src.read(refs["ecg/0002"]).patient_id == "JAX01234"
    assert src.read(refs["ecg/0003.txt"]).signal.shape == (12, 5000)
    with pytest.raises(RecordError, match=r"neither GE MUSE \(root RestingECG\) nor HL7 aECG.*root <Report>"):
        src.read(refs["ecg/notes.xml"])
    with pytest.raises(RecordError, match="a HL7 aECG file, not GE MUSE XML: read it with --source auto"):
        src.read(refs["aecg.xml"])


def test_read_export_refuses_another_xml_given_directly(tmp_path):
    other = tmp_path / "report.xml"
    other.write_text("<Report/>")
    with pytest.raises(RecordError, match="neither GE MUSE"):
        MuseSource().read_export(str(other))


def test_labels_from_a_table(tmp_path):
    (tmp_path / "ecg").mkdir()
    shutil.copy(GUANGXI, tmp_path / "ecg" / "0001.xml")
    shutil.copy(MUSEPHI, tmp_path / "ecg" / "0002.xml")
    table = tmp_path / "labels.csv"
    table.write_text("record_id,labels\necg/0001,NORM;SR\n")     # the id without its suffix also matches
    src = MuseSource(labels=str(table))
    assert src.class_names == ("NORM", "SR") and src.multilabel
    refs = {r.record_id: r for r in src.list_records(tmp_path / "ecg")}
    assert sorted(refs) == ["0001.xml", "0002.xml"]
    table.write_text("record_id,labels\n0001.xml,NORM;SR\n")
    src = MuseSource(labels=str(table))
    assert src.read(refs["0001.xml"]).labels == ("NORM", "SR")
    with pytest.raises(RecordError, match=r"unlabelled: no row for '0002.xml'"):
        src.read(refs["0002.xml"])


def test_registered_with_its_label_and_label_free_view():
    spec = source_spec("muse")
    assert spec.cls is MuseSource and spec.options is MuseOptions
    assert spec.dataset_labels == {"muse": "GE MUSE XML"}
    assert spec.label_free_options(MuseOptions()) == {"labels": "", "class_map": ""}
    assert isinstance(get_source("muse"), MuseSource)
    with pytest.raises(ValueError, match="class_map without labels"):
        MuseOptions(class_map="map.csv")


# ---------------------------------------------------------------------------- edge cases (synthetic)

RAMP = np.arange(-50, 50, dtype="<i2")       # 100 samples


def lead_xml(lead: str, samples: np.ndarray = RAMP, *, units: str | None = "MICROVOLTS", per_bit: str = "4.88",
             crc: int | None = None, b64: str | None = None, sample_size: int = 2, extra: str = "") -> str:
    data = np.asarray(samples, "<i2").tobytes()
    text = base64.b64encode(data).decode() if b64 is None else b64
    wrapped = "\n".join(text[i:i + 64] for i in range(0, len(text), 64))     # line breaks, as MUSE writes
    unit = "" if units is None else f"<LeadAmplitudeUnits>{units}</LeadAmplitudeUnits>"
    return (f"<LeadData><LeadByteCountTotal>{len(data)}</LeadByteCountTotal>"
            f"<LeadSampleCountTotal>{len(data) // 2}</LeadSampleCountTotal>"
            f"<LeadAmplitudeUnitsPerBit>{per_bit}</LeadAmplitudeUnitsPerBit>{unit}<LeadID>{lead}</LeadID>"
            f"<LeadSampleSize>{sample_size}</LeadSampleSize>{extra}"
            f"<LeadDataCRC32>{zlib.crc32(data) if crc is None else crc}</LeadDataCRC32>"
            f"<WaveFormData>\n{wrapped}\n</WaveFormData></LeadData>")


def muse_file(tmp_path: Path, leads: list[str] | None = None, *, kinds=("Median", "Rhythm"),
              sample_base: str = "500", exponent: str = "0", patient: str = " P-17 ", name: str = "ecg.xml") -> Path:
    """A small MUSE file (ISO-8859-1, DOCTYPE restecg.dtd, a patient name and birth date)."""
    leads = [lead_xml(n) for n in STORED] if leads is None else leads
    waveforms = "".join(f"<Waveform><WaveformType>{k}</WaveformType><SampleBase>{sample_base}</SampleBase>"
                        f"<SampleExponent>{exponent}</SampleExponent>{''.join(leads)}</Waveform>" for k in kinds)
    text = ('<?xml version="1.0" encoding="ISO-8859-1"?>\n<!DOCTYPE RestingECG SYSTEM "restecg.dtd">\n'
            f"<RestingECG><PatientDemographics><PatientID>{patient}</PatientID>"
            "<PatientLastName>Müller</PatientLastName><PatientFirstName>Jürgen</PatientFirstName>"
            "<DateofBirth>03-14-1951</DateofBirth></PatientDemographics>"
            "<Diagnosis><DiagnosisStatement><StmtText>Sinusrhythmus</StmtText></DiagnosisStatement></Diagnosis>"
            f"{waveforms}</RestingECG>\n")
    path = tmp_path / name
    path.write_bytes(text.encode("iso-8859-1"))
    return path


def test_synthetic_file_is_read_and_keeps_nothing_private(tmp_path):
    rec = read_file(muse_file(tmp_path))
    assert rec.patient_id == "P-17" and rec.fs == 500.0 and rec.signal.shape == (12, 100)
    np.testing.assert_allclose(rec.signal[0], RAMP * 4.88e-3, rtol=1e-6)
    np.testing.assert_allclose(rec.signal[rec.lead_names.index("aVL")], RAMP * 4.88e-3 / 2, rtol=1e-6)
    seen = " ".join([str(rec.meta), " ".join(rec.lead_names), str(rec.patient_id)])
    for private in ("Müller", "Jürgen", "1951", "Sinusrhythmus"):
        assert private not in seen


def test_millivolt_units_and_a_decimal_sample_exponent(tmp_path):
    leads = [lead_xml(n, units="MILLIVOLTS", per_bit="0.005") for n in STORED]
    rec = read_file(muse_file(tmp_path, leads, sample_base="25", exponent="1"))
    assert rec.fs == 250.0                              # SampleBase x 10**SampleExponent
    np.testing.assert_allclose(rec.signal[1], RAMP * 0.005, rtol=1e-6)
    assert rec.meta["amplitude_units"] == ["MILLIVOLTS"]


def test_twelve_stored_leads_derive_nothing(tmp_path):
    rec = read_file(muse_file(tmp_path, [lead_xml(n) for n in ("I", "II", "III", "AVR", "AVL", "AVF", *STORED[2:])]))
    assert rec.lead_names == STANDARD_LEADS and rec.meta["derived_leads"] == []


B64 = base64.b64encode(RAMP.tobytes()).decode()       # 268 characters, 200 bytes


def first_lead_then_rest(first: str) -> list[str]:
    return [first] + [lead_xml(n) for n in STORED[1:]]


DAMAGED = {
    "base64 cut mid-quad": (first_lead_then_rest(lead_xml("I", b64=B64[:-3])),
                            r"lead I: truncated base64 in WaveFormData \(265 characters"),
    "base64 cut at a quad": (first_lead_then_rest(lead_xml("I", b64=B64[:-8])),
                             r"lead I: truncated base64: 195 bytes decoded, LeadByteCountTotal is 200"),
    "bad base64": (first_lead_then_rest(lead_xml("I", b64="!!!!" + B64[4:])), r"lead I: bad base64"),
    "units missing": ([lead_xml(n, units=None) for n in STORED],
                      r"units missing: the lead I \(LeadAmplitudeUnits\) states no"),
    "unknown units": ([lead_xml(n, units="MILLIMETERS") for n in STORED], r"unknown units 'MILLIMETERS' of the lead I"),
    "zero gain": ([lead_xml(n, per_bit="0") for n in STORED], r"lead I: LeadAmplitudeUnitsPerBit 0 \(must be > 0\)"),
    "crc mismatch": ([lead_xml(n, crc=12345 if n == "V2" else None) for n in STORED],
                     r"lead V2: LeadDataCRC32 mismatch \(stored 12345"),
    "lengths differ": ([lead_xml(n, RAMP[:90] if n == "V6" else RAMP) for n in STORED],
                       r"leads of different lengths: .*V5 100, V6 90"),
    "sample offset": ([lead_xml(n, extra="<LeadOffsetFirstSample>3</LeadOffsetFirstSample>") for n in STORED],
                      r"lead I: LeadOffsetFirstSample 3 is not supported"),
    "one-byte samples": ([lead_xml(n, sample_size=1) for n in STORED],
                         r"lead I: LeadSampleSize 1; only 2-byte"),
    "lead twice": ([lead_xml("I")] + [lead_xml(n) for n in STORED], r"lead I stored twice"),
    "no leads": ([], r"the rhythm waveform holds no LeadData"),
}


@pytest.mark.parametrize("leads, reason", DAMAGED.values(), ids=DAMAGED.keys())
def test_damaged_or_unsupported_waveforms_are_record_errors(tmp_path, leads, reason):
    with pytest.raises(RecordError, match=reason):
        read_file(muse_file(tmp_path, leads))


def test_median_only_and_zero_rate_are_record_errors(tmp_path):
    with pytest.raises(RecordError, match=r"no Rhythm waveform \(waveforms: Median\)"):
        read_file(muse_file(tmp_path, kinds=("Median",), name="median.xml"))
    with pytest.raises(RecordError, match=r"sampling rate 0 Hz"):
        read_file(muse_file(tmp_path, sample_base="0", name="zero.xml"))
    with pytest.raises(RecordError, match=r"rhythm waveform: SampleBase missing"):
        read_file(muse_file(tmp_path, sample_base="", name="nobase.xml"))


def test_a_file_cut_off_is_a_record_error(tmp_path):
    whole = muse_file(tmp_path).read_bytes()
    cut = tmp_path / "cut.xml"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(RecordError, match="not well-formed XML"):
        read_file(cut)


def test_seven_stored_leads(tmp_path):
    """Without lead I nothing is derived, and lead selection names every lead it lacks; without V3
    the limb leads are still derived and only V3 is missing."""
    no_i = read_file(muse_file(tmp_path, [lead_xml(n) for n in STORED[1:]], name="no_i.xml"))
    assert no_i.lead_names == STORED[1:] and no_i.meta["derived_leads"] == []
    with pytest.raises(RecordError, match=r"missing lead\(s\) I, III, aVR, aVL, aVF; file has II, V1"):
        select_leads(no_i.signal, no_i.lead_names, STANDARD_LEADS, (), no_i.path)
    no_v3 = read_file(muse_file(tmp_path, [lead_xml(n) for n in STORED if n != "V3"], name="no_v3.xml"))
    assert no_v3.meta["derived_leads"] == ["III", "aVR", "aVL", "aVF"] and len(no_v3.lead_names) == 11
    with pytest.raises(RecordError, match=r"missing lead\(s\) V3;"):
        select_leads(no_v3.signal, no_v3.lead_names, STANDARD_LEADS, (), no_v3.path)


def test_an_empty_patient_id_is_none(tmp_path):
    assert read_file(muse_file(tmp_path, patient="  ")).patient_id is None



# ---------------------------------------------------------------------------- checksums of 0 (no checksum)

NO_CHECKSUM = "no checksum: LeadDataCRC32 0 on every lead (the writer computed none; samples not checked)"
CRC = re.compile(rb"<LeadDataCRC32>-?\d+</LeadDataCRC32>")


def with_crcs(src: Path, dst: Path, every: bytes | None, *, rhythm_lead_i: bytes | None = None) -> Path:
    """A copy of `src` with every LeadDataCRC32 set to `every` (None: kept), then (`rhythm_lead_i`)
    the rhythm waveform's first lead's, lead I's, set to that."""
    raw = src.read_bytes()
    if every is not None:
        raw, n = CRC.subn(b"<LeadDataCRC32>" + every + b"</LeadDataCRC32>", raw)
        assert n == 16                      # 8 leads of the Median and 8 of the Rhythm waveform
    if rhythm_lead_i is not None:
        rhythm = raw.index(b"<WaveformType>Rhythm</WaveformType>")
        head, tail = raw[:rhythm], raw[rhythm:]
        assert tail.index(b"<LeadID>I</LeadID>") < tail.index(b"<LeadDataCRC32>")
        raw = head + CRC.sub(b"<LeadDataCRC32>" + rhythm_lead_i + b"</LeadDataCRC32>", tail, count=1)
    dst.write_bytes(raw)
    return dst


@pytest.mark.parametrize("path", [GUANGXI, MUSEPHI], ids=["guangxi", "musephi"])
def test_a_checksum_of_0_on_every_lead_is_no_checksum(tmp_path, path):
    """A writer that computed no CRC: the intact samples are read as the original's, and noted."""
    original = read_file(path)
    assert original.meta["notes"] == [] and original.meta["crc32_checked_leads"] == 8
    rec = read_file(with_crcs(path, tmp_path / "zero.xml", b"0"))
    np.testing.assert_array_equal(rec.signal, original.signal)
    assert rec.lead_names == original.lead_names and rec.patient_id == original.patient_id
    assert rec.meta["crc32_checked_leads"] == 0 and rec.meta["notes"] == [NO_CHECKSUM]


@pytest.mark.parametrize("every, lead_i", [(b"0", b"12345"), (None, b"0")],
                         ids=["one wrong among zeros", "one zero among real crcs"])
def test_a_wrong_checksum_beside_zeros_or_a_single_zero_is_still_damage(tmp_path, every, lead_i):
    """Only 0 on EVERY lead means "no checksum": a non-zero mismatch beside zeros, or a 0 beside
    real checksums, is a damaged waveform, quarantined with its reason."""
    path = with_crcs(GUANGXI, tmp_path / "damaged.xml", every, rhythm_lead_i=lead_i)
    with pytest.raises(RecordError, match=rf"lead I: LeadDataCRC32 mismatch \(stored {int(lead_i)}, the decoded "
                                          r"samples give \d+\): the waveform is damaged") as err:
        read_file(path)
    assert err.value.path == str(path)
