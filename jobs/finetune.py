"""Fine-tune (or linear-probe, or train from scratch) an encoder on a labelled corpus, on Ray Train.

    python jobs/finetune.py --encoder runs/quickstart/encoder.pt --corpus corpora/ptbxl --output runs/ft-ptbxl
    python jobs/finetune.py --encoder none --corpus corpora/ptbxl --output runs/sup-ptbxl      # "Supervised"
    python jobs/finetune.py --encoder random --mode linear --corpus corpora/ptbxl --output runs/rnd-lin  # "Random init"
    python jobs/finetune.py --encoder ENC --corpus corpora/icbeb2018 --mode linear --leads 6 \\
        --train-fraction 0.05 --seed 1 --output runs/lin-icbeb-6l-5pct
    ray job submit --working-dir . -- python jobs/finetune.py ...                 # on a running cluster

The task is the corpus's own (its manifest's classes; single- or multi-label). Modes: finetune
(everything trains; the paper), linear (frozen encoder, linear head), frozen (frozen encoder,
attention-pooling head: the benchmark's frozen setting), scratch (random init; implied by
--encoder none). --leads 12 | 6 (I, II, III, aVR, aVL, aVF) | 1 (I) | names, e.g. I,II,V2.
Settings come from the `finetune` config section (paper: 80 epochs, lr 8e-5, batch 256, no
warm-up); `--config configs/quickstart.yaml` (its finetune section) is a small setting for this
machine. The model architecture comes from the encoder checkpoint (--encoder random: a seeded,
randomly initialised encoder of the config's `model` section, in any mode but scratch).
Devices as jobs/pretrain.py: train.use_gpu and train.num_workers default to auto (the cluster's
GPUs with one worker each, else the CPU with 2 workers; a set value is kept), said on the
console's first line and recorded in the run folder.
Merge order: defaults < --config < --set < this job's flags. The flags are config keys:
--encoder finetune.encoder (none: finetune.mode=scratch), --corpus data.corpus, --mode
finetune.mode, --leads finetune.leads, --train-fraction finetune.train_fraction, --seed
train.seed, --allow-overlap finetune.allow_overlap, --output train.storage_path + train.name.
A flag left out leaves its key to --set, --config or the default; a key given both ways is an
error (exit 2). Writes metrics.json, predictions.csv, best.pt, figures/tsne.png, metrics.jsonl
and tensorboard/ to --output; re-running the same command resumes (or returns at once when the
run is finished).
The leakage guard (docs/leakage.md): an encoder pretrained on records or patients of the corpus's
val or test split is refused before training, naming them (exit 2); --allow-overlap trains anyway
and records the overlap (metrics.json "leakage", overlap.csv, a mark in the report's tables).
Exit codes: 0 done, 2 bad arguments, config or input (leakage included), 1 training failed.
"""
from __future__ import annotations

import sys
from pathlib import Path

from coreecg.cli import fit_job, job_parser, parse_args, resolve_config


def _fmt(m: dict, key: str) -> str:
    """A test metric with its interval: the label metrics in percent, a regression's as they are."""
    v = m.get(key)
    if v is None:
        return f"{key} n/a"
    label = key in ("acc", "f1", "auroc")
    fmt = (lambda x: f"{100 * x:.1f}") if label else (lambda x: f"{x:.4g}")
    ci = (m.get("ci") or {}).get(key) or {}
    if ci.get("low") is not None and ci.get("high") is not None:
        return f"{key} {fmt(v)} [{fmt(ci['low'])}, {fmt(ci['high'])}]"
    return f"{key} {fmt(v)}"


