"""EDF/EDF+ reader: pyedflib's bundled test_generator.edf (real EDF+C, channels that are not ECG),
checked against a hand decode of its bytes, and small EDF+ files written with pyedflib for the
ECG cases the real file lacks (lead labels, units, unnamed channels, patient code, EDF+D)."""
from __future__ import annotations

import datetime
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyedflib
import pytest

import coreecg.data.sources.edf  # noqa: F401  (registers "edf")
from coreecg.config import ConfigError, load_config
from coreecg.data.record import STANDARD_LEADS, RecordError
from coreecg.data.sources import get_source
from coreecg.data.sources.edf import MENDED_NOTE, EdfSource, Unnamed, lead_of_label

REAL = Path(os.path.dirname(pyedflib.data.__file__)) / "test_generator.edf"
REAL_LABELS = ["squarewave", "ramp", "pulse", "noise", "sine 1 Hz", "sine 8 Hz", "sine 8.1777 Hz",
               "sine 8.5 Hz", "sine 15 Hz", "sine 17 Hz", "sine 50 Hz"]
# What the writer puts in headers and the record must never show.
PHI = {"patient_name": "Jane_Doe", "birthdate": datetime.date(1950, 3, 4), "sex": 0,
       "patient_additional": "diabetic", "recording_additional": "chest_pain"}
PHI_TEXT = ("jane", "doe", "1950", "04-mar", "diabetic", "chest", "pain")
_MV_PER = {"mV": 1.0, "uV": 1e-3, "V": 1e3}


def write_edf(path, signals_mv, fs, labels, unit="mV", patient_code=None, **header) -> Path:
    """Write a synthetic EDF+ (plain EDF with file_type=pyedflib.FILETYPE_EDF) of `signals_mv` (channels
    of millivolts; channels may differ in length when their rates differ).

    fs: Hz, one for all or one per channel (whole samples per 1 s data record); unit: the
    physical dimension, one or per channel; values are written in it ('uV' -> mV * 1000; other
    units are written as the mV numbers). header: file_type, and any EdfWriter setter by its
    snake name (patient_name, birthdate, sex, recording_additional, ...). Physical range:
    symmetric, the power of ten above each channel's largest magnitude (it fits the header's 8
    characters exactly); 16-bit digital.
    """
    n = len(signals_mv)
    rates = list(fs) if np.ndim(fs) else [fs] * n
    units = [unit] * n if isinstance(unit, str) else list(unit)
    writer = pyedflib.EdfWriter(str(path), n, file_type=header.pop("file_type", pyedflib.FILETYPE_EDFPLUS))
    try:
        values = [np.asarray(x, float) / _MV_PER.get(u, 1.0) for x, u in zip(signals_mv, units)]
        writer.setSignalHeaders([
            {"label": label, "dimension": u, "sample_frequency": int(r), "physical_max": top,
             "physical_min": -top, "digital_max": 32767, "digital_min": -32768}
            for label, u, r, top in zip(labels, units, rates, (_power_of_ten_above(v) for v in values))])
        if patient_code is not None:
            writer.setPatientCode(patient_code)
        for key, value in header.items():
            getattr(writer, "set" + "".join(w.capitalize() for w in key.split("_")))(value)
        writer.writeSamples(values)
    finally:
        writer.close()
    return Path(path)


def _power_of_ten_above(values: np.ndarray) -> float:
    return float(10.0 ** np.ceil(np.log10(max(np.abs(values).max(), 1e-3) * 1.01)))


def resolution_mv(path: Path, channel: int) -> float:
    """One digital step of a channel, in mV, from the file's header."""
    with pyedflib.EdfReader(str(path)) as edf:
        h = edf.getSignalHeader(channel)
    step = (h["physical_max"] - h["physical_min"]) / (h["digital_max"] - h["digital_min"])
    return step * _MV_PER[h["dimension"]]


