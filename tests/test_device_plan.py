"""train.use_gpu and train.num_workers "auto" (issue 41): chosen once, before Ray starts, from the
cluster's GPUs (coreecg.cluster.plan_devices); a set value always wins; the console says which and
why; the run folder records the chosen values."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from coreecg.cluster import Devices, resolve_devices
from coreecg.config import ConfigError, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[1]
H200 = Devices(1, ("NVIDIA H200",))
TWO = Devices(2, ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3"))
NONE = Devices(0)
JOINED_NONE = Devices(0, (), "the Ray cluster at 10.0.0.1:6379", joined=True)


def _plan(devices: Devices, *overrides: str):
    cfg, lines = resolve_devices(load_config(overrides=list(overrides)), devices)
    return cfg.train.use_gpu, cfg.train.num_workers, lines


def test_auto_is_the_default_and_set_values_load_as_set():
    t = load_config().train
    assert (t.use_gpu, t.num_workers, t.devices_resolved) == ("auto", "auto", False)
    for raw, value in (("true", True), ("false", False), ("auto", "auto")):
        assert load_config(overrides=[f"train.use_gpu={raw}"]).train.use_gpu == value
    assert load_config(overrides=["train.num_workers=4"]).train.num_workers == 4
    assert load_config(overrides=["train.num_workers=auto"]).train.num_workers == "auto"
    with pytest.raises(ConfigError, match=r"train.use_gpu: expects true/false or one of \('auto',\)"):
        load_config(overrides=["train.use_gpu=maybe"])
    with pytest.raises(ConfigError, match="train.num_workers"):
        load_config(overrides=["train.num_workers=0"])


def test_auto_without_a_gpu_trains_on_the_cpu_with_two_workers():
    assert _plan(NONE) == (False, 2, ["device: no GPU on this machine -> CPU: train.use_gpu=false (auto), "
                                      "train.num_workers=2 (auto)"])


def test_auto_with_gpus_takes_one_worker_per_gpu():
    assert _plan(H200) == (True, 1, ["device: 1 GPU (NVIDIA H200) on this machine -> train.use_gpu=true (auto), "
                                     "train.num_workers=1 (one per GPU, auto), train.compile=true (auto)"])
    use_gpu, workers, (line,) = _plan(TWO)
    assert (use_gpu, workers) == (True, 2)
    assert line == ("device: 2 GPUs (NVIDIA H100 80GB HBM3) on this machine -> train.use_gpu=true (auto), "
                    "train.num_workers=2 (one per GPU, auto), train.compile=true (auto)")


def test_a_set_value_always_wins():
    assert _plan(TWO, "train.use_gpu=false")[:2] == (False, 2)                 # GPUs there, not used
    assert "train.use_gpu=false (set)" in _plan(TWO, "train.use_gpu=false")[2][0]
    assert _plan(TWO, "train.num_workers=1")[:2] == (True, 1)                  # one of two GPUs
    assert _plan(TWO, "train.use_gpu=true", "train.num_workers=2")[2] == [
        "device: 2 GPUs (NVIDIA H100 80GB HBM3) on this machine -> train.use_gpu=true (set), "
        "train.num_workers=2 (set), train.compile=true (auto)"]
    assert _plan(TWO, "train.compile=false")[2][0].endswith("train.compile=false (set)")
    assert _plan(NONE, "train.num_workers=4")[:2] == (False, 4)
    # more workers set than GPUs: auto takes the CPU (never an error for lack of GPUs) and says how to use them
    use_gpu, workers, lines = _plan(H200, "train.num_workers=4")
    assert (use_gpu, workers) == (False, 4)
    assert lines == ["device: 1 GPU (NVIDIA H200) on this machine -> CPU: train.use_gpu=false (auto: "
                     "train.num_workers=4 is set and needs a GPU per worker), train.num_workers=4 (set)",
                     "  to train on the GPU: train.num_workers=1 or fewer (or auto)"]


def test_use_gpu_true_without_a_gpu_keeps_todays_worker_count_for_the_gpu_check():
    """Explicit true is kept where there is no GPU: the GPU check (fit, sweeps, studies) then names
    it, exit 2 on the job's own cluster (tests/test_cluster.py runs the job)."""
    import ray

    import coreecg.cluster as cluster
    from coreecg.train.fit import check_run_gpus

    cfg, lines = resolve_devices(load_config(overrides=["train.use_gpu=true"]), NONE)
    assert (cfg.train.use_gpu, cfg.train.num_workers) == (True, 2)
    assert lines == ["device: no GPU on this machine -> train.use_gpu=true (set), train.num_workers=2 (auto), "
                     "train.compile=true (auto)"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray, "cluster_resources", lambda: {"CPU": 4.0})
        mp.setattr(cluster, "_PRIVATE", True)
        with pytest.raises(cluster.ClusterError, match=r"train.use_gpu=true with train.num_workers=2 asks for "
                                                       r"2 GPU\(s\) and the Ray cluster has 0"):
            check_run_gpus(cfg)
        auto, _ = resolve_devices(load_config(), NONE)
        check_run_gpus(auto)                                    # auto never errors for lack of GPUs


