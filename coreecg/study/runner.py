"""Running a study: its corpora, then every pretraining, then every fine-tuning whose encoder
exists, as Ray Tune trials on one cluster; a failed run is recorded and the others go on.

Layout of a study folder (`--output`):
    study.json                  the validated study: its runs and their overrides
    corpora/<name>/             downstream corpora the study built (resumable builds)
    runs/pretrain/<run>/        pretraining run folders (checkpoints, encoder.pt, done.json)
    runs/finetune/<run>/        fine-tuning run folders (checkpoints, metrics.json, predictions.csv)
    tune/<phase>-<attempt>/     Ray Tune's experiment of each phase and attempt
    runs.csv                    one row per run: phase, run, status, error, seconds, run folder
    report/                     tables, figures and their index (coreecg.study.report)

A run is finished when its marker exists (pretraining: done.json; fine-tuning: metrics.json).
`--resume` re-plans the same study and starts only unfinished runs, each from the latest
checkpoint in its own run folder (trials write checkpoints there, not into Tune's folders), so a
driver killed at any point, SIGKILL included, loses at most a checkpoint interval and re-runs no
finished run.
"""
from __future__ import annotations

import csv
import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from coreecg.config import load_config
from coreecg.study.spec import FinetuneRun, PretrainRun, Study

log = logging.getLogger(__name__)
DONE = {"pretrain": "done.json", "finetune": "metrics.json"}


class StudyRunError(ValueError):
    """A study folder that cannot be used (exists without --resume, holds another study)."""


def run_dir(output: Path, phase: str, name: str) -> Path:
    return output / "runs" / phase / name


def is_done(output: Path, phase: str, name: str) -> bool:
    return (run_dir(output, phase, name) / DONE[phase]).is_file()


def describe(study: Study) -> dict[str, Any]:
    """The study as plain data (study.json): what a resumed study must equal."""
    return {"name": study.name, "file": str(study.path), "config": study.config_file,
            "pretrain": {r.name: study.pretrain_overrides(r) for r in study.pretrain_runs()},
            "finetune": {r.name: {**asdict(r), "encoder": r.encoder.name if r.encoder else None,
                                  "overrides": study.finetune_overrides(r)}
                         for r in [*study.finetune_runs(), *study.mask_rate_runs()]},
            "corpora": [asdict(c) for c in study.corpora]}


def prepare_folder(study: Study, output: Path, resume: bool) -> None:
    state = output / "study.json"
    wanted = json.loads(json.dumps(describe(study)))     # tuples read back as lists
    if state.is_file():
        if not resume:
            raise StudyRunError(f"{output} holds a study: pass --resume to continue it, or another --output")
        saved = json.loads(state.read_text())
        changed = [k for k in ("pretrain", "finetune", "corpora") if saved.get(k) != wanted[k]]
        if changed:
            raise StudyRunError(f"{output}: holds another study ({', '.join(changed)} differ from {study.path}); "
                                "use another --output")
    elif resume:
        raise StudyRunError(f"{output}: no study to resume here (run without --resume to start one)")
    output.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(wanted, indent=1) + "\n")


# ---------------------------------------------------------------------------- corpora


def build_corpora(study: Study, output: Path) -> dict[str, Path]:
    """Each downstream corpus: its path, or the study's own build (skipped when finished)."""
    from coreecg.data.pipeline import build_corpus

    out = {}
    for c in study.corpora:
        if c.path:
            out[c.name] = Path(c.path)
            continue
        dest = output / "corpora" / c.name
        if not (dest / "manifest.json").is_file():
            log.info("building corpus %s from %s (%s)", c.name, c.input, c.source)
        cfg = load_config(study.config_file, [*study.base, *c.set, *study.extra])
        build_corpus(c.source, c.input, dest, cfg.data,
                     source_options=cfg.data.sources.for_source(c.source, cfg.data.synthetic_records))
        out[c.name] = dest
    return out


# ---------------------------------------------------------------------------- the trial