def decode_by_hand(path: Path) -> dict[str, tuple[np.ndarray, str]]:
    """label -> (physical values, unit) of every channel, from the bytes (no pyedflib)."""
    raw = path.read_bytes()
    ns, n_records, header_bytes = int(raw[252:256]), int(raw[236:244]), int(raw[184:192])

    def field(offset: int, width: int) -> list[str]:
        start = 256 + offset * ns
        return [raw[start + i * width:start + (i + 1) * width].decode("ascii").strip() for i in range(ns)]

    labels, units = field(0, 16), field(96, 8)
    pmin, pmax, dmin, dmax = ([float(v) for v in field(off, 8)] for off in (104, 112, 120, 128))
    nsamp = [int(v) for v in field(216, 8)]
    data = np.frombuffer(raw[header_bytes:], "<i2").reshape(n_records, sum(nsamp))
    out, col = {}, 0
    for i, label in enumerate(labels):
        digital = data[:, col:col + nsamp[i]].reshape(-1).astype(float)
        col += nsamp[i]
        gain = (pmax[i] - pmin[i]) / (dmax[i] - dmin[i])
        out[label] = ((digital - dmin[i]) * gain + pmin[i], units[i])
    return out


def relabel(src: Path, dst: Path, new: dict[int, str]) -> Path:
    """A copy of `src` with channel labels rewritten in its header (16 bytes each, from byte 256)."""
    raw = bytearray(src.read_bytes())
    for channel, label in new.items():
        raw[256 + 16 * channel:256 + 16 * (channel + 1)] = label.ljust(16).encode("ascii")
    dst.write_bytes(bytes(raw))
    return dst


def read_one(path: Path, **options):
    src = get_source("edf", **options)
    return src.read(src.list_records(path)[0])


def text_of(record) -> str:
    """Everything of a Record but its samples, as text."""
    return " ".join(map(str, (record.record_id, record.lead_names, record.patient_id, record.labels,
                              record.meta, record.path, record.source)))


def sine_mv(fs: float, seconds: float, hz: float = 1.3, amp: float = 1.5) -> np.ndarray:
    return amp * np.sin(2 * np.pi * hz * np.arange(int(fs * seconds)) / fs)


# ---------------------------------------------------------------------------- the real file


def test_real_file_is_listed_by_content_and_refused_naming_its_channels():
    src = get_source("edf")
    assert isinstance(src, EdfSource)
    refs = src.list_records(REAL)
    assert [r.record_id for r in refs] == ["test_generator.edf"] and refs[0].extra["format"] == "edf"
    with pytest.raises(RecordError, match=r"leads missing: no ECG channel \(channels: squarewave, ramp, pulse") as err:
        src.read(refs[0])
    assert "sine 50 Hz" in err.value.reason and err.value.path == str(REAL)


def test_real_file_channels_relabelled_as_ecg_read_as_hand_decoded_millivolts(tmp_path):
    """The real file's bytes with two labels rewritten: its samples go through the whole reader."""
    path = relabel(REAL, tmp_path / "gen.edf", {4: "ECG II", 8: "EKG V1-REF"})
    rec = read_one(path)
    assert rec.lead_names == ("II", "V1") and rec.fs == 200.0 and rec.signal.shape == (2, 120_000)
    assert rec.signal.dtype == np.float32
    by_hand = decode_by_hand(path)
    for row, label in enumerate(("ECG II", "EKG V1-REF")):
        values, unit = by_hand[label]
        assert unit == "uV"
        np.testing.assert_allclose(rec.signal[row], values / 1000.0, rtol=1e-6, atol=1e-9)
    with pyedflib.EdfReader(str(path)) as edf:   # pyedflib's own physical read agrees too
        np.testing.assert_allclose(rec.signal[1], edf.readSignal(8) / 1000.0, rtol=1e-6, atol=1e-9)
    assert np.abs(rec.signal[0]).max() == pytest.approx(0.1, abs=1e-4)   # its 100 uV sine is 0.1 mV
    assert rec.meta["units"] == ["uV", "uV"] and rec.meta["file_type"] == "EDF+C"
    assert rec.meta["channel_labels"] == ["ECG II", "EKG V1-REF"]
    assert rec.meta["skipped_channels"] == [x for i, x in enumerate(REAL_LABELS) if i not in (4, 8)]
    # patient field "X X 30-JUN-1969 X": the code is unknown; the birth date is never read
    assert rec.patient_id is None
    assert "1969" not in text_of(rec) and "JUN" not in text_of(rec).upper()


def test_real_file_marked_discontinuous_is_refused(tmp_path):
    path = relabel(REAL, tmp_path / "d.edf", {0: "ECG I"})
    assert read_one(path).lead_names == ("I",)      # readable as EDF+C
    raw = bytearray(path.read_bytes())
    assert raw[192:197] == b"EDF+C"
    raw[192:197] = b"EDF+D"
    path.write_bytes(bytes(raw))
    with pytest.raises(RecordError, match=r"EDF\+D \(discontinuous\) not supported"):
        read_one(path)


