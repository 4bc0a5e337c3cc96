"""DICOM ECG reader (coreecg.data.sources.dicom) on two real files, checked against pydicom's own
decoding (Dataset.waveform_array) and a hand decode, plus edge cases in small written files."""
from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pydicom
import pytest
from pydicom.data import get_testdata_file
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import ExplicitVRBigEndian, ExplicitVRLittleEndian, generate_uid

from coreecg.data.record import STANDARD_LEADS, RecordError
from coreecg.data.sources.dicom import (  # registers "dicom"
    ECG_SOP_CLASSES, HEMODYNAMIC_NOTE, HEMODYNAMIC_SOP_CLASS, DicomOptions, DicomSource, lead_name,
)
from coreecg.data.sources.registry import source_spec

REPO = Path(__file__).resolve().parents[1]
GUANGXI = REPO / "tests/data/hospital/dicom/guangxi_teaching_sinus_rhythm.dcm"
MUSE = REPO / "tests/data/hospital/muse/guangxi_teaching_sinus_rhythm.xml"
PYDICOM_ECG = Path(get_testdata_file("waveform_ecg.dcm"))
AMBULATORY = "1.2.840.10008.5.1.4.1.1.9.1.3"
# (file, fs, samples, PatientID): both store 12 leads in microvolts
REAL = [(GUANGXI, 500.0, 5000, "000001"), (PYDICOM_ECG, 1000.0, 10000, "642341")]


def read(path: Path, **options):
    """The Record of one file, listed and read as the pipeline does."""
    src = DicomSource(**options)
    (ref,) = src.list_records(path)
    return src.read(ref)


def write_ecg(path: Path, raw: np.ndarray, *, sop: str = ECG_SOP_CLASSES[1], before: tuple[Dataset, ...] = (),
              **group) -> Path:
    """A small DICOM ECG file: one multiplex group of `raw` (`waveform_group`'s options) after `before`."""
    ds = Dataset()
    ds.file_meta = FileMetaDataset()
    ds.file_meta.TransferSyntaxUID = ExplicitVRLittleEndian
    ds.file_meta.MediaStorageSOPClassUID = ds.SOPClassUID = sop
    ds.file_meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID = generate_uid()
    ds.PatientID = " 12345 "
    ds.WaveformSequence = [*before, waveform_group(raw, **group)]
    ds.save_as(path, enforce_file_format=True)
    return path


def waveform_group(raw: np.ndarray, *, bits: int = 16, kind: str = "SS", fs: float = 500.0, label: str = "RHYTHM",
                   units: str | tuple[str, ...] | None = "uV", sensitivity: float | None = 2.5,
                   correction: float | None = None, baseline: float | None = None,
                   codes: tuple[str, ...] = ("2:1", "2:2", "2:61"), meanings: tuple[str, ...] = (),
                   data: bytes | None = None) -> Dataset:
    """A multiplex group of `raw` (samples, channels) interleaved; `units`: one for all channels or
    one per channel; `meanings`: the channels' Code Meanings (none by default)."""
    group = Dataset()
    group.MultiplexGroupLabel = label
    group.NumberOfWaveformChannels, group.NumberOfWaveformSamples = raw.shape[1], raw.shape[0]
    group.SamplingFrequency = fs
    group.WaveformBitsAllocated, group.WaveformSampleInterpretation = bits, kind
    per_channel = units if isinstance(units, tuple) else (units,) * raw.shape[1]
    channels = []
    for j in range(raw.shape[1]):
        ch, src = Dataset(), Dataset()
        src.CodeValue, src.CodingSchemeDesignator = codes[j], "MDC"
        if meanings:
            src.CodeMeaning = meanings[j]
        ch.ChannelSourceSequence = [src]
        if sensitivity is not None:
            ch.ChannelSensitivity = sensitivity
        if per_channel[j] is not None:
            unit = Dataset()
            unit.CodeValue, unit.CodingSchemeDesignator = per_channel[j], "UCUM"
            ch.ChannelSensitivityUnitsSequence = [unit]
        if correction is not None:
            ch.ChannelSensitivityCorrectionFactor = correction
        if baseline is not None:
            ch.ChannelBaseline = baseline
        channels.append(ch)
    group.ChannelDefinitionSequence = channels
    group.WaveformData = raw.astype(f"<i{bits // 8}").tobytes() if data is None else data
    return group


