"""Read rates of the hospital-export readers: the same recordings as WFDB, DICOM, GE MUSE XML,
HL7 aECG, EDF+ and arrays, each read back by its own reader, one process, no Ray.

    python -m bench.export_formats                                   # 200 recordings, a tempdir
    python -m bench.export_formats --n 200 --work /tmp/exports --repeats 3
    python -m bench.export_formats --n 200 --mixed-folder /tmp/mixed1000     # + a mixed folder
    python jobs/preprocess.py --source auto --input /tmp/mixed1000 --output ...   # later (Ray)
    python -m bench.export_formats --quick                           # 20 recordings: a smoke run

Signals: `synthesize_record(seed, i)` (12 leads, 10 s at 500 Hz, mV), the same N in every format,
one subfolder each: wfdb (`wrsamp`, 16-bit, 1000 adu/mV); dicom (the real
tests/data/hospital/dicom/guangxi_teaching_sinus_rhythm.dcm, its rhythm group's WaveformData
replaced at each channel's sensitivity x correction, a new PatientID and SOPInstanceUID); muse (the
real tests/data/hospital/muse/guangxi_teaching_sinus_rhythm.xml, the Rhythm waveform's 8 stored
leads re-encoded with their LeadDataCRC32, a new PatientID; the reader derives III, aVR, aVL, aVF);
aecg (generated AnnotatedECG, one RHYTHM series, GLIST_TS every 0.002 s, 12 SLIST_PQ leads in
integer uV); edf (pyedflib EDF+, "ECG I" ... "ECG V6" in mV, 16-bit over +-(max |x| + 1) mV);
arrays (signals.npy (N, 12, 5000) float32 + signals.csv).

Record 0 of each format is read back and compared with its source (leads matched by name): within
0.01 mV (quantisation: 0.5-2.5 uV a step). Then per format, best of --repeats: `list_records`,
`read` of every record, `read` + `preprocess_record` (`load_config().data.preprocess`, the paper's).
Files are read just after being written, from the page cache: the figures are decoding, not disk.

`--mixed-folder PATH` also writes --mixed-count files, flat, for `--source auto`: dicom, muse,
aecg, edf and wfdb in turn (a WFDB record, .hea + .dat, is one file), ecg00000..., one DICOM file
in ten without a suffix, file j holding signal j mod N; checked by listing it with `auto`.
"""
from __future__ import annotations

import base64
import dataclasses
import os
import platform
import re
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from bench.common import REPO, cpu_name, emit, parser, progress
from coreecg.config import load_config
from coreecg.data.preprocess import preprocess_record
from coreecg.data.record import STANDARD_LEADS
from coreecg.data.sources import get_source
from coreecg.data.sources.exports import millivolts_per
from coreecg.data.sources.synthetic import synthesize_record

FS, SECONDS = 500, 10
SAMPLES = FS * SECONDS
FORMATS = ("wfdb", "dicom", "muse", "aecg", "edf", "arrays")
MIXED = ("dicom", "muse", "aecg", "edf", "wfdb")
SUFFIX = {"wfdb": "", "dicom": ".dcm", "muse": ".xml", "aecg": ".xml", "edf": ".edf"}
TOLERANCE_MV = 0.01
HOSPITAL = REPO / "tests" / "data" / "hospital"
DICOM_TEMPLATE = HOSPITAL / "dicom" / "guangxi_teaching_sinus_rhythm.dcm"
MUSE_TEMPLATE = HOSPITAL / "muse" / "guangxi_teaching_sinus_rhythm.xml"


def quantise(x: np.ndarray, mv_per_unit: float) -> np.ndarray:
    """mV -> int16 counts of `mv_per_unit`; ValueError where a sample would not fit."""
    raw = np.round(np.asarray(x, np.float64) / mv_per_unit)
    if np.abs(raw).max() > 32767:
        raise ValueError(f"samples beyond int16 at {mv_per_unit:g} mV per unit")
    return raw.astype("<i2")


# ---------------------------------------------------------------------------- writers
# Each writes one recording, signal (12, 5000) float32 mV in STANDARD_LEADS order, to `stem` +
# its suffix and returns the path(s) written.


def write_wfdb(stem: Path, signal: np.ndarray, pid: str) -> list[Path]:
    import wfdb

    wfdb.wrsamp(stem.name, fs=FS, units=["mV"] * 12, sig_name=list(STANDARD_LEADS),
                p_signal=signal.T.astype(np.float64), fmt=["16"] * 12, adc_gain=[1000.0] * 12, baseline=[0] * 12,
                comments=[f"Patient ID: {pid}"], write_dir=str(stem.parent))
    return [stem.with_suffix(".hea"), stem.with_suffix(".dat")]