def test_truncated_real_file_is_unreadable(tmp_path):
    path = relabel(REAL, tmp_path / "cut.edf", {0: "ECG I"})
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(RecordError, match=r"unreadable EDF: .*not EDF\(\+\) or BDF\(\+\) compliant"):
        read_one(path)


# ---------------------------------------------------------------------------- labels


@pytest.mark.parametrize("label, lead", [
    ("ECG I", "I"), ("EKG V1-REF", "V1"), ("ECG-II", "II"), ("ecg_avr", "aVR"), ("AVL", "aVL"),
    ("ECG aVF-Ref", "aVF"), ("V6", "V6"), ("ECG V3 ref", "V3"), ("III", "III"), ("LA-RA", "I"),
    ("ECG LL-RA", "II"), ("EKG LL-LA", "III"), (" ECG:V5 ", "V5"), ("EKG V1", "V1"), ("ECG II", "II"),
    ("EEG EKG II-REF", "II"),
])
def test_lead_labels_map_to_standard_names(label, lead):
    assert lead_of_label(label) == lead and not isinstance(lead_of_label(label), Unnamed)


@pytest.mark.parametrize("label", ["ECG", "EKG", "ecg", "ECG1", "EKG 2",
                                   # EEG and sleep montages: the ECG channel among EEG-style labels
                                   "EEG EKG1-REF", "EEG EKG-REF", "eeg ekg2-ref", "ECG EKG", "ECG1-ECG2", "EKG1-EKG2"])
def test_an_ecg_label_without_a_lead_is_unnamed(label):
    assert isinstance(lead_of_label(label), Unnamed)


@pytest.mark.parametrize("label", ["EEG Fpz-Cz", "EMG chin", "Resp", "SpO2", "Temp", "Accel X", "EOG L",
                                   "Pleth", "ECG V4R", "ECG L", "REF", "squarewave", "-aVR", "RA-LA",
                                   "EEG C3-REF", "EEG EKGR-REF", "EEG EEG"])
def test_other_labels_are_not_ecg_leads(label):
    assert lead_of_label(label) is None


# ---------------------------------------------------------------------------- synthetic EDF+


def test_twelve_lead_edf_plus_round_trip_in_microvolts(tmp_path):
    rng = np.random.default_rng(0)
    ecg = [sine_mv(500, 10, hz=1 + k / 7, amp=0.5 + k / 10) + 0.05 * rng.standard_normal(5000) for k in range(12)]
    labels = ["ECG I", "ECG II", "ECG III", "ECG aVR", "ECG AVL", "EKG aVF-Ref",
              "EKG V1-REF", "ECG V2", "ECG-V3", "ecg_v4", "V5", "ECG V6"]
    path = write_edf(tmp_path / "twelve.edf", ecg + [np.zeros(1000)], [500] * 12 + [100],
                     labels + ["EEG Fpz-Cz"], unit=["uV"] * 13)
    rec = read_one(path)
    assert rec.lead_names == STANDARD_LEADS and rec.fs == 500.0 and rec.signal.shape == (12, 5000)
    for row, x in enumerate(ecg):   # written as uV, read back as mV within one digital step
        assert 0 < resolution_mv(path, row) < 1e-3
        np.testing.assert_allclose(rec.signal[row], x, atol=resolution_mv(path, row))
    assert rec.meta["skipped_channels"] == ["EEG Fpz-Cz"] and rec.meta["units"] == ["uV"] * 12


def test_one_lead_holter_at_250_hz(tmp_path):
    x = sine_mv(250, 60)
    path = write_edf(tmp_path / "holter.edf", [x], 250, ["ECG II"], unit="mV", patient_code="H0001")
    rec = read_one(path)
    assert rec.lead_names == ("II",) and rec.fs == 250.0 and rec.signal.shape == (1, 15_000)
    assert rec.duration_s == 60.0 and rec.patient_id == "H0001"
    np.testing.assert_allclose(rec.signal[0], x, atol=resolution_mv(path, 0))


def test_volts_are_scaled_to_millivolts(tmp_path):
    x = sine_mv(250, 2)
    path = write_edf(tmp_path / "v.edf", [x], 250, ["ECG I"], unit="V")
    with pyedflib.EdfReader(str(path)) as edf:      # stored in volts
        assert edf.getPhysicalDimension(0) == "V" and np.abs(edf.readSignal(0)).max() < 0.002
    rec = read_one(path)
    np.testing.assert_allclose(rec.signal[0], x, atol=resolution_mv(path, 0))


