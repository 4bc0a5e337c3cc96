"""Arrays reader (.npy / .npz / HDF5 + index CSV) on real PTB-XL records stacked into arrays.

No public file of this generic format exists: real PTB-XL records (read with wfdb, the
independent decoding) are stacked into each container and layout in tmp_path; synthetic arrays
are written only for the edge cases.
"""
from __future__ import annotations

import csv
import json
import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import coreecg.data.sources.arrays  # noqa: F401  (registers "arrays")
from coreecg.config import STANDARD_LEADS
from coreecg.data.record import RecordError
from coreecg.data.sources import get_source, source_spec
from coreecg.data.from_arrays import arrays_to_folder
from coreecg.data.sources.arrays import RLS, RSL, ArraysOptions, _open

N_REAL = 4


@pytest.fixture(scope="module")
def ptbxl(ecg_data):
    """[(ecg_id, patient_id as stored, wfdb physical signal (samples, 12), wfdb digital, lead names)]."""
    import wfdb

    root = ecg_data / "ptbxl"
    with open(root / "ptbxl_database.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if (root / f"{r['filename_hr']}.hea").is_file()][:N_REAL]
    out = []
    for r in rows:
        sig, fields = wfdb.rdsamp(str(root / r["filename_hr"]))
        digital = wfdb.rdrecord(str(root / r["filename_hr"]), physical=False)
        assert fields["fs"] == 500 and sig.shape == (5000, 12) and set(digital.units) == {"mV"}
        assert set(digital.adc_gain) == {1000.0} and set(digital.baseline) == {0}   # 1 count = 1 uV
        out.append((r["ecg_id"], r["patient_id"], sig, digital.d_signal, list(fields["sig_name"])))
    return out


def write_index(path: Path, rows: list[dict], columns: list[str] | None = None) -> Path:
    columns = columns or list(rows[0])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)
    return path


def real_index(ptbxl, **extra) -> list[dict]:
    return [{"record_id": f"ecg{e}", "patient_id": p, "sampling_rate": "500", "leads": ",".join(names), **extra}
            for e, p, _, _, names in ptbxl]


def save(path: Path, x: np.ndarray, container: str, key: str = "signals", **others) -> Path:
    if container == "npy":
        np.save(path, x)
    elif container in ("npz", "npz-compressed"):
        with open(path, "wb") as f:
            (np.savez if container == "npz" else np.savez_compressed)(f, **{key: x}, **others)
    else:
        import h5py

        with h5py.File(path, "w") as f:
            f[key] = x
            for k, v in others.items():
                f[k] = v
    return path


SUFFIX = {"npy": ".npy", "npz": ".npz", "npz-compressed": ".npz", "hdf5": ".h5"}


def synthetic(tmp_path, shape=(2, 3, 50), leads="I;II;III", container="npy", name="signals", **cells):
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 100
    path = save(tmp_path / f"{name}{SUFFIX[container]}", x, container)
    rows = [{"record_id": f"r{i}", "patient_id": f"p{i}", "sampling_rate": "250", "leads": leads, **cells}
            for i in range(shape[0])]
    write_index(tmp_path / f"{name}.csv", rows)
    return path, x


@pytest.mark.parametrize("layout", [RLS, RSL])
@pytest.mark.parametrize("container", ["npy", "npz", "npz-compressed", "hdf5"])
def test_real_records_equal_wfdb_in_every_container_and_layout(ptbxl, tmp_path, container, layout):
    stacked = np.stack([sig.T if layout == RLS else sig for _, _, sig, _, _ in ptbxl])
    path = save(tmp_path / f"ptbxl{SUFFIX[container]}", stacked, container)
    write_index(tmp_path / "ptbxl.csv", real_index(ptbxl))
    src = get_source("arrays")
    refs = src.list_records(tmp_path)
    assert [r.record_id for r in refs] == sorted(f"ecg{e}" for e, *_ in ptbxl)
    assert all(r.path == str(path) for r in refs) and all(json.loads(json.dumps(r.extra)) == r.extra for r in refs)
    by_id = {f"ecg{e}": (p, sig) for e, p, sig, _, _ in ptbxl}
    for ref in refs:
        rec = src.read(ref)
        patient, sig = by_id[ref.record_id]
        np.testing.assert_array_equal(rec.signal, sig.T.astype(np.float32))
        assert rec.signal.dtype == np.float32 and rec.fs == 500.0 and rec.lead_names == STANDARD_LEADS
        assert rec.patient_id == patient and rec.record_id == ref.record_id and rec.labels == ()
        assert rec.meta["layout"] == layout
        assert rec.meta["format"] == {"npz-compressed": "npz"}.get(container, container)