class DicomWriter:
    """The DICOM template, its rhythm group's data replaced per file (one dataset, reused)."""

    def __init__(self):
        import pydicom

        from coreecg.data.sources.dicom import rhythm_group

        self.ds = pydicom.dcmread(DICOM_TEMPLATE)
        self.group = rhythm_group(self.ds, str(DICOM_TEMPLATE))[1]
        channels = self.group.ChannelDefinitionSequence
        if len(channels) != 12 or int(self.group.NumberOfWaveformSamples) != SAMPLES:
            raise ValueError(f"{DICOM_TEMPLATE.name}: rhythm group is not 12 x {SAMPLES}")
        # mV per raw unit of each channel, as the reader scales it (baseline 0 in the template)
        self.scale = [float(ch.ChannelSensitivity) * float(ch.get("ChannelSensitivityCorrectionFactor") or 1)
                      * millivolts_per(ch.ChannelSensitivityUnitsSequence[0].CodeValue, DICOM_TEMPLATE.name)
                      for ch in channels]

    def __call__(self, stem: Path, signal: np.ndarray, pid: str) -> list[Path]:
        from pydicom.uid import generate_uid

        raw = np.stack([quantise(row, s) for row, s in zip(signal, self.scale)], axis=1)   # (samples, channels)
        self.group.WaveformData = raw.tobytes()
        self.ds.PatientID = pid
        self.ds.SOPInstanceUID = self.ds.file_meta.MediaStorageSOPInstanceUID = generate_uid()
        path = stem.with_suffix(SUFFIX["dicom"])
        self.ds.save_as(path)
        return [path]


class MuseWriter:
    """The MUSE template's text, the Rhythm waveform's leads and the PatientID replaced per file."""

    def __init__(self):
        text = MUSE_TEMPLATE.read_text(encoding="utf-8")
        start = text.index("<WaveformType>Rhythm</WaveformType>")
        end = text.index("</Waveform>", start)
        self.head, self.rhythm, self.tail = text[:start], text[start:end], text[end:]

    def __call__(self, stem: Path, signal: np.ndarray, pid: str) -> list[Path]:
        def lead(match: re.Match) -> str:
            block = match.group(0)
            name = re.search(r"<LeadID>\s*(\S+)\s*</LeadID>", block).group(1)
            per_bit = float(re.search(r"<LeadAmplitudeUnitsPerBit>(.*?)</", block).group(1))
            unit = re.search(r"<LeadAmplitudeUnits>(.*?)</", block).group(1)
            data = quantise(signal[STANDARD_LEADS.index(name)], per_bit * millivolts_per(unit, "muse")).tobytes()
            b64 = base64.b64encode(data).decode()
            lines = "\n".join(b64[k:k + 68] for k in range(0, len(b64), 68))
            crc = f"<LeadDataCRC32>{zlib.crc32(data)}</LeadDataCRC32>"
            block = re.sub(r"<LeadDataCRC32>.*?</LeadDataCRC32>", crc, block)
            return re.sub(r"<WaveFormData>.*?</WaveFormData>", lambda _: f"<WaveFormData>\n{lines}\n</WaveFormData>",
                          block, flags=re.S)

        head = re.sub(r"<PatientID>.*?</PatientID>", f"<PatientID>{pid}</PatientID>", self.head, count=1)
        rhythm = re.sub(r"<LeadData>.*?</LeadData>", lead, self.rhythm, flags=re.S)
        path = stem.with_suffix(SUFFIX["muse"])
        path.write_text(head + rhythm + self.tail, encoding="utf-8")
        return [path]


AECG_LEADS = tuple("MDC_ECG_LEAD_" + name.upper() for name in STANDARD_LEADS)   # ..._AVR, ..._V6


def write_aecg(stem: Path, signal: np.ndarray, pid: str) -> list[Path]:
    microvolts = np.round(np.asarray(signal, np.float64) * 1000).astype(np.int64)
    leads = "".join(
        f'<component><sequence><code code="{code}" codeSystem="2.16.840.1.113883.6.24"/>'
        f'<value xsi:type="SLIST_PQ"><origin value="0" unit="uV"/><scale value="1" unit="uV"/>'
        f'<digits>{" ".join(map(str, row.tolist()))}</digits></value></sequence></component>\n'
        for code, row in zip(AECG_LEADS, microvolts))
    text = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        '<AnnotatedECG xmlns="urn:hl7-org:v3" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance">\n'
        f'<id root="{stem.name}"/><code code="93000" codeSystem="2.16.840.1.113883.6.12"/>\n'
        '<componentOf><timepointEvent><componentOf><subjectAssignment><subject><trialSubject>'
        f'<id root="2.16.840.1.113883.3.456" extension="{pid}"/>'
        '</trialSubject></subject></subjectAssignment></componentOf></timepointEvent></componentOf>\n'
        '<component><series><code code="RHYTHM" codeSystem="2.16.840.1.113883.5.4"/>\n'
        '<component><sequenceSet>\n'
        '<component><sequence><code code="TIME_ABSOLUTE" codeSystem="2.16.840.1.113883.5.4"/>'
        '<value xsi:type="GLIST_TS"><head value="20240101103517"/><increment value="0.002" unit="s"/></value>'
        '</sequence></component>\n'
        f'{leads}</sequenceSet></component>\n</series></component>\n</AnnotatedECG>\n')
    path = stem.with_suffix(SUFFIX["aecg"])
    path.write_text(text, encoding="utf-8")
    return [path]


