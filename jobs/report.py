"""Assemble the paper's result tables from fine-tuning run folders.

    python jobs/report.py runs/finetune/* --output reports/paper [--set report.f1=argmax]
    python jobs/report.py runs/finetune/* --output reports/best --set "plugins=[tests.plugin_table]" \\
        --tables comparison best_auroc

Writes comparison, lead_reduction and train_fraction (.md, .csv and booktabs .tex) and
all_runs.csv into --output (coreecg/eval/report.py; docs/evaluation.md), and, when a run has a
random encoder (finetune.encoder=random), the label-efficiency table with its verdicts
(coreecg/eval/label_efficiency.py). --tables NAME ... writes those registered tables instead
(and all_runs.csv), a table a module in --set plugins=[...] registers too (docs/evaluation.md,
"Adding a table"). Each cell's difference
to the reference method (`report.reference`, default CoRe-ECG) comes with an interval over
training runs, test patients resampled within; Markdown and LaTeX mark it where both methods have
report.min_runs runs and its p-value, adjusted over the table (report.adjust), is below 1 -
report.level; the CSV holds difference, interval, raw and adjusted p, run counts and why a cell is
not marked. `report.f1` picks the F1 printed
(threshold: the paper's 0.5; argmax: ST-MEM's). Table rows follow the order in which methods
first appear among RUN_DIRS. Each table's rows must have been trained under one protocol
(coreecg/eval/fairness.py: only what defines a method may differ); a difference declared in
--variants FILE (its `allow:` entries) is printed as the table's footnote. Exit codes: 0 written,
2 a run folder, the config or the variants file cannot be read, --tables names a table not
registered (the message lists the registered ones), or a table's rows differ in an undeclared key
(the message names the table, rows and keys).
"""
from __future__ import annotations

import sys

from coreecg.cli import job_parser, parse_args, resolve_config
from coreecg.eval.fairness import UnfairTableError
from coreecg.eval.label_efficiency import extra_tables
from coreecg.eval.report import RunError, write_report
from coreecg.eval.tables import known_tables

# Lazy imports: the variants file's reader (coreecg.tune.spaces), in main: --help stays as light as it is
# (1,527 modules; 1 more).


def build_parser():
    p = job_parser(__doc__)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="a folder holding metrics.json")
    p.add_argument("--output", required=True, help="folder for the tables (created if missing)")
    p.add_argument("--variants", default=None, metavar="FILE",
                   help="a variants file (tune_spaces/ablations.yaml) whose allow: entries declare protocol "
                        "differences between rows")
    p.add_argument("--tables", nargs="+", default=None, metavar="NAME",
                   help="report.tables: write these registered tables (a plugin's too: --set plugins=[my_tables]) "
                        "instead of the default ones: comparison, lead_reduction, train_fraction and, when a run "
                        "has a random encoder, label_efficiency")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = parse_args(p, argv)          # with --print-config, RUN_DIR and --output may be left out
    tables = {"report.tables": ("--tables", f"[{', '.join(args.tables)}]" if args.tables else None)}
    cfg = resolve_config(p, args, tables)       # imports --set plugins=[...]: their tables are registered now
    unknown = [name for name in cfg.report.tables if name not in known_tables()]
    if unknown:
        p.exit(2, f"error: report.tables (--tables): unknown table(s) {unknown}; registered: {known_tables()}\n")
    from coreecg.tune.spaces import SpaceError, load_space

    try:
        allow = load_space(args.variants).allow if args.variants else []
        written = write_report(args.run_dirs, args.output, report=cfg.report, allow=allow, extra=extra_tables(),
                               tables=list(cfg.report.tables) or None)
    except (RunError, UnfairTableError, SpaceError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
