"""Hospital and device exports through the jobs (issue 44): a folder that mixes DICOM, GE MUSE XML,
HL7 aECG, EDF and bad files builds with `jobs/preprocess.py --source auto`, each file by its own
reader and each bad one quarantined with its reason; no patient identifier of the files reaches the
corpus (salted hashes, the salt outside it; `--keep-patient-ids` named in the manifest); predict and
embed read DICOM and MUSE files directly; a one-lead EDF corpus pretrains and fine-tunes.

The real files (tests/data/hospital, pydicom's waveform_ecg.dcm) are named in tests/data/README.md;
the EDF files and the bad files are written here (no public 12-lead EDF exists to borrow).
"""
from __future__ import annotations

import csv
import datetime
import importlib.util
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from coreecg.config import STANDARD_LEADS, load_config
from tests.helpers import TINY, InProcessDataset

REPO = Path(__file__).resolve().parents[1]
HOSPITAL = REPO / "tests" / "data" / "hospital"
GUANGXI_DCM = HOSPITAL / "dicom" / "guangxi_teaching_sinus_rhythm.dcm"
GUANGXI_XML = HOSPITAL / "muse" / "guangxi_teaching_sinus_rhythm.xml"
MUSE_PHI = HOSPITAL / "muse" / "musePHI_muse_ecg1.xml"
AECG_MIN = HOSPITAL / "aecg" / "FDA_minimum_aecg.xml"
SMALL = [*TINY, "model.input_samples=1500", "data.crop_samples=1500", "encoders.coreecg.patch_size=150"]
# What the EDF files written here carry in their headers, never to be copied into a corpus.
EDF_PATIENT = {"code": "MRN-4471902", "name": "Doe_Janet", "birthdate": datetime.date(1951, 5, 2)}


def _job(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_job", REPO / "jobs" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_edf(path: Path, signals_mv: np.ndarray, fs: float, labels: list[str], unit: str = "mV",
              patient: dict | None = None) -> Path:
    """(channels, samples) millivolts -> an EDF+ file (16-bit, the physical range of each channel)."""
    import pyedflib

    w = pyedflib.EdfWriter(str(path), len(labels), file_type=pyedflib.FILETYPE_EDFPLUS)
    try:
        w.setSignalHeaders([{"label": label, "dimension": unit, "sample_frequency": fs,
                             "physical_min": round(float(x.min()) - 0.5, 2),
                             "physical_max": round(float(x.max()) + 0.5, 2),
                             "digital_min": -32768, "digital_max": 32767} for label, x in zip(labels, signals_mv)])
        if patient:
            w.setPatientCode(patient["code"])
            w.setPatientName(patient["name"])
            w.setBirthdate(patient["birthdate"])
        w.writeSamples([np.ascontiguousarray(x, dtype=np.float64) for x in signals_mv])
    finally:
        w.close()
    return path


def _ptbxl_signal(ecg_data: Path) -> tuple[np.ndarray, float, list[str]]:
    """The first shared PTB-XL record at 500 Hz: (12, 5000) millivolts, its rate and lead names."""
    import wfdb

    hea = sorted((ecg_data / "ptbxl").rglob("records500/*/*.hea"))[0]
    rec = wfdb.rdrecord(str(hea.with_suffix("")))
    return rec.p_signal.T, float(rec.fs), list(rec.sig_name)


