"""Shared fixtures: the real ECG records beside the repo and one local Ray cluster per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ECG_DATA = Path(os.environ.get("COREECG_SHARED_DATA", REPO.parent / "shared" / "ecg-data")).resolve()


@pytest.fixture(scope="session")
def ecg_data() -> Path:
    """Root of ../shared/ecg-data (read in place, never copied)."""
    if not ECG_DATA.is_dir():
        pytest.fail(f"real ECG test data not found at {ECG_DATA} (set COREECG_SHARED_DATA)")
    return ECG_DATA


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster shared by every test that needs it (start-up costs seconds).

    num_cpus is above what any test's Train workers take, so Ray Data keeps CPUs of its own.
    """
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=4, include_dashboard=True, dashboard_host="127.0.0.1",
                 log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
