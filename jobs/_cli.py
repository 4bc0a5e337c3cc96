"""Shared command-line plumbing for jobs/: --config FILE, repeated --set a.b=c, and a job's own flags.

One merge order for every job: the paper defaults (coreecg/config.py), then --config FILE, then
each --set a.b=c, then the job's own flags (e.g. jobs/finetune.py's --seed, which is train.seed).
A flag left out sets nothing, so a --set of its key stands; a key given both as a --set and as a
flag is an error that names both (exit 2), never a silent override."""
from __future__ import annotations

import argparse

from coreecg.config import Config, ConfigError, load_config


def config_parser(description: str) -> argparse.ArgumentParser:
    """The parser every config-driven job starts from; also turns on the console (coreecg's INFO
    lines on stdout, `coreecg.log`)."""
    from coreecg.log import console

    console()
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", help="YAML file layered over the paper defaults")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=C",
                   help="override one config value (repeatable), e.g. --set masking.p_time=0.6")
    return p


def parse_config(parser: argparse.ArgumentParser, argv=None) -> tuple[argparse.Namespace, Config]:
    args = parser.parse_args(argv)
    try:
        return args, load_config(args.config, args.overrides)
    except (ConfigError, FileNotFoundError) as e:
        parser.exit(2, f"error: config: {e}\n")


def flag_overrides(parser: argparse.ArgumentParser, overrides: list[str],
                   flags: dict[str, tuple[str, object]]) -> list[str]:
    """`overrides` (the --set list) plus `key=value` for every job flag that was given.

    flags: config key -> (the flag as the user typed it, its value; None = not given).
    Exits 2 with a message naming both when a --set sets a key a given flag also sets.
    """
    set_keys = {o.partition("=")[0].strip(): o for o in overrides}
    out = list(overrides)
    for key, (flag, value) in flags.items():
        if value is None:
            continue
        if key in set_keys:
            parser.exit(2, f"error: {key} is set twice: by {flag} and by --set {set_keys[key]}; give it one way\n")
        out.append(f"{key}={value}")
    return out