def write_edf(stem: Path, signal: np.ndarray, pid: str) -> list[Path]:
    import pyedflib

    path = stem.with_suffix(SUFFIX["edf"])
    limit = float(np.ceil(np.abs(signal).max()) + 1)
    headers = [{"label": f"ECG {name}", "dimension": "mV", "sample_frequency": FS, "physical_max": limit,
                "physical_min": -limit, "digital_max": 32767, "digital_min": -32768, "transducer": "",
                "prefilter": ""} for name in STANDARD_LEADS]
    writer = pyedflib.EdfWriter(str(path), len(headers), file_type=pyedflib.FILETYPE_EDFPLUS)
    try:
        writer.setSignalHeaders(headers)
        writer.setPatientCode(pid)
        writer.writeSamples([np.ascontiguousarray(row, dtype=np.float64) for row in signal])
    finally:
        writer.close()
    return [path]


def write_arrays(folder: Path, signals: np.ndarray, pids: list[str]) -> None:
    """signals.npy (N, 12, 5000) float32 and signals.csv (record_id, patient_id, sampling_rate, leads)."""
    np.save(folder / "signals.npy", signals.astype(np.float32))
    rows = [f"rec{i:05d},{pid},{FS},{';'.join(STANDARD_LEADS)}" for i, pid in enumerate(pids)]
    (folder / "signals.csv").write_text("\n".join(["record_id,patient_id,sampling_rate,leads", *rows]) + "\n")


def fresh_folder(path: Path) -> Path:
    """`path`, created; SystemExit when it holds anything (nothing here is ever deleted)."""
    path.mkdir(parents=True, exist_ok=True)
    if any(path.iterdir()):
        raise SystemExit(f"{path} is not empty: give a new or empty folder")
    return path


# ---------------------------------------------------------------------------- checks and timing


def in_standard_order(rec) -> np.ndarray:
    return rec.signal[[list(rec.lead_names).index(lead) for lead in STANDARD_LEADS]]


def max_abs_diff(name: str, folder: Path, signal: np.ndarray) -> float:
    """Record 0 read back by its reader against its source signal (leads matched by name), mV."""
    src = get_source(name)
    ref = min(src.list_records(folder), key=lambda r: r.record_id)
    rec = src.read(ref)
    if rec.fs != FS or rec.signal.shape != (12, SAMPLES):
        raise AssertionError(f"{name}: read back {rec.signal.shape} at {rec.fs} Hz, wrote (12, {SAMPLES}) at {FS} Hz")
    diff = float(np.abs(in_standard_order(rec).astype(np.float64) - signal).max())
    if not diff < TOLERANCE_MV:
        raise AssertionError(f"{name}: record 0 read back differs by {diff:.4g} mV (limit {TOLERANCE_MV} mV)")
    return diff


def measure(name: str, folder: Path, n: int, repeats: int, cfg) -> dict:
    """Best of `repeats`: listing seconds, records/s of read, records/s of read + preprocess_record."""
    times = []
    for _ in range(repeats):
        src = get_source(name)
        t0 = time.perf_counter()
        refs = src.list_records(folder)
        t1 = time.perf_counter()
        for ref in refs:
            src.read(ref)
        t2 = time.perf_counter()
        for ref in refs:
            preprocess_record(src.read(ref), cfg)
        t3 = time.perf_counter()
        if len(refs) != n:
            raise AssertionError(f"{name}: listed {len(refs)} records, wrote {n}")
        times.append((t1 - t0, t2 - t1, t3 - t2))
    list_s, read_s, both_s = (min(column) for column in zip(*times))
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {"bytes_per_record": round(size / n), "list_s": round(list_s, 4), "read_records_per_s": round(n / read_s, 1),
            "read_preprocess_records_per_s": round(n / both_s, 1)}


