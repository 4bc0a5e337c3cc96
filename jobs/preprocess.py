"""Build (or resume) a Parquet ECG corpus from one source with Ray Data.

    python jobs/preprocess.py --source synthetic --output corpora/synthetic
    python jobs/preprocess.py --source ptbxl --input ../shared/ecg-data/ptbxl --output corpora/ptbxl \
        --option label_view=multi --set preprocess.filter_order=4 --set shard_records=32

`--set` keys are relative to the `data` config section (coreecg.config.DataConfig).
Re-running with the same arguments skips finished shards. Exit codes: 0 done (quarantined
records are listed in CORPUS/quarantine.csv), 2 bad arguments / missing input / unknown source.
Under `ray job submit` (RAY_ADDRESS set) it joins that cluster; otherwise it starts a local one.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import yaml

from coreecg.config import ConfigError, load_config
from coreecg.data.pipeline import build_corpus
from coreecg.data.sources import get_source


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", required=True, help="ptbxl | cpsc2018 | cinc2021 | mimic-iv-ecg | synthetic")
    p.add_argument("--input", help="the source's root folder (not needed for synthetic)")
    p.add_argument("--output", required=True, help="corpus folder to write (or resume)")
    p.add_argument("--config", help="YAML config file (its `data` section is used)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a data.* setting, e.g. preprocess.highpass_hz=0.5 (repeatable)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="source reader option, e.g. label_view=multi for ptbxl; synthetic: seed=N")
    return p.parse_args(argv)


def init_ray() -> None:
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address="auto")
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=True, configure_logging=False)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = load_config(args.config, overrides=[f"data.{s}" for s in args.set]).data
    except (ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    options = {"n_records": cfg.synthetic_records} if args.source == "synthetic" else {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            print(f"error: --option {item!r} is not of the form key=value", file=sys.stderr)
            return 2
        options[key.strip()] = yaml.safe_load(value)
    if args.source != "synthetic" and not args.input:
        print(f"error: --input is required for --source {args.source}", file=sys.stderr)
        return 2
    try:  # unknown source, missing or empty input: fail before paying for Ray start-up
        refs = get_source(args.source, **options).list_records(Path(args.input) if args.input else None)
        init_ray()
        result = build_corpus(args.source, args.input, args.output, cfg, source_options=options, refs=refs)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    c, run = result["counts"], result["run"]
    print(json.dumps({"output": str(Path(args.output).resolve()), "source": result["source"],
                      "records_listed": c["records_listed"], "records_written": c["records_written"],
                      "records_quarantined": c["records_quarantined"],
                      "quarantine_reasons": c["quarantine_reasons"], "windows": c["windows"],
                      "patients": c["patients"], "shards": run["shards"],
                      "shards_skipped": run["shards_skipped"], "wall_s": round(run["wall_s"], 2),
                      "notes": result["notes"]}, indent=1))
    if c["records_quarantined"]:
        print(f"{c['records_quarantined']} record(s) quarantined: see {Path(args.output) / 'quarantine.csv'}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
