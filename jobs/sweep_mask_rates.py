"""The paper's STDM mask-rate sensitivity study as a study: every P_time x P_lead cell (x --seeds
seeds) pretrained and judged by its representation probe (probe_auroc, the cheap mode); with
--finetune, every cell's encoder also fine-tuned on each named corpus, as the paper's figure.
A preset of jobs/study.py: it writes the study file it runs (a `mask_rates` section).

    python jobs/sweep_mask_rates.py                                   # tiny model, synthetic corpus, this machine
    python jobs/sweep_mask_rates.py --seeds 3 --output sweeps/mask-rates --resume   # continue after a crash
    python jobs/sweep_mask_rates.py --finetune corpora/ptbxl corpora/icbeb2018    # the paper's F1/AUROC heatmaps

Writes into --output: study.yaml (the study this run is), everything jobs/study.py writes
(runs/pretrain/<variant>-<cell>-s<seed>/ with metrics.jsonl, tensorboard/, encoder.pt; runs.csv:
one row per run with its status and error) and report/figures/mask_rates/: probe_results.csv
(one row per cell: the grid values, seed, final probe_auroc, status) and heatmap.png (the CHEAP
mode: mean final few-label probe_auroc over seeds per cell, the best cell marked). With
--finetune (12 leads, all training data, the finetune section of the config): runs/finetune/*/,
and in report/figures/mask_rates/ finetune_results.csv, heatmap_<dataset>_f1.png and
heatmap_<dataset>_auroc.png (the paper's figure), and rank_correlation.csv: Spearman's rho
between the cells' probe_auroc and their fine-tuned AUROC with a 95 % Fisher-z interval
(Bonett-Wright), per dataset: whether the cheap mode (and ASHA, which stops trials on it) ranks
the cells as fine-tuning does.
Exit codes: 0 every run finished, 1 some runs failed (runs.csv says which and why), 2 bad
arguments, space or config.
"""
from __future__ import annotations

import sys

from coreecg.cli import fail, parse_args, replicate_seeds, shipped, sweep_parser, sweep_settings


def build_parser():
    parser = sweep_parser(__doc__, "sweeps/mask-rates", space="mask_rates.yaml")
    parser.add_argument("--seeds", type=int, default=1, metavar="N",
                        help="replicates per grid cell: train.seed, train.seed + 1, ... (N runs each)")
    parser.add_argument("--variant", default="CoRe-ECG", metavar="NAME",
                        help="the variant whose masking is swept (its name in tune_spaces/ablations.yaml)")
    parser.add_argument("--finetune", nargs="+", default=[], metavar="CORPUS",
                        help="labelled corpora: fine-tune every cell's encoder on each (F1/AUROC heatmaps per dataset)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    s = sweep_settings(parser, args)
    args.seeds = replicate_seeds(parser, args, args.seeds)
    from coreecg.cli import run_study_job
    from coreecg.study.presets import mask_rate_study, rank_correlation_lines
    from coreecg.study.spec import StudyError, load_study, write_study_file

    try:
        study = load_study(write_study_file(s.output, mask_rate_study(
            s.output, variants=shipped("tune_spaces/ablations.yaml"), space=args.space, variant=args.variant,
            config=args.config, overrides=args.overrides, finetune=args.finetune, seeds=args.seeds)))
    except (StudyError, ValueError) as e:
        return fail(str(e))
    code = run_study_job(study, s.output, resume=s.resume, concurrency=s.concurrency,
                         gpus_per_trial=s.gpus_per_trial)
    for line in rank_correlation_lines(s.output):
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main())
