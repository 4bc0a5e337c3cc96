"""The command line every job shares: its help, its flags and the one merge order.

Each job's `--help` prints the job's whole module docstring (examples, outputs, exit codes) and
every flag with its real default. Flags mean one thing across jobs:

    --output DIR     the folder (or file) the job writes
    --corpus DIR     a preprocessed corpus the job reads
    --encoder PATH   weights the job reads (encoder.pt, a checkpoint, a run or export folder)
    --config FILE    a YAML config layered over the paper defaults (coreecg/config.py)
    --set A.B=C      one config value (repeatable)
    --print-config   print the resolved config as YAML and exit
    --verbose        Ray's own INFO lines and worker logs on the console too

One merge order for every config-driven job: the paper defaults, then --config FILE, then each
--set a.b=c, then the job's own flags (e.g. jobs/finetune.py's --seed, which is train.seed). A flag
left out sets nothing, so a --set of its key stands; a key given both as a --set and as a flag is
an error that names both (exit 2), never a silent override.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from coreecg.config import Config, ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]


def shipped(relative: str) -> Path:
    """A file the project ships beside the package (configs/, tune_spaces/, studies/): from the
    checkout when run from one, else from the installed copy (`coreecg/_shipped/`)."""
    in_checkout = REPO / relative
    if in_checkout.exists():
        return in_checkout
    installed = Path(__file__).resolve().parent / "_shipped" / relative
    return installed if installed.exists() else in_checkout


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The docstring as written (its examples keep their layout) and every flag's real default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


def job_parser(doc: str, *, config: bool = True, default_config: str | Path | None = None,
               prog: str | None = None) -> argparse.ArgumentParser:
    """A job's parser: `doc` (its module docstring) as the help text, --verbose, and, for a
    config-driven job, --config (default `default_config`, else the paper defaults), --set and
    --print-config."""
    p = argparse.ArgumentParser(prog=prog or _prog(), description=doc, formatter_class=HelpFormatter)
    if config:
        p.add_argument("--config", default=_shown(default_config) if default_config else None,
                       help="YAML config layered over the paper defaults (coreecg/config.py)"
                       + ("" if default_config else "; none: the paper defaults"))
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=C",
                       help="override one config value (repeatable), e.g. --set masking.p_time=0.6")
        p.add_argument("--print-config", action="store_true",
                       help="print the resolved config (defaults < --config < --set < flags) as YAML and exit")
    p.add_argument("--verbose", action="store_true",
                   help="also show Ray's INFO lines, worker logs and library warnings")
    return p


def _shown(path: str | Path) -> str:
    """A path as a user would type it: relative to the working folder when it lies under it."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _prog() -> str:
    """`jobs/pretrain.py` run from a checkout, `coreecg-pretrain` as an installed command."""
    arg0 = Path(sys.argv[0])
    return f"jobs/{arg0.name}" if arg0.parent.name == "jobs" else arg0.name


def console(verbose: bool = False) -> None:
    """Turn on the job's console: coreecg's INFO lines on stdout; without --verbose, Ray's INFO
    lines and worker logs stay in Ray's log files (/tmp/ray/session_latest/logs)."""
    from coreecg.log import console as _console

    _console(logging.DEBUG if verbose and os.environ.get("COREECG_DEBUG") else logging.INFO)
    quiet_ray(verbose)


def quiet_ray(verbose: bool) -> None:
    """Ray reads these when it starts (ray.init) and passes them to its workers."""
    os.environ["COREECG_VERBOSE"] = "1" if verbose else "0"
    if verbose:
        return
    os.environ.setdefault("RAY_DEDUP_LOGS", "1")
    # Tune's new console output prints an experiment table even at verbose=0; the legacy
    # reporter at verbose=0 prints nothing (our sweeps print one line per trial).
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    for name in ("ray", "ray.tune", "ray.train", "ray.data"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # Ray Data's hint that progress bars are off (we turn them off: the job prints its own progress)
    logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)
    # Optuna's "A new study created in memory" (a sweep's driver)
    logging.getLogger("optuna").setLevel(logging.WARNING)


