"""Shared command-line plumbing for jobs/: --config FILE and repeated --set a.b=c."""
from __future__ import annotations

import argparse

from coreecg.config import Config, ConfigError, load_config


def config_parser(description: str) -> argparse.ArgumentParser:
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
