"""Shared fixtures: the real ECG records beside the repo and one local Ray cluster per session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ECG_DATA = Path(os.environ.get("COREECG_SHARED_DATA", REPO.parent / "shared" / "ecg-data")).resolve()

# The suite scores as a processor without bf16 units does (precision auto -> fp32), so the tests
# that hold inference to the fine-tuning evaluation's numbers bit for bit hold on any processor;
# tests/test_inference_precision.py sets the units it tests (and reads the real ones) itself.
# Subprocesses and Ray's workers inherit it.
os.environ.setdefault("COREECG_CPU_UNITS", "none")


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
    While it runs, RAY_ADDRESS names it: the jobs tests start as subprocesses join it (a job
    never joins a private cluster it was not pointed at: coreecg.cluster) instead of paying
    for a Ray start-up each.
    """
    import ray

    if not ray.is_initialized():
        start_local_ray()
    yield ray
    ray.shutdown()
    os.environ.pop("RAY_ADDRESS", None)


def start_local_ray() -> None:
    import ray

    from coreecg.cluster import TRAIN_POLL_ENV, TRAIN_POLL_S

    os.environ.pop("RAY_ADDRESS", None)          # this cluster's own, from a previous start
    os.environ.setdefault(TRAIN_POLL_ENV, str(TRAIN_POLL_S))   # as a job's own cluster polls (coreecg.cluster)
    ray.init(num_cpus=4, include_dashboard=True, dashboard_host="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


@pytest.fixture(scope="module")
def fresh_ray(ray_session):
    """The session's cluster, restarted: Ray 2.60's Train V2 controller was seen to stall (alive,
    idle, no placement group requested, right after launching its PlacementGroupCleaner) on this
    driver's first TorchTrainer run after several other drivers' Train runs had shared the
    session cluster (twice in full runs; never in a fresh cluster). Modules whose Train runs come
    late in the session start from a clean cluster; later modules keep using it."""
    ray_session.shutdown()
    start_local_ray()
    yield ray_session


@pytest.fixture(scope="session")
def ptbxl_age_corpus(ray_session, ecg_data, tmp_path_factory):
    """The shared PTB-XL records as an age (regression) corpus (coreecg.data.tasks): (its folder, its
    manifest), built once for the tests of tasks and per-layer probes."""
    from coreecg.config import load_config
    from coreecg.data.pipeline import build_corpus

    out = tmp_path_factory.mktemp("ptbxl-age") / "age"
    data = load_config(overrides=["data.shard_records=64"]).data
    return out, build_corpus("ptbxl", ecg_data / "ptbxl", out, data, source_options={"task": "age"},
                             log_warnings=False)
