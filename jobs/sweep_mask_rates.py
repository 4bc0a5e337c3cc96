"""The paper's STDM mask-rate sensitivity study as a Ray Tune grid: every P_time x P_lead pair
(x --seeds seeds) is one pretraining trial judged by its representation probe (probe_auroc); with
--finetune, every cell's encoder is also fine-tuned on each named corpus, as the paper's figure.

    python jobs/sweep_mask_rates.py                                   # tiny model, synthetic corpus, this machine
    python jobs/sweep_mask_rates.py --seeds 3 --output sweeps/mask-rates --resume   # continue after a crash
    python jobs/sweep_mask_rates.py --finetune corpora/ptbxl corpora/icbeb2018    # the paper's F1/AUROC heatmaps

Writes into --output: results.csv (one row per trial: the grid values, seed, final and best
probe_auroc, steps, wall time, status, error), heatmap.png (the CHEAP mode: mean final few-label
probe_auroc over seeds per P_time x P_lead cell, the best cell marked), tune/ (Ray Tune's state:
--resume restores it) and trials/<id>/ (each trial's run folder: metrics.jsonl, tensorboard/,
encoder.pt). With --finetune (12 leads, all training data, the finetune section of the config):
runs/finetune/<dataset>-<cell>-s<seed>/ (fine-tuning run folders), finetune_results.csv,
heatmap_<dataset>_f1.png and heatmap_<dataset>_auroc.png (the paper's figure), and
rank_correlation.csv: Spearman's rho between the cells' probe_auroc and their fine-tuned AUROC
with a 95 % Fisher-z interval (Bonett-Wright), per dataset: whether the cheap mode (and ASHA, which
stops trials on it) ranks the cells as fine-tuning does.
Exit codes: 0 done (failed trials are recorded in results.csv), 2 bad arguments, space or config.
"""
from __future__ import annotations

import csv
import sys

from coreecg.cli import fail, parse_args, sweep_parser, sweep_settings


def main(argv=None) -> int:
    parser = sweep_parser(__doc__, "mask_rates.yaml", "sweeps/mask-rates")
    parser.add_argument("--seeds", type=int, default=1, help="seeds per grid cell (train.seed = 0..N-1)")
    parser.add_argument("--finetune", nargs="+", default=[], metavar="CORPUS",
                        help="labelled corpora: fine-tune every cell's encoder on each (F1/AUROC heatmaps per dataset)")
    args = parse_args(parser, argv)
    s = sweep_settings(parser, args)
    from ray import tune

    from coreecg.tune.plots import heatmap
    from coreecg.tune.spaces import SpaceError, load_space
    from coreecg.tune.sweep import SweepError, result_rows, run_sweep, write_results

    try:
        space = load_space(args.space, args.config, args.overrides)
        if len(space.grid) != 2:
            return fail(f"{args.space}: a mask-rate grid needs exactly two grid keys, got {list(space.grid)}")
        param_space = {k: tune.grid_search(v) for k, v in space.grid.items()}
        if args.seeds > 1:
            param_space["train.seed"] = tune.grid_search(list(range(args.seeds)))
        grid = run_sweep(s, param_space)
    except (SpaceError, SweepError, ValueError) as e:
        return fail(str(e))
    rows = result_rows(grid, list(space.grid), s)
    out = s.output
    write_results(rows, out / "results.csv")
    x, y = list(space.grid)
    heatmap(rows, x, y, out / "heatmap.png",
            title="cheap mode: few-label probe_auroc (mean over seeds), not the paper's fine-tuned metrics")
    bad = [r for r in rows if r["status"] == "error"]
    print(f"{len(rows)} trials ({len(bad)} failed): {out / 'results.csv'}, {out / 'heatmap.png'}")
    if not args.finetune:
        return 0
    from coreecg.study.mask_rates import finetune_cells, write_finetune_figures

    try:
        ft = finetune_cells(rows, x, y, args.finetune, out, args.config, args.overrides, args.concurrency)
    except (OSError, ValueError) as e:
        return fail(str(e))
    written = write_finetune_figures(rows, ft, x, y, out)
    failed = [r for r in ft if r["status"] != "done"]
    print(f"{len(ft)} fine-tunings ({len(failed)} failed): " + ", ".join(str(p) for p in written))
    for r in csv.DictReader(open(out / "rank_correlation.csv")):
        print(f"  {r['dataset']}: Spearman rho(probe_auroc, fine-tuned AUROC) = {float(r['rho']):.3f} "
              f"[{float(r['low']):.3f}, {float(r['high']):.3f}] over {r['cells']} cells"
              + (f" ({r['note']})" if r["note"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
