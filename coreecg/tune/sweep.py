"""Running a sweep on Ray Tune (one cluster for all its trials) and collecting its results.

    results = run_sweep(SweepSettings(output=Path("sweeps/mask"), config_file="configs/sweep.yaml"),
                        param_space={"methods.core.masking.p_time": tune.grid_search([...]), ...})

Layout of a sweep folder (`--output`):
    tune/            Ray Tune's experiment (state, per-trial results): what --resume restores
    trials/<id>/     each trial's pretraining run folder: config.yaml, metrics.jsonl, tensorboard/,
                     checkpoints (multi-worker trials), encoder.pt, done.json
    mlruns/          train.tracking=mlflow with no tracking_uri: every trial's MLflow run
    results.csv      one row per trial (parameters, seed, final/best probe_auroc, steps, wall time,
                     status, error)
and the sweep's plots and tables (written by jobs/).
"""
from __future__ import annotations

import csv
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coreecg.config import Config, load_config
from coreecg.eval.objectives import needs_layers, objective_directions
from coreecg.train.tracking import track_trials
from coreecg.tune.trials import TrialSpec, concurrency_for, cpus_per_trial, error_text, run_trials
from coreecg.cluster import find_devices, init_ray, resolve_devices
from coreecg.override_paths import absolute_overrides
from coreecg.data.locate import training_corpus
from coreecg.tune.storage import STUDY_FILE

# Lazy imports: ray (the `ray` extra): jobs/sweep.py's --help and the light install import this module
# without it.

EXPERIMENT = "tune"
# Every report is an epoch end with probe_auroc, so ASHA can compare and stop trials at every epoch.
FORCED = ("train.eval_every_epochs=1", "train.checkpoint_every_steps=0")
METRIC = "probe_auroc"
# What every sweep may optimise (each is in every epoch's report) and in which direction: the
# registered objectives (coreecg.eval.objectives: the probe, kNN, RankMe, plugins'), and the loss;
# the loss terms the method reports (its registry entry's `reported_losses`) join them, minimised.
def base_objectives() -> dict[str, str]:
    return {**objective_directions(), "loss": "min"}


OBJECTIVES = base_objectives()          # the built-ins, for help texts (plugins add theirs once imported)

log = logging.getLogger(__name__)


class SweepError(ValueError):
    """A sweep that cannot start (its folder, its options); the message says why."""


@dataclass
class SweepSettings:
    output: Path
    config_file: str | None
    base: list[str] = field(default_factory=list)
    concurrency: int = 0                     # 0: as many as the cluster's CPUs allow (at least 1)
    gpus_per_trial: float | str = 0.0        # single-worker trials: a fraction of a GPU, or auto (gpu_share)
    resume: bool = False
    metric: str = METRIC                     # the objective (`objectives`); its direction follows
    swept: tuple[str, ...] = ()              # the keys the search varies (a loss objective is checked against them)

    @property
    def mode(self) -> str:
        """The objective's direction: OBJECTIVES', else a method's loss term (minimised; whether the
        method reports it, `check_objective` decides before any trial starts)."""
        return base_objectives().get(self.metric, "min")


def reported_losses(config: Config) -> tuple[str, ...]:
    """The loss terms `config`'s method reports besides `loss` (its `reported_losses`)."""
    return config.method.reported_losses


def objectives(config: Config) -> dict[str, str]:
    """What a sweep of `config`'s method may optimise -> "max" or "min"."""
    return {**base_objectives(), **{k: "min" for k in reported_losses(config)}}


def check_objective(metric: str, config: Config, swept: tuple[str, ...] | list[str] = ()) -> str:
    """`metric`'s direction; SweepError naming what the method reports when it is not an objective,
    and when it is a loss whose scale a swept key moves (a temperature, a loss weight, the method
    itself: the method's `loss_scales`), naming the key and the objectives that stay comparable."""
    allowed = objectives(config)
    if metric not in allowed:
        plugins = f" (plugins imported: {', '.join(config.plugins)})" if config.plugins else ""
        raise SweepError(f"--metric {metric}: not an objective of pretrain.method={config.pretrain.method}, which "
                         f"reports {', '.join(reported_losses(config)) or 'no loss term'} besides loss; "
                         f"objectives: {', '.join(allowed)}. An objective of your own is registered by a module "
                         f"named in `plugins` (--set 'plugins=[my_objectives]', importable from the working "
                         f"folder or PYTHONPATH){plugins}: docs/sweeps.md, \"Objectives of your own\"")
    if metric not in objective_directions():                  # a loss: its scale may move with a key
        scale = set(config.method.loss_scales.get(metric, ())) | {"pretrain.method", "train.variant"}
        moving = [k for k in swept if k in scale]
        if moving:
            comparable = list(objective_directions())
            raise SweepError(f"--metric {metric}: the sweep varies {', '.join(moving)}, which changes the scale of "
                             f"{metric} itself, so trials would be ranked by the key, not by what they learned; "
                             f"objectives that stay comparable: {', '.join(comparable)}")
    return allowed[metric]


