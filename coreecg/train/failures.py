"""Which failures a restart can mend, and the record that lets a run end after one try when none can.

A worker process that dies, a node that is lost, a collective that times out: a restart from the
newest checkpoint mends those (`train.max_failures` restarts). A config that builds a parameter no
loss reaches (DDP refuses it on 2 workers), a shape that does not fit, a bad value or a bug fails the
same way on every restart: retrying it cost four start-ups (issue 61). Such an error is
*deterministic*: the rank that raises it records it in the run folder (`failure-<attempt>-<rank>.json`,
the folder every rank writes checkpoints to), and the driver that sees the worker group fail reads
the record and ends the run at once with `RunFailed`, naming the cause.

    cause = deterministic_cause(exc)            # the one-line cause, or None: a restart may mend it
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from coreecg.files import write_json

# Exception types that say the code, the config or the data is at fault, never the machine. A
# ValueError covers coreecg's own (ConfigError, CorpusError, CheckpointError, PlanError: all
# ValueErrors) and pyarrow's ArrowInvalid; OSError (a file system's hiccup), ConnectionError and
# RuntimeError (torch.distributed's errors, a CUDA out-of-memory) stay retryable.
DETERMINISTIC_TYPES = (ValueError, TypeError, AttributeError, NameError, ImportError, LookupError, AssertionError,
                       NotImplementedError, ArithmeticError)
# RuntimeErrors whose message says the model, not the machine: DDP's unused parameters, and shapes
# that do not fit (each raised the same on every restart).
DETERMINISTIC_MESSAGES = {
    "did not receive grad": "a parameter got no gradient in the step, which DDP refuses (find_unused_parameters "
                            "is off): the method builds a parameter its loss does not reach",
    "Expected to have finished reduction in the prior iteration": "a parameter got no gradient in the step, "
                                                                 "which DDP refuses (find_unused_parameters is off)",
    "shapes cannot be multiplied": "", "size mismatch": "", "must match the size of tensor": "",
    "Sizes of tensors must match": "", "Given groups=": "", "Expected input batch_size": "",
}


class RunFailed(RuntimeError):
    """A failure no restart can mend; the run ended after one try. `cause`: the error in one line."""

    def __init__(self, cause: str):
        super().__init__(f"{cause} (a deterministic error: not retried)")
        self.cause = cause

    def __reduce__(self):
        return (self.__class__, (self.cause,))


def deterministic_cause(exc: BaseException) -> str | None:
    """`exc`'s cause in one line ("Type: message", with a hint where one helps) when a restart would
    fail the same way, else None. A RunFailed is deterministic by its making."""
    if isinstance(exc, RunFailed):
        return exc.cause
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    if isinstance(exc, OSError):                     # FileNotFoundError too: storage may come back
        return None
    if isinstance(exc, DETERMINISTIC_TYPES):
        return f"{type(exc).__name__}: {line}"[:2000]
    if isinstance(exc, RuntimeError):
        for needle, hint in DETERMINISTIC_MESSAGES.items():
            if needle in text:
                detail = next((x.strip() for x in text.splitlines() if needle in x), line)
                return f"{type(exc).__name__}: {detail}" + (f" ({hint})" if hint else "")
    return None


def record_failure(run_dir: str | Path, attempt: str, rank: int | None, cause: str) -> Path:
    """Write rank `rank`'s deterministic failure of `attempt` into the run folder -> the record's path."""
    path = Path(run_dir) / f"failure-{attempt}-{rank if rank is not None else 'trial'}.json"
    write_json(path, {"attempt": attempt, "rank": rank, "cause": cause, "pid": os.getpid()})
    return path


def recorded_failure(run_dir: str | Path, attempt: str) -> str | None:
    """The cause a rank of `attempt` recorded (the lowest rank's), or None."""
    found = sorted(Path(run_dir).glob(f"failure-{attempt}-*.json"))
    for path in found:
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):                 # a record cut off by the rank's end: the next one
            continue
        rank = record.get("rank")
        return record["cause"] + (f" [rank {rank}]" if rank is not None else "")
    return None


def clear_failures(run_dir: str | Path) -> None:
    """Remove the records of earlier attempts (a new command's run starts without them)."""
    for path in Path(run_dir).glob("failure-*.json"):
        path.unlink(missing_ok=True)


__all__ = ["RunFailed", "deterministic_cause", "record_failure", "recorded_failure", "clear_failures",
           "DETERMINISTIC_TYPES"]
