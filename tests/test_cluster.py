"""Joining Ray: a RAY_ADDRESS nothing answers at fails fast with the address named (Ray's own
connection retries last minutes), in every job, jobs/preprocess.py included."""
from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_ray_address_is_an_error_naming_it_within_seconds():
    import time

    from coreecg.cluster import ClusterError, check_reachable

    port = _closed_port()
    start = time.monotonic()
    with pytest.raises(ClusterError, match=f"RAY_ADDRESS=127.0.0.1:{port}: no Ray cluster answers"):
        check_reachable(f"127.0.0.1:{port}")
    assert time.monotonic() - start < 10
    with pytest.raises(ClusterError, match="not host:port"):
        check_reachable("127.0.0.1")
    check_reachable("auto")                                     # Ray's keyword: left to Ray


class _Gcs:
    """A port that answers as a GCS does: every connection accepted (and closed) by a thread. A
    socket that only listened let the watch's probes (one every 0.05 s) fill its backlog within
    half a second, after which connects time out and the "cluster" stopped answering on its own."""

    def __init__(self, port: int = 0):
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.sock.settimeout(0.05)          # the accept loop sees close() within 0.05 s
        self.port = self.sock.getsockname()[1]
        self._open = True
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        import socket

        while self._open:
            try:
                conn, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        """Stop answering: the port refuses connections from here on."""
        self._open = False
        self._thread.join()
        self.sock.close()


def _wait_for(predicate, timeout_s: float = 10.0) -> bool:
    import time

    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_cluster_that_vanishes_mid_run_is_named_on_the_console_and_its_return_too(caplog):
    """Measured on a `ray start` cluster whose head was killed under a pretraining job: Ray ends
    the job 61 s later with a line about the GCS and nothing that names the cluster or says the
    run resumes. The watch names both within its grace period, and says so again if it returns."""
    import logging

    from coreecg.cluster import ClusterWatch

    gcs = _Gcs()
    port = gcs.port
    watch = ClusterWatch(f"127.0.0.1:{port}", every_s=0.05, grace_s=0.3, reconnect_s=60,
                         connected=lambda: True)
    with caplog.at_level(logging.WARNING, logger="coreecg.cluster"):
        watch.start()
        assert not _wait_for(lambda: caplog.records, timeout_s=0.6)     # answering: silent
        gcs.close()
        assert _wait_for(lambda: any(r.levelno == logging.ERROR for r in caplog.records))
        lost = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(lost) == 1 and f"127.0.0.1:{port} has stopped answering" in lost[0]
        assert "within 60 s" in lost[0] and "same command" in lost[0] and "resume" in lost[0]
        gcs = _Gcs(port)                                           # a GCS restarted (FT)
        assert _wait_for(lambda: any("answers again" in r.getMessage() for r in caplog.records))
        watch.stop()
    gcs.close()
    assert sum(r.levelno == logging.ERROR for r in caplog.records) == 1  # reported once per loss


def test_the_cluster_watch_ends_quietly_when_the_process_leaves_the_cluster(caplog):
    from coreecg.cluster import ClusterWatch

    port = _closed_port()
    connected = [True]
    watch = ClusterWatch(f"127.0.0.1:{port}", every_s=0.05, grace_s=10, connected=lambda: connected[0])
    watch.start()
    connected[0] = False                                                # ray.shutdown()
    watch._thread.join(timeout=5)
    assert not watch._thread.is_alive() and not caplog.records


@pytest.mark.parametrize("job", [["jobs/pretrain.py", "--set", "data.synthetic_records=64"],
                                 ["jobs/preprocess.py", "--source", "synthetic", "--output", "CORPUS"]])
def test_jobs_fail_fast_on_an_unreachable_ray_address(job, tmp_path):
    """Was: still in Ray's connection retries after 150 s. Now: exit 2 in seconds, the address named."""
    import os
    import subprocess
    import sys
    import time

    address = f"127.0.0.1:{_closed_port()}"
    args = [a.replace("CORPUS", str(tmp_path / "corpus")) for a in job]
    if "jobs/pretrain.py" in args:
        args += ["--output", str(tmp_path / "run"), "--set", f"data.cache_dir={tmp_path / 'cache'}"]
    start = time.monotonic()
    done = subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, "RAY_ADDRESS": address},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and f"RAY_ADDRESS={address}" in done.stderr, done.stderr[-2000:]
    assert time.monotonic() - start < 60