def median_group() -> Dataset:
    group = pydicom.dcmread(GUANGXI).WaveformSequence[1]
    assert group.MultiplexGroupLabel == "Median"
    return group


# 3 samples x 3 channels: 9 bytes at 8 bits, so the 8-bit file also carries a padding byte
RAW = np.array([[100, -100, 1], [0, 40, -128], [-7, 3, 127]])


# ---------------------------------------------------------------------------- real files


@pytest.mark.parametrize("path, fs, n, pid", REAL, ids=["guangxi", "pydicom"])
def test_real_file_is_its_rhythm_in_millivolts_as_pydicom_decodes_it(path, fs, n, pid):
    rec = read(path)
    assert rec.signal.shape == (12, n) and rec.signal.dtype == np.float32
    assert rec.fs == fs and rec.lead_names == STANDARD_LEADS and rec.patient_id == pid
    assert rec.meta["waveform_group_index"] == 0 and rec.meta["stored_units"] == ["uV"]
    ds = pydicom.dcmread(path)
    assert "RHYTHM" == ds.WaveformSequence[0].MultiplexGroupLabel.upper()
    # pydicom applies sensitivity x correction + baseline, in the channels' unit (uV here)
    expected = ds.waveform_array(0).T / 1000.0
    np.testing.assert_allclose(rec.signal, expected, rtol=1e-6, atol=1e-6)
    assert 0.5 < np.abs(rec.signal).max() < 5.0    # a resting ECG's amplitude in mV


def test_guangxi_hand_decode_of_its_bytes():
    """4.88 uV per bit (sensitivity 1, correction 4.88): the README's figure, from the raw bytes."""
    ds = pydicom.dcmread(GUANGXI)
    raw = np.frombuffer(ds.WaveformSequence[0].WaveformData, "<i2").reshape(5000, 12)
    rec = read(GUANGXI)
    np.testing.assert_allclose(rec.signal, raw.T * 4.88e-3, rtol=1e-6)
    assert rec.meta["sop_class"] == "General ECG Waveform Storage" and rec.meta["device_model"] == "MAC P"


def test_pydicom_file_code_meanings_map_to_standard_leads():
    ds = pydicom.dcmread(PYDICOM_ECG)
    channels = ds.WaveformSequence[0].ChannelDefinitionSequence
    assert channels[0].ChannelSourceSequence[0].CodeMeaning == "Lead I (Einthoven)"
    assert tuple(lead_name(ch, j) for j, ch in enumerate(channels)) == STANDARD_LEADS
    assert read(PYDICOM_ECG).meta["sop_class"] == "12-lead ECG Waveform Storage"


def test_lead_names_from_codes_then_meanings():
    def channel(code: str = "", meaning: str = "") -> Dataset:
        ch, src = Dataset(), Dataset()
        src.CodeValue, src.CodeMeaning = code, meaning
        ch.ChannelSourceSequence = [src]
        return ch

    assert lead_name(channel("5.6.3-9-63"), 0) == "aVL"
    assert lead_name(channel("2:61"), 0) == "III"
    assert lead_name(channel(str((2 << 16) + 8)), 0) == "V6"              # MDC's numeric form
    assert lead_name(channel("x", "aVF, augmented voltage, foot"), 0) == "aVF"
    assert lead_name(channel("x", "Lead V2"), 0) == "V2"
    assert lead_name(channel("5.6.3-9-9", "Lead V7"), 0) == "Lead V7"      # unknown: its meaning
    assert lead_name(Dataset(), 4) == "channel 5"


# ---------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("bits, kind", [(8, "SB"), (16, "SS"), (32, "SL")])
def test_sample_widths_correction_baseline_and_mv_units(tmp_path, bits, kind):
    path = write_ecg(tmp_path / "x.dcm", RAW, bits=bits, kind=kind, units="mV", sensitivity=0.5,
                     correction=2.0, baseline=-1.0)
    rec = read(path)
    np.testing.assert_allclose(rec.signal, RAW.T * 0.5 * 2.0 - 1.0, rtol=1e-6)
    assert rec.lead_names == ("I", "II", "III") and rec.patient_id == "12345" and rec.meta["bits_allocated"] == bits
    np.testing.assert_allclose(pydicom.dcmread(path).waveform_array(0).T, rec.signal, rtol=1e-6)


