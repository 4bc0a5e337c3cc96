"""Fine-tune (or linear-probe, or train from scratch) an encoder on a labelled corpus, on Ray Train.

    python jobs/finetune.py --encoder runs/quickstart/encoder.pt --corpus corpora/ptbxl --output runs/ft-ptbxl
    python jobs/finetune.py --encoder none --corpus corpora/ptbxl --output runs/sup-ptbxl      # "Supervised"
    python jobs/finetune.py --encoder ENC --corpus corpora/icbeb2018 --mode linear --leads 6 \\
        --train-fraction 0.05 --seed 1 --output runs/lin-icbeb-6l-5pct
    ray job submit --working-dir . -- python jobs/finetune.py ...                 # on a running cluster

The task is the corpus's own (its manifest's classes; single- or multi-label). Modes: finetune
(everything trains; the paper), linear (frozen encoder), scratch (random init; implied by
--encoder none). --leads 12 | 6 (I, II, III, aVR, aVL, aVF) | 1 (I) | names, e.g. I,II,V2.
Settings come from the `finetune` config section (paper: 80 epochs, lr 8e-5, batch 256, no
warm-up); configs/finetune_quickstart.yaml is a small setting for this machine. The model
architecture comes from the encoder checkpoint. Writes metrics.json, predictions.csv, best.pt,
figures/tsne.png, metrics.jsonl and tensorboard/ to --output; re-running the same command
resumes (or returns at once when the run is finished).
Exit codes: 0 done, 2 bad arguments, config or input, 1 training failed.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cli import config_parser  # noqa: E402


def _fmt(m: dict, key: str) -> str:
    v = m.get(key)
    if v is None:
        return f"{key} n/a"
    ci = (m.get("ci") or {}).get(key) or {}
    if ci.get("low") is not None and ci.get("high") is not None:
        return f"{key} {100 * v:.1f} [{100 * ci['low']:.1f}, {100 * ci['high']:.1f}]"
    return f"{key} {100 * v:.1f}"


def main(argv=None) -> int:
    parser = config_parser(__doc__.splitlines()[0])
    parser.add_argument("--encoder", required=True, help="encoder.pt or a pretraining checkpoint; 'none' = scratch")
    parser.add_argument("--corpus", required=True, help="a labelled corpus folder (jobs/preprocess.py)")
    parser.add_argument("--mode", choices=("finetune", "linear", "scratch"))
    parser.add_argument("--leads", default="12", help="12 | 6 | 1 | comma list of lead names")
    parser.add_argument("--train-fraction", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", required=True, help="run folder (re-run to resume)")
    args = parser.parse_args(argv)

    from coreecg.config import ConfigError, load_config
    from coreecg.data.corpus import CorpusError
    from coreecg.train.checkpoint import CheckpointError
    from coreecg.train.finetuning import FinetuneError, finetune, parse_leads

    scratch = args.encoder.lower() == "none"
    mode = args.mode or ("scratch" if scratch else "finetune")
    if scratch and mode != "scratch":
        parser.exit(2, f"error: --encoder none trains from scratch; --mode {mode} needs an encoder\n")
    if mode == "scratch" and not scratch:
        parser.exit(2, "error: --mode scratch trains a randomly initialised encoder; pass --encoder none\n")
    output = Path(args.output).expanduser().resolve()
    try:
        leads = parse_leads(args.leads)
        cfg = load_config(args.config, [
            *args.overrides, f"finetune.mode={mode}", f"finetune.encoder={'' if scratch else args.encoder}",
            f"finetune.leads=[{','.join(leads)}]", f"finetune.train_fraction={args.train_fraction}",
            f"train.seed={args.seed}", f"data.corpus={Path(args.corpus).expanduser().resolve()}",
            f"train.storage_path={output.parent}", f"train.name={output.name}"])
    except (ConfigError, FinetuneError, FileNotFoundError) as e:
        parser.exit(2, f"error: {e}\n")

    try:
        result = finetune(cfg)
    except (CheckpointError, CorpusError, FinetuneError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except Exception as e:   # ray.train.TrainingFailedError and friends: the cause, not the traceback
        cause = getattr(e, "__cause__", None) or e
        if isinstance(cause, (CheckpointError, CorpusError, FinetuneError)):
            print(f"error: {cause}", file=sys.stderr)
            return 2
        raise
    m, run = result.metrics, result.run_dir
    sel = m["selection"]
    print(f"\ndone: {m['method']} ({m['mode']}) on {m['dataset']}, leads {m['leads']}, "
          f"train fraction {m['train_fraction']}, seed {m['seed']}")
    print(f"selected epoch {sel['best_epoch'] + 1} of {sel['epochs']} by validation macro AUROC "
          f"({sel['val_auroc'] if sel['val_auroc'] is None else round(sel['val_auroc'], 4)})")
    t = m["test"]
    print(f"test ({t['n']} records, {t['patients']} patients; 95% CI by patient bootstrap): "
          + ", ".join(_fmt(t, k) for k in ("acc", "f1", "auroc")))
    if t["classes_left_out"]["auroc"]:
        print(f"  left out of macro AUROC (no positive or no negative in test): {t['classes_left_out']['auroc']}")
    print(f"run folder: {run}")
    for name in ("metrics.json", "predictions.csv", "best.pt", "figures/tsne.png", "tensorboard"):
        print(f"  {run / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