def _job_env() -> dict:
    """The environment of a job started by hand: no RAY_ADDRESS (conftest sets it to the session's
    cluster for the other tests' jobs)."""
    import os

    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}


@pytest.mark.slow
def test_two_jobs_at_once_each_run_on_a_private_cluster_and_the_second_outlives_the_first(tmp_path, ray_session):
    """Was (measured with two jobs/finetune.py runs): the second job joined the first's private
    cluster (Ray's address="auto" finds any Ray process on the machine) and died mid-run when the
    first finished and shut it down. Now each job starts its own cluster, no other job finds it,
    and both finish; neither joins the test session's cluster either (nothing pointed them at
    it). Preprocessing jobs: the cheapest jobs that start Ray the way every job does."""
    import json
    import shutil
    import subprocess
    import sys
    import tempfile
    import time

    def job(name: str, records: int) -> list[str]:
        return [sys.executable, "jobs/preprocess.py", "--source", "synthetic", "--output", str(tmp_path / name),
                "--set", f"data.synthetic_records={records}", "--set", "data.shard_records=32"]

    # Ray's address file names a cluster that is gone (a `ray start` ended without `ray stop`):
    # ignored with a warning. A short folder: Ray's socket paths under it must stay < 108 bytes.
    ray_tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    (ray_tmp / "ray").mkdir()
    (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_closed_port()}")
    env = {**_job_env(), "RAY_TMPDIR": str(ray_tmp)}
    first = subprocess.Popen(job("first", 32), cwd=REPO, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while not (tmp_path / "first").is_dir() and first.poll() is None and time.time() < deadline:
        time.sleep(0.1)                                  # the first job's cluster is up: it writes its corpus
    second = subprocess.Popen(job("second", 1200), cwd=REPO, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    first_out, first_err = first.communicate(timeout=300)
    assert first.returncode == 0, first_err[-3000:]
    if second.poll() is not None:                        # the old failure: it died with the first's cluster
        pytest.fail(f"the second job ended with the first (exit {second.returncode}):\n{second.stderr.read()[-3000:]}")
    second_out, second_err = second.communicate(timeout=300)
    assert second.returncode == 0, second_err[-3000:]
    shutil.rmtree(ray_tmp, ignore_errors=True)

    clusters = []
    for out, err, records in ((first_out, first_err, 32), (second_out, second_err, 1200)):
        summary = json.loads(out[out.index("{"):])
        assert summary["records_written"] == records and summary["ray"]["nodes"] == 1
        assert "where no Ray cluster answers" in out + err           # the stale address file, named
        clusters.append(summary["ray"]["address"])
    assert len({*clusters, ray_session.get_runtime_context().gcs_address}) == 3, clusters


def test_a_job_joins_only_a_cluster_meant_to_be_shared(tmp_path, monkeypatch, ray_session):
    """RAY_ADDRESS first; else the address file a `ray start --head` writes (a stale one, its
    cluster gone, is ignored with a warning); never a Ray process merely found on the machine."""
    from coreecg.cluster import shared_address

    live = ray_session.get_runtime_context().gcs_address
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))               # Ray's address file lives under it
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert shared_address() is None                                # the session's cluster is running
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{_closed_port()}")
    assert shared_address() is None                                # stale: its cluster is gone
    (tmp_path / "ray" / "ray_current_cluster").write_text(live)
    assert shared_address() == (live, str(tmp_path / "ray" / "ray_current_cluster"))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert shared_address() == ("10.0.0.1:6379", "RAY_ADDRESS")


