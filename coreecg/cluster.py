"""Connect to the Ray cluster a job runs on, or start a local one with safe defaults.

Under `ray job submit` (RAY_ADDRESS set) or beside a `ray start --head` on this machine,
`ray.init()` joins that cluster; a RAY_ADDRESS nothing answers at is a ClusterError naming it
within seconds (Ray's own connection retries last minutes). Otherwise a local cluster starts with the dashboard and job
API on 127.0.0.1 only (Ray's token authentication is on by default for a local `ray.init()`),
and with more logical CPUs than the Train workers take, because Ray Data needs CPUs of its
own: with every CPU held by workers a Parquet read waits forever.
"""
from __future__ import annotations

import os
import socket

REACH_TIMEOUT_S = 5.0


class ClusterError(ValueError):
    """The cluster a job was pointed at cannot be reached; the message names the address."""


def check_reachable(address: str, timeout_s: float = REACH_TIMEOUT_S) -> None:
    """Fail fast on a RAY_ADDRESS nothing answers at: Ray itself retries a dead GCS for minutes.

    address: host:port (a GCS, as `ray job submit` sets it), or ray://host:port / http(s)://host:port
    (Ray Client, the dashboard). "auto" and "local" are Ray's own keywords and are not checked.
    """
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"RAY_ADDRESS={address}: not host:port (e.g. 127.0.0.1:6379)")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            pass
    except OSError as e:
        raise ClusterError(f"RAY_ADDRESS={address}: no Ray cluster answers there ({e}); start one "
                           "(ray start --head) or unset RAY_ADDRESS to run on a local cluster") from None


def console_options() -> dict:
    """What Ray prints on the job's console. A job without --verbose (coreecg.cli sets
    COREECG_VERBOSE=0) keeps workers' output and Ray's INFO lines in Ray's log files
    (/tmp/ray/session_latest/logs): the driver prints progress from the run folder instead
    (coreecg.train.distributed.RunFollower) and failures reach it as exceptions. Library use
    (no COREECG_VERBOSE) keeps Ray's defaults."""
    import logging

    if os.environ.get("COREECG_VERBOSE") != "0":
        return {}
    # Ray's notice that token authentication is on (it is, by design: README "Security").
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    return {"log_to_driver": False, "logging_level": logging.WARNING}


def _passed_env() -> dict[str, str]:
    """The job's own variables its Ray processes need: the run record's command line, the console."""
    return {k: os.environ[k] for k in ("COREECG_COMMAND", "COREECG_VERBOSE") if k in os.environ}


def init_ray(worker_cpus: int = 0, reserve_for_data: int = 2) -> None:
    """Idempotent. worker_cpus: CPUs the Train workers will hold (num_workers * cpus_per_worker)."""
    import ray

    if ray.is_initialized():
        return
    console = console_options()
    if os.environ.get("RAY_ADDRESS"):
        check_reachable(os.environ["RAY_ADDRESS"])
        ray.init(address=os.environ["RAY_ADDRESS"], **console)
        return
    try:
        ray.init(address="auto", **console)   # a `ray start --head` already running here
        return
    except (ConnectionError, RuntimeError, ValueError):
        pass                              # none running: start a local one below
    # Ray Data logs two INFO lines per execution (every epoch) from its coordinator actors.
    ray.init(num_cpus=max(os.cpu_count() or 1, worker_cpus + reserve_for_data),
             include_dashboard=True, dashboard_host="127.0.0.1", **console,
             runtime_env={"env_vars": {"RAY_DATA_LOG_LEVEL": os.environ.get("RAY_DATA_LOG_LEVEL", "WARNING"),
                                      **_passed_env()}})