def check_sweep(settings: SweepSettings, param_space: dict[str, Any] | None = None) -> Config:
    """Everything a sweep can be refused for, checked before anything is written (no folder, no
    stored study: a refused sweep leaves nothing that a later one would silently reuse) -> the
    base config. SweepError: an objective the method does not report (or one a swept key
    rescales), a folder that already holds a sweep or an Optuna study without --resume, a
    --resume with nothing to resume."""
    out = settings.output.resolve()
    cfg = load_config(settings.config_file, settings.base)
    check_objective(settings.metric, cfg, (*settings.swept, *(param_space or {})))
    if settings.resume:
        if not tune_can_restore(out / EXPERIMENT):
            raise SweepError(f"{out / EXPERIMENT}: no sweep to resume here (run without --resume to start one)")
        return cfg
    for held in (out / EXPERIMENT, out / STUDY_FILE):
        if held.exists():
            raise SweepError(f"{held} exists: {out} holds a sweep; pass --resume to continue it, or another "
                             "--output")
    return cfg


def run_sweep(settings: SweepSettings, param_space: dict[str, Any], *, search_alg=None, scheduler=None,
              num_samples: int = 1, checked: Config | None = None):
    """Fit (or, with settings.resume, restore and continue) the sweep -> Tune's ResultGrid. The
    devices are chosen once, before Ray starts (coreecg.cluster: the console's first lines), and
    every trial resolves train.use_gpu / train.num_workers "auto" with the same facts. `checked`:
    what `check_sweep` returned to a caller that wrote something after it (jobs/sweep.py's stored
    study), else the sweep is checked here."""
    out = settings.output.resolve()
    cfg = checked if checked is not None else check_sweep(settings, param_space)
    devices = find_devices()                 # joins a shared cluster; else before this job's own starts
    cfg, lines = resolve_devices(cfg, devices)
    for line in lines:
        log.info("%s", line)
    concurrency = concurrency_for(cfg, settings.concurrency)
    init_ray(concurrency * cpus_per_trial(cfg), reserve_for_data=concurrency + 1, gpus=devices.gpus)
    common = dict(storage=out, name=EXPERIMENT, config=cfg, concurrency=concurrency,
                  gpus_per_trial=settings.gpus_per_trial, label="trials", metric=settings.metric)
    if settings.resume:
        log.info("resuming the sweep in %s: finished trials are kept, unfinished ones continue", out / EXPERIMENT)
        return run_trials({}, restore=True, **common)
    out.mkdir(parents=True, exist_ok=True)
    config_file = str(Path(settings.config_file).expanduser().resolve()) if settings.config_file else None
    # with train.tracking, each trial is one tracked run grouped under the sweep folder's name
    spec = TrialSpec(task="pretrain", config_file=config_file, storage=str(out / "trials"), require_probe=True,
                     overrides=(*absolute_data_paths(settings), *FORCED, *metric_overrides(settings.metric),
                                *track_trials(cfg, out, out.name)),
                     devices=devices.to_dict())
    return run_trials({**param_space, "run": spec.to_dict()}, mode=settings.mode, search_alg=search_alg,
                      scheduler=scheduler, num_samples=num_samples, **common)


def tune_can_restore(experiment: Path) -> bool:
    from ray import tune

    return tune.Tuner.can_restore(str(experiment))


def metric_overrides(metric: str) -> list[str]:
    """What a trial must compute for `metric` to be reported: every layer's probe embeddings for
    an objective that needs them (layer_probe_auroc), else nothing."""
    return ["data.probe_layers=true"] if needs_layers(metric) else []


def absolute_data_paths(settings: SweepSettings) -> list[str]:
    """The base overrides plus absolute corpus paths: trials run in working folders of their own
    (and, on a cluster, on other nodes: the corpora must be on shared storage). The embedded
    synthetic corpus is built here once, not once per trial."""
    cfg = load_config(settings.config_file, settings.base)
    fixed = [f"data.corpus={training_corpus(cfg)}", f"data.cache_dir={cfg.data.cache_dir}",
             *([f"data.probe_corpus={cfg.data.probe_corpus}"] if cfg.data.probe_corpus else [])]
    return [*settings.base, *absolute_overrides(fixed)]