def mixed_folder(folder: Path, count: int, signals: np.ndarray, pids: list[str], writers: dict) -> dict:
    """`count` files of MIXED formats in turn, flat; every tenth DICOM file without a suffix. Checked
    with `auto`: its listing by reader, and files 0-4 (one of each format) read back."""
    fresh_folder(folder)
    written = dict.fromkeys(MIXED, 0)
    bare = 0
    for j in range(count):
        fmt, i = MIXED[j % len(MIXED)], j % len(signals)
        paths = writers[fmt](folder / f"ecg{j:05d}", signals[i], pids[i])
        if fmt == "dicom" and written[fmt] % 10 == 0:
            paths[0].rename(paths[0].with_suffix(""))
            bare += 1
        written[fmt] += 1
    src = get_source("auto")
    t0 = time.perf_counter()
    refs = src.list_records(folder)
    listed = time.perf_counter() - t0
    diff = 0.0
    for j, ref in enumerate(sorted(refs, key=lambda r: r.record_id)[:len(MIXED)]):     # ecg00000 ... ecg00004
        diff = max(diff, float(np.abs(in_standard_order(src.read(ref)) - signals[j % len(signals)]).max()))
    if len(refs) != count or not diff < TOLERANCE_MV:
        raise AssertionError(f"auto: listed {len(refs)} of {count} files; read-back difference {diff:.4g} mV")
    return {"path": str(folder), "files": count, "per_format": written, "dicom_without_suffix": bare,
            "auto_listed_by_reader": {f: sum(r.extra.get("reader") == f for r in refs) for f in MIXED},
            "auto_list_s": round(listed, 4), "auto_read_back_max_abs_diff_mv": round(diff, 6)}


def versions() -> dict:
    import pydicom
    import pyedflib
    import wfdb

    return {"cpu": cpu_name(), "cpu_count": os.cpu_count(), "load_average_1min": os.getloadavg()[0],
            "python": platform.python_version(), "numpy": np.__version__, "pydicom": pydicom.__version__,
            "pyedflib": pyedflib.__version__, "wfdb": wfdb.__version__}


def main() -> None:
    p = parser(__doc__, "20 recordings, 1 repeat")
    p.add_argument("--n", type=int, default=200, help="recordings per format (default 200)")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per format; the best is reported")
    p.add_argument("--seed", type=int, default=0, help="synthetic corpus seed")
    p.add_argument("--work", help="new or empty folder for the per-format copies (kept); default a tempdir")
    p.add_argument("--mixed-folder", help="also write a flat mixed folder here (new or empty; for --source auto)")
    p.add_argument("--mixed-count", type=int, default=1000, help="files in the mixed folder (default 1000)")
    args = p.parse_args()
    if args.quick:
        args.n, args.repeats = 20, 1
    cfg = load_config().data.preprocess

    signals = np.stack([synthesize_record(args.seed, i, fs=FS, duration_s=SECONDS).signal for i in range(args.n)])
    pids = [f"P{i:06d}" for i in range(args.n)]
    writers = {"wfdb": write_wfdb, "dicom": DicomWriter(), "muse": MuseWriter(), "aecg": write_aecg, "edf": write_edf}
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="export_formats_")
    work = Path(args.work or tmp.name)
    try:
        formats = {}
        for name in FORMATS:
            folder = fresh_folder(work / name)
            t0 = time.perf_counter()
            if name == "arrays":
                write_arrays(folder, signals, pids)
            else:
                for i, (signal, pid) in enumerate(zip(signals, pids)):
                    writers[name](folder / f"rec{i:05d}", signal, pid)
            written = time.perf_counter() - t0
            diff = max_abs_diff(name, folder, signals[0].astype(np.float64))
            formats[name] = {**measure(name, folder, args.n, args.repeats, cfg), "max_abs_diff_mv": round(diff, 6),
                             "write_s": round(written, 3)}
            progress({name: formats[name]})
        mixed = (mixed_folder(Path(args.mixed_folder), args.mixed_count, signals, pids, writers)
                 if args.mixed_folder else None)
    finally:
        if tmp is not None:
            tmp.cleanup()
    emit({"benchmark": "export_formats", "n": args.n, "fs": FS, "seconds": SECONDS, "formats": formats,
          "mixed_folder": mixed,
          "settings": {"repeats": args.repeats, "seed": args.seed, "signals": "synthesize_record(seed, i, fs=500, "
                       "duration_s=10), float32 mV", "work": args.work or "tempdir (removed)",
                       "tolerance_mv": TOLERANCE_MV, "preprocess": dataclasses.asdict(cfg),
                       "command": " ".join(["python -m bench.export_formats", *sys.argv[1:]])},
          "machine": versions()})


if __name__ == "__main__":
    main()
