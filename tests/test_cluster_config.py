"""cluster.yaml against Ray's own cluster-config schema, plus this project's invariants.

Offline and fast: Ray's `prepare_config` only merges the AWS defaults.yaml shipped with Ray (no
credentials, no network, no cluster), as `ray up` does before `validate_config`, which checks the
result against ray/autoscaler/ray-schema.json with jsonschema.
"""
from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


@pytest.fixture(scope="module")
def raw() -> dict:
    with open(CLUSTER_YAML) as f:
        return yaml.safe_load(f)


@pytest.fixture(scope="module")
def prepared(raw) -> dict:
    return prepare_config(copy.deepcopy(raw))


def ray_schema() -> dict:
    import ray.autoscaler

    with open(Path(ray.autoscaler.__file__).parent / "ray-schema.json") as f:
        return json.load(f)


def check(config: dict) -> None:
    """What `ray up` checks offline: fill in defaults, then Ray's validator."""
    validate_config(prepare_config(copy.deepcopy(config)))


def ray_start(cmds: list[str]) -> list[str]:
    """Argument lists of the `ray start` invocations in a list of shell commands."""
    found = []
    for cmd in cmds:
        for part in re.split(r"[;&|]+", cmd):
            words = shlex.split(part)
            words = [w for w in words if not re.fullmatch(r"[A-Z_]+=\S*", w)]  # env prefixes
            if words[:2] == ["ray", "start"]:
                found.append(words[2:])
    return found


def flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


def worker_types(cfg: dict) -> dict:
    return {k: v for k, v in cfg["available_node_types"].items() if k != cfg["head_node_type"]}


# --- Ray's validation -------------------------------------------------------------------------

def test_raw_file_matches_ray_schema(raw):
    jsonschema.validate(raw, ray_schema())


def test_ray_validate_config_after_prepare(prepared):
    validate_config(prepared)
    assert prepared["provider"]["type"] == "aws"
    assert prepared["cluster_name"] == "coreecg"


# --- negative controls: the checks above can fail -----------------------------------------------

def test_unknown_top_level_key_fails(raw):
    bad = copy.deepcopy(raw)
    bad["max_wrokers"] = 4
    with pytest.raises(jsonschema.ValidationError, match="max_wrokers"):
        check(bad)


def test_wrong_type_fails(raw):
    bad = copy.deepcopy(raw)
    bad["max_workers"] = "four"
    with pytest.raises(jsonschema.ValidationError):
        check(bad)
    bad = copy.deepcopy(raw)
    name = next(iter(worker_types(bad)))
    bad["available_node_types"][name]["resources"]["GPU"] = "4"
    with pytest.raises(jsonschema.ValidationError):
        check(bad)


def test_min_workers_above_global_max_fails(raw):
    bad = copy.deepcopy(raw)
    name = next(iter(worker_types(bad)))
    bad["available_node_types"][name]["min_workers"] = bad["max_workers"] + 1
    with pytest.raises(ValueError, match="max_workers"):
        check(bad)


# --- this project's invariants --------------------------------------------------------------------

def test_head_is_cpu_only(prepared):
    head = prepared["available_node_types"][prepared["head_node_type"]]
    assert head["resources"].get("GPU", None) == 0
    assert head["resources"].get("CPU", 0) > 0
    assert head.get("max_workers", 0) == 0


def test_autoscaling_worker_type_with_4_gpus(raw, prepared):
    workers = worker_types(prepared)
    assert workers, "no worker node type"
    gpu_types = {k: v for k, v in workers.items() if v["resources"].get("GPU") == 4}
    assert gpu_types, f"no worker type with resources GPU: 4 in {workers}"
    for name, node in gpu_types.items():
        assert "min_workers" in raw["available_node_types"][name]
        assert "max_workers" in raw["available_node_types"][name]
        assert 0 <= node["min_workers"] <= node["max_workers"] <= prepared["max_workers"]
        assert node["max_workers"] > node["min_workers"], "a fixed-size type does not autoscale"
    assert "max_workers" in raw and "idle_timeout_minutes" in raw


def test_dashboard_and_job_api_on_localhost(prepared):
    (head,) = ray_start(prepared["head_start_ray_commands"])
    assert "--head" in head
    assert flag(head, "--dashboard-host") == "127.0.0.1"
    assert flag(head, "--port") == "6379"
    assert flag(head, "--autoscaling-config") == "~/ray_bootstrap_config.yaml"
    (worker,) = ray_start(prepared["worker_start_ray_commands"])
    assert flag(worker, "--address") == "$RAY_HEAD_IP:6379"


def test_token_auth_on_every_ray_start(prepared):
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        starts = [c for c in prepared[key] if "ray start" in c]
        assert starts and all("RAY_AUTH_MODE=token" in c for c in starts), key
    # the token reaches every node
    assert prepared["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"


def test_setup_installs_project_on_every_node(prepared):
    assert prepared["file_mounts"].get("~/coreecg") == "."
    # prepare_config merged setup_commands into the head and worker lists, as ray up runs them
    for key in ("head_setup_commands", "worker_setup_commands"):
        cmds = prepared[key]
        torch = [i for i, c in enumerate(cmds) if re.search(r"pip install torch==2\.13\.0\b", c)]
        project = [i for i, c in enumerate(cmds) if "pip install -e ~/coreecg" in c]
        assert torch and project, f"{key}: {cmds}"
        assert torch[0] < project[0], f"{key}: torch must be installed before the project"
