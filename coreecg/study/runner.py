"""Running a study: its corpora, then every pretraining, then every fine-tuning whose encoder
exists, as Ray Tune trials on one cluster; a failed run is recorded and the others go on.

Layout of a study folder (`--output`):
    study.json                  the validated study: its runs and their overrides
    corpora/<name>/             downstream corpora the study built (resumable builds)
    runs/pretrain/<run>/        pretraining run folders (checkpoints, encoder.pt, done.json)
    runs/finetune/<run>/        fine-tuning run folders (checkpoints, metrics.json, predictions.csv, done.json)
    tune/<phase>-<attempt>/     Ray Tune's experiment of each phase and attempt
    mlruns/                     train.tracking=mlflow with no tracking_uri: every run's MLflow run
    runs.csv                    one row per run: phase, run, method, seed, status, error, seconds, run folder
    report/                     tables, figures and their index (coreecg.study.summary)

Every run is a trial of `coreecg.tune.trials`, finished when its done.json exists. `--resume`
re-plans the same study and starts only unfinished runs, each from the latest checkpoint in its
own run folder (trials write checkpoints there, not into Tune's folders), so a
driver killed at any point, SIGKILL included, loses at most a checkpoint interval and re-runs no
finished run.
"""
from __future__ import annotations

import csv
import json
import logging
import time
from dataclasses import asdict
from functools import lru_cache
from pathlib import Path
from typing import Any

from coreecg.cluster import Devices, find_devices, init_ray, resolve_devices
from coreecg.config import ConfigError, load_config
from coreecg.study.plan import ExternalEncoder, FinetuneRun, PretrainRun, RandomEncoder, Study
from coreecg.train.tracking import track_trials
from coreecg.tune.trials import TrialSpec, concurrency_for, error_text, is_done, read_done, run_trials
from coreecg.data.locate import training_corpora

# Lazy imports: ray (the `ray` extra), the corpus builder and the leakage guard (torch), where a phase runs:
# a study is read and checked before Ray, torch-free.

log = logging.getLogger(__name__)


class StudyRunError(ValueError):
    """A study folder that cannot be used (exists without --resume, holds another study)."""


def run_dir(output: Path, phase: str, name: str) -> Path:
    return output / "runs" / phase / name


def describe(study: Study) -> dict[str, Any]:
    """The study as plain data (study.json): what a resumed study must equal."""
    return {"name": study.name, "file": str(study.path), "config": study.config_file,
            "pretrain": {r.name: study.pretrain_overrides(r) for r in study.pretrain_runs()},
            # a grid's `set` only where given: study folders written before it existed still resume
            "finetune": {r.name: {**{k: v for k, v in asdict(r).items() if k != "set" or v},
                                  "encoder": r.encoder.name if r.encoder else None,
                                  "overrides": study.finetune_overrides(r)}
                         for r in [*study.finetune_runs(), *study.mask_rate_runs()]},
            "corpora": [asdict(c) for c in study.corpora],
            **({"pretrain_corpora": [asdict(c) for c in study.pretrain_corpora]} if study.pretrain_corpora else {})}


def prepare_folder(study: Study, output: Path, resume: bool) -> None:
    state = output / "study.json"
    wanted = json.loads(json.dumps(describe(study)))     # tuples read back as lists
    if state.is_file():
        if not resume:
            raise StudyRunError(f"{output} holds a study: pass --resume to continue it, or another --output")
        saved = json.loads(state.read_text())
        changed = [k for k in ("pretrain", "finetune", "corpora", "pretrain_corpora") if saved.get(k) != wanted.get(k)]
        if changed:
            raise StudyRunError(f"{output}: holds another study ({', '.join(changed)} differ from {study.path}); "
                                "use another --output")
    elif resume:
        raise StudyRunError(f"{output}: no study to resume here (run without --resume to start one)")
    output.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(wanted, indent=1) + "\n")


# ---------------------------------------------------------------------------- corpora