def test_big_endian_file(tmp_path):
    """Explicit VR Big Endian (retired, still in old archives): Waveform Data in that byte order."""
    ds = pydicom.dcmread(GUANGXI)
    group = ds.WaveformSequence[0]
    raw = np.frombuffer(group.WaveformData, "<i2").reshape(5000, 12)
    group.WaveformData = raw.astype(">i2").tobytes()
    ds.file_meta.TransferSyntaxUID = ExplicitVRBigEndian
    path = tmp_path / "be.dcm"
    pydicom.dcmwrite(path, ds, little_endian=False, implicit_vr=False, force_encoding=True)
    np.testing.assert_allclose(read(path).signal, raw.T * 4.88e-3, rtol=1e-6)


def test_median_group_first_is_skipped_for_the_unlabelled_rhythm(tmp_path):
    path = write_ecg(tmp_path / "x.dcm", RAW, label="", before=(median_group(),))
    rec = read(path)
    assert rec.signal.shape == (3, 3) and rec.meta["waveform_group_index"] == 1


# ---------------------------------------------------------------------------- refused files


@pytest.mark.parametrize("kwargs, reason", [
    ({"sop": AMBULATORY}, rf"SOP class {AMBULATORY} \(Ambulatory ECG Waveform Storage\) is not an ECG waveform"),
    ({"sop": "1.2.3.4"}, r"SOP class 1.2.3.4 \(unknown class\)"),
    ({"units": None}, r"units missing: the channel 1 \(I\) states no physical unit"),
    ({"units": "mmHg"}, r"unknown units 'mmHg' of the channel 1 \(I\)"),
    ({"sensitivity": None}, r"channel 1 \(I\): no Channel Sensitivity"),
    ({"fs": 0}, r"sampling rate 0 Hz: not a rate"),
    ({"data": RAW.astype("<i2").tobytes()[:-4]},
     r"Waveform Data truncated: 14 bytes for 3 channels x 3 samples x 2 bytes \(18\)"),
    ({"data": RAW.astype("<i2").tobytes() + bytes(4)}, r"Waveform Data too long: 22 bytes .* \(18\)"),
    ({"kind": "US"}, r"16 bits, US: only signed"),
])
def test_unusable_files_are_record_errors(tmp_path, kwargs, reason):
    path = write_ecg(tmp_path / "x.dcm", RAW, **kwargs)
    with pytest.raises(RecordError, match=reason) as err:
        read(path)
    assert err.value.path == str(path)


def test_only_median_beats_is_refused(tmp_path):
    path = write_ecg(tmp_path / "x.dcm", RAW, label="MEDIAN BEAT", before=(median_group(),))
    only = r"no rhythm waveform: only median / representative beats \('Median', 'MEDIAN BEAT'\)"
    with pytest.raises(RecordError, match=only):
        read(path)


def test_no_samples_and_damaged_files_are_refused(tmp_path):
    with pytest.raises(RecordError, match=r"no samples: 3 waveform channels x 0 samples"):
        read(write_ecg(tmp_path / "empty.dcm", RAW[:0]))
    damaged = tmp_path / "damaged.dcm"
    damaged.write_bytes(bytes(128) + b"DICM" + b"\x02\x00\x10\x00UI\xff\xff")   # an element longer than the file
    with pytest.raises(RecordError, match="no SOP Class UID"):
        read(damaged)


def test_truncated_file_is_refused(tmp_path):
    """A copy cut short: pydicom reads what is there; the length check refuses it."""
    path = tmp_path / "cut.dcm"
    path.write_bytes(GUANGXI.read_bytes()[:60000])
    with pytest.raises(RecordError, match=r"Waveform Data truncated: \d+ bytes for 12 channels x 5000 samples"):
        read(path)


