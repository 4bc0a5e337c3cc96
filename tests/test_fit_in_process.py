"""fit(plan, report_fn=...) runs the one worker in the caller's process (a notebook, a Tune trial's
process): the worker's settings stay the worker's. It trains with train.cpus_per_worker intra-op
threads, as a Train worker's process does, and the caller's thread count comes back after, on
success and on failure (it leaked once: every test after the first in-process fit ran on one thread)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers import build_synthetic, tiny_config


def _plan(tmp_path, *overrides: str):
    from coreecg.train.pretraining import plan_pretrain

    corpus = build_synthetic(tmp_path / "corpus", 16, 3)
    out = tmp_path / "run"
    return plan_pretrain(tiny_config(
        f"data.corpus={corpus}", "data.cache_in_memory_gb=0", "optim.batch_size=4", "optim.epochs=1",
        "optim.warmup_epochs=0", "train.eval_every_epochs=0", "train.figures=false", "train.num_workers=1",
        f"train.storage_path={out.parent}", f"train.name={out.name}", *overrides))


@pytest.fixture
def fit_here(monkeypatch):
    import ray

    from coreecg.train import fit as fitmod

    monkeypatch.setattr(fitmod, "start_ray", lambda config: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    before = torch.get_num_threads()
    torch.set_num_threads(3)                    # the caller's own count, unlike the worker's 1
    yield fitmod.fit
    torch.set_num_threads(before)


def test_the_worker_trains_on_its_threads_and_the_caller_gets_its_own_back(fit_here, tmp_path):
    inside = []
    result = fit_here(_plan(tmp_path, "train.cpus_per_worker=1"),
                      report_fn=lambda metrics: inside.append(torch.get_num_threads()))
    assert result.metrics["step"] > 0 and inside and set(inside) == {1}
    assert torch.get_num_threads() == 3


def test_a_failing_worker_gives_the_caller_its_threads_back_too(fit_here, tmp_path):
    def report(metrics):
        raise RuntimeError("a report that fails")

    with pytest.raises(RuntimeError, match="a report that fails"):
        fit_here(_plan(tmp_path, "train.cpus_per_worker=1"), report_fn=report)
    assert torch.get_num_threads() == 3


def test_a_trial_stopped_in_its_epoch_report_keeps_that_epochs_checkpoint_and_line(fit_here, tmp_path):
    """Tune stops a trial inside its report (the training thread exits there): the epoch's
    checkpoint and its metrics.jsonl line are both written before the report."""
    import json

    from coreecg.checkpoints import checkpoint_dirs

    class Stopped(BaseException):
        pass

    def report(metrics):
        if "seconds" in metrics:              # the epoch's report, not a mid-epoch checkpoint's
            raise Stopped

    plan = _plan(tmp_path, "train.checkpoint_every_steps=0")
    with pytest.raises(Stopped):
        fit_here(plan, report_fn=report)
    lines = [json.loads(x) for x in (plan.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines if x.get("kind") == "epoch"] == [1] and len(checkpoint_dirs(plan.run_dir)) == 1
