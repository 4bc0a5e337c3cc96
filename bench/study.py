"""A study's cost: wall time, the share of it spent in training steps, and per-trial time to
first step, at 1 and 2 concurrent trials. Prints JSON.

    python bench/study.py                                   # studies/tiny.yaml, concurrency 1
    python bench/study.py --concurrency 1 2 --set pretrain.set=...   # both, one fresh folder each
    python bench/study.py --output studies-out/bench --keep

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

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--study", default=str(REPO / "studies" / "tiny.yaml"))
    p.add_argument("--concurrency", type=int, nargs="+", default=[1])
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="A.B=C")
    p.add_argument("--output", default="", help="keep the study folders here (default: a temporary folder)")
    args = p.parse_args()
    root = Path(args.output).resolve() if args.output else Path(tempfile.mkdtemp(prefix="bench-study-"))
    results = []
    for c in args.concurrency:
        out = root / f"c{c}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "jobs/study.py", args.study, "--output", str(out), "--concurrency", str(c),
               *sum((["--set", s] for s in args.overrides), [])]
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        r = {"study": args.study, "concurrency": c, "exit": done.returncode, "wall_s": round(wall, 1),
             **read_runs(out)}
        r["train_step_share_of_wall"] = round(r["train_step_s_total"] / (wall * c), 3)
        r["in_trial_share_of_wall"] = round(r["in_trial_s_total"] / (wall * c), 3)
        if done.returncode not in (0, 1):
            r["stderr_tail"] = done.stderr[-2000:]
        results.append(r)
        print(json.dumps(r), flush=True)
    if not args.output:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
