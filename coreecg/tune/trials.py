"""The one way a sweep, an ablation, a mask-rate grid or a study runs its trainings: Ray Tune
trials of `run_trial`, started by `run_trials`.

A trial's config is {"run": TrialSpec as a dict, **params}: the spec is what every trial of the
experiment shares or, for a study, grid-searched per run; params are what a searcher samples
(dotted config keys such as "methods.core.masking.p_time"). The trial:
- builds its config: config file, the spec's overrides, its params, its run folder (the spec's
  `run_dir`, or `<storage>/<trial id>`: a retried or restored trial finds its own folder), its
  devices resolved with the driver's facts (the spec's `devices`: `coreecg.cluster.Devices`), so
  every trial of an experiment gets the same train.use_gpu and train.num_workers for "auto";
- returns at once if its run folder holds `done.json` (a finished trial whose end Tune did not
  record: its last report is sent again and no step is trained);
- plans the run (pretraining or fine-tuning) and fits it with `coreecg.train.fit.fit`: in its
  own process when `train.num_workers` is 1 (no Train worker group to start), else a
  TorchTrainer whose reports Tune receives through TuneReportCallback. Either way every epoch
  is reported (ASHA compares trials there) and checkpoints live in the run folder, so a trial
  that dies is retried (`train.max_failures`) from its newest checkpoint;
- writes done.json: the last epoch's metrics and the trial's wall time.
Every attempt's start is a line of the run folder's trials.jsonl (bench/study.py reads it).
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from coreecg.config import Config, load_config
from coreecg.files import write_json
from coreecg.train.failures import RunFailed, deterministic_cause, record_failure, recorded_failure
from coreecg.tune.gpu_share import AUTO as AUTO_GPUS, auto_gpus_per_trial
from coreecg.tune.spaces import overrides_for
from coreecg.cluster import Devices, check_gpus, find_devices, resolve_devices, with_devices

# Lazy imports: ray (the `ray` extra) and the training entry point (train.fit: 2,000 modules more for
# jobs/sweep.py's --help), where a trial runs.

log = logging.getLogger(__name__)
DONE_FILE = "done.json"


@dataclass(frozen=True)
class TrialSpec:
    """What a trial runs; plain data inside Tune's param_space."""

    task: str                                   # "pretrain" | "finetune"
    config_file: str | None                     # absolute: trials run in folders of their own
    overrides: tuple[str, ...] = ()
    run_dir: str = ""                           # "" : <storage>/<trial id>
    storage: str = ""
    name: str = ""                              # the console's name of the run ("": the trial id)
    require_probe: bool = False                 # judged by probe_auroc: a corpus without labels is an error
    # The driver's coreecg.cluster.Devices (to_dict), found once for every trial; None: the trial
    # counts the cluster's GPUs itself (a sweep started before specs carried them)
    devices: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def is_done(run_dir: str | Path) -> bool:
    return (Path(run_dir) / DONE_FILE).is_file()


def read_done(run_dir: str | Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / DONE_FILE).read_text())


def build_trial_config(spec: dict[str, Any], params: dict[str, Any], run_dir: Path) -> Config:
    """The trial's config: config file, the spec's overrides, the sampled params, its folder, and
    its devices (train.use_gpu, train.num_workers where "auto") resolved with the spec's facts."""
    cfg = load_config(spec["config_file"], [*spec["overrides"], *overrides_for(params),
                                            f"train.storage_path={run_dir.parent}", f"train.name={run_dir.name}"])
    devices = Devices.from_dict(spec["devices"]) if spec.get("devices") else find_devices(join=False)
    return resolve_devices(cfg, devices)[0]


