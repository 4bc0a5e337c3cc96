"""Command-line plumbing shared by the sweep jobs (sweep_mask_rates.py, sweep.py, ablate.py)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _cli import config_parser

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "configs" / "sweep.yaml"


def sweep_parser(description: str, default_space: str, default_output: str) -> argparse.ArgumentParser:
    p = config_parser(description)
    p.set_defaults(config=str(DEFAULT_CONFIG))
    p.add_argument("--space", default=str(REPO / "tune_spaces" / default_space), help="search space YAML")
    p.add_argument("--output", default=default_output, help="sweep folder (results, plots, trials)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --output (after a crash)")
    p.add_argument("--concurrency", type=int, default=0, help="trials at once (0: what the cluster's CPUs allow)")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="single-worker trials: e.g. 0.25 or 1")
    return p


def settings(args: argparse.Namespace, parser: argparse.ArgumentParser):
    from coreecg.config import ConfigError, load_config
    from coreecg.tune.sweep import SweepSettings

    try:
        load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        parser.exit(2, f"error: config: {e}\n")
    return SweepSettings(output=Path(args.output).expanduser().resolve(), config_file=args.config,
                         base=list(args.overrides), concurrency=args.concurrency,
                         gpus_per_trial=args.gpus_per_trial, resume=args.resume)


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2
