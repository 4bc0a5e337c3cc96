"""Connect to the Ray cluster a job runs on, or start a private local one with safe defaults.

A job joins only a cluster meant to be shared:
- RAY_ADDRESS (as `ray job submit` sets it, or set by hand);
- else the cluster a `ray start --head` on this machine recorded in Ray's address file
  (`<RAY_TMPDIR or /tmp>/ray/ray_current_cluster`; `ray stop` removes it).
Never another job's private cluster: Ray's own `address="auto"` joins any Ray process it finds
on the machine, and when that job ended and shut its cluster down the joined job died with it.
An address nothing answers at is a ClusterError naming it within seconds (Ray's own connection
retries last minutes); so is a cluster that refuses the job (an auth token that does not match).
Otherwise a private local cluster starts, with the dashboard and job API on 127.0.0.1 only (Ray's
token authentication is on by default for a local `ray.init()`), and with more logical CPUs than
the Train workers take, because Ray Data needs CPUs of its own: with every CPU held by workers a
Parquet read waits forever. A private cluster writes no address file, so no other job finds it.
A cluster that vanishes while the job runs (its head node lost, its GCS killed) is named on the
console within seconds by ClusterWatch; Ray itself ends the job once the GCS has been gone for
`gcs_rpc_server_reconnect_timeout_s` (60 s), and the run folder keeps what was finished.

On a private cluster, Ray Train's controller polls its workers every TRAIN_POLL_S (0.1 s)
instead of Ray's 2 s: init_ray sets RAY_TRAIN_HEALTH_CHECK_INTERVAL_S in the job's environment
(unless the job sets it itself) before the cluster starts, so its processes inherit it, and Ray
Train hands the driver's value to the controller of every fit. Every `ray.train.report` waits for
that poll: a worker's result queue holds one report, and the next report blocks until the
controller has collected it, so at
2 s an epoch costs at least 2 s whatever it computes. An epoch of a linear probe on cached
features computes ~0.1 s (tiny model, PTB-XL): at 2 s, 50 epochs took 122 s against 6 s of
compute (bench/linear_probe.py). The faster poll costs nothing measurable: an idle one-worker
fit used 0.70 CPU-s/s of this cluster's processes at 2 s and 0.71 at 0.1 s (2 CPUs, the
dashboard included). A worker is declared dead only after
RAY_TRAIN_WORKER_HEALTH_CHECK_TIMEOUT_S (600 s) of unanswered polls, whatever the interval. A
job on a shared cluster keeps Ray's default unless it exports the variable itself (Ray Train
propagates the driver's value to the job's controller there too).

The devices a run trains on are chosen here, once, before the job's own cluster starts
(`plan_devices`: `find_devices`, then `resolve_devices`): `train.use_gpu=auto` and
`train.num_workers=auto` (the defaults) become the GPUs with one worker per GPU where the cluster
has them, else the CPU with 2 workers; a value the user set is kept. The GPUs are counted by torch
(torch.cuda.device_count(), what the local cluster then declares to Ray) where the job starts its
own cluster, and by Ray (ray.cluster_resources()) on a cluster it joined. The console's first
lines say what was chosen and why; the run folder records the resolved values.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from coreecg.config.base import ConfigError
from coreecg.config.sections import AUTO, CPU_WORKERS
from coreecg.log import TRACE_MANIFEST_ENV

# Lazy imports: ray (the `ray` extra: the light install calls init_ray without it, which names the extra), with
# coreecg.extras, the check that names it (jobs/sweep.py's --help imports this module: 2,552 modules, 1 more);
# torch (coreecg.data.from_arrays imports this module, and the data package stays torch-free).

REACH_TIMEOUT_S = 5.0
# Ray Train's controller poll on a private cluster (module docstring); Ray's default is 2.0 s.
TRAIN_POLL_ENV, TRAIN_POLL_S = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", 0.1
# Ray's default for how long a driver waits for a GCS that stopped answering before it ends
# the process (RAY_gcs_rpc_server_reconnect_timeout_s overrides it, for Ray and for the message).
GCS_RECONNECT_S = 60
log = logging.getLogger(__name__)


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


class ClusterWatch:
    """Names a cluster that stops answering while the job runs, instead of leaving the console
    silent for the minute Ray waits before it ends the job with a line about the GCS.

    A daemon thread opens a TCP connection to the GCS every `every_s`; once it has failed for
    `grace_s` it logs one error naming the address, when Ray will end the job, and that the
    same command resumes from the run folder; it logs again if the cluster comes back (a GCS
    restarted with fault tolerance). It only reports: ending the job stays Ray's decision, so
    a GCS that returns within Ray's timeout loses nothing."""

    def __init__(self, address: str, every_s: float = 2.0, grace_s: float = 6.0,
                 reconnect_s: float | None = None, connected=None):
        """connected: () -> bool, False once this process has left the cluster (ray.shutdown):
        the watch then ends quietly. Default: ray.is_initialized."""
        self.address, self.every_s, self.grace_s = address, every_s, grace_s
        self.connected = connected
        self.reconnect_s = reconnect_s if reconnect_s is not None else float(
            os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", GCS_RECONNECT_S))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="coreecg-cluster-watch", daemon=True)

    def start(self) -> "ClusterWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _answers(self) -> bool:
        try:
            check_reachable(self.address, timeout_s=min(self.every_s, REACH_TIMEOUT_S))
            return True
        except ClusterError:
            return False

    def _run(self) -> None:
        if self.connected is None:
            import ray

            self.connected = ray.is_initialized
        lost_since, reported = None, False
        while not self._stop.wait(self.every_s):
            if not self.connected():              # ray.shutdown(): nothing to watch any more
                return
            if self._answers():
                if reported:
                    log.warning("the Ray cluster at %s answers again after %.0f s", self.address,
                                time.monotonic() - lost_since)
                lost_since, reported = None, False
            elif lost_since is None:
                lost_since = time.monotonic()
            elif not reported and time.monotonic() - lost_since >= self.grace_s:
                reported = True
                log.error(
                    "the Ray cluster at %s has stopped answering (%.0f s): its head node or GCS is gone. "
                    "Ray ends this job if it is not back within %.0f s of losing it "
                    "(gcs_rpc_server_reconnect_timeout_s). Finished checkpoints and trial results stay "
                    "in the run folder: run the same command again, on a cluster that answers, "
                    "to resume from them.", self.address, time.monotonic() - lost_since, self.reconnect_s)


_watch: ClusterWatch | None = None


def _watch_cluster() -> None:
    """Watch the GCS this process has just connected to (one watch per process)."""
    global _watch
    import ray

    if _watch is not None:
        _watch.stop()
        _watch = None
    try:
        address = ray.get_runtime_context().gcs_address
    except Exception as e:         # Ray Client (ray://) drivers have no GCS of their own to watch
        log.debug("no GCS address to watch: %s", e)
        return
    _watch = ClusterWatch(address).start()


def console_options() -> dict:
    """What Ray prints on the job's console. A job without --verbose (coreecg.cli sets
    COREECG_VERBOSE=0) keeps workers' output and Ray's INFO lines in Ray's log files
    (/tmp/ray/session_latest/logs): the driver prints progress from the run folder instead
    (coreecg.train.follower.RunFollower) and failures reach it as exceptions. Library use
    (no COREECG_VERBOSE) keeps Ray's defaults."""
    if os.environ.get("COREECG_VERBOSE") != "0":
        return {}
    # Ray's notice that token authentication is on (it is, by design: docs/cluster.md "Security").
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    return {"log_to_driver": False, "logging_level": logging.WARNING}


def _passed_env() -> dict[str, str]:
    """The job's own variables its Ray processes need: the run record's command line, the console."""
    return {k: os.environ[k] for k in ("COREECG_COMMAND", "COREECG_VERBOSE", TRACE_MANIFEST_ENV) if k in os.environ}


def quiet_data() -> None:
    """Ray Data's progress bars off and its per-execution INFO lines (two per dataset run: every
    epoch, every corpus build) down to warnings; the job prints its own progress. Called after
    `ray.init`, which configures Ray's loggers. The DataContext propagates to Train workers."""
    from ray.data import DataContext

    ctx = DataContext.get_current()
    ctx.enable_progress_bars = ctx.enable_operator_progress_bars = False
    if os.environ.get("COREECG_VERBOSE") != "1":
        logging.getLogger("ray.data").setLevel(logging.WARNING)


def shared_address() -> tuple[str, str] | None:
    """(address, where it came from) of the shared cluster this job should join, or None.

    RAY_ADDRESS first, then the address file a `ray start --head` wrote; a stale file (its
    cluster gone without `ray stop`) is named in a warning and ignored."""
    from ray._private.utils import read_ray_address
    from ray._common.utils import get_ray_address_file

    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    recorded = read_ray_address()
    if not recorded:
        return None
    where = get_ray_address_file(None)
    try:
        check_reachable(recorded)
    except ClusterError:
        msg = (f"{where} names {recorded}, where no Ray cluster answers (a `ray start` cluster gone without "
               "`ray stop`): starting a private local cluster")
        if msg not in _WARNED:              # asked by the device planning, then by init_ray: one warning
            _WARNED.add(msg)
            log.warning("%s", msg)
        return None
    return recorded, where


_PRIVATE = False     # this process started its own local cluster (init_ray): no node can join it
_WARNED: set[str] = set()


def owns_cluster() -> bool:
    """Whether this process started the Ray cluster it uses (init_ray's private local cluster):
    nothing but this job holds its CPUs (no other job, no Tune trial of another process)."""
    return _PRIVATE


def check_gpus(needed: float, what: str, fix: str = "set train.use_gpu=false to train on the CPU",
               *, joined_may_wait: bool = True) -> None:
    """A request for GPUs the cluster lacks would wait for them forever (Ray Train, Tune and Ray
    Data's actor pools queue it silently). On this process's private local cluster, which no node
    can join, that is a ClusterError at once naming `what` and `fix`. On a cluster it joined (one
    that may add GPU nodes, `cluster.yaml`'s autoscaler) a warning, and the run waits as Ray
    does; with joined_may_wait=False (inference: `--workers` is cheap to lower) an error there too."""
    import ray

    if needed <= 0:
        return
    have = ray.cluster_resources().get("GPU", 0.0)
    if have >= needed:
        return
    msg = f"{what} asks for {math.ceil(needed)} GPU(s) and the Ray cluster has {have:g}"
    if _PRIVATE:
        raise ClusterError(f"{msg}: this machine's own local cluster can gain none; {fix}, "
                           "or submit to a cluster with GPUs (docs/cluster.md)")
    if not joined_may_wait:
        raise ClusterError(f"{msg}: {fix}")
    if msg not in _WARNED:                  # planning and fitting both ask: one warning
        _WARNED.add(msg)
        log.warning("%s: the run waits until the cluster has them (an autoscaling cluster adds GPU nodes; "
                    "otherwise stop it and %s)", msg, fix)


def init_ray(worker_cpus: int = 0, reserve_for_data: int = 2, gpus: int | None = None) -> None:
    """Idempotent. worker_cpus: CPUs the Train workers will hold (num_workers * cpus_per_worker).
    gpus: the GPUs a private local cluster declares (`find_devices`'s count, so that Ray holds
    the GPUs the run was planned on); None: Ray's own detection. A joined cluster has its own."""
    from coreecg.extras import require_ray_extra

    require_ray_extra("this job (Ray: training, sweeps, studies, corpus builds)")   # the light install has no Ray
    import ray

    if ray.is_initialized():
        return
    console = console_options()
    shared = shared_address()
    if shared is not None:
        address, source = shared
        check_reachable(address)
        if source != "RAY_ADDRESS":
            # A `ray start` cluster of this machine checks tokens. Ray sends this user's token
            # to a cluster it finds itself (address="auto"), never to an explicit address, and
            # the address read from its file is explicit: enable token mode as "auto" would
            # (a RAY_ADDRESS job sets RAY_AUTH_MODE=token itself, docs/cluster.md).
            from ray._private.authentication.authentication_token_setup import (
                maybe_enable_token_auth_if_token_available)

            maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        # A joined cluster's processes get the job's variables only through its runtime env; the
        # diagnostic trace is the one a joined job needs there
        trace = {k: v for k, v in _passed_env().items() if k == TRACE_MANIFEST_ENV}
        try:
            ray.init(address=address, **console, **({"runtime_env": {"env_vars": trace}} if trace else {}))
        except Exception as e:        # refused (auth), or gone between the check and the join
            raise ClusterError(
                f"{source}: the Ray cluster at {address} did not accept this job ({type(e).__name__}: {e}); "
                "a cluster started under another user or HOME refuses a job whose auth token differs "
                "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token: Ray's lines above say "
                "InvalidAuthToken), and one that stopped meanwhile no longer answers") from None
        _watch_cluster()
        return
    # Before the cluster starts, so that its processes (a Tune trial's fit included) inherit it.
    os.environ.setdefault(TRAIN_POLL_ENV, str(TRAIN_POLL_S))
    # "local": a new cluster even where Ray's address file names one (a stale one, ignored above).
    # Ray Data logs two INFO lines per execution (every epoch) from its coordinator actors.
    global _PRIVATE
    _PRIVATE = True
    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, worker_cpus + reserve_for_data),
             **({"num_gpus": gpus} if gpus is not None else {}),
             include_dashboard=True, dashboard_host="127.0.0.1", **console,
             runtime_env={"env_vars": {"RAY_DATA_LOG_LEVEL": os.environ.get("RAY_DATA_LOG_LEVEL", "WARNING"),
                                      **_passed_env()}})
    _watch_cluster()


