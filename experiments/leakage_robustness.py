"""How well the leakage guard's fingerprints tell copies from other records, on the shared data.

    python -m experiments.leakage_robustness --workdir /tmp/leak-robust     # about 1 min on 2 cores

Builds six corpora from ../shared/ecg-data (COREECG_SHARED_DATA): ptbxl (500 Hz), ptbxl100 (PTB-XL's
own 100 Hz files of the same records), mimic (the MIMIC-IV-ECG layout's re-written PTB-XL records,
aVL/aVF swapped in the file), cinc2021, cinc2021-smoke (CinC 2021: HR* are PTB-XL, A* CPSC2018)
and cpsc (CPSC2018 as released in CinC 2020). Every window against every other: the truth is the
record id (PTB-XL ecg_id = MIMIC study id - 40000000 = the number of CinC's HR id; CPSC's A id),
the scores the guard's (lead by lead, lead-permuted; coreecg.data.overlap.similarity), and
whether a candidate key was shared. Prints one JSON object: per corpus pair the copies, their
score range and how many the thresholds find; recordings a database stores twice under two ids
(scores >= 0.999); over the other different records, how many the guard takes for copies and
the largest scores.
The figures are in docs/leakage.md.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path

import numpy as np

CORPORA = {  # name: (source, folder, options)
    "ptbxl": ("ptbxl", "ptbxl", {"label_view": "none"}),
    "ptbxl100": ("ptbxl", "ptbxl", {"label_view": "none", "rate": 100}),
    "mimic": ("mimic-iv-ecg", "mimic-iv-ecg-layout", {}),
    "cinc2021": ("cinc2021", "cinc2021", {"class_map": "none"}),
    "cinc2021-smoke": ("cinc2021", "cinc2021-smoke", {"class_map": "none"}),
    "cpsc": ("cpsc2018", "cpsc2018-cinc2020", {"label_view": "none"}),
}


def original(name: str, record_id: str) -> str | None:
    """The recording a record is (one key for every copy of it), None when unknown."""
    if name == "mimic":
        return f"ptbxl:{int(record_id) - 40000000}"
    if name.startswith("ptbxl") or record_id.startswith("HR"):
        return f"ptbxl:{int(re.findall(r'[0-9]+', record_id)[0])}"
    return f"cpsc:{record_id}" if re.fullmatch(r"A[0-9]{4}", record_id) else None


def build(workdir: Path, data: Path) -> dict[str, Path]:
    import ray

    from coreecg.config import load_config
    from coreecg.data.pipeline import build_corpus

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    cfg = load_config(overrides=["data.shard_records=64"]).data
    for name, (source, folder, options) in CORPORA.items():
        build_corpus(source, data / folder, workdir / name, cfg, source_options=options, log_warnings=False)
    ray.shutdown()
    return {name: workdir / name for name in CORPORA}


def scores(paths: dict[str, Path]) -> dict:
    import pyarrow as pa

    from coreecg.data.fingerprints import corpus_fingerprints, decode_fingerprints
    from coreecg.data.overlap import PERMUTED, SIMILARITY, _norms, similarity

    tables = {n: corpus_fingerprints(p) for n, p in paths.items()}
    table = pa.concat_tables(tables.values())
    names = np.repeat(list(tables), [t.num_rows for t in tables.values()])
    ids = table.column("record_id").to_pylist()
    keys, feats = decode_fingerprints(table)
    windows = table.column("window_index").to_pylist()
    truth = np.array([f"{original(n, r) or f'other:{n}:{r}'}#{w}" for n, r, w in zip(names, ids, windows)])
    i, j = np.triu_indices(len(ids), 1)
    same, permuted = similarity(feats[i], feats[j], _norms(feats)[i], _norms(feats)[j])
    shared_key = ((keys[i][:, :, None] == keys[j][:, None, :]) & (keys[i][:, :, None] != 0)).any((1, 2))
    found = shared_key & ((same >= SIMILARITY) | (permuted >= PERMUTED))
    copy = (truth[i] == truth[j]) & (names[i] != names[j])
    other = (truth[i] != truth[j]) & ((names[i] != names[j]) | (np.array(ids)[i] != np.array(ids)[j]))
    out: dict = {"windows": len(ids), "pairs": int(len(i)), "copies": {}}
    for a, b in sorted({tuple(sorted(p)) for p in zip(names[i][copy], names[j][copy])}):
        m = copy & (((names[i] == a) & (names[j] == b)) | ((names[i] == b) & (names[j] == a)))
        out["copies"][f"{a} ~ {b}"] = {"pairs": int(m.sum()), "found": int(found[m].sum()),
                                      "min": round(float(same[m].min()), 4),
                                      "p1": round(float(np.quantile(same[m], 0.01)), 4)}
    twins = other & (same >= 0.999)              # one recording stored under two ids by its database
    out["identical_under_two_ids"] = sorted({tuple(sorted((f"{names[a]}:{ids[a]}", f"{names[b]}:{ids[b]}")))
                                             for a, b in zip(i[twins], j[twins])})
    other &= ~twins
    top = np.argsort(-same[other])[:3]
    out["different_records"] = {
        "pairs": int(other.sum()), "found": int(found[other].sum()),
        "max_lead_by_lead": [(ids[i[other][k]], ids[j[other][k]], round(float(same[other][k]), 4)) for k in top],
        "max_lead_permuted": round(float(permuted[other].max()), 4)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", type=Path, required=True, help="where the corpora are built (reused when there)")
    default = Path(__file__).resolve().parents[1].parent / "shared" / "ecg-data"
    p.add_argument("--data", type=Path, default=Path(os.environ.get("COREECG_SHARED_DATA", default)))
    args = p.parse_args()
    print(json.dumps(scores(build(args.workdir.resolve(), args.data.resolve())), indent=1))


if __name__ == "__main__":
    main()