def study_trial(trial: dict[str, Any]) -> None:
    """Tune function trainable: one run of the study (trial["run"]: phase, name, config file,
    overrides, run folder). Reports every epoch; checkpoints go to the run folder."""
    from ray import tune

    spec = trial["run"]
    out = Path(spec["run_dir"])
    overrides = [*spec["overrides"], f"train.storage_path={out.parent}", f"train.name={out.name}"]
    cfg = load_config(spec["config_file"], overrides)
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "trials.jsonl", "a") as f:        # every attempt's start (bench/study.py reads it)
        f.write(json.dumps({"event": "trial_start", "time": round(time.time(), 3)}) + "\n")
    if spec["phase"] == "pretrain":
        from coreecg.train.pretraining import plan_pretrain

        plan = plan_pretrain(cfg)
    else:
        from coreecg.train.finetuning import plan_finetune

        plan = plan_finetune(cfg)
    last = _fit_in_process(plan) if cfg.train.num_workers == 1 else _fit_on_train(plan)
    if spec["phase"] == "pretrain":
        (out / DONE["pretrain"]).write_text(json.dumps({**last, "wall_s": time.perf_counter() - t0}))
    elif not (out / DONE["finetune"]).is_file():
        raise RuntimeError(f"{out}: fine-tuning ended without metrics.json")
    tune.report({"finished": 1.0, "wall_s": time.perf_counter() - t0})


def _fit_on_train(plan) -> dict[str, Any]:
    from ray.tune.integration.ray_train import TuneReportCallback

    from coreecg.train.distributed import build_trainer

    result = build_trainer(plan, callbacks=[TuneReportCallback()]).fit()
    return {k: v for k, v in (result.metrics or {}).items() if isinstance(v, (int, float))}