def parse_args(parser: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse and turn the console on (--verbose decides how much of Ray it shows)."""
    import shlex

    from coreecg.run_record import COMMAND_ENV

    args = parser.parse_args(argv)
    if getattr(args, "config", None):   # trials and workers run in folders of their own
        args.config = str(Path(args.config).expanduser().resolve())
    console(getattr(args, "verbose", False))
    # The run record's command line (coreecg.run_record), also in processes Ray starts.
    shown = [parser.prog, *(sys.argv[1:] if argv is None else argv)]
    os.environ[COMMAND_ENV] = shlex.join(shown if parser.prog.startswith("coreecg-") else ["python", *shown])
    return args


def resolve_config(parser: argparse.ArgumentParser, args: argparse.Namespace,
                   flags: dict[str, tuple[str, object]] | None = None) -> Config:
    """The config of a config-driven job: defaults < --config < --set < the job's `flags`
    (see flag_overrides); exits 2 on a bad config, and 0 after printing it with --print-config."""
    overrides = flag_overrides(parser, args.overrides, flags or {})
    try:
        cfg = load_config(args.config, overrides)
    except (ConfigError, FileNotFoundError) as e:
        parser.exit(2, f"error: config: {e}\n")
    if getattr(args, "print_config", False):
        sys.stdout.write(cfg.to_yaml())
        parser.exit(0)
    return cfg


def flag_overrides(parser: argparse.ArgumentParser, overrides: list[str],
                   flags: dict[str, tuple[str, object]]) -> list[str]:
    """`overrides` (the --set list) plus `key=value` for every job flag that was given.

    flags: config key -> (the flag as the user typed it, its value; None = not given).
    Exits 2 with a message naming both when a --set sets a key a given flag also sets to another
    value (the same value both ways says one thing and stands).
    """
    set_keys = {o.partition("=")[0].strip(): o for o in overrides}
    out = list(overrides)
    for key, (flag, value) in flags.items():
        if value is None:
            continue
        if key in set_keys and set_keys[key].partition("=")[2].strip() != str(value):
            parser.exit(2, f"error: {key} is set twice: by {flag} and by --set {set_keys[key]}; give it one way\n")
        out.append(f"{key}={value}")
    return out


def fail(message: str, code: int = 2) -> int:
    sys.stderr.write(f"error: {message}\n")
    return code


# ---------------------------------------------------------------------------- sweep jobs


def sweep_parser(doc: str, default_space: str, default_output: str) -> argparse.ArgumentParser:
    """The parser of the sweep jobs (sweep.py, sweep_mask_rates.py, ablate.py): configs/sweep.yaml
    as the base config, a space file, the sweep folder, resume, concurrency."""
    p = job_parser(doc, default_config=shipped("configs/sweep.yaml"))
    p.add_argument("--space", default=str(shipped(f"tune_spaces/{default_space}")), help="search space YAML")
    p.add_argument("--corpus", help="the pretraining corpus of every trial (data.corpus; "
                                    "default: the embedded synthetic corpus)")
    p.add_argument("--output", default=default_output, help="sweep folder (results, plots, trials)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --output (after a crash)")
    p.add_argument("--concurrency", type=int, default=0, help="trials at once (0: what the cluster's CPUs allow)")
    p.add_argument("--gpus-per-trial", type=float, default=0.0, help="single-worker trials: e.g. 0.25 or 1")
    return p


def sweep_settings(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """SweepSettings from a sweep job's arguments; --corpus joins the --set list (a conflict with
    a --set of data.corpus is an error), a bad config exits 2, --print-config prints and exits 0."""
    from coreecg.tune.sweep import SweepSettings

    corpus = str(Path(args.corpus).expanduser().resolve()) if args.corpus else None
    args.overrides = flag_overrides(parser, args.overrides, {"data.corpus": ("--corpus", corpus)})
    args.corpus = None            # now one of the overrides: resolve_config must not add it twice
    resolve_config(parser, args)
    return SweepSettings(output=Path(args.output).expanduser().resolve(), config_file=args.config,
                         base=list(args.overrides), concurrency=args.concurrency,
                         gpus_per_trial=args.gpus_per_trial, resume=args.resume)
