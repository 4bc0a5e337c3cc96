"""The driver's console during a Ray Train fit (coreecg.train.fit): the progress and epoch lines
that rank 0 appends to the run's metrics.jsonl, printed as they arrive. The workers' own console
lines are off there, so each line is printed once, however many workers there are.
"""
from __future__ import annotations

import json
import threading
from pathlib import Path

from coreecg.train.console import progress_line, progress_log, progress_text


class RunFollower:
    """The driver's console during a Ray Train fit: prints the epoch and progress records that
    rank 0 appends to the run's metrics.jsonl, once each, as they arrive.

    The run folder is on storage the driver sees (a shared filesystem on a cluster), so this
    works wherever the workers run, and the console needs none of Ray's log forwarding (off
    without --verbose: coreecg.cluster.console_options). Only records appended after it starts
    are printed: a resumed run does not repeat its history."""

    def __init__(self, metrics: Path, epochs: int, poll_s: float = 0.5, on_epoch=None):
        self.path, self.epochs, self.poll_s, self.on_epoch = Path(metrics), epochs, poll_s, on_epoch
        self._offset = self.path.stat().st_size if self.path.is_file() else 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="coreecg-run-follower", daemon=True)

    def __enter__(self) -> "RunFollower":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._drain()                     # what the last epoch wrote just before fit() returned

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self._drain()

    def _drain(self) -> None:
        if not self.path.is_file():
            return
        with open(self.path) as f:
            f.seek(self._offset)
            text = f.read()
        complete = text[:text.rfind("\n") + 1]          # a line still being written waits
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "epoch":
                progress_log.info("%s", progress_line(record, self.epochs))
                if self.on_epoch is not None:
                    self.on_epoch()
            elif record.get("kind") == "progress":
                progress_log.info("%s", progress_text(record))
