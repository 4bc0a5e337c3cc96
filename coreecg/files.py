"""Files that are whole or absent: every file coreecg writes for others to read goes through
`write_atomic`, and every file it checks against a recorded digest through `sha256_file`.

A write goes to a hidden temporary file beside its target (`.NAME.tmp-PID`, so two processes
never share one and a folder listing skips it), then `os.replace`s it: a reader, a resuming run
or a mirror sees the old file or the new one, never half of one. A process killed mid-write
leaves the temporary file behind; `TEMP_GLOB` finds such leftovers.

The file gets the mode `open()` would give a new file (0666 less the umask: 0644 under the
usual 022), whatever the writer chose: safetensors writes 0600, which colleagues on shared
storage cannot read.

Standard library only: the data layer (no torch) writes its corpora with it.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable

TEMP_GLOB = ".*.tmp-*"          # what write_atomic leaves behind when killed mid-write


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks (checkpoints run to gigabytes)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: str | Path, write: Callable[[Path], Any]) -> Path:
    """Call write(tmp) with a temporary path beside `path`, then rename it over `path`.
    Creates the parent folder; the temporary file is removed when `write` raises. -> path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        mode = _new_file_mode(tmp)
        write(tmp)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _new_file_mode(probe: Path) -> int:
    """The permission bits `open()` gives a new file here: created with 0666 at `probe` (then
    removed), so the process umask applies (and a folder's default ACL), read without changing
    the umask (os.umask is process-wide: racy under threads)."""
    probe.unlink(missing_ok=True)        # a leftover keeps its own mode: measure a new file
    fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        return os.fstat(fd).st_mode & 0o777
    finally:
        os.close(fd)
        os.unlink(probe)


def write_bytes(path: str | Path, data: bytes) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_bytes(data))


def write_text(path: str | Path, text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text))


def write_json(path: str | Path, obj: Any, indent: int = 1) -> Path:
    """`obj` as indented JSON with a final newline (insertion order kept)."""
    return write_text(path, json.dumps(obj, indent=indent) + "\n")