def test_a_joined_cluster_without_gpus_says_how_to_ask_for_its_gpu_nodes():
    use_gpu, workers, lines = _plan(JOINED_NONE)
    assert (use_gpu, workers) == (False, 2)
    assert lines[0] == ("device: no GPU on the Ray cluster at 10.0.0.1:6379 -> CPU: train.use_gpu=false (auto), "
                        "train.num_workers=2 (auto)")
    assert "set train.use_gpu=true and train.num_workers" in lines[1]
    assert len(_plan(JOINED_NONE, "train.use_gpu=false")[2]) == 1        # set: nothing to suggest


def test_the_batch_must_divide_over_the_workers_auto_chose():
    """Config.validate checks batch % num_workers for a set value at load; for auto, on the
    resolved config, naming what auto chose."""
    with pytest.raises(ConfigError, match=r"optim.batch_size=256 .* not divisible by train.num_workers=3 "
                                          r"\(train.num_workers=auto chose 3, one per GPU on 3 GPUs"):
        resolve_devices(load_config(overrides=["finetune.batch_size=240"]), Devices(3, ("A100",) * 3))
    with pytest.raises(ConfigError, match="not divisible by train.num_workers=3"):
        load_config(overrides=["train.num_workers=3"])           # set: at load, as before
    cfg, _ = resolve_devices(load_config(overrides=["optim.batch_size=6", "finetune.batch_size=6"]),
                             Devices(3, ("A100",) * 3))
    assert cfg.train.num_workers == 3


