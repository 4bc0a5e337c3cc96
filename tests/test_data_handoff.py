"""The training split materialised beside the Train worker group's start
(coreecg.train.data_handoff): Ray Train gets the same windows as a materialise() before the fit
would give, on every start of its worker group, and a split that cannot be read fails the fit
with the read's own error naming the file."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tests.helpers import build_synthetic, tiny_config


def _rows(ds) -> dict[int, np.ndarray]:
    out = {}
    for batch in ds.iter_batches(batch_size=None):
        for uid, signal in zip(batch["uid"], batch["signal"]):
            out[int(uid)] = np.asarray(signal)
    return out


def _wait_until_gone(actor, timeout_s: float = 30.0) -> None:
    import ray
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.__ray_ready__.remote(), timeout=timeout_s)
        except RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the actor was still alive {timeout_s:.0f} s after ray.kill")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_synthetic(tmp_path_factory.mktemp("handoff") / "corpus", 48, 1)


def test_ray_train_takes_the_split_materialised_beside_it(ray_session, corpus):
    from coreecg.train.data_handoff import DatasetHandoff
    from coreecg.train.ingest import training_dataset

    lazy = training_dataset(corpus, seed=0, materialise=False)
    assert type(lazy).__name__ == "Dataset"          # not executed yet: the thread does that
    handoff = DatasetHandoff(lazy, worker_cpus=3, what="run-a").start()
    try:
        source = handoff.source()
        first, again = source(), source()            # Ray Train calls it on every start of the worker group
        assert type(first).__name__ == "MaterializedDataset"
        expected = _rows(training_dataset(corpus, seed=0))
        got = _rows(first)
        assert sorted(got) == sorted(expected) and len(got) > 0
        assert all(np.array_equal(got[u], expected[u]) for u in expected)
        assert _rows(again).keys() == got.keys()
        assert handoff.ready_at is not None
        # Ray Data's read tasks leave the Train workers' CPUs alone: 4 on the session's cluster, 3 the workers'
        assert ray_session.cluster_resources()["CPU"] == 4
        assert lazy.context.execution_options.resource_limits.cpu == 1
    finally:
        handoff.close()


def test_a_dead_mailbox_fails_the_controller_at_once(ray_session, corpus):
    """A RayActorError would make Ray Train restart the worker group without end; a RuntimeError
    fails the fit."""
    from coreecg.train.data_handoff import DatasetHandoff
    from coreecg.train.ingest import training_dataset

    handoff = DatasetHandoff(training_dataset(corpus, seed=0, materialise=False), worker_cpus=1, what="run-c").start()
    handoff.close()                                  # the mailbox killed, as when the driver stops
    _wait_until_gone(handoff.mailbox)                # ray.kill returns before the actor has died
    with pytest.raises(RuntimeError, match="run-c: the training data's mailbox is gone"):
        handoff.source()()


def test_only_a_cluster_this_job_owns_materialises_beside_the_workers(ray_session, monkeypatch):
    """On a joined cluster (the session's, here) or without a CPU beyond the workers', the split is
    materialised before the fit: a read waiting for CPUs that placement groups hold could wait
    forever while the workers wait for it."""
    from coreecg import cluster
    from coreecg.train.data_handoff import beside_workers

    def cfg(cpus):
        return tiny_config("train.num_workers=1", f"train.cpus_per_worker={cpus}", "train.use_gpu=false")

    monkeypatch.setattr(cluster, "_PRIVATE", False)  # a cluster this process joined (an earlier test may
    assert not beside_workers(cfg(1))               # have started a private one in this process)
    monkeypatch.setattr(cluster, "_PRIVATE", True)
    assert beside_workers(cfg(1)) and beside_workers(cfg(3))   # 3 CPUs spare, 1 spare
    assert not beside_workers(cfg(4))               # none


@pytest.mark.slow
def test_a_fit_takes_its_split_through_the_handoff(ray_session, corpus, tmp_path, monkeypatch):
    """Through fit() and Ray Train's controller: the run trains on the split materialised beside its
    worker group's start, and its closing speed line says how long that took."""
    import time

    from coreecg import cluster
    from coreecg.train import run_speed as rs
    from coreecg.train.fit import fit
    from coreecg.train.pretraining import plan_pretrain

    monkeypatch.setattr(cluster, "_PRIVATE", True)   # as on the job's own local cluster
    out = tmp_path / "run"
    cfg = tiny_config(f"data.corpus={corpus}", "optim.batch_size=4", "optim.epochs=1", "train.eval_every_epochs=0",
                      "train.num_workers=1", "train.use_gpu=false", f"train.storage_path={out.parent}",
                      f"train.name={out.name}")
    since = time.time()
    rs.mark("ray")
    result = fit(plan_pretrain(cfg))
    assert result.metrics["step"] > 0 and result.model.is_file()
    speed = rs.run_speed(out, since)
    assert speed["epochs"] == 1 and speed["beside_s"]["materialised"] >= 0
    assert "data materialised beside them in" in rs.speed_line(speed)


def test_a_shard_that_cannot_be_read_fails_with_its_own_error(ray_session, corpus, tmp_path):
    import shutil

    from coreecg.data.corpus import open_corpus
    from coreecg.train.data_handoff import DatasetHandoff
    from coreecg.train.ingest import training_dataset

    broken = tmp_path / "corpus"
    shutil.copytree(corpus, broken)
    bad = open_corpus(broken).split_files("train")[1]
    bad.write_bytes(b"not a parquet file" * 64)
    handoff = DatasetHandoff(training_dataset(broken, seed=0, materialise=False), worker_cpus=1, what="run-b").start()
    try:
        with pytest.raises(RuntimeError, match="run-b: the training data could not be materialised"):
            handoff.source()()                       # what the Train controller sees
        with pytest.raises(Exception) as raised:
            handoff.raise_if_failed()                # what the driver raises: the read's error, naming the file
        assert str(bad) in str(raised.value) and "Parquet" in str(raised.value)
    finally:
        handoff.close()


@pytest.mark.slow
@pytest.mark.parametrize("beside", [True, False])
def test_a_fit_whose_split_cannot_be_read_raises_the_reads_error(ray_session, corpus, tmp_path, monkeypatch, beside):
    """Through fit(), materialised beside the workers or before the fit: the driver raises the
    read's error, naming the shard file, not Ray Train's wrapper; the run record says it failed."""
    import json
    import shutil

    from coreecg import cluster
    from coreecg.data.corpus import open_corpus
    from coreecg.train.fit import fit
    from coreecg.train.pretraining import plan_pretrain

    monkeypatch.setattr(cluster, "_PRIVATE", beside)

    broken = tmp_path / "corpus"
    shutil.copytree(corpus, broken)
    bad = open_corpus(broken).split_files("train")[0]
    bad.write_bytes(b"not a parquet file" * 64)
    out = tmp_path / "run"
    cfg = tiny_config(f"data.corpus={broken}", "optim.batch_size=4", "optim.epochs=1", "train.eval_every_epochs=0",
                      "train.num_workers=1", "train.use_gpu=false",
                      f"train.storage_path={out.parent}", f"train.name={out.name}")
    with pytest.raises(Exception) as raised:
        fit(plan_pretrain(cfg))
    assert str(bad) in str(raised.value), str(raised.value)[:2000]
    sessions = json.loads((out / "run.json").read_text())["sessions"]
    assert sessions[-1]["status"] == "failed"