def run_trial(trial: dict[str, Any]) -> None:
    """The Tune function trainable (see the module docstring)."""
    from ray import tune

    spec = trial["run"]
    run_dir = Path(spec["run_dir"] or Path(spec["storage"]) / tune.get_context().get_trial_id())
    if is_done(run_dir):
        tune.report(read_done(run_dir))
        return
    attempt = f"job{_job_id()}"
    earlier = recorded_failure(run_dir, attempt)
    if earlier is not None:               # Tune's retry of a deterministic error: ended before it starts
        raise RunFailed(f"{earlier}; its first attempt under this driver failed so")
    cfg = build_trial_config(spec, {k: v for k, v in trial.items() if k != "run"}, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "trials.jsonl", "a") as f:        # every attempt's start (bench/study.py reads it)
        f.write(json.dumps({"event": "trial_start", "time": round(time.time(), 3)}) + "\n")
    t0 = time.perf_counter()
    last = _fit_once(spec, cfg, run_dir, attempt)
    write_json(run_dir / DONE_FILE, {**last, "wall_s": time.perf_counter() - t0})


def _fit_once(spec: dict[str, Any], cfg: Config, run_dir: Path, attempt: str) -> dict[str, Any]:
    """_fit, recording a deterministic error (coreecg.train.failures) under `attempt`, this
    driver's Ray job: Tune restarts a failed trial `train.max_failures` times whatever the error,
    and a restart under the same driver then ends at its start (run_trial). A later command (a fixed
    config, --resume) tries again."""
    try:
        return _fit(spec, cfg)
    except Exception as e:
        cause = deterministic_cause(e)
        if cause is None:
            raise
        record_failure(run_dir, attempt, None, cause)
        raise RunFailed(cause) from e


def _job_id() -> str:
    import ray

    return ray.get_runtime_context().get_job_id()


def _fit(spec: dict[str, Any], cfg: Config) -> dict[str, Any]:
    from ray import tune

    from coreecg.train.fit import PLANNERS, fit

    plan = PLANNERS[spec["task"]](cfg)
    if spec["require_probe"] and plan.probe_corpus is None:
        raise ValueError(f"{plan.corpus}: a sweep trial is judged by probe_auroc, but the corpus has no labels; "
                         "set data.probe_corpus")
    if cfg.train.num_workers == 1:
        from ray.data import DataContext

        ctx = DataContext.get_current()        # the console shows trials, not Ray Data progress
        ctx.enable_progress_bars = ctx.enable_operator_progress_bars = False
        for name in ("ray.data", "ray.tune", "ray.train"):
            logging.getLogger(name).setLevel(logging.WARNING)
        result = fit(plan, report_fn=tune.report)
    else:
        from ray.tune.integration.ray_train import TuneReportCallback

        result = fit(plan, callbacks=[TuneReportCallback()])
    return _numbers(result.metrics)


def _numbers(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float))}


# ---------------------------------------------------------------------------- running many


def trial_resources(config: Config, gpus_per_trial: float = 0.0) -> dict[str, float]:
    """What Tune reserves per trial. Multi-worker trials only drive their TorchTrainer, whose
    workers hold the resources (Train's placement groups are invisible to Tune: concurrency is
    the limit); Ray refuses an empty request, so the driver holds a tenth of a CPU. `config`: its
    devices resolved (coreecg.cluster.resolve_devices)."""
    t = config.train
    if t.num_workers == 1:
        return {"cpu": t.cpus_per_worker, "gpu": gpus_per_trial or (1.0 if t.use_gpu else 0.0)}
    return {"cpu": 0.1}


def cpus_per_trial(config: Config) -> int:
    return config.train.num_workers * config.train.cpus_per_worker