def test_the_resolved_values_are_saved_and_a_resumed_auto_run_compares_equal(tmp_path):
    from coreecg.train.resume_check import changed_keys

    cfg, _ = resolve_devices(load_config(overrides=[f"train.storage_path={tmp_path}"]), H200)
    cfg.to_yaml(tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "  use_gpu: true\n" in text and "  num_workers: 1\n" in text
    saved = load_config(tmp_path / "config.yaml")
    assert (saved.train.use_gpu, saved.train.num_workers) == (True, 1)
    again, _ = resolve_devices(load_config(overrides=[f"train.storage_path={tmp_path}"]), H200)
    assert changed_keys(saved, again) == []                      # the same auto run, resumed: no change


@pytest.mark.parametrize("use_gpu, workers", [(False, 2), (True, 4)])
def test_an_old_saved_config_loads_unchanged(tmp_path, use_gpu, workers):
    """Run folders and checkpoints written before auto hold concrete values: they load as set,
    and planning keeps them (on any machine)."""
    data = load_config().to_dict()
    data["train"].update(use_gpu=use_gpu, num_workers=workers, compile=False)
    path = tmp_path / "config.yaml"
    path.write_text(load_config().to_yaml().replace("use_gpu: auto", f"use_gpu: {str(use_gpu).lower()}")
                    .replace("num_workers: auto", f"num_workers: {workers}").replace("compile: auto", "compile: false"))
    for cfg in (load_config(path), config_from_dict(data)):
        assert (cfg.train.use_gpu, cfg.train.num_workers, cfg.train.compile) == (use_gpu, workers, False)
        for devices in (NONE, TWO):
            planned, lines = resolve_devices(cfg, devices)     # its saved compile=false loads as set
            assert planned is cfg and lines[0].endswith(f"train.use_gpu={str(use_gpu).lower()} (set), "
                                                        f"train.num_workers={workers} (set)"
                                                        + (", train.compile=false (set)" if use_gpu else ""))


def test_a_trial_resolves_with_the_drivers_devices(tmp_path):
    """Every trial of a sweep or study resolves auto with the facts the driver found once (its
    spec's `devices`), not with what its own process sees; a user's value in the spec still wins."""
    from coreecg.tune.trials import TrialSpec, build_trial_config, trial_resources

    spec = TrialSpec(task="pretrain", config_file=None, devices=TWO.to_dict()).to_dict()
    cfg = build_trial_config(spec, {}, tmp_path / "t1")
    assert (cfg.train.use_gpu, cfg.train.num_workers) == (True, 2)
    one = build_trial_config({**spec, "overrides": ("train.num_workers=1",)}, {}, tmp_path / "t2")
    assert (one.train.use_gpu, one.train.num_workers) == (True, 1)
    assert trial_resources(one) == {"cpu": 1, "gpu": 1.0}
    old = build_trial_config({**spec, "devices": None}, {}, tmp_path / "t3")    # a spec without devices
    assert old.train.devices_resolved
    assert Devices.from_dict(json.loads(json.dumps(TWO.to_dict()))) == TWO


def test_a_planner_given_an_unresolved_config_resolves_it_without_ray(monkeypatch):
    """Library use (a planner called with a loaded config): resolved there, Ray neither started
    nor joined."""
    import ray

    from coreecg import cluster

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray was started"))
    monkeypatch.setattr(cluster, "_local_devices", lambda: TWO)
    cfg = cluster.with_devices(load_config())
    assert (cfg.train.use_gpu, cfg.train.num_workers) == (True, 2)
    set_cfg = load_config(overrides=["train.use_gpu=false", "train.num_workers=3", "optim.batch_size=3",
                                     "finetune.batch_size=3"])
    assert cluster.with_devices(set_cfg) is set_cfg


def test_devices_of_a_connected_cluster_are_rays_count(monkeypatch):
    import ray

    from coreecg import cluster

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 32.0, "GPU": 4.0, "accelerator_type:H100": 1.0})
    monkeypatch.setattr(cluster, "_PRIVATE", True)
    assert cluster.find_devices() == Devices(4, ("H100",), "this machine", joined=False)
    monkeypatch.setattr(cluster, "_PRIVATE", False)
    found = cluster.find_devices()
    assert (found.gpus, found.names, found.joined) == (4, ("H100",), True)
    assert found.where.startswith("the Ray cluster")


def test_inference_actors_take_the_gpus_when_there_is_one_per_worker():
    from coreecg.cluster import plan_actors

    assert plan_actors("auto", 1, H200) == ("cuda", ["device: 1 GPU (NVIDIA H200) on this machine -> --device cuda "
                                                     "(auto), 1 actor(s), one GPU each"])
    device, lines = plan_actors("auto", 8, H200)
    assert device == "cpu" and "--workers 8 needs a GPU per actor" in lines[0] and "--workers 1 or fewer" in lines[1]
    assert plan_actors("auto", 2, NONE) == ("cpu", ["device: no GPU on this machine -> --device cpu (auto), "
                                                    "2 CPU actor(s)"])
    assert plan_actors("cpu", 2, TWO)[0] == "cpu" and plan_actors("cuda", 4, NONE)[0] == "cuda"   # set: kept


@pytest.mark.slow
def test_planning_on_a_ray_cluster_that_declares_gpus(tmp_path):
    """Through Ray itself: a cluster of this process declaring 2 GPUs (none exists here) is
    counted by Ray, and auto plans 2 GPU workers. In a subprocess: the session's cluster stays."""
    code = """
import json, ray
ray.init(address="local", num_cpus=1, num_gpus=2, include_dashboard=False, log_to_driver=False)
from coreecg.cluster import find_devices, plan_devices
from coreecg.config import load_config
cfg, lines = plan_devices(load_config())
print(json.dumps({"gpus": find_devices().gpus, "use_gpu": cfg.train.use_gpu,
                  "workers": cfg.train.num_workers, "lines": lines}))
ray.shutdown()
"""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    path = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**env, "PYTHONPATH": path},
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert (out["gpus"], out["use_gpu"], out["workers"]) == (2, True, 2)
    # on a GPU machine Ray names the GPUs' type too: "2 GPUs (H200)"
    assert re.match(r"device: 2 GPUs( \(\w+\))? on the Ray cluster at ", out["lines"][0]), out["lines"]
    assert out["lines"][0].endswith("-> train.use_gpu=true (auto), train.num_workers=2 (one per GPU, auto), "
                                    "train.compile=true (auto)")