# ---------------------------------------------------------------------------- devices


@dataclass(frozen=True)
class Devices:
    """The GPUs a job may use, found once (`find_devices`). where: how the console names the
    place ("this machine", "the Ray cluster at 10.0.0.1:6379"); joined: a cluster this job joined
    (it may autoscale), not its own local one. Plain data (`to_dict`): a sweep's or study's
    trials resolve their configs with the driver's facts, so every trial is planned alike."""

    gpus: int
    names: tuple[str, ...] = ()
    where: str = "this machine"
    joined: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "names": list(self.names), "where": self.where, "joined": self.joined}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Devices":
        return cls(int(d["gpus"]), tuple(d.get("names") or ()), str(d.get("where") or "this machine"),
                   bool(d.get("joined")))

    def describe(self) -> str:
        """"1 GPU (NVIDIA H200) on this machine", "no GPU on the Ray cluster at ..."."""
        if not self.gpus:
            return f"no GPU on {self.where}"
        kinds = ", ".join(dict.fromkeys(self.names))         # one name per kind, in order
        return f"{self.gpus} GPU{'s' * (self.gpus != 1)}{f' ({kinds})' if kinds else ''} on {self.where}"


def find_devices(join: bool = True) -> Devices:
    """The GPUs of the cluster this job runs on, before its own local cluster starts.

    A cluster this process is connected to: Ray's count (ray.cluster_resources()). Else, with
    `join`, a shared cluster to join (RAY_ADDRESS, a `ray start` address file: `shared_address`)
    is joined now (init_ray) and counted by Ray. Else the job will start its own local cluster on
    this machine: torch's count (torch.cuda.device_count(), the GPUs this process may use, which
    the local cluster then declares: init_ray(gpus=...)). join=False never starts nor joins Ray."""
    try:
        import ray

        connected = ray.is_initialized()
    except ImportError:                       # the light install: no Ray, this machine's GPUs
        return _local_devices()
    if not connected and join and shared_address() is not None:
        init_ray()
        connected = True
    if connected:
        try:
            return _cluster_devices()
        except Exception as e:               # noqa: BLE001 - a client that lost its cluster: this machine's
            log.warning("the Ray cluster's resources could not be read (%s: %s): counting this machine's GPUs "
                        "instead", type(e).__name__, e)
    return _local_devices()


