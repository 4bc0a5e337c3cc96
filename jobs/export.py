"""Export a trained encoder or a fine-tuned classifier as a self-describing model folder
(safetensors weights, config.json with the input contract, a model card), optionally ONNX.

    python jobs/export.py --model runs/quickstart --output exports/quickstart     # a pretraining run (encoder.pt)
    python jobs/export.py --model runs/quickstart/encoder.pt --output exports/quickstart
    python jobs/export.py --model runs/ft-ptbxl --output exports/ft-ptbxl --onnx   # a fine-tuning run (best.pt)
    python jobs/export.py --model runs/ft-ptbxl/best.pt --output exports/ft-ptbxl

--model: a pretraining run folder (encoder.pt), encoder.pt or a pretraining
checkpoint (checkpoint_step*/checkpoint.pt), a fine-tuning run folder (best.pt + metrics.json),
or a best.pt (its class names come from metrics.json beside it, else from the fine-tuning
corpus's manifest). Nothing is trained and Ray is not started.

Writes to --output (a new or empty folder, or an earlier export, which is replaced):
  model.safetensors  the weights (float32; no pickle)
  config.json        kind (encoder | classifier), architecture, the input contract ("input":
                     sampling rate, window, leads, band-pass, z-score; a classifier's class
                     names, task and record aggregation), the sha256 of model.safetensors
                     (checked on every load), provenance and the full coreecg config
  README.md          the model card: method, data and their licences, test metrics with 95 %
                     CIs (fine-tuned models), intended use and limitations, how to load
  model.onnx         with --onnx: encoder -> pooled embedding + token features, classifier ->
                     logits; dynamic batch axis; checked against PyTorch in onnxruntime
  precision_checks.json  the bf16 and int8 paths checked against float32 on --check-corpus (default:
                     the model's own corpus) --check-split (default test): embedding and probability
                     differences, a classifier's macro AUROC difference with its patient-bootstrap
                     interval, accepted or refused against the config's inference bounds; the card
                     states them and jobs/predict.py refuses a refused path (docs/inference.md)
Load it with coreecg.load_model(DIR) (or load_encoder / load_classifier); docs/export.md.

Exit codes: 0 done, 2 bad arguments or input (a missing path, not a coreecg model, an output
folder holding other files), 1 the export failed.
"""
from __future__ import annotations

import json
import logging
import sys
import warnings
from pathlib import Path

from coreecg.cli import fail, job_parser, parse_args, renamed


def build_parser():
    parser = job_parser(__doc__, config=False)
    parser.add_argument("--model", required=True, metavar="PATH",
                        help="the model to export: a pretraining or fine-tuning run folder, encoder.pt, best.pt or a "
                             "checkpoint")
    renamed(parser, "RUN_OR_CHECKPOINT", "--model")
    parser.add_argument("--output", required=True, help="the export folder to write")
    parser.add_argument("--onnx", action="store_true", help="also write model.onnx (and check it in onnxruntime)")
    parser.add_argument("--precision", choices=("auto", "fp32", "bf16", "int8"), default="auto",
                        help="the export's default inference precision (refused if its check refused it); the bf16 "
                             "and int8 paths are checked against float32 whatever it is (docs/inference.md)")
    parser.add_argument("--check-corpus", default=None, metavar="DIR",
                        help="the corpus to check the precision paths on (default: the model's own, if here)")
    parser.add_argument("--check-split", default="test", choices=("train", "val", "test"),
                        help="its split (default: test, held out)")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parse_args(parser, argv)

    source = Path(args.model).expanduser()
    if not source.exists():
        return fail(f"{source}: no such file or folder")

    from coreecg.checkpoints import CheckpointError
    from coreecg.hub import CARD_FILE, CONFIG_FILE, ONNX_FILE, WEIGHTS_FILE, export_model

    if not args.verbose:
        # The ONNX exporter logs a line per optional torchvision op it skips, and torch.export
        # emits deprecation notices from its own internals: none concerns this model. (After
        # importing torch, whose logging set-up would reset the level.)
        logging.getLogger("torch.onnx").setLevel(logging.ERROR)
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)

    try:
        out = export_model(source, args.output, onnx=args.onnx, precision=args.precision,
                           check_corpus=args.check_corpus, check_split=args.check_split)
    except CheckpointError as e:       # missing, corrupted or foreign input, or a busy --output
        return fail(str(e))
    except Exception as e:             # the exporter itself (e.g. an op ONNX cannot express)
        if args.verbose:
            raise
        return fail(f"export of {source} failed: {type(e).__name__}: {e}", code=1)

    meta = json.loads((out / CONFIG_FILE).read_text())
    c = meta["input"]
    print(f"exported {meta['kind']} from {source}")
    print(f"  weights:     {out / WEIGHTS_FILE}  ({meta['weights']['parameters']:,} parameters, "
          f"sha256 {meta['weights']['sha256'][:16]}...)")
    print(f"  config:      {out / CONFIG_FILE}  (input: {len(c['leads'])} leads x {c['window_samples']} samples "
          f"at {c['sampling_rate']} Hz" + (f"; {len(c['class_names'])} classes, {c['task']}" if "class_names" in c
                                          else "") + ")")
    print(f"  model card:  {out / CARD_FILE}")
    if args.onnx:
        diff = meta["onnx"]["max_abs_diff_vs_pytorch"]
        print(f"  onnx:        {out / ONNX_FILE}  (" + (f"max |onnxruntime - PyTorch| = {diff:.1e}" if diff is not None
                                                         else "unchecked: onnxruntime is not installed") + ")")
    for line in _precision_summary(meta.get("precision") or {}):
        print(line)
    print(f"load with:     coreecg.load_model({str(out)!r})")
    return 0


def _precision_summary(entry: dict) -> list[str]:
    lines = [f"  precision:   default {entry.get('default')}"]
    for p, c in sorted(entry.get("checks", {}).items()):
        lines.append(f"    {p}: {'accepted' if c.get('accepted') else 'refused'}: {c.get('reason')}")
    for p, why in sorted(entry.get("not_checked", {}).items()):
        lines.append(f"    {p}: not checked: {why}")
    return lines if entry else []


if __name__ == "__main__":
    sys.exit(main())