def build_corpora(study: Study, output: Path) -> dict[str, Path]:
    """Each downstream corpus, then each pretraining corpus: its path, or the study's own build
    (skipped when finished); a pretraining corpus the study builds leaves out the val and test
    records of its `exclude` downstream corpora (docs/leakage.md). -> name -> folder."""
    from coreecg.data.pipeline import build_corpus

    out: dict[str, Path] = {}
    for c in (*study.corpora, *study.pretrain_corpora):
        if c.path:
            out[c.name] = Path(c.path)
            continue
        dest = output / "corpora" / c.name
        exclude = [out[name] for name in getattr(c, "exclude", ())]
        if not (dest / "manifest.json").is_file():
            log.info("building corpus %s from %s (%s)%s", c.name, c.input, c.source,
                     f", without the val/test records of {', '.join(c.exclude)}" if exclude else "")
        cfg = load_config(study.config_file, [*study.base, *c.set, *study.extra])
        try:
            build_corpus(c.source, c.input, dest, cfg.data,
                         source_options=cfg.data.sources.for_source(c.source, cfg.data.synthetic_records),
                         **({"exclude_overlap_with": exclude} if exclude else {}))
        except ValueError as e:     # e.g. a finished corpus asked with another exclusion: named, no traceback
            if not exclude:
                raise
            raise StudyRunError(f"corpus {c.name}: {e}") from None
        out[c.name] = dest
    for c, contract, leads in contract_corpora(study):
        dest = output / "corpora" / contract_key(c.name, contract)
        if not c.source:
            raise StudyRunError(f"corpus {c.name}: given by its path, but a published encoder of the study takes "
                                f"the {contract} input contract, whose corpus is built from the raw records: give "
                                f"{c.name} as source + input (docs/published_encoders.md)")
        if not (dest / "manifest.json").is_file():
            log.info("building corpus %s under the %s contract from %s (%s)", c.name, contract, c.input, c.source)
        cfg = load_config(study.config_file, [*study.base, *c.set, *study.extra, f"data.preprocess.contract={contract}",
                                              f"data.preprocess.leads=[{','.join(leads)}]"])
        build_corpus(c.source, c.input, dest, cfg.data,
                     source_options=cfg.data.sources.for_source(c.source, cfg.data.synthetic_records))
        out[contract_key(c.name, contract)] = dest
    return out


def contract_key(corpus: str, contract: str) -> str:
    """The study's name of a downstream corpus built under a published family's contract."""
    return f"{corpus}@{contract}"


@lru_cache(maxsize=None)        # one read per weights file (a real release is ~1 GB), not one per run
def _encoder_contract(path: str) -> tuple[str, tuple[str, ...]] | None:
    """A downstream.encoders file's input contract: (family, its leads), None for coreecg's preprocessing."""
    from coreecg.loading import open_source

    pre = open_source(path, kind="encoder").config.data.preprocess
    return (pre.contract, tuple(pre.leads)) if pre.contract else None


def contract_corpora(study: Study) -> list[tuple[Any, str, tuple[str, ...]]]:
    """(downstream corpus, family, leads) of each corpus a published encoder with its own contract
    fine-tunes on: built once per family under its contract (a cached, resumable corpus build)."""
    seen: dict[str, tuple[str, tuple[str, ...]] | None] = {}
    by_name = {c.name: c for c in study.corpora}
    out: dict[tuple[str, str], tuple[Any, str, tuple[str, ...]]] = {}
    for r in [*study.finetune_runs(), *study.mask_rate_runs()]:
        if not isinstance(r.encoder, ExternalEncoder):
            continue
        if r.encoder.path not in seen:
            seen[r.encoder.path] = _encoder_contract(r.encoder.path)
        found = seen[r.encoder.path]
        if found is not None:
            out.setdefault((r.corpus, found[0]), (by_name[r.corpus], *found))
    return list(out.values())


def run_corpus(study: Study, run: FinetuneRun, corpora: dict[str, Path]) -> Path:
    """The corpus a fine-tuning reads: its downstream corpus, or that corpus under its encoder's contract."""
    if isinstance(run.encoder, ExternalEncoder):
        found = _encoder_contract(run.encoder.path)
        if found is not None:
            return corpora[contract_key(run.corpus, found[0])]
    return corpora[run.corpus]


