"""Run a study: the paper's experiment section from one YAML file, resumable, with its report.

    python jobs/study.py studies/tiny.yaml --output studies-out/tiny
    python jobs/study.py studies/tiny.yaml --output studies-out/tiny --resume     # after a crash or kill
    python jobs/study.py studies/paper.yaml --output /mnt/shared/paper --set train.use_gpu=true
    RAY_AUTH_MODE=token ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        python jobs/study.py studies/paper.yaml --output /mnt/shared/paper

The study file (coreecg/study/spec.py; docs/studies.md) is validated against the typed config
before Ray starts: an unknown key, variant, method, corpus, source, mode or lead name is an error
naming it. Then: the downstream corpora are built (or reused), every pretraining runs as a Ray
Tune trial, then every fine-tuning whose encoder exists; a failed run is recorded in runs.csv with
its error and the others go on. With --resume, finished runs are kept and unfinished ones continue
from their latest checkpoint. --set a.b=c applies to every run (after the study's own settings).
Once the corpora are there, before any training, the leakage guard compares each pretraining
corpus with the downstream corpora it is fine-tuned on (docs/leakage.md): shared records or
patients in a val/test split stop the study naming them (exit 2); --allow-overlap
(finetune.allow_overlap) goes on and each fine-tuning records its overlap.

Outputs in --output: study.json, corpora/, runs/pretrain/*, runs/finetune/*, runs.csv, and
report/ (tables as Markdown, CSV and LaTeX, figures as PNG, README.md naming each with its runs).
Exit codes: 0 every run finished and the report is written; 1 some runs failed or were skipped
(see runs.csv; the report holds what finished); 2 the study file, the folder or --set is invalid,
or the leakage guard refused.
"""
from __future__ import annotations

import sys

from coreecg.cli import flag_overrides, job_parser, parse_args, run_study_job


def build_parser():
    # A study names its own config (its `config:` key): --set and --print-config, no --config.
    parser = job_parser(__doc__, config=False)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=C",
                        help="override one config value in every run (repeatable), after the study's own settings")
    parser.add_argument("--print-config", action="store_true",
                        help="print the config every run starts from (the study's config + set + --set) and exit; "
                             "needs the study file, not --output")
    parser.add_argument("study", metavar="STUDY", help="a study YAML file (studies/*.yaml)")
    parser.add_argument("--output", required=True, help="the study folder (re-run with --resume to continue)")
    parser.add_argument("--resume", action="store_true", help="continue the study in --output")
    parser.add_argument("--concurrency", type=int, default=0, metavar="N",
                        help="trials at once (0: what the cluster's CPUs allow)")
    parser.add_argument("--allow-overlap", action="store_true",
                        help="fine-tune although a pretraining corpus shares records or patients with a downstream "
                             "val/test split (finetune.allow_overlap; each run records its overlap)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    if args.study is None:          # left out with --print-config: the study names the config it prints
        parser.error("the following arguments are required: STUDY (--print-config prints its config)")
    args.overrides = flag_overrides(parser, args.overrides, {
        "finetune.allow_overlap": ("--allow-overlap", "true" if args.allow_overlap else None)})

    from coreecg.study.spec import StudyError, load_study

    try:
        study = load_study(args.study, args.overrides)
    except StudyError as e:
        parser.exit(2, f"error: {e}\n")
    if args.print_config:      # a study has a config per run: the base every run starts from
        from coreecg.config import load_config

        sys.stdout.write(load_config(study.config_file, [*study.base, *study.extra]).to_yaml())
        return 0
    return run_study_job(study, args.output, resume=args.resume, concurrency=args.concurrency)


if __name__ == "__main__":
    sys.exit(main())