def _fit_in_process(plan) -> dict[str, Any]:
    """The loop in the trial's process (no Train worker group), checkpoints in the run folder."""
    from ray import tune
    from ray.data import DataContext

    from coreecg.devices import trial_device
    from coreecg.train.distributed import run_task
    from coreecg.train.ingest import local_source, training_dataset
    from coreecg.train.plan import checkpoint_dirs, write_run_folder

    cfg, folder = plan.config, write_run_folder(plan)
    device = trial_device(cfg.train.use_gpu)
    ctx = DataContext.get_current()
    ctx.enable_progress_bars = ctx.enable_operator_progress_bars = False
    data = local_source(training_dataset(plan.corpus, cfg.train.seed, cfg.data.cache_in_memory_gb,
                                          keep=plan.keep))
    last: dict[str, Any] = {}

    def report(metrics: dict[str, float], checkpoint=None, checkpoint_dir_name: str | None = None) -> None:
        if checkpoint is not None:            # into the run folder, atomically; keep the newest few
            dest = folder / checkpoint_dir_name
            tmp = folder / f".{checkpoint_dir_name}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(checkpoint.path, tmp)
            tmp.rename(dest)
            for old in checkpoint_dirs(folder)[:-cfg.train.keep_checkpoints]:
                shutil.rmtree(old)
        last.clear()
        last.update({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        tune.report(metrics)

    run_task(plan, data, 0, 1, device, report_fn=report, get_checkpoint=lambda: None, checkpoint_cls=tune.Checkpoint)
    return dict(last)


# ---------------------------------------------------------------------------- phases


def _resources(cfg) -> tuple[dict[str, float], int]:
    """Per-trial resources and concurrency from the config (as the sweeps do)."""
    import os

    import ray

    t = cfg.train
    if t.num_workers == 1:
        per = {"cpu": t.cpus_per_worker, "gpu": 1.0 if t.use_gpu else 0.0}
        need = t.cpus_per_worker
    else:   # Train-in-Tune: the TorchTrainer's workers hold the resources
        per, need = {"cpu": 0.1}, t.num_workers * t.cpus_per_worker
    cpus = ray.cluster_resources().get("CPU", os.cpu_count() or 1) if ray.is_initialized() else (os.cpu_count() or 1)
    return per, max(1, int(cpus // (need + 1)))     # one CPU per running trial left to Ray Data


def run_phase(output: Path, phase: str, config_file: str | None, runs: list[tuple[str, list[str]]],
              concurrency: int = 0, tune_dir: Path | None = None) -> list[dict[str, Any]]:
    """Run (name, overrides) pairs of one phase (pretrain | finetune) as Tune trials, each in
    `output/runs/<phase>/<name>/`, Tune's experiment in `tune_dir/<phase>-<attempt>` (default
    output/tune) -> one row per run. Resources per trial come from the first run's config."""
    from ray import tune

    if not runs:
        return []
    first = load_config(config_file, runs[0][1])
    per, auto = _resources(first)
    concurrency = concurrency or auto
    tune_dir = tune_dir or output / "tune"
    attempt = 1 + sum(1 for p in tune_dir.glob(f"{phase}-*")) if tune_dir.is_dir() else 1
    specs = [{"phase": phase, "name": name, "config_file": config_file, "overrides": overrides,
              "run_dir": str(run_dir(output, phase, name))} for name, overrides in runs]
    tuner = tune.Tuner(
        tune.with_resources(study_trial, per),
        param_space={"run": tune.grid_search(specs)},
        tune_config=tune.TuneConfig(max_concurrent_trials=concurrency,
                                    trial_dirname_creator=lambda t: t.config["run"]["name"][:120]),
        run_config=tune.RunConfig(name=f"{phase}-{attempt}", storage_path=str(tune_dir),
                                  # a run whose process or node died restarts from its checkpoint
                                  failure_config=tune.FailureConfig(max_failures=first.train.max_failures),
                                  verbose=0,
                                  callbacks=[_progress(phase, len(runs))]),
    )
    t0 = time.perf_counter()
    grid = tuner.fit()
    rows = []
    for result in grid:
        spec = (result.config or {}).get("run", {})
        name = spec.get("name", Path(result.path).name)
        done = is_done(output, phase, name)
        rows.append({"phase": phase, "run": name, "status": "done" if done else "failed",
                     "error": _error_text(result.error) if not done else "",
                     "seconds": (result.metrics or {}).get("wall_s", ""), "run_dir": str(run_dir(output, phase, name))})
    log.info("%s: %d run(s) in %.0f s", phase, len(rows), time.perf_counter() - t0)
    return rows


def _progress(phase: str, total: int):
    from ray import tune

    class Progress(tune.Callback):
        done = 0

        def on_trial_complete(self, iteration, trials, trial, **info):
            self.done += 1
            log.info("[%s %d/%d] %s finished", phase, self.done, total, trial.config["run"]["name"])

        def on_trial_error(self, iteration, trials, trial, **info):
            self.done += 1
            log.warning("[%s %d/%d] %s FAILED (recorded in runs.csv)", phase, self.done, total,
                        trial.config["run"]["name"])

    return Progress()


def _error_text(error: BaseException | None) -> str:
    if error is None:
        return "no result"
    cause = getattr(error, "cause", None) or error
    text = str(cause).strip()
    return f"{type(cause).__name__}: {text.splitlines()[-1] if text else ''}"[:1000]


def write_runs_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    fields = ["phase", "run", "status", "error", "seconds", "run_dir"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    return path


def run_study(study: Study, output: str | Path, *, resume: bool = False, concurrency: int = 0) -> list[dict]:
    """Corpora, pretraining, fine-tuning; -> one row per run (runs.csv). Finished runs are kept."""
    from coreecg.cluster import init_ray

    output = Path(output).resolve()
    prepare_folder(study, output, resume)
    cfg = load_config(study.config_file, [*study.base, *study.extra])
    init_ray(cfg.train.num_workers * cfg.train.cpus_per_worker)
    corpora = build_corpora(study, output)
    from coreecg.data.locate import training_corpus

    for r in study.pretrain_runs():     # the embedded synthetic corpus is built here once, not per trial
        training_corpus(load_config(study.config_file, study.pretrain_overrides(r)))
    rows = []

    def finished(phase: str, name: str) -> dict[str, Any]:
        return {"phase": phase, "run": name, "status": "done", "error": "", "seconds": "",
                "run_dir": str(run_dir(output, phase, name))}

    pending = []
    for r in study.pretrain_runs():
        if is_done(output, "pretrain", r.name):
            rows.append(finished("pretrain", r.name))
        else:
            pending.append((r.name, study.pretrain_overrides(r)))
    log.info("pretraining: %d run(s), %d finished before", len(study.pretrain_runs()), len(study.pretrain_runs()) - len(pending))
    rows += run_phase(output, "pretrain", study.config_file, pending, concurrency)

    pending = []
    finetunes = [*study.finetune_runs(), *study.mask_rate_runs()]
    for r in finetunes:
        if is_done(output, "finetune", r.name):
            rows.append(finished("finetune", r.name))
            continue
        extra = [f"data.corpus={corpora[r.corpus]}"]
        if r.encoder is not None:
            encoder = run_dir(output, "pretrain", r.encoder.name) / "encoder.pt"
            if not is_done(output, "pretrain", r.encoder.name) or not encoder.is_file():
                rows.append({**finished("finetune", r.name), "status": "skipped",
                             "error": f"its encoder's pretraining ({r.encoder.name}) did not finish"})
                continue
            extra.append(f"finetune.encoder={encoder}")
        pending.append((r.name, study.finetune_overrides(r, extra)))
    log.info("fine-tuning: %d run(s), %d to run", len(finetunes), len(pending))
    rows += run_phase(output, "finetune", study.config_file, pending, concurrency)
    write_runs_csv(rows, output / "runs.csv")
    return rows


__all__ = ["run_study", "study_trial", "StudyRunError", "PretrainRun", "FinetuneRun"]