# ---------------------------------------------------------------------------- hemodynamic waveforms (cath lab)

# Channels a cath lab stores beside the ECG: codes outside the lead numbers, pressures in mmHg
PRESSURE_CODES, PRESSURE_NAMES = ("2:18944", "2:18948"), ("Aortic pressure", "Left ventricular pressure")
# 3 samples: leads I and II (x 0.01 mV), then an aortic pressure (x 0.01 mmHg)
CATH = np.array([[100, -100, 9000], [0, 40, 10000], [-7, 3, 11000]])


def as_hemodynamic(src: Path, dst: Path, code: str | None = None) -> Path:
    """A copy of `src` stored as Hemodynamic Waveform Storage; `code`: every channel's source
    code replaced by it (the Code Meanings kept)."""
    ds = pydicom.dcmread(src)
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = HEMODYNAMIC_SOP_CLASS
    for group in ds.WaveformSequence if code else ():
        for ch in group.ChannelDefinitionSequence:
            ch.ChannelSourceSequence[0].CodeValue = code
    ds.save_as(dst)
    return dst


def test_twelve_standard_coded_leads_in_hemodynamic_storage_are_read_and_noted(tmp_path):
    rec, ecg = read(as_hemodynamic(GUANGXI, tmp_path / "cath.dcm")), read(GUANGXI)
    np.testing.assert_array_equal(rec.signal, ecg.signal)
    assert rec.lead_names == STANDARD_LEADS and rec.fs == 500.0 and rec.meta["waveform_group"] == "Rhythm"
    assert rec.meta["sop_class"] == "Hemodynamic Waveform Storage"
    assert rec.meta["notes"] == [HEMODYNAMIC_NOTE.format(0)] and rec.meta["skipped_channels"] == []
    assert rec.meta["notes"][0].split(" (")[0] == "ECG leads read from Hemodynamic Waveform Storage"   # its count key
    assert ecg.meta["notes"] == [] and ecg.meta["skipped_channels"] == []


def test_pressure_channels_beside_the_leads_are_skipped_and_named(tmp_path):
    codes, meanings = ("2:1", "2:2", PRESSURE_CODES[0]), ("Lead I", "Lead II", PRESSURE_NAMES[0])
    options = dict(codes=codes, meanings=meanings, units=("mV", "mV", "mmHg"), sensitivity=0.01)
    rec = read(write_ecg(tmp_path / "cath.dcm", CATH, sop=HEMODYNAMIC_SOP_CLASS, **options))
    assert rec.lead_names == ("I", "II") and rec.meta["skipped_channels"] == ["Aortic pressure"]
    np.testing.assert_allclose(rec.signal, CATH[:, :2].T * 0.01, rtol=1e-6)
    assert rec.meta["notes"] == [HEMODYNAMIC_NOTE.format(1)] and rec.meta["stored_units"] == ["mV"]
    # the same channels in an ECG class are all read: the pressure's mmHg is refused as before
    with pytest.raises(RecordError, match=r"unknown units 'mmHg' of the channel 3 \(Aortic pressure\)"):
        read(write_ecg(tmp_path / "ecg.dcm", CATH, **options))


def test_a_pressure_group_before_the_ecg_group_is_passed_over(tmp_path):
    pressures = waveform_group(CATH[:, 1:], label="PRESSURE", fs=250.0, codes=PRESSURE_CODES,
                               meanings=PRESSURE_NAMES, units="mmHg")
    path = write_ecg(tmp_path / "cath.dcm", CATH[:, :2], sop=HEMODYNAMIC_SOP_CLASS, before=(pressures,),
                     label="ECG", codes=("2:1", "2:2"), units="mV", sensitivity=0.01)
    rec = read(path)
    assert rec.meta["waveform_group_index"] == 1 and rec.lead_names == ("I", "II") and rec.fs == 500.0
    np.testing.assert_allclose(rec.signal, CATH[:, :2].T * 0.01, rtol=1e-6)


