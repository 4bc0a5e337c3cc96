"""A leaderboard of pretraining runs: final losses, the probe against its value at init, steps,
wall time and the run folder, one row per run, best probe first.

    python jobs/leaderboard.py runs                               # every pretraining run under runs/
    python jobs/leaderboard.py runs/quickstart runs/moco --output tables/
    python jobs/leaderboard.py sweeps/quickstart/trials --output sweeps/quickstart

RUN_OR_FOLDER: a pretraining run folder, or a folder holding them (searched two levels deep;
fine-tuning runs are skipped). jobs/pretrain.py refreshes <train.storage_path>/leaderboard.* at
the end of every run. Writes leaderboard.csv (full precision, every column) and leaderboard.md
into --output (default: the first argument when it is a folder of runs, else the working folder)
and prints the Markdown. Definitions: coreecg/eval/leaderboard.py.
Exit codes: 0 written, 2 no pretraining run found or a run folder that cannot be read.
"""
from __future__ import annotations

import sys
from pathlib import Path

from coreecg.cli import fail, job_parser, parse_args


def build_parser():
    parser = job_parser(__doc__, config=False)
    parser.add_argument("runs", nargs="+", metavar="RUN_OR_FOLDER", help="pretraining run folders, or folders of them")
    parser.add_argument("--output", help="folder for leaderboard.csv and leaderboard.md (default: see above)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    from coreecg.config import ConfigError
    from coreecg.eval.leaderboard import find_pretraining_runs, is_pretraining_run, leaderboard_rows, write_leaderboard

    folders: list[Path] = []
    for given in map(Path, args.runs):
        if not given.is_dir():
            return fail(f"{given}: not a folder")
        folders += [given] if is_pretraining_run(given) else find_pretraining_runs(given)
    if not folders:
        return fail(f"no pretraining run folder (config.yaml + metrics.jsonl) in {', '.join(args.runs)}")
    first = Path(args.runs[0])
    output = Path(args.output) if args.output else (first if not is_pretraining_run(first) else Path.cwd())
    try:
        rows = leaderboard_rows(sorted(set(p.resolve() for p in folders)))
    except (ConfigError, OSError, ValueError) as e:
        return fail(str(e))
    csv_path, md_path = write_leaderboard(rows, output)
    print(md_path.read_text())
    print(f"written: {csv_path}, {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
