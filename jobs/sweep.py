"""Search the pretraining hyperparameters with Optuna (TPE) + ASHA on Ray Tune, judged by the
representation probe (probe_auroc), which (unlike the loss) compares across masking settings.

    python jobs/sweep.py                                            # tune_spaces/core.yaml, 8 trials, this machine
    python jobs/sweep.py --space tune_spaces/core.yaml --num-samples 64 --output sweeps/core
    python jobs/sweep.py --output sweeps/core --resume              # continue after a crash
    python jobs/sweep.py --num-samples 8 --validate 2 --finetune corpora/ptbxl
                                                                    # does the objective predict fine-tuning?
    optuna-dashboard sqlite:///sweeps/core/optuna.db                # watch the stored study while it runs

ASHA stops weak trials after any epoch (grace period 1 epoch, reduction factor 2); a stopped
trial reaches Optuna with its last probe_auroc. Sampling is seeded (--search-seed; every trial
trains with train.seed, --set train.seed=N). Writes into
--output: results.csv, importance.png (Optuna's fANOVA parameter importances), best_config.yaml
(the best trial's full config: `python jobs/pretrain.py --config best_config.yaml` runs it as
is), tune/ and trials/<id>/, and optuna.db: the Optuna study, stored as it runs (an SQLite file
by default; --optuna-storage postgresql://... for a sweep that spans machines), which
`optuna-dashboard sqlite:///<output>/optuna.db` shows live and --resume continues. Exit codes: 0
done, 2 bad arguments, space or config.
"""
from __future__ import annotations

import sys

from coreecg.cli import fail, parse_args, renamed, run_study_job, shipped, sweep_parser, sweep_settings
from coreecg.tune.spaces import SpaceError, load_space, optuna_space, trial_config
from coreecg.tune.sweep import (OBJECTIVES, SweepError, best_row, check_sweep, rank_rows, result_rows, run_sweep,
                                write_results)

# Lazy imports: Ray Tune's search (the `ray` extra), after the job has checked the extra is installed, and
# the rest where it is used, so that --help stays as light as it is (2,552 modules): the extras check, the
# plots, the searcher and the stored study (coreecg.extras, coreecg.tune.plots, coreecg.tune.search,
# coreecg.tune.storage) and
# the validation study (coreecg.study: 139 modules more).


