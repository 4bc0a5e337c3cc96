"""A linear probe on every layer of a frozen encoder: which block's pooled features a labelled corpus
is best read from (intermediate layers often probe better than the last: ECG-Soup 2025).

    python jobs/probe_layers.py --model runs/quickstart --corpus corpora/ptbxl --output runs/layers-ptbxl
    python jobs/probe_layers.py --model random --corpus corpora/ptbxl --output runs/layers-random --seed 1

For each block of the encoder (the ViT `coreecg`, `s4`, `xresnet1d`; a published family is refused,
named), its output pooled as the encoder pools its last (the mean over real tokens or time steps):
a logistic-regression probe (coreecg.eval.probe) fitted on the train split's windows, scored on val
and test as fine-tuning scores a model (the crop rule's finetune.eval_crops evaluation crops of
data.crop_samples samples, a record's probabilities the mean over its windows, macro AUROC; test
with patient-bootstrap 95 % intervals of finetune.bootstrap_resamples resamples, seeded by
train.seed). The best layer is chosen on val only.
A regression task's corpus (coreecg.data.tasks; data.sources.<source>.task=age): a ridge regression per layer
(RidgeCV on standardised features, the target standardised by train's record-level mean and SD),
MAE in the target's unit with test's patient-bootstrap interval; the best layer is the lowest val MAE.
--model: any model source (a pretraining run folder, encoder.pt, a checkpoint, an export folder;
a classifier's encoder), or `random`: a seeded, randomly initialised encoder of the config's
`model` section, as finetune.encoder=random builds it (seeded by train.seed).
Merge order: defaults < --config < --set < this job's flags (--corpus data.corpus, --seed train.seed).

Writes to --output: layer_probe.json (every layer's scores, the best layer, the settings),
layer_probe.csv (layer, val_auroc, test_auroc, low, high: one row per layer; a regression's: layer,
val_mae, test_mae, low, high, plus layer_predictions.csv, every layer's record-level predictions) and
figures/layer_probe.png (test AUROC, or MAE, per layer with its interval, the best-by-val layer marked).
The device: CUDA when available, else the CPU.
Exit codes: 0 done, 2 bad arguments, config, model or corpus.
"""
from __future__ import annotations

import sys
from pathlib import Path

from coreecg.cli import fail, job_parser, parse_args, resolve_config

# Lazy imports: in main, so that --help stays light: torch, the encoders, the corpus reader and scikit-learn.


def _auroc(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def build_parser():
    parser = job_parser(__doc__)
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="the encoder's model source: a run folder, encoder.pt, best.pt, a checkpoint or an "
                             "export folder (coreecg.loading), or 'random' (a seeded random encoder of the config)")
    parser.add_argument("--corpus", required=True, metavar="DIR",
                        help="a labelled corpus folder with train, val and test splits (data.corpus)")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="train.seed: the random encoder's seed and the bootstrap's; default: the config's (0)")
    parser.add_argument("--output", required=True, help="the folder the table, JSON and figure go to")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)
    cfg = resolve_config(parser, args, {
        "data.corpus": ("--corpus", Path(args.corpus).expanduser().resolve() if args.corpus else None),
        "train.seed": ("--seed", args.seed)})

    from coreecg.checkpoints import CheckpointError
    from coreecg.data.corpus import CorpusError
    from coreecg.devices import DeviceError, resolve_device
    from coreecg.eval.layer_probe import probe_layers, write_results
    from coreecg.loading import load_encoder
    from coreecg.train.finetuning import random_encoder

    try:
        device = resolve_device("auto")          # CUDA when available
        encoder = random_encoder(cfg) if args.model == "random" else load_encoder(args.model)
        result = probe_layers(encoder.to(device), cfg.data.corpus, cfg.data.crop_samples, cfg.finetune.eval_crops,
                              device, cfg.finetune.bootstrap_resamples, cfg.train.seed)
    except (CheckpointError, CorpusError, DeviceError, FileNotFoundError, ValueError) as e:
        return fail(str(e))
    result["model"] = args.model
    paths = write_results(result, Path(args.output).expanduser())
    best, last = result["best"], result["last"]
    m = "mae" if result.get("metric") == "mae" else "auroc"
    print(f"{result['n_layers']} layers probed on {result['corpus']}: best by val layer {result['best_layer']} "
          f"(val {_auroc(best[f'val_{m}'])}, test {_auroc(best[f'test_{m}'])}); "
          f"last layer test {_auroc(last[f'test_{m}'])}{' (MAE, lower is better)' if m == 'mae' else ''}")
    for p in paths.values():
        print(f"  {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