def test_digital_microvolt_counts_become_millivolts(ptbxl, tmp_path):
    counts = np.stack([d.T for _, _, _, d, _ in ptbxl]).astype(np.int16)   # PTB-XL: 1 count = 1 uV
    save(tmp_path / "counts.npy", counts, "npy")
    write_index(tmp_path / "counts.csv", real_index(ptbxl, units="uV"))
    src = get_source("arrays")
    by_option = get_source("arrays", units="uV")
    write_index(tmp_path / "plain.csv", real_index(ptbxl))
    save(tmp_path / "plain.npy", counts, "npy")
    for ref, (_, _, sig, _, _) in zip(sorted(src.list_records(tmp_path / "counts.npy"), key=lambda r: r.extra["row"]),
                                      ptbxl):
        rec = src.read(ref)
        np.testing.assert_allclose(rec.signal, sig.T, rtol=1e-6, atol=1e-9)
        assert rec.meta["units"] == "uV"
    plain = by_option.read(by_option.list_records(tmp_path / "plain.npy")[0])
    assert plain.meta["units"] == "uV" and np.abs(plain.signal).max() < 50   # millivolts, not counts


@pytest.mark.parametrize("container", ["npy", "npz", "npz-compressed", "hdf5"])
def test_reading_one_record_does_not_load_the_array(tmp_path, container):
    x = np.random.default_rng(0).standard_normal((80, 12, 5000))     # 38 MB, incompressible
    path = save(tmp_path / f"big{SUFFIX[container]}", x, container)
    write_index(tmp_path / "big.csv", [{"record_id": str(i), "patient_id": "", "sampling_rate": "500",
                                        "leads": ";".join(STANDARD_LEADS)} for i in range(80)])
    src = get_source("arrays")
    last = next(r for r in src.list_records(path) if r.extra["row"] == 79)
    tracemalloc.start()
    try:
        rec = src.read(last)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(rec.signal, x[79].astype(np.float32))
    assert peak < x.nbytes / 8, f"{peak / 1e6:.1f} MB peak to read one record of {x.nbytes / 1e6:.0f} MB"
    assert rec.patient_id is None       # an empty patient_id cell
    if container == "npy":
        assert isinstance(_open(str(path), "npy"), np.memmap)


def test_row_column_maps_records_to_array_indices(tmp_path):
    path, x = synthetic(tmp_path)
    write_index(tmp_path / "signals.csv", [
        {"record_id": "a", "patient_id": "7", "sampling_rate": "250", "leads": "I,II,III", "row": "1"},
        {"record_id": "b", "patient_id": "7", "sampling_rate": "250", "leads": "I,II,III", "row": "0"}])
    src = get_source("arrays")
    got = {r.record_id: src.read(r) for r in src.list_records(tmp_path)}
    np.testing.assert_array_equal(got["a"].signal, x[1])
    np.testing.assert_array_equal(got["b"].signal, x[0])
    write_index(tmp_path / "signals.csv", [
        {"record_id": "a", "patient_id": "7", "sampling_rate": "250", "leads": "I", "row": "1"},
        {"record_id": "b", "patient_id": "7", "sampling_rate": "250", "leads": "I", "row": "1"}])
    with pytest.raises(ValueError, match=r"signals.csv: line 3: row 1 given twice"):
        src.list_records(tmp_path)


def test_ambiguous_layout_needs_the_option(tmp_path):
    path, x = synthetic(tmp_path, shape=(2, 3, 3))
    src = get_source("arrays")
    with pytest.raises(RecordError, match=r"ambiguous layout: .*set data.sources.arrays.layout") as err:
        src.read(src.list_records(tmp_path)[0])
    assert err.value.path == str(path)
    rsl = get_source("arrays", layout=RSL)
    np.testing.assert_array_equal(rsl.read(rsl.list_records(tmp_path)[0]).signal, x[0].T)
    rls = get_source("arrays", layout=RLS)
    np.testing.assert_array_equal(rls.read(rls.list_records(tmp_path)[0]).signal, x[0])


