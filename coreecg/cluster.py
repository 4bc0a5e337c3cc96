"""Connect to the Ray cluster a job runs on, or start a local one with safe defaults.

Under `ray job submit` (RAY_ADDRESS set) or beside a `ray start --head` on this machine,
`ray.init()` joins that cluster. Otherwise a local cluster starts with the dashboard and job
API on 127.0.0.1 only (Ray's token authentication is on by default for a local `ray.init()`),
and with more logical CPUs than the Train workers take, because Ray Data needs CPUs of its
own: with every CPU held by workers a Parquet read waits forever.
"""
from __future__ import annotations

import os


def init_ray(worker_cpus: int = 0, reserve_for_data: int = 2) -> None:
    """Idempotent. worker_cpus: CPUs the Train workers will hold (num_workers * cpus_per_worker)."""
    import ray

    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init(address=os.environ["RAY_ADDRESS"])
        return
    try:
        ray.init(address="auto")          # a `ray start --head` already running here
        return
    except (ConnectionError, RuntimeError, ValueError):
        pass                              # none running: start a local one below
    # Ray Data logs two INFO lines per execution (every epoch) from its coordinator actors.
    ray.init(num_cpus=max(os.cpu_count() or 1, worker_cpus + reserve_for_data),
             include_dashboard=True, dashboard_host="127.0.0.1",
             runtime_env={"env_vars": {"RAY_DATA_LOG_LEVEL": os.environ.get("RAY_DATA_LOG_LEVEL", "WARNING")}})