def build_parser():
    parser = job_parser(__doc__)
    parser.add_argument("--encoder", required=True, metavar="PATH|none|random",
                        help="what the encoder starts from (finetune.encoder; this job's name for the model it reads): "
                             "encoder.pt, a pretraining checkpoint, run or export folder; 'none' = scratch; "
                             "'random' = a seeded, randomly initialised encoder of the config's model "
                             "(\"Random init\")")
    parser.add_argument("--corpus", required=True, metavar="DIR", help="a labelled corpus folder (jobs/preprocess.py)")
    parser.add_argument("--mode", choices=("finetune", "linear", "frozen", "scratch"),
                        help="finetune.mode: finetune (everything trains), linear (frozen encoder, linear head), "
                             "frozen (frozen encoder, attention-pooling head), scratch (implied by --encoder none); "
                             "default: finetune.mode (finetune)")
    parser.add_argument("--leads", help="12 | 6 | 1 | comma list of lead names (default: finetune.leads, all 12)")
    parser.add_argument("--train-fraction", type=float, metavar="F",
                        help="finetune.train_fraction; default: the config's (1.0)")
    parser.add_argument("--seed", type=int, metavar="N", help="train.seed; default: the config's (0)")
    parser.add_argument("--output", required=True, help="run folder (re-run to resume)")
    parser.add_argument("--allow-overlap", action="store_true",
                        help="fine-tune although the encoder's pretraining corpus shares records or patients with "
                             "the val/test splits (finetune.allow_overlap; recorded in metrics.json, overlap.csv "
                             "and the report)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)     # with --print-config, --encoder, --corpus and --output may be left out

    from coreecg.train.finetune_plan import FinetuneError, parse_leads

    scratch = (args.encoder or "").lower() == "none"
    if scratch and args.mode not in (None, "scratch"):
        parser.exit(2, f"error: --encoder none trains from scratch; --mode {args.mode} needs an encoder\n")
    if args.mode == "scratch" and not scratch:
        parser.exit(2, "error: --mode scratch trains a randomly initialised encoder; pass --encoder none\n")
    output = Path(args.output).expanduser().resolve() if args.output else None
    try:
        leads = parse_leads(args.leads) if args.leads is not None else None
        cfg = resolve_config(parser, args, {
            "finetune.mode": ("--encoder none", "scratch") if scratch else ("--mode", args.mode),
            "finetune.encoder": ("--encoder", "" if scratch else args.encoder),
            "finetune.leads": ("--leads", f"[{','.join(leads)}]" if leads else None),
            "finetune.train_fraction": ("--train-fraction", args.train_fraction),
            "train.seed": ("--seed", args.seed),
            "finetune.allow_overlap": ("--allow-overlap", "true" if args.allow_overlap else None),
            "data.corpus": ("--corpus", Path(args.corpus).expanduser().resolve() if args.corpus else None),
            "train.storage_path": ("--output", output.parent if output else None),
            "train.name": ("--output", output.name if output else None)})
    except FinetuneError as e:
        parser.exit(2, f"error: {e}\n")

    result = fit_job(cfg, "finetune", input_errors=(FinetuneError,))
    if result is None:
        return 2
    m, run = result.metrics, result.run_dir
    sel = m["selection"]
    print(f"\ndone: {m['method']} ({m['mode']}) on {m['dataset']}, leads {m['leads']}, "
          f"train fraction {m['train_fraction']}, seed {m['seed']}")
    t = m["test"]
    regression = "target_scaler" in m          # a regression task (docs/tasks.md): MAE, not AUROC
    if regression:
        print(f"selected epoch {sel['best_epoch']} of {sel['epochs']} by validation MAE ({sel['val_mae']:.4g} "
              f"{t['unit']}, lower is better)")
        print(f"test ({t['n']} records, {t['patients']} patients; 95% CI by patient bootstrap; {m['task']['name']} "
              f"in {t['unit'] or 'its unit'}): " + ", ".join(_fmt(t, k) for k in ("mae", "mae_sd", "rmse", "r2")))
    else:
        print(f"selected epoch {sel['best_epoch']} of {sel['epochs']} by validation macro AUROC "
              f"({sel['val_auroc'] if sel['val_auroc'] is None else round(sel['val_auroc'], 4)})")
        print(f"test ({t['n']} records, {t['patients']} patients; 95% CI by patient bootstrap): "
              + ", ".join(_fmt(t, k) for k in ("acc", "f1", "auroc")))
        if t["classes_left_out"]["auroc"]:
            print(f"  left out of macro AUROC (no positive or no negative in test): {t['classes_left_out']['auroc']}")
    print(f"run folder: {run}")
    for name in ("metrics.json", "predictions.csv", "best.pt", *(() if regression else ("figures/tsne.png",)),
                 "tensorboard"):
        print(f"  {run / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