# ---------------------------------------------------------------------------- results


def _status(result, epochs: int) -> str:
    if result.error is not None:
        return "error"
    m = result.metrics or {}
    done = int(m.get("epoch", 0))       # epochs count from 1
    if done >= epochs:
        return "completed"
    return "stopped_collapse" if m.get("collapsed", 0) >= 1 else "stopped_early"


def result_rows(grid, params: list[str], settings: SweepSettings) -> list[dict[str, Any]]:
    """One row per trial: trial_id, status, the parameters, seed, probe_auroc (final, best, at
    init), the last epoch's value of every objective (registered ones, plugins' included, with
    the keys they also report; the loss and its terms) and of the sweep's own metric, the
    objective's best over the trial's epochs, steps, epochs, wall seconds, run folder, error.
    The sweep's metric is always a column: the ranking (`rank_rows`) reads it."""
    cfg = load_config(settings.config_file, settings.base)
    rows = []
    for result in grid:
        conf, m = result.config or {}, result.metrics or {}
        trial_id = m.get("trial_id") or Path(result.path).name
        history = result.metrics_dataframe
        best = float(history[METRIC].max()) if history is not None and METRIC in history else math.nan
        rows.append({
            "trial_id": trial_id, "status": _status(result, cfg.optim.epochs),
            **{p: conf.get(p) for p in params},
            "seed": conf.get("train.seed", cfg.train.seed),
            "probe_auroc": _number(m.get(METRIC)), "probe_auroc_best": best,
            "probe_auroc_init": _number(m.get("probe_auroc_init")),
            **{k: _number(m.get(k)) for k in reported_columns(cfg, settings.metric) if k != METRIC},
            **_objective_columns(settings, history),
            "steps": m.get("step"), "epochs": int(m.get("epoch", 0)),
            "wall_s": m.get("wall_s", m.get("time_total_s")),     # a re-reported finished trial: its own
            "run_dir": str(settings.output.resolve() / "trials" / trial_id),
            "error": error_text(result.error),
        })
    return sorted(rows, key=lambda r: r["trial_id"])


def reported_columns(config: Config, metric: str) -> list[str]:
    """The final values results.csv keeps: every objective a sweep of `config` may optimise (the
    registered ones and what they also report, the loss and the method's terms), `collapsed`, and
    `metric` itself wherever it comes from. From the registries, never a fixed list: a plugin's
    objective is a column as soon as its module is imported (issue 61)."""
    return list(dict.fromkeys([*objectives(config), "collapsed", metric]))


def _number(value: Any) -> float:
    """A reported value as a float (an int or a numpy scalar too), NaN where there is none."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _objective_columns(settings: SweepSettings, history) -> dict[str, float]:
    """`<metric>_best` over the trial's epochs when the sweep optimises something other than
    probe_auroc (probe_auroc_best is already a column). For reading: the ranking compares the
    final values at equal budget."""
    metric = settings.metric
    if metric == METRIC:
        return {}
    if history is None or metric not in history:
        return {f"{metric}_best": math.nan}
    column = history[metric]
    return {f"{metric}_best": float(column.max() if settings.mode == "max" else column.min())}


def write_results(rows: list[dict[str, Any]], path: Path) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, list(rows[0]) if rows else ["trial_id"])
        w.writeheader()
        w.writerows(rows)
    return path


def rank_rows(rows: list[dict[str, Any]], key: str = "probe_auroc", mode: str = "max") -> list[dict[str, Any]]:
    """The trials compared at equal budget: those that reached the largest number of epochs any
    trial with a `key` reached (ASHA stopped the others earlier), ranked by `key` at that epoch
    (their last report). Every row gets "compared_at_epoch" and "rank" (1 = best; None for a trial
    stopped before that budget, however high its early score). -> the compared rows, best first."""
    scored = [r for r in rows if isinstance(r.get(key), float) and not math.isnan(r[key])]
    budget = max((int(r.get("epochs") or 0) for r in scored), default=0)
    compared = sorted((r for r in scored if int(r.get("epochs") or 0) == budget),
                      key=lambda r: r[key], reverse=mode == "max")
    ranks = {id(r): i for i, r in enumerate(compared, start=1)}
    for r in rows:
        r["compared_at_epoch"], r["rank"] = budget or None, ranks.get(id(r))
    return compared


def best_row(rows: list[dict[str, Any]], key: str = "probe_auroc", mode: str = "max") -> dict[str, Any] | None:
    """The best trial at equal budget (`rank_rows`): never one ASHA stopped before trials that ran further."""
    compared = rank_rows(rows, key, mode)
    return compared[0] if compared else None