def build_parser():
    parser = sweep_parser(__doc__, "sweeps/core", space="core.yaml")
    parser.add_argument("--num-samples", type=int, default=8, metavar="N", help="trials to sample")
    parser.add_argument("--search-seed", type=int, default=0, metavar="N",
                        help="the seed of Optuna's sampler (not the trials' train.seed)")
    parser.add_argument("--validate", type=int, default=0, metavar="K",
                        help="after the sweep, fine-tune the K best and K worst trials' encoders on --finetune and "
                             "write validation.csv: Spearman's rho of each objective against the fine-tuned AUROC")
    parser.add_argument("--finetune", action="append", default=[], metavar="CORPUS",
                        help="a labelled corpus (repeatable) the --validate trials are fine-tuned on")
    parser.add_argument("--optuna-storage", default="", metavar="URL",
                        help="where the Optuna study is stored (an RDB URL; default: sqlite:///<output>/optuna.db)")
    renamed(parser, "--seed", "--search-seed (Optuna's sampler seed; the trials' training seed is "
                              "--set train.seed=N)")
    built_in = ", ".join(f"{k} ({v})" for k, v in OBJECTIVES.items())
    parser.add_argument("--metric", default="probe_auroc", metavar="NAME",
                        help=f"the objective, from each epoch's report: {built_in}, a loss the "
                             "method reports (CoRe-ECG: loss_rec, loss_con; minimised), or an objective a plugin "
                             "registers (a module named in `plugins`, e.g. --set 'plugins=[my_objectives]'), "
                             "optimised in the direction its registration declares (docs/sweeps.md)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    s = sweep_settings(parser, args)
    s.metric = args.metric
    from coreecg.extras import RAY_EXTRA_MODULES, MissingExtra, require_ray_extra

    try:                               # the search imports Ray Tune and Optuna before any plan checks them
        require_ray_extra("jobs/sweep.py", RAY_EXTRA_MODULES)
    except MissingExtra as e:
        return fail(str(e))
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import ConcurrencyLimiter

    from coreecg.tune.plots import importance_plot
    from coreecg.tune.search import EqualBudgetOptunaSearch
    from coreecg.tune.storage import StudyError, check_study, load_stored_study, open_storage, study_storage

    try:
        space = load_space(args.space, args.config, args.overrides)
        if not space.params:
            return fail(f"{args.space}: needs a 'params' section of Optuna distributions")
        s.swept = tuple(space.params)
        # every refusal before anything is written: a refused sweep leaves no folder and no study
        cfg = check_sweep(s)
        epochs = cfg.optim.epochs
        storage_url, study_name = study_storage(s.output, args.optuna_storage)
        check_study(storage_url, study_name, s.mode, s.resume)
        distributions = optuna_space(space)
        # stopped trials are stored as PRUNED: the study's best_trial keeps the equal-budget rule
        searcher = EqualBudgetOptunaSearch(space=distributions, metric=s.metric, mode=s.mode, seed=args.search_seed,
                                           storage=open_storage(storage_url), study_name=study_name, budget=epochs)
        print(f"Optuna study {study_name!r} in {storage_url}: watch it with `optuna-dashboard {storage_url}`",
              flush=True)
        if args.concurrency:
            searcher = ConcurrencyLimiter(searcher, max_concurrent=args.concurrency)
        # max_t one past the last epoch: a trial that reaches its last epoch ends by itself, writing
        # encoder.pt and done.json (at max_t ASHA stops the trial at that report, before either)
        scheduler = ASHAScheduler(time_attr="training_iteration", max_t=epochs + 1, grace_period=1,
                                  reduction_factor=2)
        grid = run_sweep(s, {}, search_alg=searcher, scheduler=scheduler, num_samples=args.num_samples,
                         checked=cfg)
    except (SpaceError, SweepError, StudyError, ValueError) as e:
        return fail(str(e))
    rows = result_rows(grid, list(space.params), s)
    out = s.output
    compared = rank_rows(rows, s.metric, s.mode)       # equal budget: the trials that ran furthest
    write_results(rows, out / "results.csv")
    importance_plot(compared, distributions, out / "importance.png", key=s.metric,
                    study=load_stored_study(storage_url, study_name))
    best = best_row(rows, s.metric, s.mode)
    if best is None:
        print(f"no trial finished with a {s.metric}: see {out / 'results.csv'}", file=sys.stderr)
        return 1
    cfg = trial_config(args.config, [*args.overrides, "train.name=best"], {k: best[k] for k in space.params})
    cfg.to_yaml(out / "best_config.yaml")
    print(f"{len(rows)} trials, {len(compared)} compared at epoch {best['compared_at_epoch']}; best {s.metric} "
          f"{best[s.metric]:.4f} (trial {best['trial_id']}): "
          + ", ".join(f"{k}={best[k]:.4g}" if isinstance(best[k], float) else f"{k}={best[k]}" for k in space.params))
    print(f"results: {out / 'results.csv'}, {out / 'importance.png'}, {out / 'best_config.yaml'}")
    if args.validate:
        return validate(args, s, compared)
    return 0


def validate(args, s, compared: list[dict]) -> int:
    """--validate K: the K best and K worst trials fine-tuned (the study machinery), rho per objective."""
    from coreecg.study.reader import study_from_dict
    from coreecg.study.validate import VALIDATION, chosen_trials, validation_rows, validation_study, write_validation

    if not args.finetune:
        return fail("--validate needs --finetune CORPUS (the labelled corpus the trials are fine-tuned on)")
    try:
        picked = chosen_trials(compared, args.validate)
    except ValueError as e:
        return fail(str(e))
    data = validation_study(s.output, picked, config=args.config, overrides=args.overrides, finetune=args.finetune,
                            variants=shipped("tune_spaces/ablations.yaml"))
    study = study_from_dict(data, s.output / f"{VALIDATION}.yaml")
    folder = s.output / VALIDATION
    # --resume continues a validation that began; one that never ran starts
    code = run_study_job(study, folder, resume=args.resume and (folder / "study.json").exists(),
                         concurrency=s.concurrency)
    extra = () if s.metric in ("probe_auroc", "loss") else (s.metric,)
    rows = validation_rows(study, s.output, picked, extra)
    path = write_validation(rows, s.output / "validation.csv")
    for r in rows:
        print(f"  {r['corpus']}: rho({r['objective']}, fine-tuned AUROC) = {r['rho']:.3f} [{r['low']:.3f}, "
              f"{r['high']:.3f}] over {r['cells']} trials" + (f" ({r['note']})" if r["note"] else ""))
    print(f"validation: {path}")
    return code


if __name__ == "__main__":
    sys.exit(main())