def test_lead_count_mismatch_is_a_record_error(tmp_path):
    synthetic(tmp_path, shape=(2, 3, 50), leads="I;II")
    src = get_source("arrays")
    with pytest.raises(RecordError, match=r"2 lead names in signals.csv for an array of shape \(2, 3, 50\): "
                                          r"neither axis 1 nor 2"):
        src.read(src.list_records(tmp_path)[0])
    synthetic(tmp_path, shape=(2, 3, 50), leads="I;II;III")
    wrong = get_source("arrays", layout=RSL)
    with pytest.raises(RecordError, match=r"axis 2 does not have 3 entries"):
        wrong.read(wrong.list_records(tmp_path)[0])


def test_a_record_without_lead_names_is_a_record_error(tmp_path):
    synthetic(tmp_path, leads=" ; ")
    src = get_source("arrays")
    with pytest.raises(RecordError, match=r"no lead names for record 'r0' of signals.csv"):
        src.read(src.list_records(tmp_path)[0])


@pytest.mark.parametrize("container", ["npy", "npz", "npz-compressed", "hdf5"])
def test_a_truncated_file_is_a_record_error(tmp_path, container):
    path, _ = synthetic(tmp_path, shape=(4, 3, 500), container=container)
    src = get_source("arrays")
    refs = src.list_records(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])
    with pytest.raises(RecordError, match=r"unreadable|truncated|not an? NumPy/HDF5 array") as err:
        src.read(refs[-1])
    assert err.value.path == str(path)


def test_csv_rows_not_matching_records_is_a_value_error_naming_both(tmp_path):
    synthetic(tmp_path, shape=(3, 3, 50))
    with open(tmp_path / "signals.csv") as f:
        lines = f.readlines()
    (tmp_path / "signals.csv").write_text("".join(lines[:-1]))
    with pytest.raises(ValueError, match=r"signals.csv: 2 row\(s\) for the 3 record\(s\) of .*signals.npy"):
        get_source("arrays").list_records(tmp_path)


def test_bad_csv_columns_and_ids_are_value_errors(tmp_path):
    synthetic(tmp_path)
    write_index(tmp_path / "signals.csv", [{"record_id": "a", "sampling_rate": "250", "leads": "I;II;III"}] * 2)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['patient_id'\]"):
        get_source("arrays").list_records(tmp_path)
    write_index(tmp_path / "signals.csv", [{"record_id": "a", "patient_id": "", "sampling_rate": "250",
                                            "leads": "I;II;III"}] * 2)
    with pytest.raises(ValueError, match=r"line 3: record_id 'a' is given twice"):
        get_source("arrays").list_records(tmp_path)


def test_missing_csv_is_one_quarantined_ref(tmp_path):
    synthetic(tmp_path)
    (tmp_path / "signals.csv").unlink()
    src = get_source("arrays")
    refs = src.list_records(tmp_path)
    assert [r.record_id for r in refs] == ["signals.npy"]
    with pytest.raises(RecordError, match=r"no index CSV: signals.csv .* beside signals.npy"):
        src.read(refs[0])


@pytest.mark.parametrize("cell, reason", [("0", r"sampling rate 0 Hz: not a rate"),
                                          ("fast", r"sampling rate 'fast' of record 'r0' of signals.csv: not a number"),
                                          ("", r"sampling rate '' .*not a number")])
def test_bad_sampling_rate_quarantines_its_record(tmp_path, cell, reason):
    synthetic(tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "signals.csv")))
    rows[0]["sampling_rate"] = cell
    write_index(tmp_path / "signals.csv", rows)
    src = get_source("arrays")
    first, second = src.list_records(tmp_path)
    with pytest.raises(RecordError, match=reason):
        src.read(first)
    assert src.read(second).fs == 250.0


def test_missing_and_unknown_units_are_record_errors(tmp_path):
    synthetic(tmp_path, units="")
    src = get_source("arrays")
    with pytest.raises(RecordError, match=r"units missing"):
        src.read(src.list_records(tmp_path)[0])
    synthetic(tmp_path, units="mmHg")
    with pytest.raises(RecordError, match=r"unknown units 'mmHg'"):
        src.read(src.list_records(tmp_path)[0])
    path, x = synthetic(tmp_path, units="V")
    np.testing.assert_allclose(src.read(src.list_records(tmp_path)[1]).signal, x[1] * 1000, rtol=1e-6)


