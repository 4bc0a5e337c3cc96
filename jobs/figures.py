"""Figures from saved runs.

    python jobs/figures.py reconstruction --model runs/quickstart --corpus corpora/ptbxl --output recon.png
    python jobs/figures.py reconstruction --model runs/quickstart/checkpoint_step000000594/checkpoint.pt \\
        --corpus corpora/ptbxl --output recon.png --split test --windows 4 --seed 1

`reconstruction`: the paper's reconstruction figure (original vs the Time Decoder's output on
masked patches, masked patches shaded, dropped ones hatched) for fixed windows of a corpus
split, with the same plotting code as the in-loop figure (`coreecg.eval.figures`) and, by
default, the same masks (the run's train.seed). --model must be a full pretraining checkpoint
(`checkpoint_step*/checkpoint.pt`, or a run folder: its latest) of a method with a Time Decoder:
the other model sources (encoder.pt, best.pt, an export folder) hold only the encoder, which
reconstructs nothing. Writes the PNG named by --output.
Exit codes: 0 written, 2 bad arguments or input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def reconstruction(args: argparse.Namespace) -> Path:
    import torch

    from coreecg.data.reading import read_split
    from coreecg.eval.figures import reconstruction_figure, save_figure
    from coreecg.eval.probe import center_crop
    from coreecg.checkpoints import CheckpointError
    from coreecg.loading import load_method, open_method
    from coreecg.methods import build_method

    src = open_method(args.model)          # a run folder stands for its latest checkpoint
    if not any(k.startswith("time_decoder.") for k in src.state):
        raise CheckpointError(f"{src.weights}: holds no Time Decoder weights (encoder.pt keeps only the "
                              "encoder, and a method without one, e.g. MoCo V3 or CMSC, reconstructs "
                              "nothing); pass a CoRe-ECG run's checkpoint_step*/checkpoint.pt")
    loaded = load_method(src, build_method)
    model, config, source = loaded.model, loaded.config, loaded.weights
    windows = read_split(args.corpus, args.split, ["signal"], max_windows=args.windows)["signal"]
    if len(windows) == 0:
        raise ValueError(f"corpus {args.corpus} has no {args.split!r} windows")
    x = center_crop(torch.from_numpy(windows), config.model.input_samples)
    step = loaded.entries.get("trainer", {}).get("step", "?")
    seed = config.train.seed if args.seed is None else args.seed     # the in-loop figure's masks by default
    fig = reconstruction_figure(model, x, seed=seed,
                                title=f"{source.parent.name} (step {step}), {args.split} windows: "
                                      "original (blue), reconstruction of masked patches (red); "
                                      "grey: masked, hatched: dropped")
    return save_figure(fig, args.output)


def build_parser():
    from coreecg.cli import HelpFormatter, job_parser, renamed

    p = job_parser(__doc__, config=False)
    sub = p.add_subparsers(dest="figure", required=True, metavar="FIGURE", help="the figure to draw: reconstruction")
    r = sub.add_parser("reconstruction", help="original vs reconstructed signal of fixed windows",
                       description=__doc__, formatter_class=HelpFormatter, prog=f"{p.prog} reconstruction")
    r.add_argument("--model", required=True, metavar="PATH",
                   help="the model: a full pretraining checkpoint.pt, or a pretraining run folder (its latest); "
                        "not encoder.pt, best.pt or an export (no Time Decoder)")
    renamed(r, "--encoder", "--model")
    r.add_argument("--corpus", required=True, metavar="DIR", help="a corpus folder (jobs/preprocess.py output)")
    r.add_argument("--output", required=True, help="PNG file to write")
    r.add_argument("--split", default="val", choices=["train", "val", "test"], help="the corpus split shown")
    r.add_argument("--windows", type=int, default=2, metavar="N", help="windows shown, evenly spaced over the split")
    r.add_argument("--seed", type=int, default=None, metavar="N",
                   help="train.seed the masks are drawn with (default: the run's own, as its in-loop figure)")
    return p


def main(argv=None) -> int:
    from coreecg.cli import parse_args

    p = build_parser()
    args = parse_args(p, argv)
    from coreecg.checkpoints import CheckpointError
    from coreecg.data.corpus import CorpusError

    try:
        path = reconstruction(args)
    except (CheckpointError, CorpusError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
