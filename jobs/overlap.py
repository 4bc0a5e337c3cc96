"""Audit two corpora for leakage: the records of CORPUS_B that share a patient (same database) or
a recording (signal fingerprint: the same ECG under another name, format, gain, sampling rate or
lead order) with CORPUS_A, in every split of both.

    python jobs/overlap.py corpora/cinc2021 corpora/ptbxl                      # CinC 2021 holds PTB-XL
    python jobs/overlap.py corpora/mimic corpora/ptbxl --output audits/mimic-ptbxl

Prints the counts (records and windows of each, shared patients, B's records sharing a patient or
a recording, per split of B) and writes overlap.csv to --output: one row per (A record, B record,
kind), kind patient | signal, with both records' dataset, patient and split, the signal match's
similarity and the windows matched. A corpus built before fingerprints existed gets them computed
once (cached as fingerprints.parquet beside its manifest). Fine-tuning runs the same comparison
(A's train split against B's val and test) before it trains: docs/leakage.md.
Exit codes: 0 written (with or without overlap), 2 a folder that is not a corpus.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

from coreecg.cli import fail, job_parser, parse_args


def _summary(name: str, manifest: dict, records: int, windows: int) -> str:
    """One corpus's line: its folder, source, records and windows."""
    return f"{name} ({manifest['source']}): {records} records, {windows} windows"


def build_parser():
    parser = job_parser(__doc__, config=False)
    parser.add_argument("corpus_a", metavar="CORPUS_A", help="a corpus folder (e.g. the pretraining corpus)")
    parser.add_argument("corpus_b", metavar="CORPUS_B", help="a corpus folder (e.g. the downstream corpus)")
    parser.add_argument("--output", default=".", help="folder for overlap.csv")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    from coreecg.data.corpus import CorpusError, load_manifest
    from coreecg.data.fingerprints import corpus_fingerprints
    from coreecg.data.overlap import OVERLAP_CSV, compare

    t0 = time.perf_counter()
    try:
        a, b = Path(args.corpus_a).resolve(), Path(args.corpus_b).resolve()
        manifests = load_manifest(a), load_manifest(b)
        overlap = compare(corpus_fingerprints(a), corpus_fingerprints(b), str(a), str(b))
    except (CorpusError, OSError, ValueError) as e:
        return fail(str(e))
    c = overlap.counts
    path = overlap.write_csv(Path(args.output) / OVERLAP_CSV)
    print(f"A: {_summary(str(a), manifests[0], c['a_records'], c['a_windows'])}")
    print(f"B: {_summary(str(b), manifests[1], c['b_records_compared'], c['b_windows_compared'])}")
    print(f"shared patients (same database): {c['shared_patients']}")
    print(f"records of B sharing with A: {c['b_records']} (a patient: {c['patient_records']}, "
          f"a recording: {c['signal_records']})")
    for split, s in c["by_split"].items():
        print(f"  {split}: {s['shared']} of {s['records']} (patient {s['patient']}, recording {s['signal']})")
    if "warning" in c:
        print(f"warning: {c['warning']}")
    print(f"{path}: {len(overlap.pairs)} record pair(s); {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
