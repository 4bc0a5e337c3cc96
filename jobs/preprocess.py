"""Build (or resume) a Parquet ECG corpus from one source with Ray Data.

    python jobs/preprocess.py --source synthetic --output corpora/synthetic
    python jobs/preprocess.py --source ptbxl --input ../shared/ecg-data/ptbxl --output corpora/ptbxl \\
        --set data.sources.ptbxl.label_view=multi --set data.shard_records=32

Every setting is a `data.*` key of the typed config (coreecg/config/data.py): preprocessing
(`data.preprocess.*`), splits, shard size and the readers' options (`data.sources.*`).
Re-running with the same arguments skips finished shards. A source of your own is a module named
in the config's `plugins` (docs/data_sources.md, "Adding a source"):

    python jobs/preprocess.py --set plugins=[my_source] --source my_source --input ... --output ...

    python jobs/preprocess.py --source mimic-iv-ecg --input ../shared/ecg-data/mimic-iv-ecg-layout \\
        --output corpora/mimic --exclude-overlap-with corpora/ptbxl --exclude-overlap-with corpora/icbeb

Hospital and device exports (docs/data_pipeline.md, "Your own files"): --source dicom | muse |
aecg | edf | arrays, or --source auto for a folder that mixes them (each file by its content);
labels from a table with --set data.sources.auto.labels=labels.csv. Patient ids, and record ids
made from file and folder names, are stored as salted keys (--salt-file, outside the corpus) unless
--keep-patient-ids; the map from record key back to file is written beside the salt, owner-only
(--record-map elsewhere), and its path printed:

    python jobs/preprocess.py --source auto --input exports/ --output corpora/clinic \\
        --set data.sources.auto.labels=labels.csv --set data.sources.auto.class_map=classes.csv

--exclude-overlap-with CORPUS (repeatable; a built downstream corpus) leaves out of the new corpus
every record sharing a patient or a recording with CORPUS's val/test records, as the leakage
guard decides; each is listed in quarantine.csv with its twin, the manifest records the exclusion
(docs/leakage.md). A finished corpus asked again with other such corpora is an error (exit 2).

Exit codes: 0 done (quarantined
records are listed in CORPUS/quarantine.csv), 2 bad arguments / missing input / unknown source.
At the end, after the JSON summary, warnings go to stderr ("warning: ..."): diagnosis codes
the reader did not recognise, records without a patient id (see manifest.json).
Ray comes from coreecg.cluster, as for every job: under `ray job submit` (RAY_ADDRESS set) it
joins that cluster (an address nothing answers at is an error naming it), beside a `ray start`
cluster it joins that, otherwise it starts a local one.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from coreecg.cli import job_parser, parse_args as parse_cli, resolve_config
from coreecg.data.patient_ids import PatientIdPolicy
from coreecg.data.pipeline import build_corpus
from coreecg.data.sources import SOURCES, get_source, reader_options, source_spec
from coreecg.run_record import ray_cluster


def build_parser():
    p = job_parser(__doc__)
    p.add_argument("--source", required=True, metavar="SOURCE",
                   help="the reader: " + " | ".join(SOURCES) + ", or a plugin's (--set plugins=[module])")
    p.add_argument("--input", metavar="DIR",
                   help="the source's root folder of raw records (not needed for synthetic)")
    p.add_argument("--output", required=True, help="corpus folder to write (or resume)")
    p.add_argument("--exclude-overlap-with", action="append", default=[], metavar="CORPUS",
                   help="a built downstream corpus (repeatable): records sharing a patient or a recording with "
                        "its val/test records (the leakage guard's match) are left out of this corpus and "
                        "quarantined, so fine-tuning on it after pretraining here passes the guard")
    p.add_argument("--keep-patient-ids", action="store_true",
                   help="hospital exports (dicom, muse, aecg, edf, arrays, auto): store patient ids as read, "
                        "named in the manifest; by default only their salted hash is stored (docs/data_pipeline.md)")
    p.add_argument("--keep-record-ids", action="store_true",
                   help="hospital exports: key patient ids but keep record ids as the file names read (for files "
                        "named by opaque UIDs); --keep-patient-ids keeps both")
    p.add_argument("--record-map", default="", metavar="FILE",
                   help="where the map from record key back to file goes (outside the corpus, owner-only; default "
                        "beside the salt: <salt folder>/record-maps/<corpus name>-<hash>.csv)")
    p.add_argument("--salt-file", default="", metavar="FILE",
                   help="the patient-id salt, kept outside the corpus (created on first use; default "
                        "$COREECG_SALT_FILE, else ~/.config/coreecg/patient-id-salt): corpora meant to be "
                        "checked against each other for shared patients must share it")
    return p


def parse_args(argv: list[str] | None = None):
    """(arguments, the resolved config); --print-config prints it and exits 0 here."""
    p = build_parser()
    args = parse_cli(p, argv)
    return args, resolve_config(p, args)


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)
    cfg = config.data
    try:  # unknown source, missing or empty input: fail before paying for Ray start-up
        if getattr(source_spec(args.source).cls, "needs_input", True) and not args.input:
            print(f"error: --input is required for --source {args.source}", file=sys.stderr)
            return 2
        options = reader_options(args.source, cfg)
        refs = get_source(args.source, **options).list_records(Path(args.input) if args.input else None)
        from coreecg.cluster import init_ray, quiet_data

        init_ray()                        # the one way every job joins or starts Ray
        quiet_data()
        # absolute: Ray Data's tasks run in working folders of their own
        source_root = str(Path(args.input).expanduser().resolve()) if args.input else None
        result = build_corpus(args.source, source_root, str(Path(args.output).expanduser().resolve()), cfg,
                              source_options=options, refs=refs,
                              log_warnings=False,  # printed below, after the summary
                              exclude_overlap_with=args.exclude_overlap_with,
                              patient_ids=PatientIdPolicy(args.keep_patient_ids, args.salt_file,
                                                          args.keep_record_ids, args.record_map))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c, run = result["counts"], result["run"]
    print(json.dumps({"output": str(Path(args.output).resolve()), "source": result["source"],
                      "dataset_key": result["dataset_key"],
                      "records_listed": c["records_listed"], "records_written": c["records_written"],
                      "records_quarantined": c["records_quarantined"],
                      "quarantine_reasons": c["quarantine_reasons"], "windows": c["windows"],
                      "patients": c["patients"], "patient_id_fallbacks": c["patient_id_fallbacks"],
                      "patient_ids": result["patient_ids"], "record_map": run["record_map"],
                      "label_view": result["label_view"], "unrecognised_codes": result["unrecognised_codes"],
                      "excluded_overlap_with": result.get("excluded_overlap_with"),
                      "shards": run["shards"], "shards_skipped": run["shards_skipped"],
                      "wall_s": round(run["wall_s"], 2), "ray": ray_cluster(), "notes": result["notes"],
                      "warnings": result["warnings"]}, indent=1))
    if c["records_quarantined"]:
        where = f" (by record key; the files behind the keys: {run['record_map']})" if run["record_map"] else ""
        print(f"{c['records_quarantined']} record(s) quarantined: see {Path(args.output) / 'quarantine.csv'}{where}",
              file=sys.stderr)
    for message in result["warnings"]:
        print(f"warning: {message}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
