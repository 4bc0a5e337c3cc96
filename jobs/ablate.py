"""The paper's baselines and ablations on Ray Tune: every variant x seed is a pretraining trial
(judged by probe_auroc); with --finetune, each variant's encoder is fine-tuned on each named corpus
(and the Supervised variant trains from scratch there), and the paper's tables are written.

    python jobs/ablate.py                                           # every variant, 1 seed, this machine
    python jobs/ablate.py --only "Supervised,MoCo V3,CMSC,MTAE-like,MLAE-like,ST-MEM-like,CoRe-ECG" \\
        --finetune corpora/ptbxl corpora/icbeb2018 corpora/ningbo --seeds 3 --output sweeps/table1
    python jobs/ablate.py --output sweeps/ablations --resume        # continue after a crash

Variants (tune_spaces/ablations.yaml) are override lists: the CoRe-ECG ablations, the
reconstruction baselines (ST-MEM-, MTAE-, MLAE-like), the contrastive baselines (MoCo V3, CMSC:
pretrain.method), Supervised (scratch) and BMIRC (not available: listed with its reason).
Writes into --output: results.csv (one row per pretraining trial), finetune/<variant>-<corpus>-s<seed>/
(fine-tuning run folders, skipped when finished; a failed one is listed in finetune_failures.csv),
tables/ (jobs/report.py's tables, with `comparison` in the paper's Table 1 row order, plus one
per other `tables` entry of the variants file: ablation_paradigm, ablation_stdm_fda, ...; as
Markdown and CSV, mean ± std over seeds and the run count), tune/ and trials/<id>/.
Exit codes: 0 done (failed trials are recorded), 2 bad arguments, variants or config.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from coreecg.cli import fail, parse_args, sweep_parser, sweep_settings


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, "ablations.yaml", "sweeps/ablations")
    parser.add_argument("--variants", dest="space", help="variants YAML (default tune_spaces/ablations.yaml)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per variant (train.seed = 0..N-1)")
    parser.add_argument("--only", help="comma list of variant names to run")
    parser.add_argument("--finetune", nargs="+", default=[], metavar="CORPUS", help="labelled corpora to fine-tune on")
    args = parse_args(parser, argv)
    s = sweep_settings(parser, args)
    from ray import tune

    from coreecg.config import load_config
    from coreecg.eval.report import write_report
    from coreecg.study.spec import slug
    from coreecg.train.distributed import finetune
    from coreecg.tune.spaces import NOT_AVAILABLE, SCRATCH, SpaceError, load_space
    from coreecg.tune.sweep import SweepError, result_rows, run_sweep, write_results

    try:
        space = load_space(args.space, args.config, args.overrides)
        if not space.variants:
            return fail(f"{args.space}: needs a 'variants' section")
        names = [n.strip() for n in args.only.split(",")] if args.only else list(space.variants)
        unknown = [n for n in names if n not in space.variants]
        if unknown:
            return fail(f"--only: unknown variant(s) {unknown}; {args.space} has {list(space.variants)}")
        unavailable = [n for n in names if space.variants[n] == NOT_AVAILABLE]
        for n in unavailable:
            print(f"{n}: not available ({space.unavailable[n]})", file=sys.stderr)
        names = [n for n in names if n not in unavailable]
        pretrained = [n for n in names if space.variants[n] != SCRATCH]
        s.variants = {n: space.variants[n] for n in pretrained}
        seeds = list(range(args.seeds))
        rows = []
        if pretrained:
            grid = run_sweep(s, {"variant": tune.grid_search(pretrained), "train.seed": tune.grid_search(seeds)})
            rows = result_rows(grid, ["variant"], s)
            write_results(rows, s.output / "results.csv")
    except (SpaceError, SweepError, ValueError) as e:
        return fail(str(e))
    print(f"{len(rows)} pretraining trials: {s.output / 'results.csv'}")
    if not args.finetune:
        return 0

    # One line per fine-tuning below, not each run's own account and progress.
    logging.getLogger("coreecg.train").setLevel(logging.WARNING)
    runs, failures = [], []
    for corpus in args.finetune:
        corpus = Path(corpus).expanduser().resolve()
        for name in names:
            for seed in seeds:
                run = s.output / "finetune" / f"{slug(name)}-{slug(corpus.name)}-s{seed}"
                extra = [f"data.corpus={corpus}", f"train.seed={seed}", f"finetune.method={name}",
                         f"train.storage_path={run.parent}", f"train.name={run.name}"]
                if space.variants[name] == SCRATCH:
                    extra.append("finetune.mode=scratch")
                else:
                    row = next((r for r in rows if r["variant"] == name and r["seed"] == seed), None)
                    encoder = Path(row["run_dir"]) / "encoder.pt" if row else None
                    if row is None or row["status"] == "error" or not encoder.is_file():
                        print(f"skipping {name} (seed {seed}) on {corpus.name}: its pretraining did not finish",
                              file=sys.stderr)
                        continue
                    extra.append(f"finetune.encoder={encoder}")
                try:
                    finetune(load_config(args.config, [*args.overrides, *extra]))
                    runs.append(run)
                    print(f"fine-tuned {name} (seed {seed}) on {corpus.name}: {run}")
                except Exception as e:            # recorded in finetune_failures.csv; the ablation goes on
                    failures.append([name, seed, str(corpus), f"{type(e).__name__}: {e}"])
                    print(f"fine-tuning {name} (seed {seed}) on {corpus.name} failed: {failures[-1][-1]}",
                          file=sys.stderr)
    if failures:
        import csv

        with open(s.output / "finetune_failures.csv", "w", newline="") as f:
            csv.writer(f).writerows([["variant", "seed", "corpus", "error"], *failures])
        print(f"{len(failures)} fine-tuning run(s) failed: {s.output / 'finetune_failures.csv'}", file=sys.stderr)
    if not runs:
        return fail("no fine-tuning run finished")
    # Each table keeps its rows that ran, in the file's order, and its not-available rows.
    tables = {name: [m for m in methods if m in names or m in space.unavailable]
              for name, methods in space.tables.items()}
    written = write_report(runs, s.output / "tables",
                           {k: v for k, v in tables.items() if any(m in names for m in v)}, space.unavailable,
                           report=load_config(args.config, args.overrides).report)
    print("tables: " + ", ".join(str(p) for p in written if p.suffix == ".md"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
