"""The platform's console: the `logging` module, configured once by each entry point.

Library code logs to `logging.getLogger(__name__)` (under "coreecg") and never prints. A job
calls `console()` so that INFO lines reach stdout as bare messages; a process that never calls
it shows WARNING and above only, through Python's default, unless its host configures logging
(Ray Train's workers log INFO to the driver: coreecg.train.fit mutes their epoch line).
Callbacks that run in another process (Ray Train's controller) capture their logger's level in
the driver and call `console(level)` where they run, so the driver's choice travels with them.
"""
from __future__ import annotations

import logging
import sys

ROOT = "coreecg"
_HANDLER_NAME = "coreecg-console"
# A diagnostic trace: every corpus manifest read appends a JSON line to the file this names
# (coreecg.data.corpus); a job passes it to its Ray processes (coreecg.cluster).
TRACE_MANIFEST_ENV = "COREECG_TRACE_MANIFEST_READS"


def console(level: int = logging.INFO, stream=None) -> logging.Logger:
    """Idempotent: one stdout handler on the "coreecg" logger printing bare messages at `level`."""
    logger = logging.getLogger(ROOT)
    logger.setLevel(level)
    for h in logger.handlers:
        if h.get_name() == _HANDLER_NAME:
            h.setLevel(level)
            return logger
    handler = logging.StreamHandler(stream or sys.stdout)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(level)
    logger.addHandler(handler)
    return logger
