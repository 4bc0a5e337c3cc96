"""A study's cost: wall time, the share of it spent in training steps, and per-trial time to
first step, at 1 and 2 concurrent trials. Prints one JSON object (a line) per concurrency.

    python -m bench.study                                   # studies/tiny.yaml, concurrency 1
    python -m bench.study --concurrency 1 2 --output studies-out/bench   # both, one kept folder each
    python -m bench.study --set train.use_gpu=true          # --set: a config override for every run
    python -m bench.study --quick                           # one pretraining, one fine-tuning: a smoke run

Each run is `jobs/study.py STUDY --output <folder>/c<N> --concurrency N` in a fresh Python (its own
local Ray). Read back from the study folder:
- runs/*/*/trials.jsonl: every trial attempt's start (wall clock, written first thing in the trial);
- runs/*/*/metrics.jsonl: the `first_step` event (after the first optimiser step of the attempt)
  and each epoch line's `seconds` (the loop's step time: batches and steps, no evaluation);
- the job's own wall time.
- the run's finished marker (done.json, metrics.json): its modification time ends the trial.
time to first step = first_step - trial_start (config, plan, Ray Data dataset, model build, the
first batch and step); training share = sum of epoch seconds / (wall x concurrency); in-trial
share = sum of (marker - trial_start) / (wall x concurrency): the rest is the driver (validation,
corpora, Ray and Tune start-up, scheduling between trials, the report).
"""
from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from bench.common import REPO, SHARED, TINY, emit, job, job_env, parser, sets

MARKERS = {"pretrain": "done.json", "finetune": "metrics.json"}


def read_runs(out: Path) -> dict:
    firsts, steps, in_trials, per_phase = [], 0.0, 0.0, {}
    for run in sorted(out.glob("runs/*/*")):
        trials = run / "trials.jsonl"
        metrics = run / "metrics.jsonl"
        if not trials.is_file() or not metrics.is_file():
            continue
        start = json.loads(trials.read_text().splitlines()[-1])["time"]
        lines = [json.loads(x) for x in metrics.read_text().splitlines()]
        first = [x["time"] for x in lines if x.get("event") == "first_step" and x["time"] >= start]
        epoch_s = sum(x["seconds"] for x in lines if x.get("kind") == "epoch")
        steps += epoch_s
        phase = run.parent.name
        marker = run / MARKERS[phase]
        in_trial = marker.stat().st_mtime - start if marker.is_file() else 0.0
        in_trials += in_trial
        per_phase.setdefault(phase, {"runs": 0, "train_step_s": 0.0, "in_trial_s": 0.0})
        per_phase[phase]["runs"] += 1
        per_phase[phase]["train_step_s"] = round(per_phase[phase]["train_step_s"] + epoch_s, 2)
        per_phase[phase]["in_trial_s"] = round(per_phase[phase]["in_trial_s"] + in_trial, 2)
        if first:
            firsts.append(first[0] - start)
    return {"runs": sum(p["runs"] for p in per_phase.values()), "per_phase": per_phase,
            "train_step_s_total": round(steps, 1), "in_trial_s_total": round(in_trials, 1),
            "time_to_first_step_s": {"median": round(statistics.median(firsts), 2) if firsts else None,
                                     "max": round(max(firsts), 2) if firsts else None, "n": len(firsts)}}


def quick_study(root: Path) -> Path:
    """The smallest study: CoRe-ECG pretrained once, fine-tuned once on PTB-XL, one table."""
    study = {
        "name": "bench-quick", "config": str(REPO / "configs" / "quickstart.yaml"),
        "set": [*TINY, "data.synthetic_records=64", "train.num_workers=1", "train.eval_every_epochs=0",
                "train.figures=false", "report.bootstrap_resamples=50"],
        "variants": str(REPO / "tune_spaces" / "ablations.yaml"),
        "pretrain": {"methods": ["CoRe-ECG"], "seeds": [0],
                     "set": ["optim.epochs=1", "optim.batch_size=16", "optim.warmup_epochs=0"]},
        "downstream": {"corpora": {"ptbxl": {"source": "ptbxl", "input": str(SHARED / "ptbxl")}},
                       "methods": ["CoRe-ECG"], "leads": ["12"],
                       "set": ["finetune.epochs=1", "finetune.batch_size=16", "finetune.bootstrap_resamples=50",
                               "finetune.tsne_max_points=0", "finetune.warmup_epochs=0"]},
        "report": {"tables": ["comparison"]},
    }
    path = root / "quick.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def main() -> None:
    p = parser(__doc__, "a study of one CoRe-ECG pretraining and one PTB-XL fine-tuning (tiny model, one epoch)")
    p.add_argument("--study", default=str(REPO / "studies" / "tiny.yaml"))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=C")
    p.add_argument("--output", default="", help="keep the study folders here (default: a temporary folder)")
    args = p.parse_args()
    root = Path(args.output).resolve() if args.output else Path(tempfile.mkdtemp(prefix="bench-study-"))
    root.mkdir(parents=True, exist_ok=True)
    study = str(quick_study(root)) if args.quick else args.study
    for c in args.concurrency:
        out = root / f"c{c}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = job("study", study, "--output", str(out), "--concurrency", str(c), *sets(args.overrides))
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=job_env(), capture_output=True, text=True)
        wall = time.perf_counter() - t0
        r = {"benchmark": "study", "study": study, "concurrency": c, "exit": done.returncode,
             "wall_s": round(wall, 1), **read_runs(out)}
        r["train_step_share_of_wall"] = round(r["train_step_s_total"] / (wall * c), 3)
        r["in_trial_share_of_wall"] = round(r["in_trial_s_total"] / (wall * c), 3)
        if done.returncode not in (0, 1):
            r["stderr_tail"] = done.stderr[-2000:]
        emit(r, one_line=True)
    if not args.output:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
