"""The Tune trial: one pretraining on the shared loop, judged by its representation probe.

`pretrain_trial(trial_config)` is a Tune function trainable (importable from this module, as
`Tuner.restore` needs). trial_config holds the trial's parameters (dotted config keys, e.g.
"masking.p_time", or "variant": an ablation variant's name) plus a constant "sweep" entry:
{config_file, base (overrides), storage (the sweep's trials folder), variants (name -> overrides)}. The trial's run folder is `<storage>/<trial id>`, so a restarted trial
finds its own checkpoints.

Two ways to run, chosen by `train.num_workers`:
- 1: the loop runs in the trial's own process (no Train worker group: no per-trial Train
  start-up), reading the corpus through Ray Data and reporting with `ray.tune.report`; resources
  per trial: `train.cpus_per_worker` CPUs and `sweep.gpus_per_trial` GPUs (a fraction is fine).
- > 1: a TorchTrainer (DDP over num_workers workers) built by the pretraining driver and fitted
  here, its reports forwarded to Tune by TuneReportCallback (Ray 2.60: Train inside Tune).
Every report is an epoch end with `probe_auroc` (the trial forces `train.eval_every_epochs=1` and
`train.checkpoint_every_steps=0`), so ASHA can compare and stop trials at every epoch.

A finished trial writes `done.json` (its last report); a trial restarted after that (a sweep
resumed after its driver died before Tune recorded the finish) reports it again and trains no
step.
"""
from __future__ import annotations

import json
import time
from typing import Any

from coreecg.config import Config
from coreecg.tune.spaces import trial_config

DONE_FILE = "done.json"
FORCED = ["train.eval_every_epochs=1", "train.checkpoint_every_steps=0"]


def resolve(trial: dict[str, Any], trial_id: str) -> Config:
    """The trial's config: config file, base overrides, forced settings, the trial's parameters."""
    sweep = trial["sweep"]
    params = {k: v for k, v in trial.items() if k not in ("sweep", "variant")}
    base = [*sweep["base"], *FORCED, f"train.storage_path={sweep['storage']}", f"train.name={trial_id}"]
    if "variant" in trial:          # an ablation variant: its overrides and its name
        name = trial["variant"]
        base += [*sweep["variants"][name], f"train.variant={name}"]
    return trial_config(sweep["config_file"], base, params)


def pretrain_trial(trial: dict[str, Any]) -> None:
    """Tune function trainable (see the module docstring)."""
    from ray import tune

    cfg = resolve(trial, tune.get_context().get_trial_id())
    run_dir = cfg.train.run_dir
    done = run_dir / DONE_FILE
    if done.is_file():
        tune.report(json.loads(done.read_text()))
        return
    t0 = time.perf_counter()
    last = _pretrain_in_process(cfg) if cfg.train.num_workers == 1 else _pretrain_on_train(cfg)
    if last:
        done.write_text(json.dumps({**last, "trial_wall_s": time.perf_counter() - t0}))


def _pretrain_on_train(cfg: Config) -> dict[str, Any]:
    from ray.tune.integration.ray_train import TuneReportCallback

    from coreecg.train.distributed import build_trainer
    from coreecg.train.pretraining import plan_pretrain

    result = build_trainer(plan_pretrain(cfg), callbacks=[TuneReportCallback()]).fit()
    return {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}


def _pretrain_in_process(cfg: Config) -> dict[str, Any]:
    """The loop in this process: the same plan and task as a Train worker of rank 0."""
    import logging

    from ray import tune
    from ray.data import DataContext

    from coreecg.devices import trial_device
    from coreecg.train.distributed import run_task
    from coreecg.train.ingest import local_source, training_dataset
    from coreecg.train.plan import write_run_folder
    from coreecg.train.pretraining import plan_pretrain

    plan = plan_pretrain(cfg)
    if plan.probe_corpus is None:
        raise ValueError(f"{plan.corpus}: a sweep trial is judged by probe_auroc, but the corpus has no labels; "
                         "set data.probe_corpus")
    write_run_folder(plan)
    device = trial_device(cfg.train.use_gpu)
    ctx = DataContext.get_current()        # the sweep's console shows trials, not Ray Data progress
    ctx.enable_progress_bars = ctx.enable_operator_progress_bars = False
    for name in ("ray.data", "ray.tune", "ray.train"):
        logging.getLogger(name).setLevel(logging.WARNING)
    data = local_source(training_dataset(plan.corpus, cfg.train.seed, cfg.data.cache_in_memory_gb))
    last = {}

    def report(metrics: dict[str, float], checkpoint=None) -> None:
        last.clear()
        last.update(metrics)
        tune.report(metrics, checkpoint=checkpoint)

    run_task(plan, data, 0, 1, device, report_fn=report, get_checkpoint=tune.get_checkpoint,
             checkpoint_cls=tune.Checkpoint)
    return dict(last)
