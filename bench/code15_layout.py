"""Real PTB-XL records re-written as CODE-15% (`exams.csv` + `exams_partK.hdf5`) and as WFDB,
the same 400 Hz signals in both, for the CODE-15 reader's tests and its read-speed comparison.

    python -m bench.code15_layout --records 200 --output /tmp/c15     # /tmp/c15/code15, /tmp/c15/wfdb
    python -m bench.preprocess --source code15 --input /tmp/c15/code15 --records 200
    python -m bench.preprocess --source wfdb --input /tmp/c15/wfdb --records 200

PTB-XL's 500 Hz records are resampled to 400 Hz (resample_poly 4/5), cut to 7 s or kept at 10 s,
and zero-padded on both sides to 4,096 samples as the release pads them (layout in
coreecg/data/sources/code15.py). The WFDB copies hold the unpadded 400 Hz signals.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.common import SHARED, emit, parser

PADDED = 4096
FS = 400
LABELS = ("1dAVb", "RBBB", "LBBB", "SB", "ST", "AF", "normal_ecg")


def ptbxl_at_400hz(n: int, ptbxl: Path = SHARED / "ptbxl") -> list[tuple[int, np.ndarray]]:
    """The first `n` PTB-XL 500 Hz records as (ecg_id, (12, 4000) float32 mV at 400 Hz)."""
    from scipy.signal import resample_poly

    from coreecg.data.sources import get_source

    src = get_source("ptbxl", label_view="none")
    out = []
    for ref in src.list_records(ptbxl):
        if not Path(ref.path + ".hea").is_file():
            continue  # the shared subset holds about half of the csv's records
        rec = src.read(ref)
        out.append((int(ref.record_id), resample_poly(rec.signal, 4, 5, axis=1).astype(np.float32)))
        if len(out) == n:
            break
    return out


def pad(signal: np.ndarray) -> np.ndarray:
    """(12, n) -> (4096, 12), zeros on both sides (the extra one at the end when 4096 - n is odd)."""
    lead = (PADDED - signal.shape[1]) // 2
    out = np.zeros((PADDED, signal.shape[0]), np.float32)
    out[lead:lead + signal.shape[1]] = signal.T
    return out


def write_code15(root: Path, exams: list[dict], parts: dict[str, list[int]], padding_row: bool = True) -> None:
    """exams.csv from `exams` (dicts: exam_id, patient_id, trace_file, signal (12, n), labels, optional age
    and is_male: "" leaves the cell empty; default 50 and True) and one
    hdf5 per entry of `parts` (file name -> exam_ids in row order), each ending with an exam_id-0
    padding row when `padding_row`. An exam whose id no part lists is in exams.csv only."""
    import h5py
    import pandas as pd

    root.mkdir(parents=True, exist_ok=True)
    by_id = {e["exam_id"]: e for e in exams}
    for name, ids in parts.items():
        rows = [pad(by_id[i]["signal"]) for i in ids] + ([np.zeros((PADDED, 12), np.float32)] if padding_row else [])
        with h5py.File(root / name, "w") as f:
            f["tracings"] = np.stack(rows)
            f["exam_id"] = np.asarray(list(ids) + ([0] if padding_row else []), np.int64)
    table = pd.DataFrame([{"exam_id": e["exam_id"], "age": e.get("age", 50), "is_male": e.get("is_male", True),
                           "nn_predicted_age": 51.5,
                           **{c: c in e["labels"] for c in LABELS[:6]}, "patient_id": e["patient_id"],
                           "death": "", "timey": "", "normal_ecg": "normal_ecg" in e["labels"],
                           "trace_file": e["trace_file"]} for e in exams])
    table.to_csv(root / "exams.csv", index=False)


def write_wfdb(root: Path, exams: list[dict]) -> None:
    """The same exams as WFDB records `<exam_id>.hea/.dat` (16-bit, 1000 adu/mV) in `root`."""
    import wfdb

    from coreecg.config import STANDARD_LEADS

    root.mkdir(parents=True, exist_ok=True)
    for e in exams:
        wfdb.wrsamp(str(e["exam_id"]), fs=FS, units=["mV"] * 12, sig_name=list(STANDARD_LEADS),
                    p_signal=e["signal"].T.astype(np.float64), fmt=["16"] * 12, adc_gain=[1000.0] * 12,
                    baseline=[0] * 12, write_dir=str(root))


def main() -> None:
    p = parser(__doc__, "20 records")
    p.add_argument("--records", type=int, default=200)
    p.add_argument("--output", required=True)
    args = p.parse_args()
    n = 20 if args.quick else args.records
    exams = [{"exam_id": ecg_id, "patient_id": str(ecg_id), "signal": sig, "labels": ("normal_ecg",),
              "trace_file": f"exams_part{i % 2}.hdf5"} for i, (ecg_id, sig) in enumerate(ptbxl_at_400hz(n))]
    parts = {f"exams_part{k}.hdf5": [e["exam_id"] for e in exams if e["trace_file"].endswith(f"{k}.hdf5")]
             for k in (0, 1)}
    write_code15(Path(args.output) / "code15", exams, parts)
    write_wfdb(Path(args.output) / "wfdb", exams)
    emit({"benchmark": "code15_layout", "records": len(exams), "output": args.output})


if __name__ == "__main__":
    main()
