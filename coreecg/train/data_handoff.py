"""The training split materialised beside the Train worker group's start, to shorten the time
from the command to the first step.

A fit's two slowest start-up phases are Ray Data materialising the split in the object store and
the TorchTrainer starting its controller and worker group (their figures: docs/performance.md).
Neither needs the other until a worker asks for its shard, so the driver materialises in a
thread while `trainer.fit()` starts the workers, and Ray Train takes the dataset through a
callable (`TorchTrainer(datasets={"train": callable})`, which Ray Train V2 calls in its
controller once the worker group is up, on every start of it) that waits for the thread's result
in a small mailbox actor.

- Where: only on the job's own local cluster with a CPU to spare beyond the workers'
  (`beside_workers`). The workers hold their CPUs while the controller waits,
  so on a cluster that others share (a joined one, Tune's trials) a read task waiting for a CPU
  that other placement groups hold could wait forever; there the split is materialised first.
- Ownership: the driver ran the materialisation, so it owns the blocks, as with a `materialize()`
  before the fit; the mailbox (pinned to the driver's node) and the controller only borrow them.
- Resources: the thread's Ray Data execution leaves the Train workers' CPUs alone
  (`resource_limits`), so the workers' placement group is not kept waiting by read tasks.
- Failure: a read that fails hands its error to the controller and the driver raises the original
  error, naming the file, instead of Ray Train's wrapper (`raise_if_failed`). The controller's
  errors here are RuntimeErrors, which Ray Train does not retry (a dead mailbox included: as a
  RayActorError it would restart the worker group without end).
"""
from __future__ import annotations

import threading
import time
from typing import Any
import asyncio

import ray
from ray.data import ExecutionResources
from ray.exceptions import RayActorError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from coreecg.cluster import owns_cluster
from coreecg.config import Config


def beside_workers(config: Config) -> bool:
    """Whether a Ray Train fit may materialise its split beside the worker group's start: only on
    this job's own local cluster (coreecg.cluster.owns_cluster) with a CPU beyond the workers' for
    Ray Data's read tasks. Elsewhere (a joined cluster, a Tune trial's process) other placement
    groups may hold every CPU while this fit's workers wait for the data, and a read waiting for a
    CPU would wait forever: the split is materialised before the fit there."""
    t = config.train
    return owns_cluster() and ray.cluster_resources().get("CPU", 0.0) - t.num_workers * t.cpus_per_worker >= 1


def start_handoff(lazy: Any, config: Config, what: str) -> "DatasetHandoff":
    """The split `lazy` materialising in a driver thread while the TorchTrainer starts its worker
    group, the workers' CPUs (`config.train`) left to them; what: names the run in errors."""
    t = config.train
    return DatasetHandoff(lazy, t.num_workers * t.cpus_per_worker, what).start()


def _mailbox_class():
    @ray.remote(num_cpus=0)
    class DatasetMailbox:
        """Holds one value for any number of readers; `get` waits until it is put."""

        def __init__(self) -> None:
            self._ready = asyncio.Event()
            self._value: tuple[str, Any] = ("error", "nothing was put")

        async def put(self, kind: str, value: Any) -> None:
            self._value = (kind, value)
            self._ready.set()

        async def get(self) -> tuple[str, Any]:
            await self._ready.wait()
            return self._value

    return DatasetMailbox


class WaitForDataset:
    """What Ray Train calls for the "train" dataset (in its controller, when the worker group is
    up): the materialised dataset, once the driver's thread put it in the mailbox."""

    def __init__(self, mailbox: Any, what: str):
        self.mailbox, self.what = mailbox, what

    def __call__(self):
        try:
            kind, value = ray.get(self.mailbox.get.remote())
        except RayActorError as e:         # the driver is gone (its mailbox with it)
            raise RuntimeError(f"{self.what}: the training data's mailbox is gone ({type(e).__name__}); "
                               "the driver that was materialising it has stopped") from None
        if kind == "error":
            raise RuntimeError(f"{self.what}: the training data could not be materialised: {value}")
        return value


class DatasetHandoff:
    """Materialise `lazy` (a Ray Dataset not yet executed) in a driver thread; `source()` is the
    callable to give Ray Train instead of the dataset.

        handoff = DatasetHandoff(lazy, worker_cpus=4, what=str(run_dir)).start()
        try:
            TorchTrainer(..., datasets={"train": handoff.source()}).fit()
        except Exception:
            handoff.raise_if_failed()     # the read's own error, not Ray Train's wrapper
            raise
        finally:
            handoff.close()
    """

    def __init__(self, lazy: Any, worker_cpus: float, what: str):
        self.lazy, self.what = lazy, what
        # The workers' CPUs are Train's: Ray Data's read tasks take only the rest (read tasks
        # use no GPU). resource_limits, as exclude_resources is deprecated in Ray 2.60.
        spare = ray.cluster_resources().get("CPU", 0.0) - worker_cpus
        lazy.context.execution_options.resource_limits = ExecutionResources(cpu=max(1.0, spare))
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.mailbox = _mailbox_class().options(scheduling_strategy=here).remote()
        self.error: BaseException | None = None
        self.ready_at: float | None = None        # time.time() when the dataset was materialised
        self._thread = threading.Thread(target=self._run, name="coreecg-materialise", daemon=True)

    def start(self) -> "DatasetHandoff":
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            ds = self.lazy.materialize()
            self.ready_at = time.time()
            ray.get(self.mailbox.put.remote("dataset", ds))
        except BaseException as e:     # handed on: the controller fails the fit, the driver re-raises it
            self.error = e
            try:
                ray.get(self.mailbox.put.remote("error", f"{type(e).__name__}: {e}"))
            except Exception:          # Ray itself is gone: the fit fails on its own
                pass

    def source(self) -> WaitForDataset:
        return WaitForDataset(self.mailbox, self.what)

    def raise_if_failed(self, wait_s: float = 10.0) -> None:
        """Raise the materialisation's own error, if it failed. Waits up to `wait_s` for the thread:
        a read that failed put its error before the controller saw it, so its thread is ending; a
        fit that failed for another reason is not held up by a read still running."""
        self._thread.join(wait_s)
        if self.error is not None:
            raise self.error

    def close(self, wait_s: float = 60.0) -> None:
        """Let the mailbox go (the dataset's blocks stay the driver's until it drops them). A read
        still running after `wait_s` (a fit that ended early) is left to its daemon thread."""
        self._thread.join(wait_s)
        try:
            ray.kill(self.mailbox)
        except Exception:              # Ray already shut down
            pass