def check_leakage(study: Study, corpora: dict[str, Path]) -> None:
    """The leakage guard (coreecg.train.leakage_guard) of every (pretraining corpus, downstream corpus)
    pair the study fine-tunes, before any training: LeakageError naming the records unless
    finetune.allow_overlap (then each fine-tuning records its overlap itself)."""
    from coreecg.train.leakage_guard import Pretraining, check_overlap

    pairs = set()
    for r in [*study.finetune_runs(), *study.mask_rate_runs()]:
        # each run's own config decides (downstream.set may allow what the study's set does not)
        # an external encoder's pretraining data is whatever its own record names: its run's guard
        # (coreecg.train.leakage_guard) checks that, or records that it cannot
        if isinstance(r.encoder, PretrainRun) and not load_config(study.config_file,
                                                     study.finetune_overrides(r)).finetune.allow_overlap:
            pretrained = load_config(study.config_file, study.pretrain_overrides(r.encoder, corpora)).data.corpora
            pairs |= {(str(Path(c).resolve()), r.corpus) for c in pretrained}     # a mixture: each of its corpora
    for corpus, name in sorted(pairs):
        check_overlap(Pretraining(corpus), corpora[name], allow=False)


# ---------------------------------------------------------------------------- phases


def run_phase(output: Path, phase: str, config_file: str | None, runs: list[tuple[str, list[str]]],
              concurrency: int = 0, tune_dir: Path | None = None, gpus_per_trial: float | str = 0.0,
              group: str = "", devices: Devices | None = None) -> list[dict[str, Any]]:
    """Run (name, overrides) pairs of one phase (pretrain | finetune) as Tune trials
    (`coreecg.tune.trials`), each in `output/runs/<phase>/<name>/`, Tune's experiment in
    `tune_dir/<phase>-<attempt>` (default output/tune) -> one row per run. Resources per trial
    come from the first run's config; with train.tracking each run is one tracked run in
    `group` (default: the output folder's name). devices: what every run's train.use_gpu and
    train.num_workers "auto" resolve with (coreecg.cluster.Devices; default: found now)."""
    from ray import tune


    if not runs:
        return []
    devices = devices or find_devices()
    first = resolve_devices(load_config(config_file, runs[0][1]), devices)[0]
    tune_dir = tune_dir or output / "tune"
    attempt = 1 + sum(1 for p in tune_dir.glob(f"{phase}-*")) if tune_dir.is_dir() else 1
    tracking = track_trials(first, output, group or output.name)
    specs = [TrialSpec(task=phase, config_file=config_file, overrides=(*overrides, *tracking), name=name,
                       run_dir=str(run_dir(output, phase, name)), devices=devices.to_dict()).to_dict()
             for name, overrides in runs]
    t0 = time.perf_counter()
    grid = run_trials({"run": tune.grid_search(specs)}, storage=tune_dir, name=f"{phase}-{attempt}", config=first,
                      concurrency=concurrency_for(first, concurrency), gpus_per_trial=gpus_per_trial,
                      label=phase, total=len(runs))
    rows = []
    for result in grid:
        name = (result.config or {}).get("run", {}).get("name", Path(result.path).name)
        folder = run_dir(output, phase, name)
        done = is_done(folder)
        rows.append({"phase": phase, "run": name, "status": "done" if done else "failed",
                     "error": "" if done else (error_text(result.error) or "no result"),
                     "seconds": read_done(folder).get("wall_s", "") if done else "", "run_dir": str(folder)})
    log.info("%s: %d run(s) in %.0f s", phase, len(rows), time.perf_counter() - t0)
    return rows


def write_runs_csv(rows: list[dict[str, Any]], path: Path) -> Path:
    fields = ["phase", "run", "method", "seed", "status", "error", "seconds", "run_dir"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields)
        w.writeheader()
        w.writerows(rows)
    return path


def _finished(output: Path, phase: str, name: str) -> dict[str, Any]:
    """The runs.csv row of a run finished before (kept, not run again)."""
    return {"phase": phase, "run": name, "status": "done", "error": "", "seconds": "",
            "run_dir": str(run_dir(output, phase, name))}


