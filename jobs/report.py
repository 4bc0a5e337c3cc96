"""Assemble the paper's result tables from fine-tuning run folders.

    python jobs/report.py runs/finetune/* --output reports/paper [--set report.f1=argmax]

Writes comparison, lead_reduction and train_fraction (.md, .csv and booktabs .tex) and
all_runs.csv into --output (coreecg/eval/report.py; docs/evaluation.md). Each cell's difference
to the reference method (`report.reference`, default CoRe-ECG) comes with an interval over
training runs, test patients resampled within; Markdown and LaTeX mark it where both methods have
report.min_runs runs and its p-value, adjusted over the table (report.adjust), is below 1 -
report.level; the CSV holds difference, interval, raw and adjusted p, run counts and why a cell is
not marked. `report.f1` picks the F1 printed
(threshold: the paper's 0.5; argmax: ST-MEM's). Table rows follow the order in which methods
first appear among RUN_DIRS. Exit codes: 0 written, 2 a run folder or the config cannot be read
(the message names it).
"""
from __future__ import annotations

import sys

from coreecg.cli import job_parser, parse_args, resolve_config
from coreecg.eval.report import RunError, write_report


def main(argv: list[str] | None = None) -> int:
    p = job_parser(__doc__)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a folder holding metrics.json")
    p.add_argument("--output", required=True, help="folder for the tables (created if missing)")
    args = parse_args(p, argv)
    cfg = resolve_config(p, args)
    try:
        written = write_report(args.run_dirs, args.output, report=cfg.report)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
