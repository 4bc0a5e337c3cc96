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
