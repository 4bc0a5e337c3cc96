"""The command line every job shares: its help, its flags and the one merge order.

Each job's `--help` prints the job's whole module docstring as written (examples, outputs, exit
codes) and every flag with its help and real default, a shipped file's shown as the package names
it (`configs/quickstart.yaml`). A flag name means one thing in every job: `VOCABULARY` below
(docs/cli.md prints it; tests/test_vocabulary.py checks every job's parser against it). An old
spelling is an error naming the new one (`renamed`), never a silent other meaning.

One merge order for every config-driven job: the paper defaults, then --config FILE, then each
--set a.b=c, then the job's own flags (e.g. jobs/finetune.py's --seed, which is train.seed). A flag
left out sets nothing, so a --set of its key stands; a key given both as a --set and as a flag is
an error that names both (exit 2), never a silent override. --print-config needs none of the
job's required arguments: they are checked after it (`parse_args`).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
import shlex

from coreecg.config import Config, ConfigError, load_config
from coreecg.eval.fairness import UnfairTableError
from coreecg.log import console as _console
from coreecg.run_record import COMMAND_ENV
from coreecg.tune.gpu_share import GpuShareError, parse_gpus_per_trial

# Lazy imports: training, studies, sweeps, the checkpoint store and the corpus reader, in the functions that
# run them: every job's --help imports this module (about 200 modules, no torch); those add torch,
# Ray Data's readers and the tables (2-15 s; python -X importtime).

REPO = Path(__file__).resolve().parents[1]


def shipped(relative: str) -> Path:
    """A file the project ships beside the package (configs/, tune_spaces/, studies/): from the
    checkout when run from one, else from the installed copy (`coreecg/_shipped/`)."""
    in_checkout = REPO / relative
    if in_checkout.exists():
        return in_checkout
    installed = Path(__file__).resolve().parent / "_shipped" / relative
    return installed if installed.exists() else in_checkout


def gpus_per_trial(value: str) -> float | str:
    """--gpus-per-trial: a number of GPUs (0.25: a quarter) or "auto" (coreecg.tune.gpu_share)."""
    try:
        return parse_gpus_per_trial(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of GPUs >= 0 or 'auto'") from e


@dataclass(frozen=True)
class Flag:
    """One flag name's one meaning across jobs. says: words every job's help of it contains (the
    config key it sets, where it sets one); dest, type, metavar: as every job declares it."""

    meaning: str
    says: str
    dest: str | None = None          # None: argparse's own (--gpus-per-trial -> gpus_per_trial)
    type: type | None = None
    metavar: str | None = None


# Every flag more than one job takes, and the names whose meaning was once split between jobs.
# docs/cli.md's vocabulary table says the same; tests/test_vocabulary.py holds every parser to it.
VOCABULARY: dict[str, Flag] = {
    "--output": Flag("the folder (or file) the job writes", says=""),
    "--corpus": Flag("a preprocessed corpus the job reads (data.corpus where the job has a config)",
                     says="corpus", metavar="DIR"),
    "--split": Flag("which split(s) of a corpus the job reads: train, val, test", says="split"),
    "--input": Flag("raw records the job reads (a source's folder, WFDB files)", says="record"),
    "--model": Flag("the trained model the job reads: a run folder, encoder.pt, best.pt, a checkpoint or an "
                    "export folder (coreecg.loading)", says="model", metavar="PATH"),
    "--encoder": Flag("jobs/finetune.py only, as its config key finetune.encoder: what the classifier's "
                      "encoder starts from (a model source, none or random)", says="finetune.encoder",
                      metavar="PATH|none|random"),
    "--seed": Flag("the training seed, train.seed", says="train.seed", type=int, metavar="N"),
    "--seeds": Flag("a count: N replicates, train.seed, train.seed + 1, ...", says="train.seed", type=int,
                    metavar="N"),
    "--search-seed": Flag("a sweep's Optuna sampler seed", says="Optuna", type=int, metavar="N"),
    "--variants": Flag("a variants file (tune_spaces/ablations.yaml)", says="variants", metavar="FILE"),
    "--space": Flag("a sweep's search space or grid file (tune_spaces/*.yaml)", says="space", metavar="FILE"),
    "--finetune": Flag("labelled corpora a preset also fine-tunes on", says="fine-tune", metavar="CORPUS"),
    "--allow-overlap": Flag("train although pretraining and downstream data overlap (finetune.allow_overlap)",
                            says="finetune.allow_overlap"),
    "--resume": Flag("continue the sweep or study in --output", says="--output"),
    "--concurrency": Flag("trials at once", says="trials at once", type=int, metavar="N"),
    "--gpus-per-trial": Flag("GPUs each trial takes, or auto", says="trial", type=gpus_per_trial, metavar="G|auto"),
    "--precision": Flag("a trained model's inference path: auto, fp32, bf16 or int8 (inference.precision)",
                        says="precision"),
    "--config": Flag("a YAML config over the paper defaults", says="YAML"),
    "--set": Flag("one config value (repeatable)", says="config value", dest="overrides", metavar="A.B=C"),
    "--print-config": Flag("print the resolved config as YAML and exit", says="config"),
    "--verbose": Flag("Ray's own INFO lines and worker logs on the console too", says="Ray"),
    "--help": Flag("the job's docstring and every flag", says="help"),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The docstring as written (its examples keep their layout and line continuations) and every
    flag's real default, a file shipped with the package shown by its name there."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, False, argparse.SUPPRESS) or action.default == []:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: {shown_default(action.default).replace('%', '%%')})"
        return text


def shown_default(value: object) -> str:
    """A default as --help shows it: a path inside the checkout or the installed package's shipped
    files relative to it (configs/sweep.yaml), so no machine's folders appear in help."""
    if isinstance(value, (str, Path)) and Path(value).is_absolute():
        for root in (Path(__file__).resolve().parent / "_shipped", REPO):
            try:
                return str(Path(value).resolve().relative_to(root))
            except ValueError:
                continue
    return str(value)