@pytest.mark.parametrize("container", ["npz", "hdf5"])
def test_several_members_need_a_key(tmp_path, container):
    x = np.ones((2, 3, 50), np.float32)
    path = save(tmp_path / f"a{SUFFIX[container]}", x, container, key="ecg", extra=2 * x)
    write_index(tmp_path / "a.csv", [{"record_id": f"r{i}", "patient_id": "", "sampling_rate": "100",
                                      "leads": "I;II;III"} for i in range(2)])
    src = get_source("arrays")
    refs = src.list_records(tmp_path)
    what = "member" if container == "npz" else "dataset"
    assert len(refs) == 1
    with pytest.raises(RecordError, match=rf"2 {what}s \(ecg, extra\) and none named 'signals': "
                                          r"set data.sources.arrays.key"):
        src.read(refs[0])
    keyed = get_source("arrays", key="extra")
    assert keyed.read(keyed.list_records(tmp_path)[0]).signal.max() == 2.0
    with pytest.raises(RecordError, match=rf"no {what} 'nope' \(has ecg, extra\)"):
        get_source("arrays", key="nope").read(get_source("arrays", key="nope").list_records(tmp_path)[0])
    # a member named "signals" is the default (written beside and moved in: HDF5 cannot truncate an open file)
    os.replace(save(tmp_path / f"new{SUFFIX[container]}", x, container, key="signals", other=2 * x), path)
    assert src.read(src.list_records(tmp_path)[0]).signal.max() == 1.0


def test_array_not_3d_names_the_file(tmp_path):
    np.save(tmp_path / "flat.npy", np.ones((12, 5000), np.float32))
    src = get_source("arrays")
    ref, = src.list_records(tmp_path)
    with pytest.raises(RecordError, match=r"has shape \(12, 5000\): expected 3-D") as err:
        src.read(ref)
    assert err.value.path.endswith("flat.npy")


def test_listing_is_by_content(tmp_path):
    path, x = synthetic(tmp_path)
    path.rename(tmp_path / "signals.bin")              # wrong suffix, still an .npy by its bytes
    (tmp_path / "fake.npy").write_text("record_id,leads\n")
    (tmp_path / "notes.h5").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    src = get_source("arrays")
    refs = {r.record_id: r for r in src.list_records(tmp_path)}
    assert set(refs) == {"r0", "r1", "fake.npy", "notes.h5"}    # the CSV is never a record
    np.testing.assert_array_equal(src.read(refs["r1"]).signal, x[1])
    with pytest.raises(RecordError, match=r"not an? NumPy/HDF5 array file"):
        src.read(refs["fake.npy"])
    with pytest.raises(RecordError, match=r"not an? NumPy/HDF5 array file"):
        src.read(refs["notes.h5"])


def test_index_option_names_the_csv_of_one_array(tmp_path):
    path, x = synthetic(tmp_path)
    index = (tmp_path / "signals.csv").rename(tmp_path / "elsewhere.csv")
    src = get_source("arrays", index=str(index))
    refs = src.list_records(path)
    assert [r.record_id for r in refs] == ["r0", "r1"]
    np.testing.assert_array_equal(src.read(refs[0]).signal, x[0])
    np.save(tmp_path / "second.npy", x)
    with pytest.raises(ValueError, match=r"describes one array, but .* holds 2"):
        src.list_records(tmp_path)
    with pytest.raises(FileNotFoundError, match="index CSV not found"):
        get_source("arrays", index=str(tmp_path / "none.csv")).list_records(path)


def test_no_name_birth_date_or_free_text_in_the_record(tmp_path):
    path, _ = synthetic(tmp_path)
    write_index(tmp_path / "signals.csv", [
        {"record_id": f"r{i}", "patient_id": "MRN-1", "sampling_rate": "250", "leads": "I;II;III",
         "patient_name": "Doe^Jane", "birth_date": "1950-01-02", "comment": "suspected infarction"}
        for i in range(2)])
    src = get_source("arrays")
    for ref in src.list_records(tmp_path):
        rec = src.read(ref)
        text = " ".join(map(str, (rec.meta, rec.lead_names, ref.extra, rec.record_id, rec.patient_id)))
        for secret in ("Doe", "Jane", "1950", "infarction"):
            assert secret not in text
        assert rec.patient_id == "MRN-1"