def test_unnamed_ecg_channel_needs_the_unnamed_lead_option(tmp_path):
    x = sine_mv(256, 5)
    path = write_edf(tmp_path / "psg.edf", [x, np.zeros(256 * 5)], 256, ["ECG", "EEG C3-A2"], unit=["mV", "uV"])
    with pytest.raises(RecordError) as err:
        read_one(path)
    assert err.value.reason == ("ECG channel 'ECG' names no lead: set data.sources.edf.unnamed_lead=II "
                                "(the lead it records)")
    rec = read_one(path, unnamed_lead="ii")
    assert rec.lead_names == ("II",) and rec.meta["channel_labels"] == ["ECG"]
    assert rec.meta["skipped_channels"] == ["EEG C3-A2"]
    np.testing.assert_allclose(rec.signal[0], x, atol=resolution_mv(path, 0))


def test_two_unnamed_channels_or_an_unnamed_lead_given_twice_are_refused(tmp_path):
    x = sine_mv(200, 2)
    two = write_edf(tmp_path / "two.edf", [x, x], 200, ["ECG1", "ECG2"])
    with pytest.raises(RecordError, match="ECG channels 'ECG1', 'ECG2' name no lead"):
        read_one(two, unnamed_lead="II")
    clash = write_edf(tmp_path / "clash.edf", [x, x], 200, ["EKG", "ECG II"])
    with pytest.raises(RecordError, match=r"duplicated lead II \(channels 'EKG' and 'ECG II'\)"):
        read_one(clash, unnamed_lead="II")


def test_unnamed_lead_option_is_checked_in_config_and_constructor():
    sources = load_config(overrides=["data.sources.edf.unnamed_lead=II"]).data.sources
    assert get_source("edf", **sources.for_source("edf", 10)).unnamed_lead == "II"
    with pytest.raises(ConfigError, match=r"data\.sources\.edf: unnamed_lead 'V7': not a lead"):
        load_config(overrides=["data.sources.edf.unnamed_lead=V7"])
    with pytest.raises(ValueError, match="unnamed_lead 'MLII'"):
        get_source("edf", unnamed_lead="MLII")


def test_missing_and_unknown_units_name_the_channel(tmp_path):
    x = sine_mv(250, 2)
    with pytest.raises(RecordError, match=r"units missing: the channel 'ECG II' states no physical unit"):
        read_one(write_edf(tmp_path / "none.edf", [x], 250, ["ECG II"], unit=""))
    with pytest.raises(RecordError, match=r"unknown units 'degC' of the channel 'ECG II'"):
        read_one(write_edf(tmp_path / "degc.edf", [x], 250, ["ECG II"], unit="degC"))
    # a temperature channel in degC is skipped, not an error
    rec = read_one(write_edf(tmp_path / "temp.edf", [x, np.full(500, 36.6)], 250, ["ECG II", "Temp"],
                             unit=["mV", "degC"]))
    assert rec.lead_names == ("II",) and rec.meta["skipped_channels"] == ["Temp"]


def test_ecg_channels_at_different_rates_are_refused(tmp_path):
    path = write_edf(tmp_path / "rates.edf", [sine_mv(500, 2), sine_mv(250, 2)], [500, 250], ["ECG I", "ECG II"])
    with pytest.raises(RecordError, match=r"ECG channels at different sampling rates: 'ECG I' 500 Hz, 'ECG II' 250 Hz"):
        read_one(path)


def test_no_ecg_channel_is_leads_missing(tmp_path):
    path = write_edf(tmp_path / "eeg.edf", [np.zeros(200), np.zeros(200)], 100, ["EEG Fpz-Cz", "SpO2"],
                     unit=["uV", "%"])
    with pytest.raises(RecordError, match=r"leads missing: no ECG channel \(channels: EEG Fpz-Cz, SpO2\)"):
        read_one(path)


# ---------------------------------------------------------------------------- EEG and sleep exports