def _bad_files(folder: Path, ecg_data: Path) -> dict[str, str]:
    """The issue's bad inputs, each written from a real file -> {file name: the reason's pattern}."""
    import pydicom

    folder.mkdir(parents=True)
    ds = pydicom.dcmread(GUANGXI_DCM)
    ds.SOPClassUID = ds.file_meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"     # CT Image Storage
    ds.save_as(folder / "ct_slice.dcm")
    (folder / "report.xml").write_text('<?xml version="1.0"?>\n<ClinicalReport><Text>n/a</Text></ClinicalReport>\n')
    muse = GUANGXI_XML.read_text(encoding="iso-8859-1")
    rhythm = muse.index("<WaveformType>Rhythm")                            # the median beats come first
    first = re.compile(r"<WaveFormData>(.*?)</WaveFormData>", re.S).search(muse, rhythm)
    cut = muse[:first.start(1)] + first.group(1).strip()[:1001] + muse[first.end(1):]      # not a multiple of 4
    (folder / "truncated.xml").write_text(cut, encoding="iso-8859-1")
    (folder / "no_units.xml").write_text(re.sub(r"<LeadAmplitudeUnits>[^<]*</LeadAmplitudeUnits>", "", muse),
                                         encoding="iso-8859-1")
    last = list(re.finditer(r"<LeadData>.*?</LeadData>", muse, re.S))[-1]            # V6 gone: 7 stored leads
    (folder / "seven_leads.xml").write_text(muse[:last.start()] + muse[last.end():], encoding="iso-8859-1")
    (folder / "zero_rate.xml").write_text(re.sub(r"<SampleBase>\d+</SampleBase>", "<SampleBase>0</SampleBase>", muse),
                                          encoding="iso-8859-1")
    (folder / "gone.xml").symlink_to(folder / "deleted-since.xml")       # listed, cannot be opened
    return {"gone.xml": r"unreadable: the file cannot be opened", "ct_slice.dcm": r"SOP class",
            "report.xml": r"neither GE MUSE .* nor HL7 aECG",
            "truncated.xml": r"truncated|base64", "no_units.xml": r"units missing",
            "seven_leads.xml": r"missing lead", "zero_rate.xml": r"sampling rate|rate"}


@pytest.fixture(scope="module")
def exports(ecg_data, tmp_path_factory) -> dict:
    """A clinic's export folder: the real DICOM (one without a suffix), MUSE and aECG files, a 12-lead
    EDF+ and a one-lead Holter EDF+ with a patient's name and birth date, the bad files, and
    documents (a labels table, a README) that are no records."""
    import pydicom.data

    root = tmp_path_factory.mktemp("exports") / "clinic"
    (root / "dicom").mkdir(parents=True)
    shutil.copy(GUANGXI_DCM, root / "dicom" / "guangxi.dcm")
    shutil.copy(pydicom.data.get_testdata_file("waveform_ecg.dcm"), root / "dicom" / "IM000042")   # no suffix
    (root / "muse").mkdir()
    shutil.copy(GUANGXI_XML, root / "muse" / "guangxi.xml")
    shutil.copy(MUSE_PHI, root / "muse" / "musephi.xml")
    (root / "aecg").mkdir()
    shutil.copy(AECG_MIN, root / "aecg" / "minimum.xml")          # 13 samples: too short for a window
    (root / "edf").mkdir()
    x, fs, leads = _ptbxl_signal(ecg_data)
    write_edf(root / "edf" / "cart.edf", x, fs, [f"ECG {n}" for n in leads], patient=EDF_PATIENT)
    write_edf(root / "edf" / "holter.edf", x[1:2].repeat(3, axis=1), fs, ["ECG II"],
              patient=EDF_PATIENT)
    bad = _bad_files(root / "bad", ecg_data)
    (root / "README.txt").write_text("exported 2026-11-27\n")
    (root / "labels.csv").write_text("record_id,labels\n")
    return {"root": root, "bad": bad}


@pytest.fixture(scope="module")
def built(exports, ray_session, tmp_path_factory) -> dict:
    """jobs/preprocess.py --source auto on the export folder, the salt in a folder of its own."""
    tmp = tmp_path_factory.mktemp("built")
    out, salt = tmp / "corpus", tmp / "secrets" / "salt"
    rc = _job("preprocess").main(["--source", "auto", "--input", str(exports["root"]), "--output", str(out),
                                  "--salt-file", str(salt), "--set", "data.shard_records=4"])
    assert rc == 0
    from coreecg.data.patient_ids import PatientIdPolicy, read_record_map

    record_map = read_record_map(PatientIdPolicy(salt_file=str(salt)).map_file(out))
    return {"out": out, "salt": salt, "manifest": json.loads((out / "manifest.json").read_text()), "map": record_map}