def _pending_finetunes(study: Study, output: Path, corpora: dict[str, Path]
                       ) -> tuple[list[dict[str, Any]], list[tuple[str, list[str]]]]:
    """The fine-tunings (the mask-rate figure's too) -> (rows of those finished before or skipped
    because their encoder's pretraining did not finish, (name, overrides) of those to run)."""
    rows, pending = [], []
    for r in [*study.finetune_runs(), *study.mask_rate_runs()]:
        if is_done(run_dir(output, "finetune", r.name)):
            rows.append(_finished(output, "finetune", r.name))
            continue
        extra = [f"data.corpus={run_corpus(study, r, corpora)}"]
        if isinstance(r.encoder, ExternalEncoder):
            extra.append(f"finetune.encoder={r.encoder.path}")
        elif isinstance(r.encoder, RandomEncoder):
            pass                        # finetune.encoder=random is in the run's own overrides
        elif r.encoder is not None:
            encoder = run_dir(output, "pretrain", r.encoder.name) / "encoder.pt"
            if not is_done(run_dir(output, "pretrain", r.encoder.name)) or not encoder.is_file():
                rows.append({**_finished(output, "finetune", r.name), "status": "skipped",
                             "error": f"its encoder's pretraining ({r.encoder.name}) did not finish"})
                continue
            extra.append(f"finetune.encoder={encoder}")
        pending.append((r.name, study.finetune_overrides(r, extra)))
    return rows, pending


def run_study(study: Study, output: str | Path, *, resume: bool = False, concurrency: int = 0,
              gpus_per_trial: float | str = 0.0) -> list[dict]:
    """Corpora, pretraining, fine-tuning; -> one row per run (runs.csv). Finished runs are kept.
    concurrency: trials at once (0: what the cluster's CPUs allow); gpus_per_trial: what each
    single-worker trial reserves (0: one GPU when train.use_gpu, else none). The devices are
    chosen once, before Ray starts (coreecg.cluster; the console's lines name them for the study's
    base config), and every run resolves train.use_gpu / train.num_workers "auto" with them."""
    output = Path(output).resolve()
    prepare_folder(study, output, resume)
    devices = find_devices()            # joins a shared cluster; else before this job's own starts
    try:
        cfg, lines = resolve_devices(load_config(study.config_file, [*study.base, *study.extra]), devices)
    except ConfigError as e:            # auto's worker count does not divide a batch: named, exit 2
        raise StudyRunError(f"{study.path}: {e}") from None
    for line in lines:
        log.info("%s", line)
    init_ray(cfg.train.num_workers * cfg.train.cpus_per_worker, gpus=devices.gpus)
    corpora = build_corpora(study, output)
    check_leakage(study, corpora)
    for r in study.pretrain_runs():     # the embedded synthetic corpus is built here once, not per trial
        training_corpora(load_config(study.config_file, study.pretrain_overrides(r, corpora)))

    rows, pending = [], []
    for r in study.pretrain_runs():
        if is_done(run_dir(output, "pretrain", r.name)):
            rows.append(_finished(output, "pretrain", r.name))
        else:
            pending.append((r.name, study.pretrain_overrides(r, corpora)))
    log.info("pretraining: %d run(s), %d finished before", len(study.pretrain_runs()),
             len(study.pretrain_runs()) - len(pending))
    rows += run_phase(output, "pretrain", study.config_file, pending, concurrency, gpus_per_trial=gpus_per_trial,
                      group=study.name, devices=devices)
    finished, pending = _pending_finetunes(study, output, corpora)
    log.info("fine-tuning: %d run(s), %d to run", len(finished) + len(pending), len(pending))
    rows += finished + run_phase(output, "finetune", study.config_file, pending, concurrency,
                                 gpus_per_trial=gpus_per_trial, group=study.name, devices=devices)
    labels = {("pretrain", r.name): (r.variant, r.seed) for r in study.pretrain_runs()}
    labels.update({("finetune", r.name): (r.method, r.seed) for r in [*study.finetune_runs(), *study.mask_rate_runs()]})
    rows = [{**row, "method": labels[row["phase"], row["run"]][0], "seed": labels[row["phase"], row["run"]][1]}
            for row in rows]
    write_runs_csv(rows, output / "runs.csv")
    return rows


__all__ = ["run_study", "run_phase", "StudyRunError", "PretrainRun", "FinetuneRun"]