def test_hemodynamic_storage_without_standard_lead_codes_is_refused(tmp_path):
    only_pressures = write_ecg(tmp_path / "p.dcm", CATH[:, 1:], sop=HEMODYNAMIC_SOP_CLASS, codes=PRESSURE_CODES,
                               meanings=PRESSURE_NAMES, units="mmHg")
    with pytest.raises(RecordError) as err:
        read(only_pressures)
    assert err.value.reason == ("Hemodynamic Waveform Storage without an ECG lead: no channel's source code is a "
                                "standard lead's (SCP-ECG 5.6.3-9-<n>, MDC 2:<n>; channels: Aortic pressure, "
                                "Left ventricular pressure)")
    assert err.value.path == str(only_pressures)
    # the real leads under a code that is no lead's: their meanings ("Lead I") alone are not taken
    recoded = as_hemodynamic(GUANGXI, tmp_path / "recoded.dcm", code=PRESSURE_CODES[0])
    with pytest.raises(RecordError, match=r"without an ECG lead: .*channels: Lead I, Lead II, Lead III, aVR"):
        read(recoded)


# ---------------------------------------------------------------------------- listing, privacy, labels


def test_listing_by_content_not_name(tmp_path, caplog):
    root = tmp_path / "export"
    (root / "a").mkdir(parents=True)
    shutil.copy(GUANGXI, root / "a" / "IM000001")           # DICOM without a suffix
    shutil.copy(PYDICOM_ECG, root / "ecg.bin")               # and with a wrong one
    (root / "notes.dcm").write_text("not a DICOM file")      # our suffix, other content
    shutil.copy(MUSE, root / "other.xml")                    # another reader's format: not listed
    src = DicomSource()
    with caplog.at_level("WARNING"):
        refs = {r.record_id: r for r in src.list_records(root)}
    assert sorted(refs) == ["a/IM000001", "ecg.bin", "notes.dcm"]
    assert "1 file(s) of other formats" in caplog.text
    assert src.read(refs["a/IM000001"]).signal.shape == (12, 5000)
    assert src.read(refs["ecg.bin"]).signal.shape == (12, 10000)
    with pytest.raises(RecordError, match="not a DICOM ECG file"):
        src.read(refs["notes.dcm"])


def test_no_name_birth_date_or_free_text_in_the_record(tmp_path):
    ds = pydicom.dcmread(GUANGXI)
    ds.PatientName, ds.PatientBirthDate = "Zebulon^Quirinus", "19450317"
    ds.PatientComments = "allergic to penicillin"
    path = tmp_path / "named.dcm"
    ds.save_as(path)
    assert b"Zebulon" in path.read_bytes()
    rec = read(path)
    text = " ".join([str(rec.meta), " ".join(rec.lead_names), str(rec.patient_id), rec.record_id])
    for secret in ("Zebulon", "Quirinus", "19450317", "1945", "penicillin", "Anonymized"):
        assert secret not in text
    assert rec.patient_id == "000001"


def test_empty_patient_id_is_none(tmp_path):
    ds = pydicom.dcmread(GUANGXI)
    ds.PatientID = "  "
    ds.save_as(tmp_path / "x.dcm")
    assert read(tmp_path / "x.dcm").patient_id is None


def test_labels_from_a_table(tmp_path):
    root = tmp_path / "export"
    root.mkdir()
    shutil.copy(GUANGXI, root / "sinus.dcm")
    shutil.copy(PYDICOM_ECG, root / "other.dcm")
    table = tmp_path / "labels.csv"
    table.write_text("record_id,labels\nsinus,SR;NORM\n")
    src = DicomSource(**dataclasses.asdict(DicomOptions(labels=str(table))))
    refs = {r.record_id: r for r in src.list_records(root)}
    assert src.read(refs["sinus.dcm"]).labels == ("NORM", "SR")
    with pytest.raises(RecordError, match="unlabelled: no row for 'other.dcm'"):
        src.read(refs["other.dcm"])


def test_registered_with_its_label_free_view():
    spec = source_spec("dicom")
    assert spec.cls is DicomSource and spec.options is DicomOptions
    assert spec.label_free_options(DicomOptions()) == {"labels": "", "class_map": ""}
    assert spec.dataset_labels == {"dicom": "DICOM ECG"}
    assert DicomSource.suffixes == (".dcm", ".dicom") and DicomSource.formats == ("dicom",)
