"""The paper's ablations and baselines as a study: every variant pretrained (per seed) and, with
--finetune, fine-tuned on each named corpus (the Supervised variant trains from scratch there),
then the paper's tables. A preset of jobs/study.py: it writes the study file it runs.

    python jobs/ablate.py                                           # every variant, 1 seed, this machine
    python jobs/ablate.py --only "Supervised,MoCo V3,CMSC,MTAE-like,MLAE-like,ST-MEM-like,CoRe-ECG" \\
        --finetune corpora/ptbxl corpora/icbeb2018 corpora/ningbo --seeds 3 --output sweeps/table1
    python jobs/ablate.py --output sweeps/ablations --resume        # continue after a crash

Variants (tune_spaces/ablations.yaml) are override lists: the CoRe-ECG ablations, the
reconstruction baselines (ST-MEM-, MTAE-, MLAE-like), the contrastive baselines (MoCo V3, CMSC:
pretrain.method), Supervised (scratch) and BMIRC (not available: listed with its reason).
--seeds N runs N replicates of each (train.seed, train.seed + 1, ...). Each pretraining is
evaluated by the representation probe every epoch (probe_auroc).
Writes into --output: study.yaml (the study this run is: `python jobs/study.py study.yaml`
runs it again), everything jobs/study.py writes (runs/pretrain/<variant>-s<seed>/,
runs/finetune/<variant>-<corpus>-finetune-l12-f100-s<seed>/, runs.csv: one row per run with its
method, seed, status and error), and with --finetune report/tables/: `comparison` in the paper's
Table 1 row order plus one table per other `tables` entry of the variants file
(ablation_paradigm, ablation_stdm_fda, ...), as Markdown, CSV and LaTeX, mean ± std over seeds.
The leakage guard (docs/leakage.md) compares --corpus with each --finetune corpus before any
training: shared records or patients in a val/test split stop the ablation (exit 2) unless
--allow-overlap (finetune.allow_overlap), which records the overlap in each fine-tuning.
Exit codes: 0 every run finished, 1 some runs failed (runs.csv says which and why), 2 bad
arguments, variants or config, or the leakage guard refused.
"""
from __future__ import annotations

import sys

from coreecg.cli import (
    fail, flag_overrides, parse_args, renamed, replicate_seeds, shipped, sweep_parser, sweep_settings,
)


def build_parser():
    parser = sweep_parser(__doc__, "sweeps/ablations")
    parser.add_argument("--variants", default=str(shipped("tune_spaces/ablations.yaml")), metavar="FILE",
                        help="the variants file: each variant's override list, tables, allow: entries")
    renamed(parser, "--space", "--variants")
    parser.add_argument("--seeds", type=int, default=1, metavar="N",
                        help="replicates per variant: train.seed, train.seed + 1, ... (N runs each)")
    parser.add_argument("--only", metavar="NAMES", help="comma list of variant names to run")
    parser.add_argument("--finetune", nargs="+", default=[], metavar="CORPUS",
                        help="labelled corpora to also fine-tune every variant on")
    parser.add_argument("--allow-overlap", action="store_true",
                        help="fine-tune although the pretraining corpus shares records or patients with a --finetune "
                             "corpus's val/test split (finetune.allow_overlap; docs/leakage.md)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    args.overrides = flag_overrides(parser, args.overrides, {
        "finetune.allow_overlap": ("--allow-overlap", "true" if args.allow_overlap else None)})
    s = sweep_settings(parser, args)
    args.seeds = replicate_seeds(parser, args, args.seeds)
    from coreecg.cli import run_study_job
    from coreecg.study.presets import ablation_study, ablation_variants
    from coreecg.study.spec import StudyError, load_study, write_study_file
    from coreecg.tune.spaces import SpaceError, load_space

    try:
        space = load_space(args.variants, args.config, args.overrides)
        names, pretrained, tables, unavailable = ablation_variants(space, args.variants, args.only)
        for name, why in unavailable.items():
            print(f"{name}: not available ({why})", file=sys.stderr)
        study = load_study(write_study_file(s.output, ablation_study(
            s.output, variants=args.variants, config=args.config, overrides=args.overrides, finetune=args.finetune,
            seeds=args.seeds, names=names, pretrained=pretrained, tables=tables)))
    except (SpaceError, StudyError, ValueError) as e:
        return fail(str(e))
    return run_study_job(study, s.output, resume=s.resume, concurrency=s.concurrency,
                         gpus_per_trial=s.gpus_per_trial)


if __name__ == "__main__":
    sys.exit(main())