@pytest.mark.parametrize("label", ["EEG EKG1-REF", "EEG EKG-REF", "ECG EKG", "EKG"])
def test_the_ecg_channel_of_an_eeg_export_is_taken_by_unnamed_lead(tmp_path, label):
    """Not "no ECG channel": the channel is found, names no lead, and unnamed_lead takes it."""
    x, eeg = sine_mv(256, 5), np.zeros(256 * 5)
    path = write_edf(tmp_path / "eeg.edf", [eeg, x, eeg], 256, ["EEG FP1-REF", label, "EEG C3-REF"],
                     unit=["uV", "mV", "uV"])
    with pytest.raises(RecordError) as err:
        read_one(path)
    assert err.value.reason == (f"ECG channel {label!r} names no lead: set data.sources.edf.unnamed_lead=II "
                                "(the lead it records)")
    rec = read_one(path, unnamed_lead="II")
    assert rec.lead_names == ("II",) and rec.meta["channel_labels"] == [label]
    assert rec.meta["skipped_channels"] == ["EEG FP1-REF", "EEG C3-REF"]
    np.testing.assert_allclose(rec.signal[0], x, atol=resolution_mv(path, 1))


# ---------------------------------------------------------------------------- odd bytes in the header

# (offset, width) of a channel field in the EDF header (its block starts at 256 + offset x channels)
DIMENSION, PHYSICAL_MAX = (96, 8), (112, 8)


def patch_field(path: Path, field: tuple[int, int], channel: int, value: bytes) -> Path:
    """`path` with one channel's header field set to `value` (space padded), in place."""
    raw = bytearray(path.read_bytes())
    offset, width = field
    start = 256 + offset * int(raw[252:256]) + width * channel
    raw[start:start + width] = value.ljust(width)
    path.write_bytes(bytes(raw))
    return path


def test_a_degree_sign_in_a_skipped_channel_no_longer_loses_the_file(tmp_path, monkeypatch):
    """A temperature channel's "°C" (0xB0, Latin-1): edflib refuses the whole file; the reader
    reads a mended copy in a private temporary folder, deletes it, and notes the mending."""
    x, y = sine_mv(250, 4), sine_mv(250, 4, hz=2.1, amp=0.8)
    clean = write_edf(tmp_path / "clean.edf", [x, y, np.full(4, 36.6)], [250, 250, 1], ["ECG I", "ECG II", "Temp"],
                      unit=["mV", "mV", "degC"])
    odd = patch_field(Path(shutil.copy(clean, tmp_path / "odd.edf")), DIMENSION, 2, b"\xb0C")
    with pytest.raises(OSError, match=r"not EDF\(\+\) or BDF\(\+\) compliant \(Physical Dimension\)"):
        pyedflib.EdfReader(str(odd))
    before = odd.read_bytes()
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    rec, reference = read_one(odd), read_one(clean)
    np.testing.assert_array_equal(rec.signal, reference.signal)
    assert rec.lead_names == ("I", "II") and rec.fs == 250.0
    assert rec.meta["skipped_channels"] == ["Temp"]
    assert rec.meta["header_quirks"] == [MENDED_NOTE.format("channel 'Temp' physical dimension")]
    # what the corpus manifest counts: "header corrected: " + the text before " ("
    assert rec.meta["header_quirks"][0].split(" (")[0] == "non-ASCII characters in EDF header fields"
    assert reference.meta["header_quirks"] == []
    assert odd.read_bytes() == before and list((tmp_path / "tmp").iterdir()) == []   # the copy is gone


@pytest.mark.parametrize("micro", [b"\xb5V", "µV".encode()], ids=["latin-1", "utf-8"])
def test_microvolts_with_a_micro_sign_and_an_umlaut_in_the_patient_field(tmp_path, micro):
    """What is read comes from the original bytes: "µV" scales as uV, the patient code is kept,
    and the name edflib refused is still never read."""
    x = sine_mv(250, 2)
    clean = write_edf(tmp_path / "clean.edf", [x], 250, ["ECG II"], unit="uV", patient_code="MRN0042",
                      patient_name="Mueller")
    odd = tmp_path / "odd.edf"
    # the name is the field's last subfield: one byte shorter, padded with a space as the field is
    odd.write_bytes(clean.read_bytes().replace(b"Mueller", "Müller".encode("latin-1") + b" ", 1))
    patch_field(odd, DIMENSION, 0, micro)
    rec = read_one(odd)
    np.testing.assert_array_equal(rec.signal, read_one(clean).signal)
    assert rec.meta["units"] == ["µV"] and rec.patient_id == "MRN0042"
    assert rec.meta["header_quirks"] == [MENDED_NOTE.format("patient field; channel 'ECG II' physical dimension")]
    assert "ller" not in text_of(rec)