def concurrency_for(config: Config, requested: int = 0) -> int:
    """`requested`, else as many trials as the cluster's CPUs hold with one CPU per running trial
    left to Ray Data (a local cluster: this machine's cores)."""
    import ray

    if requested:
        return requested
    if ray.is_initialized():
        return max(1, int(ray.cluster_resources().get("CPU", 1) // (cpus_per_trial(config) + 1)))
    return max(1, (os.cpu_count() or 1) // cpus_per_trial(config))


def _stop_on_collapse(trial_id: str, result: dict[str, Any]) -> bool:
    """Tune's stopper under train.stop_on_collapse: an epoch whose evaluation found a collapse
    (a report without an evaluation carries no "collapsed" and never stops a trial)."""
    return float(result.get("collapsed", 0.0)) >= 1.0


def run_trials(param_space: dict[str, Any], *, storage: Path, name: str, config: Config, concurrency: int,
               gpus_per_trial: float | str = 0.0, metric: str | None = None, mode: str | None = None,
               search_alg=None, scheduler=None, num_samples: int = 1, restore: bool = False,
               label: str = "trials", total: int | None = None):
    """Run `run_trial` over `param_space` as the Tune experiment `storage/name` (restore=True:
    continue that experiment, its finished trials kept) -> Tune's ResultGrid. `config` (any of the
    trials' configs) sets each trial's resources and retries (train.max_failures)."""
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter


    config = with_devices(config)           # resolved by the caller (run_sweep, run_phase): unchanged
    if gpus_per_trial == AUTO_GPUS:          # packed by the trial's measured memory (a GpuShareError if it fits none)
        gpus_per_trial, why = auto_gpus_per_trial(config)
        log.info("%s", why)
    resources = trial_resources(config, gpus_per_trial)
    # One trial's GPUs at least (its own, or its Train workers'), else Tune queues them forever.
    t = config.train
    check_gpus(resources["gpu"] if t.num_workers == 1 else (t.num_workers if t.use_gpu else 0),
               f"each trial (train.use_gpu={str(t.use_gpu).lower()}, train.num_workers={t.num_workers}"
               f"{f', gpus_per_trial={gpus_per_trial:.3g}' if gpus_per_trial else ''})")
    trainable = tune.with_resources(run_trial, resources)
    callbacks = [_Progress.make(label, total, metric)]
    if restore:
        return tune.Tuner.restore(str(storage / name), trainable=trainable, resume_unfinished=True,
                                  resume_errored=False, restart_errored=False).fit()
    tuner = tune.Tuner(
        trainable, param_space=param_space,
        tune_config=tune.TuneConfig(metric=metric, mode=mode, search_alg=search_alg, scheduler=scheduler,
                                    num_samples=num_samples,
                                    # a ConcurrencyLimiter already limits (Tune warns when both do)
                                    max_concurrent_trials=None if isinstance(search_alg, ConcurrencyLimiter)
                                    else concurrency,
                                    trial_dirname_creator=_trial_dirname),
        run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=0, callbacks=callbacks,
                                  # a trial whose process or node died restarts from its newest
                                  # checkpoint; one that keeps failing is recorded as an error
                                  failure_config=tune.FailureConfig(max_failures=config.train.max_failures),
                                  # a collapsed encoder's trial ends at that epoch (train.stop_on_collapse)
                                  stop=_stop_on_collapse if config.train.stop_on_collapse else None))
    return tuner.fit()


def _trial_dirname(trial) -> str:
    return (trial.config["run"].get("name") or trial.trial_id)[:120]


def trial_name(trial) -> str:
    """A trial's name on the console: its run's name, else its id and sampled parameters."""
    name = trial.config["run"].get("name")
    params = {k: v for k, v in trial.config.items() if k != "run"}
    return name or f"trial {trial.trial_id} {params}"


class _Progress:
    """One console line per finished or failed trial (Tune's own tables are off: verbose=0)."""

    @staticmethod
    def make(label: str, total: int | None, metric: str | None):
        from ray import tune

        class Progress(tune.Callback):
            done = 0

            def _count(self) -> str:
                self.done += 1
                return f"[{label} {self.done}/{total}]" if total else f"[{label}: {self.done} done]"

            def on_trial_complete(self, iteration, trials, trial, **info):
                m = trial.last_result or {}
                score = f": {metric} {m.get(metric, math.nan):.4f} after {int(m.get('epoch', 0))} epoch(s)" \
                    if metric else ""
                log.info("%s %s finished%s, %.0f s", self._count(), trial_name(trial), score,
                         m.get("wall_s", m.get("time_total_s", 0)))

            def on_trial_error(self, iteration, trials, trial, **info):
                log.warning("%s %s FAILED (recorded with its error)", self._count(), trial_name(trial))

        return Progress()


def error_text(error: BaseException | None) -> str:
    """The root cause of a failed trial, one line (Ray wraps it in a RayTaskError with a traceback)."""
    if error is None:
        return ""
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip()
    return f"{type(cause).__name__}: {text.splitlines()[-1] if text else ''}"[:1000]
