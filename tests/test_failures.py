"""Failures no restart can mend end the run after one try, naming the cause (issue 61: a DDP error
of the config was retried train.max_failures times, 240 s lost); those a restart may mend (a lost
process or node, a file system's hiccup) are still retried (tests/test_multinode.py)."""
from __future__ import annotations

import json
import logging
import time

import pytest

from coreecg.config import ConfigError, load_config
from coreecg.train.failures import RunFailed, deterministic_cause, record_failure, recorded_failure
from tests.helpers import TINY

DDP = ("Expected to have finished reduction in the prior iteration before starting a new one. This error indicates "
       "that your module has parameters that were not used in producing loss.\nParameter indices which did not "
       "receive grad for rank 0: 22 23 24\n In addition, ...")


def test_which_errors_a_restart_cannot_mend():
    from ray.exceptions import ActorDiedError

    assert deterministic_cause(ConfigError("methods.cpc.steps=12: ...")) == "ConfigError: methods.cpc.steps=12: ..."
    assert deterministic_cause(KeyError("probe_auroc")) == "KeyError: 'probe_auroc'"
    cause = deterministic_cause(RuntimeError(DDP))
    assert cause.startswith("RuntimeError: Parameter indices which did not receive grad for rank 0: 22 23 24")
    assert "find_unused_parameters is off" in cause
    assert deterministic_cause(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 16x2)"))
    for mendable in (OSError("stale file handle"), FileNotFoundError("checkpoint.pt"), RuntimeError("NCCL timeout"),
                     ConnectionError("peer"), ActorDiedError()):
        assert deterministic_cause(mendable) is None, mendable
    assert deterministic_cause(RunFailed("ValueError: x")) == "ValueError: x"


def test_the_record_names_the_attempt_and_the_lowest_rank(tmp_path):
    record_failure(tmp_path, "a1", 1, "ValueError: one")
    record_failure(tmp_path, "a1", 0, "ValueError: zero")
    assert recorded_failure(tmp_path, "a1") == "ValueError: zero [rank 0]"
    assert recorded_failure(tmp_path, "a2") is None                     # another attempt's: not this one's


@pytest.mark.slow
def test_a_deterministic_worker_error_ends_the_run_after_one_try(ray_session, tmp_path, caplog):
    """A method with a parameter no loss reaches, on 2 Ray Train workers with train.max_failures=3:
    DDP's error at the second step ends the run at once with RunFailed naming it, after one start
    of the worker group (the old path started it four times)."""
    from coreecg.train.fit import fit, plan_run

    cfg = load_config(overrides=[*TINY, "plugins=[tests.plugin_dead_parameter]", "pretrain.method=dead_head",
                                 "optim.batch_size=8", "optim.epochs=1", "data.synthetic_records=64",
                                 f"data.cache_dir={tmp_path / 'cache'}", "train.eval_every_epochs=0",
                                 "train.num_workers=2", "train.use_gpu=false", "train.max_failures=3",
                                 f"train.storage_path={tmp_path}", "train.name=dead", "train.figures=false"])
    t0 = time.perf_counter()
    with caplog.at_level(logging.WARNING), pytest.raises(RunFailed, match=r"did not receive grad.*"
                                                                          r"find_unused_parameters is off.*"
                                                                          r"not retried") as failed:
        fit(plan_run(cfg, "pretrain"))
    took = time.perf_counter() - t0
    records = sorted(p.name for p in (tmp_path / "dead").glob("failure-*.json"))
    assert len({name.split("-")[1] for name in records}) == 1, records          # one attempt recorded
    assert not any("restarting from the newest checkpoint" in r.getMessage() for r in caplog.records)
    session = json.loads((tmp_path / "dead" / "run.json").read_text())["sessions"][-1]
    assert session["status"] == "failed" and "did not receive grad" in session["error"]
    print(f"one try: {took:.1f} s; {failed.value}")


@pytest.mark.slow
def test_a_sweep_trial_with_a_deterministic_error_is_not_trained_again(ray_session, tmp_path):
    """A single-worker trial (in its own process) whose method raises in forward, train.max_failures=2:
    Tune restarts it, and each restart ends at its start with the first attempt's cause; the trial
    trained once (one trial_start in trials.jsonl) and results name the cause."""
    from ray import tune

    from coreecg.tune.sweep import SweepSettings, run_sweep
    from coreecg.tune.trials import error_text

    sets = [*TINY, "plugins=[tests.plugin_dead_parameter]", "pretrain.method=broken_forward",
            "data.synthetic_records=64", "data.probe_max_windows=32", "optim.epochs=1", "optim.batch_size=8",
            f"data.cache_dir={tmp_path / 'cache'}", "train.max_failures=2", "train.num_workers=1"]
    grid = run_sweep(SweepSettings(output=tmp_path / "sweep", config_file=None, base=sets, concurrency=1),
                     {"methods.patch_regression.ratio": tune.grid_search([0.5])})
    (result,) = list(grid)
    assert error_text(result.error).startswith("RunFailed: ValueError: a bug in forward: the same on every restart")
    (run,) = (tmp_path / "sweep" / "trials").iterdir()
    starts = [json.loads(x) for x in (run / "trials.jsonl").read_text().splitlines()]
    assert [x["event"] for x in starts] == ["trial_start"]
    assert [p.name.endswith("-trial.json") for p in run.glob("failure-*.json")] == [True]