def _local_devices() -> Devices:
    import torch

    n = torch.cuda.device_count()
    return Devices(n, tuple(torch.cuda.get_device_name(i) for i in range(n)), "this machine", joined=False)


def _cluster_devices() -> Devices:
    import ray

    resources = ray.cluster_resources()
    names = tuple(sorted(k.split(":", 1)[1] for k in resources if k.startswith("accelerator_type:")))
    if _PRIVATE:                              # this job's own local cluster, started earlier in this process
        return Devices(int(resources.get("GPU", 0)), names, "this machine", joined=False)
    try:
        where = f"the Ray cluster at {ray.get_runtime_context().gcs_address}"
    except Exception:                         # noqa: BLE001 - Ray Client drivers have no GCS address
        where = "the Ray cluster"
    return Devices(int(resources.get("GPU", 0)), names, where, joined=True)


def _choose_devices(t, gpus: int) -> tuple[bool, int, int | None]:
    """train.use_gpu and train.num_workers made concrete (t: the train section) on `gpus` GPUs ->
    (use_gpu, workers, too_few: the set workers that outnumber the GPUs when auto chose the CPU for
    them, else None)."""
    gpu_auto, workers_auto = t.use_gpu == AUTO, t.num_workers == AUTO
    too_few = None
    if not gpu_auto:
        use_gpu = bool(t.use_gpu)
    elif gpus and not workers_auto and t.num_workers > gpus:
        use_gpu, too_few = False, t.num_workers
    else:
        use_gpu = gpus > 0
    workers = t.num_workers if not workers_auto else (gpus if use_gpu and gpus else CPU_WORKERS)
    return use_gpu, workers, too_few