def job_parser(doc: str, *, config: bool = True, default_config: str | Path | None = None,
               prog: str | None = None) -> argparse.ArgumentParser:
    """A job's parser: `doc` (its module docstring) as the help text, --verbose, and, for a
    config-driven job, --config (default `default_config`, else the paper defaults), --set and
    --print-config."""
    p = argparse.ArgumentParser(prog=prog or _prog(), description=doc, formatter_class=HelpFormatter)
    if config:
        p.add_argument("--config", default=str(default_config) if default_config else None,
                       help="YAML config over the paper defaults (docs/configuration.md)"
                       + ("" if default_config else "; none: the paper defaults"))
        p.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=C",
                       help="override one config value (repeatable), e.g. --set methods.core.masking.p_time=0.6")
        p.add_argument("--print-config", action="store_true",
                       help="print the resolved config (defaults < --config < --set < flags) as YAML and exit; "
                            "the job's required arguments are not needed")
    p.add_argument("--verbose", action="store_true",
                   help="also show Ray's INFO lines, worker logs and library warnings")
    return p


class _Renamed(argparse.Action):
    """An old spelling: giving it is an error naming the new one (exit 2)."""

    def __init__(self, option_strings, dest, new: str, old: str | None = None, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS)
        self.new, self.old = new, old or option_strings[0]

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{self.old} was renamed {self.new}")


def renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """`old` (a flag, or a positional's metavar) is spelled `new` now: giving it is an error that
    says so, never a silent other meaning (hidden from --help)."""
    if old.startswith("-"):
        parser.add_argument(old, action=_Renamed, new=new)
    else:
        parser.add_argument(f"renamed-{old}", action=_Renamed, new=new, old=f"the positional {old}")


def _prog() -> str:
    """`jobs/pretrain.py` run from a checkout, `coreecg-pretrain` as an installed command."""
    arg0 = Path(sys.argv[0])
    return f"jobs/{arg0.name}" if arg0.parent.name == "jobs" else arg0.name


def console(verbose: bool = False) -> None:
    """Turn on the job's console: coreecg's INFO lines on stdout; without --verbose, Ray's INFO
    lines and worker logs stay in Ray's log files (/tmp/ray/session_latest/logs)."""
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
    args = _parse(parser, argv)
    if getattr(args, "config", None):   # trials and workers run in folders of their own
        args.config = str(Path(args.config).expanduser().resolve())
    console(getattr(args, "verbose", False))
    # The run record's command line (coreecg.run_record), also in processes Ray starts.
    shown = [parser.prog, *(sys.argv[1:] if argv is None else argv)]
    os.environ[COMMAND_ENV] = shlex.join(shown if parser.prog.startswith("coreecg-") else ["python", *shown])
    return args


def _parse(parser: argparse.ArgumentParser, argv) -> argparse.Namespace:
    """parser.parse_args, except that with --print-config the job's required arguments are not
    required: the config it prints does not depend on them (a left-out one is None or [])."""
    if "--print-config" not in parser._option_string_actions:
        return parser.parse_args(argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=parser.allow_abbrev)
    pre.add_argument("--print-config", action="store_true")
    if not pre.parse_known_args(argv)[0].print_config:
        return parser.parse_args(argv)
    relaxed = [(a, a.nargs) for a in parser._actions if a.required]
    try:
        for a, nargs in relaxed:
            a.required = False
            if not a.option_strings:        # a positional: one or more -> any, one -> optional
                a.nargs = argparse.ZERO_OR_MORE if nargs == argparse.ONE_OR_MORE else argparse.OPTIONAL
        return parser.parse_args(argv)
    finally:
        for a, nargs in relaxed:
            a.required, a.nargs = True, nargs


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