def _quarantine(out: Path, record_map: dict[str, dict[str, str]]) -> dict[str, str]:
    """{file name: reason} of quarantine.csv, its keyed record ids looked up in the owner's map."""
    with open(out / "quarantine.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert all(row["path"] == "" for row in rows)              # a keyed corpus names no file
    return {Path(record_map[row["record_id"]]["path"]).name: row["reason"] for row in rows}


def test_a_mixed_folder_builds_each_file_by_its_own_reader_and_quarantines_the_bad_ones(built, exports):
    m, q = built["manifest"], _quarantine(built["out"], built["map"])
    written = m["counts"]["records_written"]
    # the two DICOM (one found by content alone), two MUSE and the 12-lead EDF; the aECG (lead II, 13
    # samples) and the Holter have one lead of the default twelve: both quarantined with that reason
    assert written == 5, (written, q)
    for name, pattern in exports["bad"].items():
        assert re.search(pattern, q[name], re.I), (name, q[name])
    assert re.search(r"missing lead", q["minimum.xml"]) and re.search(r"missing lead", q["holter.edf"])
    assert not {"README.txt", "labels.csv"} & set(q)                  # documents are no records
    assert m["counts"]["records_listed"] == written + len(q)
    assert m["source"] == "auto" and m["patient_ids"]["stored"].startswith("hmac-sha256")
    assert any("derived leads III, aVR, aVL, aVF" in note for note in m["notes"]), m["notes"]


def _identifiers() -> list[str]:
    """Every patient identifier, name and birth date the export folder's files hold."""
    import pydicom
    import pydicom.data

    out = []
    for f in (GUANGXI_DCM, pydicom.data.get_testdata_file("waveform_ecg.dcm")):
        ds = pydicom.dcmread(f)
        out += [str(ds.get(k, "")) for k in ("PatientID", "PatientName", "PatientBirthDate")]
    for f in (GUANGXI_XML, MUSE_PHI):
        text = Path(f).read_text(encoding="iso-8859-1")
        out += re.findall(r"<(?:PatientID|PatientLastName|PatientFirstName|DateofBirth)>([^<]+)<", text)
    out += re.findall(r'<trialSubject>\s*<id [^>]*extension="([^"]+)"', AECG_MIN.read_text())
    out += [EDF_PATIENT["code"], EDF_PATIENT["name"], EDF_PATIENT["name"].replace("_", " "), "02-MAY-1951"]
    return sorted({s.strip() for s in out if s.strip()})


def test_no_identifier_from_the_files_appears_anywhere_in_the_corpus(built):
    ids = _identifiers()
    assert {"642341", "JAX01234", "00000000", "SBJ-123", "MRN-4471902", "19710123"} <= set(ids)
    out = built["out"]
    texts = {}
    for f in sorted(p for p in out.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":        # every value but the signal, as text (pages are compressed)
            table = pq.read_table(f)
            texts[f] = json.dumps(table.drop([c for c in table.column_names if c == "signal"]).to_pylist(), default=str)
        else:
            texts[f] = f.read_bytes().decode("utf-8", errors="replace")
    assert any(f.name == "fingerprints.parquet" for f in texts) and any("train" in f.parts for f in texts)
    for f, text in texts.items():
        for ident in ids:                 # a whole token: "00000000" may sit inside a checksum
            assert not re.search(rf"(?<![\w.-]){re.escape(ident)}(?![\w.-])", text), (ident, f)
    salt = built["salt"].read_text().strip()
    assert all(salt not in t for t in texts.values())
    keys = set(pq.ParquetDataset(sorted(out.glob("*/shard-*.parquet"))).read(["patient_id"]).column(0).to_pylist())
    assert keys and all(re.fullmatch(r"p-[0-9a-f]{24}|record:.+", k) for k in keys), keys


def test_the_same_patient_gets_the_same_key_in_every_corpus_of_one_salt(built, exports, tmp_path):
    """The leakage guard's premise: a key is a function of (salt, id). Rebuilt from the MUSE files
    alone with the same salt, the patient keys are the mixed corpus's; with another salt, none is."""
    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus

    from coreecg.data.patient_ids import read_record_map

    def keys(out: Path, salt: Path) -> dict[str, str]:
        names = read_record_map(PatientIdPolicy(salt_file=str(salt)).map_file(out))
        t = pq.ParquetDataset(sorted(out.glob("*/shard-*.parquet"))).read(["record_id", "patient_id"]).to_pylist()
        return {Path(names[r["record_id"]]["record_id"]).name: r["patient_id"] for r in t}

    mixed = keys(built["out"], built["salt"])
    cfg = load_config().data
    for salt, same in ((built["salt"], True), (tmp_path / "other-salt", False)):
        out = tmp_path / f"muse-{same}"
        with pytest.MonkeyPatch.context() as mp:
            import ray.data

            mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
            build_corpus("muse", exports["root"] / "muse", out, cfg, log_warnings=False,
                         patient_ids=PatientIdPolicy(salt_file=str(salt)))
        muse = keys(out, salt)
        assert set(muse) == {"guangxi.xml", "musephi.xml"}
        assert all((muse[k] == mixed[k]) == same for k in muse), (muse, mixed)


def test_keep_patient_ids_stores_them_and_says_so(exports, tmp_path):
    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus

    out = tmp_path / "kept"
    with pytest.MonkeyPatch.context() as mp:
        import ray.data

        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        m = build_corpus("muse", exports["root"] / "muse", out, load_config().data, log_warnings=False,
                         patient_ids=PatientIdPolicy(keep=True))
    assert m["patient_ids"] == {"stored": "as read", "keep_patient_ids": True, "record_ids": "as read"}
    t = pq.ParquetDataset(sorted(out.glob("*/shard-*.parquet"))).read(["patient_id", "record_id"])
    assert set(t.column("patient_id").to_pylist()) == {"00000000", "JAX01234"}
    assert set(t.column("record_id").to_pylist()) == {"guangxi.xml", "musephi.xml"}       # the names, as read
    assert m["input"] == str(exports["root"] / "muse") and m["run"]["record_map"] is None


def test_the_salt_must_stay_outside_the_corpus(exports, tmp_path):
    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus

    with pytest.raises(ValueError, match="lies inside the corpus folder"):
        build_corpus("muse", exports["root"] / "muse", tmp_path / "c", load_config().data,
                     patient_ids=PatientIdPolicy(salt_file=str(tmp_path / "c" / "salt")))


# ---------------------------------------------------------------------------- predict and embed


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> Path:
    """A tiny pretrained encoder run folder (12 leads), trained in this process on synthetic windows."""
    from coreecg.data import synthetic_windows
    from coreecg.train.pretraining import pretrain_local

    tmp = tmp_path_factory.mktemp("hospital-encoder")
    windows, _ = synthetic_windows(16, seed=0)
    cfg = load_config(overrides=[*SMALL, "optim.batch_size=8", "optim.epochs=1", "optim.warmup_epochs=0",
                                 "train.eval_every_epochs=0", "train.figures=false", "train.device=cpu",
                                 "train.checkpoint_every_steps=0"])
    pretrain_local(cfg, windows.astype(np.float16), tmp / "pre")
    return tmp / "pre"


def test_predict_reads_a_dicom_and_a_muse_file_and_embed_takes_a_path(encoder, tmp_path, monkeypatch):
    import coreecg

    monkeypatch.setenv("COREECG_VERBOSE", "0")
    out = tmp_path / "emb.parquet"
    rc = _job("predict").main(["--model", str(encoder), "--input", str(GUANGXI_DCM), str(GUANGXI_XML),
                               "--output", str(out), "--embeddings"])
    assert rc == 0
    table = pq.read_table(out).to_pylist()
    by_name = {Path(r["path"]).name: np.asarray(r["embedding"], dtype=np.float32) for r in table}
    assert set(by_name) == {GUANGXI_DCM.name, GUANGXI_XML.name}
    dcm, xml = by_name[GUANGXI_DCM.name], by_name[GUANGXI_XML.name]
    # one ECG, two exports (the DICOM was converted from the MUSE file): one embedding
    cos = float(dcm @ xml / np.linalg.norm(dcm) / np.linalg.norm(xml))
    assert cos > 0.999, cos
    np.testing.assert_allclose(coreecg.embed(str(GUANGXI_XML), model=encoder), xml, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="states its own sampling rate"):
        coreecg.embed(str(GUANGXI_XML), 500, STANDARD_LEADS, encoder)


def test_predict_reads_a_folder_of_exports_each_file_by_its_reader(encoder, exports, tmp_path, monkeypatch):
    """jobs/predict.py on the clinic's folder: every DICOM, MUSE, aECG and EDF file by content (the
    DICOM without a suffix too), WFDB-free; the bad ones fail with their reasons, the rest are scored;
    XML of another kind in a folder is no record (not a failure); named directly, it fails."""
    monkeypatch.setenv("COREECG_VERBOSE", "0")
    out = tmp_path / "folder.parquet"
    rc = _job("predict").main(["--model", str(encoder), "--input", str(exports["root"]), "--output", str(out),
                               "--embeddings"])
    scored = {Path(r["path"]).name for r in pq.read_table(out).to_pylist()}
    assert {"guangxi.dcm", "IM000042", "guangxi.xml", "musephi.xml", "cart.edf"} <= scored, scored
    with open(out.parent / "failed.csv", newline="") as f:
        failed = {Path(row["path"]).name: row["reason"] for row in csv.DictReader(f)}
    assert rc == 1 and "report.xml" not in failed and "README.txt" not in failed
    for name in ("ct_slice.dcm", "truncated.xml", "no_units.xml", "zero_rate.xml"):
        assert re.search(exports["bad"][name], failed[name], re.I), (name, failed[name])
    rc = _job("predict").main(["--model", str(encoder), "--input", str(exports["root"] / "bad" / "report.xml"),
                               "--output", str(tmp_path / "one.parquet"), "--embeddings"])
    with open(tmp_path / "failed.csv", newline="") as f:
        assert rc == 2 and re.search("neither GE MUSE", next(csv.DictReader(f))["reason"])   # nothing readable


# ---------------------------------------------------------------------------- a one-lead EDF corpus


def test_a_one_lead_edf_corpus_pretrains_and_fine_tunes(tmp_path):
    """Holters: 24 one-lead EDF files (lead II, 40 s, a patient each) and a labels table build a corpus
    with data.preprocess.leads=[II]; CoRe-ECG pretrains on it (temporal masking: one lead has no
    spatial axis) and a linear fine-tune trains and evaluates on its labels."""
    import torch

    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus
    from coreecg.data.reading import read_split
    from coreecg.data.sources.synthetic import synthesize_record
    from coreecg.train.finetuning import FinetuneTask, plan_finetune
    from coreecg.train.loop import run_local
    from coreecg.train.pretraining import pretrain_local

    raw = tmp_path / "holters"
    raw.mkdir()
    rows = ["record_id,labels"]
    for i in range(24):
        rec = synthesize_record(5, i, duration_s=40.0)
        lead_ii = rec.signal[list(rec.lead_names).index("II")][None]
        write_edf(raw / f"h{i:02d}.edf", lead_ii, rec.fs, ["EKG II-REF"],
                  patient={**EDF_PATIENT, "code": f"MRN-{i:05d}"})
        rows.append(f"h{i:02d}.edf,{'AF' if rec.labels[0].startswith('AF') or i % 2 else 'SR'}")
    (raw / "labels.csv").write_text("\n".join(rows) + "\n")
    cfg = load_config(overrides=["data.preprocess.leads=[II]", "data.shard_records=8",
                                 "data.split_ratios=[0.5,0.25,0.25]",
                                 f"data.sources.edf.labels={raw / 'labels.csv'}"])
    salt = tmp_path / "salt"              # a fixed salt: the patient hashes, hence the splits, are fixed
    salt.write_text("5e" * 32 + "\n")
    one = ["data.preprocess.leads=[II]", "methods.core.masking.strategy=temporal"]
    from coreecg.config import ConfigError
    from coreecg.methods import build_method
    with pytest.raises(ConfigError, match=r"k=4 must satisfy 0 < k < 1.*strategy=temporal \(one lead"):
        build_method(load_config(overrides=[*SMALL, "data.preprocess.leads=[II]"]))     # STDM on one lead
    out = tmp_path / "corpus"
    with pytest.MonkeyPatch.context() as mp:
        import ray.data

        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        m = build_corpus("edf", raw, out, cfg.data, source_options=cfg.data.sources.for_source("edf"),
                         log_warnings=False, patient_ids=PatientIdPolicy(salt_file=str(salt)))
    assert m["counts"]["records_written"] == 24 and m["signal"]["leads"] == ["II"]
    assert m["class_names"] == ["AF", "SR"] and all(m["counts"]["records"][s] > 0 for s in ("train", "val", "test"))
    train = read_split(out, "train", ["signal"], as_stored=True)["signal"]
    assert train.shape[1:] == (1, 2500)
    from coreecg.train.plan import PlanError
    from coreecg.train.pretraining import plan_pretrain
    with pytest.raises(PlanError, match=r"stores the leads \['II'\].*set data\.preprocess\.leads=\[II\]"):
        plan_pretrain(load_config(overrides=[*SMALL, f"data.corpus={out}", "methods.core.masking.strategy=temporal",
                                             f"train.storage_path={tmp_path / 'runs'}"]))   # read as 12 leads
    pre = load_config(overrides=[*SMALL, *one, "optim.batch_size=8",
                                 "optim.epochs=1", "optim.warmup_epochs=0", "train.eval_every_epochs=0",
                                 "train.figures=false", "train.device=cpu", "train.checkpoint_every_steps=0"])
    summary = pretrain_local(pre, train, tmp_path / "pre")
    assert (tmp_path / "pre" / "encoder.pt").is_file() and np.isfinite(summary["loss"]), summary
    ft = load_config(overrides=[
        *SMALL, *one, f"data.corpus={out}", f"finetune.encoder={tmp_path / 'pre' / 'encoder.pt'}",
        "finetune.mode=linear", "finetune.leads=[II]", "finetune.epochs=2", "finetune.batch_size=8",
        "finetune.bootstrap_resamples=0", "finetune.tsne_max_points=0", "train.num_workers=1", "train.device=cpu",
        "train.checkpoint_every_steps=0", f"train.storage_path={tmp_path}", "train.name=ft-holter"])
    plan = plan_finetune(ft)
    run_local(plan, FinetuneTask(plan, torch.device("cpu")), train)
    metrics = json.loads((plan.run_dir / "metrics.json").read_text())
    assert metrics["class_names"] == ["AF", "SR"] and metrics["lead_names"] == ["II"], metrics
    assert metrics["test"]["n"] > 0 and 0.0 <= metrics["test"]["auroc"] <= 1.0
    # pretraining fed lead II's embedding, the one fine-tuning on lead II reads (not lead I's)
    assert build_method(pre).lead_idx(1, torch.device("cpu")).tolist() == [STANDARD_LEADS.index("II")]


def test_a_corpus_from_arrays_in_memory(ray_session, tmp_path):
    """coreecg.data.build_corpus_from_arrays: the arrays reader's corpus without files of one's own;
    labels per record through a class map, patient ids salted, the scratch folder gone after."""
    from coreecg.data import build_corpus_from_arrays, read_split
    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.sources.synthetic import synthesize_record

    recs = [synthesize_record(3, i, duration_s=10.0) for i in range(8)]
    x = np.stack([r.signal for r in recs])                                      # (8, 12, samples)
    codes = [["164889003"] if i % 2 else ["426783006"] for i in range(8)]       # SNOMED: AF, sinus rhythm
    m = build_corpus_from_arrays(x, recs[0].fs, recs[0].lead_names, tmp_path / "mem",
                                 record_ids=[f"ecg{i}" for i in range(8)],
                                 patient_ids=[f"MRN{i // 2}" for i in range(8)],
                                 labels=codes, class_map={"164889003": "AF", "426783006": "SR"},
                                 patient_id_policy=PatientIdPolicy(salt_file=str(tmp_path / "salt")))
    assert m["source"] == "arrays" and m["class_names"] == ["AF", "SR"] and m["counts"]["records_written"] == 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mem", "record-maps", "salt"]   # the scratch folder is gone
    rows = {s: read_split(tmp_path / "mem", s, ["patient_id", "record_id", "labels"])
               if m["counts"]["records"][s] else None
            for s in ("train", "val", "test")}
    pids = {p for r in rows.values() if r for p in r["patient_id"]}
    assert len(pids) == 4 and all(p.startswith("p-") for p in pids)
    from coreecg.data.patient_ids import read_record_map

    names = read_record_map(m["run"]["record_map"])          # the given record ids, keyed in the corpus
    given = sorted(names[k]["record_id"] for r in rows.values() if r for k in set(r["record_id"]))
    assert given == [f"ecg{i}" for i in range(8)]


def test_the_leakage_guard_finds_a_patient_by_the_salted_key(tmp_path):
    """Two MUSE exports of one patient (JAX01234), different recordings: a pretraining corpus holds one,
    a downstream corpus the other. Under one salt the guard finds the shared patient by its key
    alone (no signal is shared); under two salts it cannot, which is why corpora checked against
    each other must share the salt (docs/data_pipeline.md)."""
    import ray.data

    from coreecg.data.overlap import compare
    from coreecg.data.patient_ids import PatientIdPolicy
    from coreecg.data.pipeline import build_corpus

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(MUSE_PHI, tmp_path / "a" / "visit1.xml")
    other = GUANGXI_XML.read_text(encoding="iso-8859-1").replace("<PatientID>00000000</PatientID>",
                                                                  "<PatientID>JAX01234</PatientID>")
    (tmp_path / "b" / "visit2.xml").write_text(other, encoding="iso-8859-1")
    cfg = load_config().data

    def build(name: str, salt: Path) -> pa.Table:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
            build_corpus("muse", tmp_path / name[0], tmp_path / name, cfg, log_warnings=False,
                         patient_ids=PatientIdPolicy(salt_file=str(salt)))
        return pq.read_table(tmp_path / name / "fingerprints.parquet")

    shared = compare(build("a1", tmp_path / "s1"), build("b1", tmp_path / "s1"), "a", "b")
    assert shared.counts["shared_patients"] == 1 and shared.counts["signal_records"] == 0, shared.counts
    assert "warning" not in shared.counts
    apart = compare(build("a2", tmp_path / "s1"), build("b2", tmp_path / "s2"), "a", "b")
    assert apart.counts["shared_patients"] == 0, apart.counts
    assert re.search(r"salted \(salt \w+\) in one corpus and salted \(salt \w+\) in the other: no patient can match",
                     apart.counts["warning"]), apart.counts          # said, not silent