def test_labels_from_a_table(tmp_path):
    synthetic(tmp_path)
    labels = write_index(tmp_path / "labels.txt", [{"record_id": "r0", "labels": "AF;NORM"}])
    src = get_source("arrays", labels=str(labels))
    r0, r1 = src.list_records(tmp_path)
    assert src.read(r0).labels == ("AF", "NORM") and src.multilabel
    with pytest.raises(RecordError, match="unlabelled"):
        src.read(r1)


def test_a_rewritten_file_is_read_afresh(tmp_path):
    src = get_source("arrays")
    for value in (1.0, 2.0):
        save(tmp_path / "new.npy", np.full((1, 3, 50), value, np.float32), "npy")
        os.replace(tmp_path / "new.npy", tmp_path / "signals.npy")
        write_index(tmp_path / "signals.csv", [{"record_id": "a", "patient_id": "", "sampling_rate": "250",
                                                "leads": "I;II;III"}])
        assert src.read(src.list_records(tmp_path)[0]).signal[0, 0] == value


def test_options_are_checked():
    with pytest.raises(ValueError, match="layout must be one of"):
        ArraysOptions(layout="leads-first")
    with pytest.raises(ValueError, match="unknown units 'mmHg'"):
        get_source("arrays", units="mmHg")
    assert ArraysOptions().units == "mV"
    spec = source_spec("arrays")     # the registry builds the reader from its options section's fields
    src = spec.cls(**spec.reader_options(ArraysOptions(layout=RSL, key="ecg"), None))
    assert (src.options.layout, src.options.key) == (RSL, "ecg") and spec.dataset_labels == {"arrays": "Arrays"}
    assert spec.label_free_options(ArraysOptions()) == {"labels": "", "class_map": ""}


def test_arrays_to_folder_round_trips(ptbxl, tmp_path):
    x = np.stack([sig.T for _, _, sig, _, _ in ptbxl]).astype(np.float32)
    ids = [f"ecg{e}" for e, *_ in ptbxl]
    folder = arrays_to_folder(x, [500.0] * len(ids), STANDARD_LEADS, tmp_path / "out", record_ids=ids,
                              patient_ids=[p for _, p, *_ in ptbxl[:-1]] + [None])
    assert folder == tmp_path / "out" and sorted(p.name for p in folder.iterdir()) == ["signals.csv", "signals.npy"]
    src = get_source("arrays")
    recs = {r.record_id: src.read(r) for r in src.list_records(folder)}
    for i, rid in enumerate(ids):
        np.testing.assert_array_equal(recs[rid].signal, x[i])
        assert recs[rid].fs == 500.0 and recs[rid].lead_names == STANDARD_LEADS
    assert recs[ids[-1]].patient_id is None and recs[ids[0]].patient_id == ptbxl[0][1]
    default = arrays_to_folder(x[:2] * 1000, 250, STANDARD_LEADS, tmp_path / "uv", units="uV")
    recs = [src.read(r) for r in src.list_records(default)]
    assert [r.record_id for r in recs] == ["0", "1"]
    np.testing.assert_allclose(recs[1].signal, x[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, message", [
    ({"signals": np.ones((12, 50))}, r"\(records, leads, samples\) .* got shape \(12, 50\)"),
    ({"leads": ["I", "II"]}, r"2 lead names for 3 leads"),
    ({"leads": ["I", "II", "V1;V2"]}, r"without ';' or ','"),
    ({"fs": [500, 500, 500]}, r"fs has 3 rates for 2 records"),
    ({"fs": 0}, r"fs must be > 0 Hz"),
    ({"record_ids": ["a", "a"]}, r"record_ids must be 2 distinct"),
    ({"patient_ids": ["p"]}, r"1 patient_ids for 2 records"),
    ({"units": "mmHg"}, r"unknown units"),
])
def test_arrays_to_folder_names_what_is_wrong(tmp_path, kwargs, message):
    args = {"signals": np.ones((2, 3, 50)), "fs": 500, "leads": ["I", "II", "III"], "folder": tmp_path / "f",
            **kwargs}
    with pytest.raises(ValueError, match=message):
        arrays_to_folder(**args)
    assert not (tmp_path / "f" / "signals.npy").exists()