def fit_job(config: Config, kind: str, input_errors: tuple[type[Exception], ...] = ()) -> Any | None:
    """A training job's run, `fit(plan_run(config, kind))` -> its FitResult; None (the job exits 2)
    after an "error: ..." line when the input is at fault: a CheckpointError, CorpusError, missing
    file or ValueError from planning, or a CheckpointError, CorpusError or one of `input_errors`
    that stopped a worker (the cause of Ray's TrainingFailedError, not its traceback), or a
    deterministic error that ended the run after one try (coreecg.train.failures.RunFailed). Any
    other failure propagates (exit 1)."""
    from coreecg.checkpoints import CheckpointError
    from coreecg.data.corpus import CorpusError
    from coreecg.extras import RAY_EXTRA_MODULES, TRAINING, require_ray_extra

    require_ray_extra(TRAINING, RAY_EXTRA_MODULES)      # before the driver's module imports Ray
    from coreecg.train.fit import fit, plan_run

    from coreecg.train.failures import RunFailed

    named = (CheckpointError, CorpusError, *input_errors)
    try:
        return fit(plan_run(config, kind))
    except (*named, FileNotFoundError, ValueError, RunFailed) as e:   # RunFailed: ended after one try, named
        error = e
    except Exception as e:   # ray.train.TrainingFailedError and friends: the cause, not the traceback
        error = getattr(e, "__cause__", None) or e
        if not isinstance(error, named):
            raise
    fail(str(error))
    return None


# ---------------------------------------------------------------------------- study jobs


def run_study_job(study: Any, output: str | Path, *, resume: bool = False, concurrency: int = 0,
                  gpus_per_trial: float | str = 0.0) -> int:
    """What jobs/study.py and its presets do with a loaded study: run it, write its report, say
    what finished -> the exit code (0 all runs finished, 1 some did not, 2 the folder cannot hold
    this study or the leakage guard refused; the error on stderr)."""
    from coreecg.data.overlap import LeakageError
    from coreecg.study.summary import write_study_report
    from coreecg.study.runner import StudyRunError, run_study

    output = Path(output).expanduser().resolve()
    masks = len(study.mask_rate_runs())      # the mask-rate figure's fine-tunings run too
    sys.stdout.write(f"study {study.name}: {len(study.pretrain_runs())} pretraining run(s), "
                     f"{len(study.finetune_runs()) + masks} fine-tuning run(s)"
                     f"{f' ({masks} for the mask-rate figure)' if masks else ''} -> {output}\n")
    try:
        rows = run_study(study, output, resume=resume, concurrency=concurrency, gpus_per_trial=gpus_per_trial)
    except (StudyRunError, LeakageError, GpuShareError) as e:
        return fail(str(e))
    bad = [r for r in rows if r["status"] != "done"]
    try:
        index = write_study_report(study, output)
    except UnfairTableError as e:     # checked before the runs; here only if --set changed between resumes
        return fail(f"{study.path}: {e}")
    sys.stdout.write(f"\n{len(rows) - len(bad)} of {len(rows)} run(s) finished; runs: {output / 'runs.csv'}\n")
    sys.stdout.flush()
    for r in bad:
        sys.stderr.write(f"  {r['status']}: {r['phase']} {r['run']}: {r['error']}\n")
    sys.stdout.write(f"report: {index}\n")
    return 1 if bad else 0


# ---------------------------------------------------------------------------- sweep jobs


def sweep_parser(doc: str, default_output: str, *, space: str | None = None) -> argparse.ArgumentParser:
    """The parser of the sweep jobs (sweep.py, sweep_mask_rates.py, ablate.py): configs/sweep.yaml
    as the base config, the sweep folder, resume, concurrency and, given `space`, --space (a
    tune_spaces/ file; ablate.py reads --variants instead)."""
    p = job_parser(doc, default_config=shipped("configs/sweep.yaml"))
    if space:
        p.add_argument("--space", default=str(shipped(f"tune_spaces/{space}")), metavar="FILE",
                       help="the search space or grid YAML")
    p.add_argument("--corpus", metavar="DIR", help="the pretraining corpus of every trial (data.corpus; "
                                                   "default: the embedded synthetic corpus)")
    p.add_argument("--output", default=default_output, help="sweep folder (results, plots, trials)")
    p.add_argument("--resume", action="store_true", help="continue the sweep in --output (after a crash)")
    p.add_argument("--concurrency", type=int, default=0, metavar="N",
                   help="trials at once (0: what the cluster's CPUs allow)")
    p.add_argument("--gpus-per-trial", type=gpus_per_trial, default=0.0, metavar="G|auto",
                   help="GPUs each trial takes (single-worker trials): e.g. 0.25 or 1; auto: as many trials "
                        "share a GPU as its memory holds, by the trial's measured memory (coreecg.tune.gpu_share)")
    return p


def replicate_seeds(parser: argparse.ArgumentParser, args: argparse.Namespace, count: int) -> list[int]:
    """--seeds N: the training seeds of N replicates, train.seed (of the resolved config), +1, ..."""
    if count < 1:
        parser.exit(2, f"error: --seeds {count}: needs at least 1\n")
    first = load_config(args.config, args.overrides).train.seed
    return list(range(first, first + count))


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
