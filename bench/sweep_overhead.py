"""Sweep overhead: per-trial start-up (trial start to first training step) and the share of a
sweep's wall time spent in training steps, at 1 and 2 concurrent trials.

    python bench/sweep_overhead.py                         # 4 trials, configs/sweep.yaml, concurrency 1 and 2
    python bench/sweep_overhead.py --train-in-tune         # + a run with train.num_workers=2 (Train in Tune)
    python bench/sweep_overhead.py --p-time 0.3 0.6 --concurrency 1 2 --set optim.epochs=2

Each sweep is `jobs/sweep_mask_rates.py --space <grid> --output <tmp> --concurrency N` in a fresh
Python with a fresh local Ray (started by the job, shut down when it exits), on a mask-rate grid
(default masking.p_time in {0.3, 0.5, 0.6, 0.8} x masking.p_lead in {0.2}: 4 trials) on the
--config defaults (tiny model, synthetic corpus of 512 records, 3 epochs). Before each sweep the
benchmark waits until no other Ray cluster runs on this machine (the job's init_ray would join
it); Ray's temp folder is a private one, so the processes of each sweep's cluster are known and
nothing else is touched. Afterwards everything is read from the sweep folder:

- tune/experiment_state-*.json: when Tune marked each trial RUNNING (its actor is up) = trial start;
- tune/<id>/result.json: Tune's time_this_iter_s / time_total_s per report (a cross-check);
- trials/<id>/config.yaml mtime: written after config, corpus and probe checks, just before the
  Ray Data training dataset is built (and, for Train-in-Tune, the TorchTrainer);
- trials/<id>/tensorboard/ events (wall time of every event, from the trial's own clock): the
  first event = the loop's RunWriter opening (model built, data ready); step scalars (at every
  train.log_every) and their samples_per_s give each epoch's first-step start
  (wall - steps_since_epoch_start * batch / samples_per_s); epoch scalars = the epoch's
  evaluation done, just before its report;
- trials/<id>/metrics.jsonl epoch lines: `seconds` (the loop's step time: batches from Ray Data
  and steps; no evaluation) and `probe_seconds`;
- trials/<id>/done.json mtime: the trial function's end (after the last report and encoder.pt).

Ray Data logs nothing per trial at the sweep's log level, so the parts of a trial's start-up
(config_to_loop_s) and of its evaluation are also timed on their own, in a fresh Python with a
fresh local Ray (as many CPUs as a concurrency-1 sweep asks for), with the same functions a trial
calls: `components` in the output (Ray start, the training dataset materialised cold and warm,
probe and figure windows read, model built, the probe, the reconstruction figure written as the
loop writes it).

Prints one JSON object: each run's figures, and the ratios of concurrency 2 to concurrency 1.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

DEFINITIONS = {
    "trial_start": "Tune marks the trial RUNNING (its actor is up; Trial.run_metadata.start_time in the "
                   "experiment state)",
    "first_step_start": "the loop's epoch-0 timer start: wall time of the first logged step's TensorBoard "
                        "scalar minus steps * batch / samples_per_s of that log line",
    "overhead_to_first_step_s": "first_step_start - trial_start (= startup_to_config_s + config_to_loop_s + "
                                "probe_init_s)",
    "startup_to_config_s": "trial_start -> trials/<id>/config.yaml written: train() call, imports, config, "
                           "corpus manifest and probe checks",
    "config_to_loop_s": "config.yaml -> the loop's TensorBoard writer opens: Ray Data training dataset "
                        "materialised, probe and figure windows read, model built (Train-in-Tune: also the "
                        "TorchTrainer, its controller and worker group)",
    "probe_init_s": "writer opens -> first step starts: essentially the probe of the randomly initialised "
                    "encoder",
    "steps_s": "sum of metrics.jsonl epoch `seconds` (the loop's per-epoch step time, batches from Ray Data "
               "included, evaluation excluded)",
    "probe_s_per_epoch": "mean metrics.jsonl `probe_seconds` (the probe after each epoch)",
    "eval_other_s_per_epoch": "epoch scalars written - (epoch start + seconds + probe_seconds): the "
                              "reconstruction figure and logging",
    "report_s_per_epoch": "epoch scalars written -> next epoch's first step starts: checkpoint saved, "
                          "reported, Tune's round trip (epochs but the last)",
    "finish_s": "last epoch scalars -> done.json: last report, encoder.pt export, done.json",
    "trial_span_s": "trial_start -> done.json written",
    "tune_first_iter_minus_epoch0_steps_s": "Tune-only cross-check: result.json time_this_iter_s of the "
                                            "first report minus epoch 0's `seconds` (train() call -> first "
                                            "report, less steps: start-up, init probe, epoch-0 probe, "
                                            "figure, checkpoint)",
    "job_wall_s": "launching `python jobs/sweep_mask_rates.py` -> its exit (imports, Ray start, Tune, all "
                  "trials, results.csv, heatmap, Ray shutdown)",
    "before_first_trial_s": "job launch -> first trial_start",
    "after_last_trial_s": "last done.json -> job exit",
    "slot_refill_s_mean": "a trial's done.json -> the next trial_start in the freed slot (actor teardown "
                          "and creation, Tune's scheduling)",
    "training_share": "sum over trials of steps_s / (job_wall_s x concurrency): the share of the sweep's "
                      "trial slots spent in training steps",
    "steps_per_wall_s": "sum over trials of steps_s / job_wall_s",
    "slot_seconds": "concurrency x job_wall_s split into: steps, probe (init and per epoch), trial start-up, "
                    "evaluation other than the probe, reports, finish, and outside any trial (before the "
                    "first, between trials, after the last)",
}


# ---------------------------------------------------------------------------- processes


def _cmdlines() -> dict[int, str]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                pass
    return out


def _ray_clusters(exclude: str | None = None) -> list[int]:
    """pids of GCS servers on this machine (one per Ray cluster), less those of our own cluster
    (their command line holds our private Ray temp folder)."""
    return [pid for pid, cmd in _cmdlines().items()
            if "gcs_server" in cmd.split(" ", 1)[0] and not (exclude and exclude in cmd)]


def wait_for_no_ray(max_wait_s: float) -> float:
    """Wait until no Ray cluster runs here (the job's init_ray would join it); -> seconds waited."""
    t0 = time.time()
    while _ray_clusters():
        if time.time() - t0 > max_wait_s:
            raise SystemExit(f"another Ray cluster is still running after {max_wait_s:.0f} s "
                             f"(gcs_server pids {_ray_clusters()}); not starting a sweep beside it")
        time.sleep(10)
    return time.time() - t0


def _end_own_processes(ray_tmp: str) -> list[int]:
    """Processes left by our own cluster (their command line holds our private Ray temp folder):
    normally none, Ray shuts its local cluster down when the job exits."""
    left = [pid for pid, cmd in _cmdlines().items() if ray_tmp in cmd and pid != os.getpid()]
    for pid in left:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    time.sleep(2)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left


# ---------------------------------------------------------------------------- one sweep


def run_job(name: str, workdir: Path, grid: dict, concurrency: int, config: str, overrides: list[str],
            timeout_s: float, max_wait_s: float) -> tuple[Path, float, float, dict]:
    """One sweep in a fresh job process -> (output folder, launch time, exit time, notes)."""
    space = workdir / f"{name}-grid.yaml"
    space.write_text(json.dumps({"grid": grid}))       # JSON is YAML
    out = workdir / name
    log = workdir / f"{name}.log"
    waited = wait_for_no_ray(max_wait_s)
    ray_tmp = tempfile.mkdtemp(prefix="rso", dir="/tmp")   # short: Ray's socket paths have a length limit
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmp
    cmd = [sys.executable, "jobs/sweep_mask_rates.py", "--config", config, "--space", str(space),
           "--output", str(out), "--concurrency", str(concurrency),
           *sum((["--set", s] for s in overrides), [])]
    foreign: set[int] = set()
    stop = threading.Event()

    def watch() -> None:               # another Ray cluster starting during the sweep spoils its timing
        while not stop.wait(2.0):
            foreign.update(_ray_clusters(exclude=ray_tmp))

    watcher = threading.Thread(target=watch, daemon=True)
    print(f"[{name}] {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
    with open(log, "w") as f:
        t0 = time.time()
        watcher.start()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        t1 = time.time()
    stop.set()
    watcher.join()
    left = _end_own_processes(ray_tmp)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    if rc != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"[{name}] the sweep job exited with {rc} after {t1 - t0:.0f} s:\n{tail}")
    print(f"[{name}] done in {t1 - t0:.1f} s", file=sys.stderr, flush=True)
    notes = {"waited_for_other_ray_s": round(waited, 1), "other_ray_clusters_during_run": sorted(foreign),
             "own_ray_processes_left_and_ended": len(left), "loadavg_after": os.getloadavg()[0]}
    return out, t0, t1, notes


# ---------------------------------------------------------------------------- reading a sweep folder


def tb_events(folder: Path) -> list:
    """Every event of the TensorBoard files in `folder` (TFRecord: u64 length, u32 crc, data, u32 crc)."""
    from tensorboardX.proto import event_pb2

    events = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data, i = path.read_bytes(), 0
        while i + 12 <= len(data):
            (n,) = struct.unpack_from("<Q", data, i)
            i += 12
            if i + n + 4 > len(data):
                break
            events.append(event_pb2.Event.FromString(data[i:i + n]))
            i += n + 4
    return events


def trial_starts(tune_dir: Path) -> dict[str, float]:
    """trial_id -> when Tune marked it RUNNING, from the newest experiment state."""
    states = sorted(tune_dir.glob("experiment_state-*.json"), key=lambda p: p.stat().st_mtime)
    if not states:
        return {}
    data = json.loads(states[-1].read_text())
    out = {}
    for trial_json, meta_json in data.get("trial_data", []):
        trial, meta = json.loads(trial_json), json.loads(meta_json)
        if meta.get("start_time") is not None:
            out[trial["trial_id"]] = float(meta["start_time"])
    return out


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return statistics.fmean(xs) if xs else None


def read_trial(run_dir: Path, tune_dir: Path, start: float | None) -> dict:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    epochs = [x for x in lines if x.get("kind") == "epoch"]
    steps = [x for x in lines if x.get("kind") == "step"]
    cfg_yaml = run_dir / "config.yaml"
    import yaml

    cfg = yaml.safe_load(cfg_yaml.read_text())
    batch = cfg["optim"]["batch_size"]
    spe = int(epochs[0]["step"]) if epochs else None
    events = tb_events(run_dir / "tensorboard")
    writer_open = min((e.wall_time for e in events), default=None)
    step_wall, epoch_wall = {}, {}
    for e in events:
        for v in e.summary.value:
            if v.tag.endswith("/samples_per_s") and not v.tag.startswith("epoch/"):
                step_wall[int(e.step)] = e.wall_time
            elif v.tag == "epoch/seconds":
                epoch_wall[int(e.step)] = e.wall_time
    # each epoch's step timer start, from its first logged step
    epoch_start: dict[int, float] = {}
    for s in steps:
        ep = int(s["epoch"]) - 1                      # epochs count from 1
        if ep in epoch_start or int(s["step"]) not in step_wall or not s.get("samples_per_s"):
            continue
        k = int(s["step"]) - ep * spe                 # steps since the epoch's timer started
        epoch_start[ep] = step_wall[int(s["step"])] - k * batch / s["samples_per_s"]
    done = run_dir / "done.json"
    end = done.stat().st_mtime if done.is_file() else None
    ends = [epoch_wall.get(int(x["step"])) for x in epochs]
    eval_other, report = [], []
    for i, x in enumerate(epochs):
        e0, e_end = epoch_start.get(i), ends[i]
        if e0 is not None and e_end is not None:
            eval_other.append(e_end - e0 - x["seconds"] - x.get("probe_seconds", 0.0))
        if i + 1 < len(epochs) and e_end is not None and epoch_start.get(i + 1) is not None:
            report.append(epoch_start[i + 1] - e_end)
    first = epoch_start.get(0)
    config_written = cfg_yaml.stat().st_mtime
    results = [json.loads(x) for x in (tune_dir / run_dir.name / "result.json").read_text().splitlines()
               if x.strip()] if (tune_dir / run_dir.name / "result.json").is_file() else []
    results = [r for r in results if "seconds" in r]
    t = {
        "trial_id": run_dir.name,
        "params": {k: cfg["masking"][k.split(".")[1]] for k in ("masking.p_time", "masking.p_lead")},
        "epochs": len(epochs), "steps_per_epoch": spe,
        "overhead_to_first_step_s": first - start if first is not None and start is not None else None,
        "startup_to_config_s": config_written - start if start is not None else None,
        "config_to_loop_s": writer_open - config_written if writer_open is not None else None,
        "probe_init_s": first - writer_open if first is not None and writer_open is not None else None,
        "steps_s": sum(x["seconds"] for x in epochs),
        "epoch_seconds": [x["seconds"] for x in epochs],
        "samples_per_s_per_epoch": [x["samples_per_s"] for x in epochs],
        "probe_s": sum(x.get("probe_seconds", 0.0) for x in epochs),
        "probe_s_per_epoch": _mean([x.get("probe_seconds") for x in epochs]),
        "eval_other_s": sum(eval_other), "eval_other_s_per_epoch": _mean(eval_other),
        "report_s": sum(report), "report_s_per_epoch": _mean(report),
        "finish_s": end - ends[-1] if end is not None and ends and ends[-1] is not None else None,
        "trial_span_s": end - start if end is not None and start is not None else None,
        "tune_time_total_s": results[-1]["time_total_s"] if results else None,
        "tune_first_iter_minus_epoch0_steps_s":
            results[0]["time_this_iter_s"] - epochs[0]["seconds"] if results and epochs else None,
        "start": start, "end": end,
    }
    return t


def analyse(out: Path, t0: float, t1: float, concurrency: int) -> dict:
    tune_dir = out / "tune"
    starts = trial_starts(tune_dir)
    trials = [read_trial(d, tune_dir, starts.get(d.name)) for d in sorted((out / "trials").iterdir())
              if (d / "metrics.jsonl").is_file()]
    wall = t1 - t0
    n = len(trials)
    have = [t for t in trials if t["start"] is not None and t["end"] is not None]
    # the freed slot each later trial took: the latest trial end at or before its start
    refill = []
    for t in sorted(have, key=lambda t: t["start"])[concurrency:]:
        before = [u["end"] for u in have if u["end"] <= t["start"]]
        if before:
            refill.append(t["start"] - max(before))
    steps_total = sum(t["steps_s"] for t in trials)
    slots = concurrency * wall
    probe_total = sum(t["probe_s"] + (t["probe_init_s"] or 0.0) for t in trials)
    startup_total = sum((t["startup_to_config_s"] or 0.0) + (t["config_to_loop_s"] or 0.0) for t in trials)
    span_total = sum(t["trial_span_s"] or 0.0 for t in trials)
    parts = {
        "steps": steps_total,
        "probe_init_and_epochs": probe_total,
        "trial_startup": startup_total,
        "eval_other_than_probe": sum(t["eval_other_s"] for t in trials),
        "reports": sum(t["report_s"] for t in trials),
        "finish": sum(t["finish_s"] or 0.0 for t in trials),
    }
    parts["unattributed_in_trials"] = span_total - sum(parts.values())
    parts["outside_trials"] = slots - span_total
    epochs_n = max((t["epochs"] for t in trials), default=0)

    def r(x, nd=3):
        return None if x is None else round(x, nd)

    per_epoch = [_mean([t["epoch_seconds"][e] for t in trials if len(t["epoch_seconds"]) > e]) for e in range(epochs_n)]
    steady = _mean([_mean(t["samples_per_s_per_epoch"][1:]) for t in trials if len(t["samples_per_s_per_epoch"]) > 1])
    return {
        "concurrency": concurrency, "trials": n, "trials_with_full_timeline": len(have),
        "job_wall_s": r(wall, 2),
        "trials_per_min": r(60 * n / wall),
        "tune_span_s": r(max(t["end"] for t in have) - min(t["start"] for t in have), 2) if have else None,
        "before_first_trial_s": r(min(t["start"] for t in have) - t0, 2) if have else None,
        "after_last_trial_s": r(t1 - max(t["end"] for t in have), 2) if have else None,
        "slot_refill_s_mean": r(_mean(refill)),
        "step_seconds_total": r(steps_total, 2),
        "training_share": r(steps_total / slots, 4),
        "steps_per_wall_s": r(steps_total / wall, 4),
        "mean_per_trial": {k: r(_mean([t[k] for t in trials])) for k in (
            "overhead_to_first_step_s", "startup_to_config_s", "config_to_loop_s", "probe_init_s",
            "steps_s", "probe_s_per_epoch", "eval_other_s_per_epoch", "report_s_per_epoch", "finish_s",
            "trial_span_s", "tune_first_iter_minus_epoch0_steps_s", "tune_time_total_s")},
        "epoch_seconds_mean_by_epoch": [r(x) for x in per_epoch],
        "steady_samples_per_s_per_trial": r(steady, 1),
        "slot_seconds": {"total": r(slots, 2), **{k: r(v, 2) for k, v in parts.items()}},
        "slot_shares": {k: r(v / slots, 4) for k, v in parts.items()},
        "per_trial": [{k: (r(v) if isinstance(v, float) else v) for k, v in t.items()
                       if k not in ("start", "end", "epoch_seconds", "samples_per_s_per_epoch")}
                      for t in trials],
    }


def components(config: str, overrides: list[str], params: dict, repeats: int = 3) -> dict:
    """(child process) The pieces of a trial's start-up and evaluation, each timed on its own."""
    import torch

    from coreecg.cluster import init_ray
    from coreecg.config import load_config
    from coreecg.methods import CoReECG
    from coreecg.data.locate import probe_corpus, training_corpus
    from coreecg.eval.probe import load_probe_data
    from coreecg.train.pretraining import figure_windows as read_figure_windows
    from coreecg.train.ingest import local_source, training_dataset
    from coreecg.train.loop import RunWriter
    from coreecg.tune.trial import FORCED

    cfg = load_config(config, [*overrides, *FORCED, *(f"{k}={v}" for k, v in params.items())])
    torch.set_num_threads(max(1, cfg.train.cpus_per_worker))      # as run_task does
    out: dict = {}
    t = time.perf_counter()
    init_ray(cfg.train.num_workers * cfg.train.cpus_per_worker, reserve_for_data=2)
    out["ray_init_s"] = time.perf_counter() - t
    corpus = training_corpus(cfg)
    mats = []
    for _ in range(repeats):
        t = time.perf_counter()
        local_source(training_dataset(corpus, cfg.train.seed, cfg.data.cache_in_memory_gb))
        mats.append(time.perf_counter() - t)
    out["dataset_materialise_s_first"] = mats[0]
    out["dataset_materialise_s_warm"] = statistics.median(mats[1:]) if len(mats) > 1 else None
    t = time.perf_counter()
    probe = load_probe_data(probe_corpus(cfg, corpus), cfg.data.probe_max_windows)
    figure_windows = read_figure_windows(corpus, cfg.data.crop_samples)
    out["probe_and_figure_windows_read_s"] = time.perf_counter() - t
    t = time.perf_counter()
    torch.manual_seed(0)
    core = CoReECG(cfg)
    out["model_build_s"] = time.perf_counter() - t
    from coreecg.eval.figures import reconstruction_figure
    from coreecg.eval.probe import run_probe

    d = cfg.data
    probes, figs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        writer = RunWriter(Path(tmp), True)
        for i in range(repeats):
            t = time.perf_counter()
            run_probe(core.encoder, probe, d.crop_samples, torch.device("cpu"), d.probe_labels_per_class,
                      d.probe_subsets)
            probes.append(time.perf_counter() - t)
            t = time.perf_counter()
            fig = reconstruction_figure(core, figure_windows, seed=cfg.train.seed, title=f"epoch {i}")
            writer.figure(fig, "reconstruction", i, i)
            figs.append(time.perf_counter() - t)
        writer.close()
    out["probe_s_first"], out["probe_s_warm"] = probes[0], statistics.median(probes[1:] or probes)
    out["figure_s_first"], out["figure_s_warm"] = figs[0], statistics.median(figs[1:] or figs)
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def run_components(workdir: Path, args, params: dict) -> dict:
    """`components` in a fresh Python with a fresh local Ray (none other running)."""
    waited = wait_for_no_ray(args.max_wait_s)
    ray_tmp = tempfile.mkdtemp(prefix="rso", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmp
    cmd = [sys.executable, __file__, "--components-child", json.dumps(params), "--config", args.config,
           *sum((["--set", s] for s in args.set), [])]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    finally:
        _end_own_processes(ray_tmp)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    if done.returncode != 0:
        raise SystemExit(f"component timings failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "waited_for_other_ray_s": round(waited, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default=str(REPO / "configs" / "sweep.yaml"), help="the sweep's base config")
    p.add_argument("--p-time", type=float, nargs="+", default=[0.3, 0.5, 0.6, 0.8])
    p.add_argument("--p-lead", type=float, nargs="+", default=[0.2])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2], help="one sweep per value")
    p.add_argument("--train-in-tune", action="store_true",
                   help="also a sweep with train.num_workers=2 (a TorchTrainer inside each trial), concurrency 1")
    p.add_argument("--set", action="append", default=[], metavar="A.B=C", help="override for every sweep")
    p.add_argument("--timeout-s", type=float, default=1800, help="per sweep")
    p.add_argument("--max-wait-s", type=float, default=1800, help="for another Ray cluster to end, per sweep")
    p.add_argument("--keep", action="store_true", help="keep the sweep folders (their path goes to stderr)")
    p.add_argument("--no-components", action="store_true", help="skip the separately timed start-up parts")
    p.add_argument("--components-child", help=argparse.SUPPRESS)      # child process: JSON of the params
    args = p.parse_args()
    if args.components_child:
        print(json.dumps(components(args.config, args.set, json.loads(args.components_child))))
        return

    from coreecg.config import load_config
    from coreecg.data.locate import training_corpus

    cfg = load_config(args.config, args.set)
    t = time.time()
    corpus = training_corpus(cfg)       # built once here, if missing, so no sweep's wall time holds it
    grid = {"masking.p_time": args.p_time, "masking.p_lead": args.p_lead}
    workdir = Path(tempfile.mkdtemp(prefix="coreecg-sweep-overhead-"))
    if args.keep:
        print(f"sweep folders: {workdir}", file=sys.stderr)
    runs = [(f"concurrency_{c}", c, list(args.set)) for c in args.concurrency]
    if args.train_in_tune:
        runs.append(("train_in_tune_concurrency_1", 1, [*args.set, "train.num_workers=2"]))
    out: dict = {
        "config": os.path.relpath(args.config, REPO), "overrides": args.set, "grid": grid,
        "trials_per_sweep": len(args.p_time) * len(args.p_lead), "cpus": os.cpu_count(),
        "default_concurrency_here": max(1, (os.cpu_count() or 1) // (cfg.train.num_workers * cfg.train.cpus_per_worker))
        if cfg.train.num_workers == 1 else None,
        "corpus": str(corpus), "corpus_ready_s": round(time.time() - t, 2),
        "model": {"embed_dim": cfg.model.embed_dim, "depth": cfg.model.depth}, "epochs": cfg.optim.epochs,
        "batch": cfg.optim.batch_size, "log_every": cfg.train.log_every,
        "definitions": DEFINITIONS, "runs": {},
    }
    try:
        for name, conc, overrides in runs:
            folder, t0, t1, notes = run_job(name, workdir, grid, conc, args.config, overrides,
                                            args.timeout_s, args.max_wait_s)
            out["runs"][name] = {**analyse(folder, t0, t1, conc), "run_notes": notes}
        if not args.no_components:
            print("[components] timing start-up and evaluation parts on their own", file=sys.stderr, flush=True)
            out["components"] = run_components(workdir, args, {k: v[0] for k, v in grid.items()})
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    a, b = out["runs"].get("concurrency_1"), out["runs"].get("concurrency_2")
    if a and b:
        def ratio(x, y):
            return round(y / x, 3) if x and y is not None else None

        out["concurrency_2_vs_1"] = {
            "job_wall_s": ratio(a["job_wall_s"], b["job_wall_s"]),
            "trials_per_min": ratio(a["trials_per_min"], b["trials_per_min"]),
            "training_share": ratio(a["training_share"], b["training_share"]),
            "steps_per_wall_s": ratio(a["steps_per_wall_s"], b["steps_per_wall_s"]),
            "steady_samples_per_s_per_trial": ratio(a["steady_samples_per_s_per_trial"],
                                                    b["steady_samples_per_s_per_trial"]),
            **{f"mean_{k}": ratio(a["mean_per_trial"][k], b["mean_per_trial"][k]) for k in (
                "overhead_to_first_step_s", "config_to_loop_s", "probe_init_s", "steps_s",
                "probe_s_per_epoch", "trial_span_s")},
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