def _device_lines(t, devices: Devices, use_gpu: bool, workers: int, too_few: int | None,
                  why_workers: str) -> list[str]:
    """The console's lines on the devices chosen (t: the train section as set): what, why, and
    how to train on GPUs that went unused."""
    g, gpu_auto = devices.gpus, t.use_gpu == AUTO
    how = "auto" if gpu_auto else "set"
    if use_gpu:
        gpu_text = f"train.use_gpu=true ({how})"
    elif too_few:
        gpu_text = (f"CPU: train.use_gpu=false (auto: train.num_workers={too_few} is set and needs a GPU per "
                    f"worker)")
    else:
        gpu_text = f"CPU: train.use_gpu=false ({how})"
    # On the GPU the step is compiled unless set otherwise (coreecg.train.speed.compile_enabled)
    compile_text = "" if not use_gpu else (
        ", train.compile=true (auto)" if t.compile == AUTO else f", train.compile={str(t.compile).lower()} (set)")
    lines = [f"device: {devices.describe()} -> {gpu_text}, train.num_workers={workers} ({why_workers}){compile_text}"]
    if too_few:
        lines.append(f"  to train on the GPU{'s' * (g != 1)}: train.num_workers={g} or fewer (or auto)")
    elif gpu_auto and not g and devices.joined:
        lines.append("  an autoscaling cluster adds GPU nodes only for a run that asks for them: set "
                     "train.use_gpu=true and train.num_workers to train on them")
    return lines