def test_a_cluster_that_refuses_the_job_is_an_error_naming_it(tmp_path, ray_session):
    """Was (another HOME, another auth token): Ray's connection retries went on for minutes.
    Now: exit 2 within a minute, the address and the likely cause named."""
    import os
    import subprocess
    import sys
    import time

    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": address, "RAY_AUTH_TOKEN": "0" * 64}      # not this cluster's
    start = time.monotonic()
    done = subprocess.run([sys.executable, "jobs/pretrain.py", "--output", str(tmp_path / "run")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"the Ray cluster at {address} did not accept this job" in done.stderr and "auth token" in done.stderr
    assert time.monotonic() - start < 60


def test_a_private_cluster_polls_train_workers_every_tenth_of_a_second_unless_the_job_says_otherwise(monkeypatch):
    """Every ray.train.report waits for the Train controller's poll (Ray's default: 2 s), so an
    epoch of a cached linear probe cost 2 s whatever it computed (bench/linear_probe.py). A private
    cluster gets 0.1 s, set before Ray starts (its processes inherit it); the job's own value wins."""
    import os

    import ray

    import coreecg.cluster as cluster

    seen = []
    # init_ray marks the process as owning its cluster (a module global): recorded here so that it is
    # undone after the test; left True, later in-process fits on the session's joined cluster took
    # the private cluster's paths (materialised beside the workers, GPU shortfalls as errors)
    monkeypatch.setattr(cluster, "_PRIVATE", False)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: seen.append(os.environ.get(cluster.TRAIN_POLL_ENV)))
    monkeypatch.setattr(cluster, "shared_address", lambda: None)
    monkeypatch.setattr(cluster, "_watch_cluster", lambda: None)
    monkeypatch.setenv(cluster.TRAIN_POLL_ENV, "")        # recorded, so what init_ray sets is undone
    monkeypatch.delenv(cluster.TRAIN_POLL_ENV)
    cluster.init_ray(1)
    monkeypatch.setenv(cluster.TRAIN_POLL_ENV, "0.5")
    cluster.init_ray(1)
    assert seen == ["0.1", "0.5"]


@pytest.mark.slow
def test_the_train_controller_of_a_private_cluster_gets_the_short_poll(tmp_path):
    """The variable reaches the process that polls: the Train controller of a fit in a job that
    started its own cluster (a UserCallback runs in the controller)."""
    import subprocess
    import sys

    code = f"""
import os, ray.train
from ray.train import UserCallback
from ray.train.torch import TorchTrainer
from coreecg.cluster import init_ray
init_ray(1)

class Seen(UserCallback):
    def after_report(self, run_context, metrics, checkpoint):
        open({str(tmp_path / 'seen')!r}, 'w').write(os.environ.get('RAY_TRAIN_HEALTH_CHECK_INTERVAL_S', 'unset'))

def loop(config):
    ray.train.report({{"x": 1.0}})

TorchTrainer(loop, scaling_config=ray.train.ScalingConfig(num_workers=1),
             run_config=ray.train.RunConfig(name="poll", storage_path={str(tmp_path)!r}, callbacks=[Seen()])).fit()
"""
    env = {k: v for k, v in _job_env().items() if k != "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "seen").read_text() == "0.1"


def test_gpus_the_cluster_lacks_are_an_error_on_a_private_cluster_and_a_warning_on_a_joined_one(
        monkeypatch, caplog):
    """Ray Train and Tune queue a GPU request the cluster can't meet and wait forever. A private
    local cluster can never gain a GPU: error at once naming the setting. A joined cluster may
    autoscale: warn, and let Ray wait."""
    import logging

    import ray

    import coreecg.cluster as cluster

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0, "GPU": 1.0})
    monkeypatch.setattr(cluster, "_PRIVATE", True)
    cluster.check_gpus(1, "train.use_gpu=true")           # enough: nothing happens
    cluster.check_gpus(0, "train.use_gpu=false")
    with pytest.raises(cluster.ClusterError, match=r"train.use_gpu=true .* asks for 4 GPU\(s\) and the Ray "
                                                   r"cluster has 1: .*set train.use_gpu=false"):
        cluster.check_gpus(4, "train.use_gpu=true with train.num_workers=4")
    monkeypatch.setattr(cluster, "_PRIVATE", False)
    monkeypatch.setattr(cluster, "_WARNED", set())
    with caplog.at_level(logging.WARNING, logger="coreecg.cluster"):
        cluster.check_gpus(4, "train.use_gpu=true with train.num_workers=4")
    assert "asks for 4 GPU(s) and the Ray cluster has 1: the run waits" in caplog.text


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has a GPU")
def test_use_gpu_on_a_machine_without_one_exits_2_instead_of_waiting_forever(tmp_path):
    """Was: `jobs/pretrain.py --set train.use_gpu=true` on a CPU machine hung (Ray Train waited
    for a GPU its private cluster can never have). Now: exit 2 naming the setting, no run folder."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}      # its own private cluster
    done = subprocess.run([sys.executable, "jobs/pretrain.py", "--set", "train.use_gpu=true", "--set",
                           "data.synthetic_records=64", "--set", f"train.storage_path={tmp_path}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "train.use_gpu=true with train.num_workers=2 asks for 2 GPU(s) and the Ray cluster has 0" in done.stderr
    assert not (tmp_path / "quickstart" / "metrics.jsonl").exists()