def test_a_stray_byte_in_a_number_is_still_unreadable(tmp_path):
    """Only text fields are mended: a byte above ASCII in a number is damage."""
    path = patch_field(write_edf(tmp_path / "x.edf", [sine_mv(250, 2)], 250, ["ECG II"]), PHYSICAL_MAX, 0, b"1\xb00")
    with pytest.raises(RecordError, match=r"unreadable EDF: .*not EDF\(\+\) or BDF\(\+\) compliant"):
        read_one(path)


# ---------------------------------------------------------------------------- patient fields


def test_edf_plus_patient_code_is_read_and_nothing_else_of_the_patient(tmp_path):
    x = sine_mv(250, 2)
    path = write_edf(tmp_path / "p.edf", [x], 250, ["ECG II"], patient_code="MRN0042", **PHI)
    header = path.read_bytes()[:256].decode("ascii")
    assert "Jane_Doe" in header and "04-MAR-1950" in header and "chest_pain" in header  # they are there
    rec = read_one(path)
    assert rec.patient_id == "MRN0042"
    text = text_of(rec)
    assert [t for t in PHI_TEXT if t in text.lower()] == []
    # EDF+ stores a space of the code as '_': edflib gives the code back with its space
    spaced = write_edf(tmp_path / "s.edf", [x], 250, ["ECG II"], patient_code="MRN_7")
    assert read_one(spaced).patient_id == "MRN 7"


def test_unknown_patient_code_is_none(tmp_path):
    rec = read_one(write_edf(tmp_path / "x.edf", [sine_mv(250, 2)], 250, ["ECG II"]))
    assert rec.patient_id is None and rec.meta["file_type"] == "EDF+C"


def test_plain_edf_patient_field_is_never_read(tmp_path):
    path = write_edf(tmp_path / "plain.edf", [sine_mv(250, 2)], 250, ["ECG II"], patient_code="MRN0042",
                     file_type=pyedflib.FILETYPE_EDF, **PHI)
    assert b"MRN0042" in path.read_bytes()[:256]     # the free-text field holds it
    rec = read_one(path)
    assert rec.patient_id is None and rec.meta["file_type"] == "EDF"
    assert "MRN0042" not in text_of(rec) and "Jane" not in text_of(rec) and "1950" not in text_of(rec)


# ---------------------------------------------------------------------------- listing and labels


def test_listing_is_by_content_and_a_wrong_edf_is_quarantined_with_its_reason(tmp_path):
    x = sine_mv(250, 2)
    write_edf(tmp_path / "holter.dat", [x], 250, ["ECG II"])
    (tmp_path / "sub").mkdir()
    write_edf(tmp_path / "sub" / "noext", [x], 250, ["ECG I"])
    (tmp_path / "notes.edf").write_text("not an EDF at all\n")
    (tmp_path / "muse.edf").write_text('<?xml version="1.0"?><RestingECG></RestingECG>')
    (tmp_path / "readme.txt").write_text("hello")
    src = get_source("edf")
    refs = {r.record_id: r for r in src.list_records(tmp_path)}
    assert sorted(refs) == ["holter.dat", "muse.edf", "notes.edf", "sub/noext"]
    assert src.read(refs["holter.dat"]).lead_names == ("II",)
    assert src.read(refs["sub/noext"]).lead_names == ("I",)
    with pytest.raises(RecordError, match=r"not an EDF file \(its content is none of"):
        src.read(refs["notes.edf"])
    with pytest.raises(RecordError, match=r"a GE MUSE XML file, not EDF: read it with --source auto"):
        src.read(refs["muse.edf"])


def test_labels_come_from_a_label_table(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in ("a.edf", "b.edf"):
        write_edf(data / name, [sine_mv(250, 2)], 250, ["ECG II"])
    (tmp_path / "labels.csv").write_text("record_id,labels\na,AF;SR\n")
    src = get_source("edf", labels=str(tmp_path / "labels.csv"))
    refs = {r.record_id: r for r in src.list_records(data)}
    rec = src.read(refs["a.edf"])
    assert rec.labels == ("AF", "SR") and src.class_names == ("AF", "SR") and src.multilabel
    with pytest.raises(RecordError, match="unlabelled: no row for 'b.edf'"):
        src.read(refs["b.edf"])


def test_the_real_file_copied_without_suffix_is_still_listed(tmp_path):
    shutil.copy(REAL, tmp_path / "recording")
    refs = get_source("edf").list_records(tmp_path)
    assert [r.record_id for r in refs] == ["recording"] and refs[0].extra["format"] == "edf"