def resolve_devices(config, devices: Devices):
    """`config` with train.use_gpu and train.num_workers concrete, and the console's lines saying
    what was chosen and why -> (config, lines). Pure: `devices` are the facts.

    use_gpu=auto: true where the cluster has a GPU for every worker (num_workers=auto: one per
    GPU), else false; never an error for lack of GPUs. num_workers=auto: one per GPU when the run
    trains on GPUs, else CPU_WORKERS (2). A set value is kept, true without GPUs included (the
    GPU check, coreecg.cluster.check_gpus, then names it). The resolved config is validated again:
    the global batches must divide over the workers auto chose (a ConfigError saying so)."""
    t, g = config.train, devices.gpus
    workers_auto = t.num_workers == AUTO
    use_gpu, workers, too_few = _choose_devices(t, g)
    why_workers = ("one per GPU, auto" if use_gpu and g else "auto") if workers_auto else "set"
    lines = _device_lines(t, devices, use_gpu, workers, too_few, why_workers)
    if (use_gpu, workers) == (t.use_gpu, t.num_workers):
        return config, lines
    resolved = dataclasses.replace(config, train=dataclasses.replace(t, use_gpu=use_gpu, num_workers=workers))
    try:
        resolved.validate()
    except ConfigError as e:
        if not workers_auto:
            raise
        raise ConfigError(f"{e} (train.num_workers=auto chose {workers}, {why_workers.removesuffix(', auto')} "
                          f"on {devices.describe()}); set train.num_workers, or a batch size it divides") from None
    return resolved, lines


def plan_devices(config) -> tuple[Any, list[str]]:
    """The one place a job's devices are chosen: `resolve_devices(config, find_devices())` ->
    (config with concrete train.use_gpu and train.num_workers, the console's lines). Call it
    before init_ray (the local cluster's CPUs depend on the workers); it joins a shared cluster
    itself to count its GPUs."""
    return resolve_devices(config, find_devices())


def with_devices(config):
    """`config` as it is when train.use_gpu and train.num_workers are concrete (a job or a trial
    resolved them: the usual case); else resolved here, its lines logged, without starting or
    joining Ray (a planner called straight from library code with a loaded config)."""
    if config.train.devices_resolved:
        return config
    config, lines = resolve_devices(config, find_devices(join=False))
    for line in lines:
        log.info("%s", line)
    return config


def plan_actors(device: str, workers: int, devices: Devices) -> tuple[str, list[str]]:
    """Inference actors (`jobs/predict.py --workers N --device D`) on `devices` -> (the actors'
    device, "cpu" or "cuda"; the console's lines). auto: cuda where the cluster has a GPU per
    actor, else cpu; cpu and cuda are kept (cuda without the GPUs: check_gpus refuses it)."""
    if device != "auto":
        return device, [f"device: {devices.describe()} -> --device {device} (set), {workers} "
                        f"{'GPU' if device == 'cuda' else 'CPU'} actor(s)"]
    if devices.gpus and workers <= devices.gpus:
        return "cuda", [f"device: {devices.describe()} -> --device cuda (auto), {workers} actor(s), one GPU each"]
    if devices.gpus:
        return "cpu", [f"device: {devices.describe()} -> --device cpu (auto: --workers {workers} needs a GPU per "
                       f"actor), {workers} CPU actor(s)",
                       f"  to score on the GPU{'s' * (devices.gpus != 1)}: --workers {devices.gpus} or fewer"]
    return "cpu", [f"device: {devices.describe()} -> --device cpu (auto), {workers} CPU actor(s)"]
