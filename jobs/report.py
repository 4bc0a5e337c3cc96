"""Assemble the paper's result tables from fine-tuning run folders.

    python jobs/report.py runs/finetune/* --output reports/paper

Writes comparison, lead_reduction and train_fraction (.md and .csv) and all_runs.csv into
--output (coreecg/eval/report.py; docs/evaluation.md). Table rows follow the order in which
methods first appear among RUN_DIRS. Exit codes: 0 written, 2 a run folder cannot be read
(the message names it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from coreecg.eval.report import RunError, write_report  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a folder holding metrics.json")
    p.add_argument("--output", required=True, help="folder for the tables (created if missing)")
    args = p.parse_args(argv)
    try:
        written = write_report(args.run_dirs, args.output)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
