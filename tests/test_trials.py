"""The one trial runner (coreecg.tune.trials) under a sweep and under a study: a trial whose
process is killed mid-run is retried by Tune and resumes from the newest checkpoint in its run
folder, in the same way for both."""
from __future__ import annotations

import glob
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import TINY

pytestmark = pytest.mark.slow
SETS = [*TINY, "data.synthetic_records=96", "data.probe_max_windows=64", "optim.epochs=3", "optim.batch_size=16",
        "train.max_failures=1"]


def _sweep(out: Path, sets: list[str]) -> None:
    from ray import tune

    from coreecg.tune.sweep import SweepSettings, run_sweep

    run_sweep(SweepSettings(output=out, config_file=None, base=sets, concurrency=1),
              {"methods.core.masking.p_time": tune.grid_search([0.5])})


def _study(out: Path, sets: list[str]) -> None:
    from coreecg.config import load_config
    from coreecg.data.locate import training_corpus
    from coreecg.study.runner import run_phase

    corpus = training_corpus(load_config(overrides=sets))
    run_phase(out, "pretrain", None,
              [("core-ecg-s0", [*sets, f"data.corpus={corpus}", "methods.core.masking.p_time=0.5",
                                "train.eval_every_epochs=1"])], concurrency=1)


def _pid(run: Path) -> int | None:
    try:
        sessions = json.loads((run / "run.json").read_text())["sessions"]
    except (OSError, ValueError, KeyError):
        return None
    return sessions[-1].get("pid") if sessions else None


@pytest.mark.parametrize("kind", ["sweep", "study"])
def test_a_killed_trial_resumes_from_its_newest_checkpoint_in_a_sweep_and_in_a_study(ray_session, tmp_path, kind):
    out, sets = tmp_path / kind, [*SETS, f"data.cache_dir={tmp_path / 'cache'}"]
    runs = str(out / ("trials/*" if kind == "sweep" else "runs/pretrain/*"))
    thread = threading.Thread(target=_sweep if kind == "sweep" else _study, args=(out, sets))
    thread.start()
    killed = None
    deadline = time.time() + 300
    while killed is None and thread.is_alive() and time.time() < deadline:
        time.sleep(0.2)
        for run in map(Path, glob.glob(runs)):
            saved = sorted(run.glob("checkpoint_step*/checkpoint.pt.sha256"))
            if saved and _pid(run) and not (run / "done.json").exists():
                killed = (run, int(saved[-1].parent.name.split("step")[1]), _pid(run))
                os.kill(killed[2], signal.SIGKILL)           # the trial's own process, mid-run
                break
    thread.join(timeout=600)
    assert killed is not None, "the trial ended before it could be killed"
    run, step, pid = killed
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    (resume,) = [x for x in lines if x.get("event") == "resume"]
    assert resume["step"] >= step and Path(resume["checkpoint"]).parent.parent == run   # its own folder's newest
    before = [x["step"] for x in lines[:lines.index(resume)] if x.get("kind") in ("step", "epoch")]
    assert resume["step"] <= max(before)                    # nothing trained before the kill is skipped
    epochs = [x["epoch"] for x in lines if x.get("kind") == "epoch"]
    assert sorted(set(epochs)) == [1, 2, 3] and epochs.count(3) == 1 and len(epochs) - 3 <= 1, epochs
    sessions = json.loads((run / "run.json").read_text())["sessions"]
    assert [s["status"] for s in sessions] == ["running", "completed"]
    assert sessions[0]["pid"] == pid != sessions[1]["pid"]
    done = json.loads((run / "done.json").read_text())
    assert done["epoch"] == 3 and 0.0 <= done["probe_auroc"] <= 1.0 and (run / "encoder.pt").is_file()
