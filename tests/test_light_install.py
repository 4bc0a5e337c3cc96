"""The light install (`pip install coreecg`, no extras): loading an export and embedding a raw
record never import Ray, Optuna, tensorboardX, matplotlib or scikit-learn (the `ray` extra's),
and a job started without them says which extra to install."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXPORT = REPO / "tests" / "data" / "export-v1-encoder"
RECORD = Path("ptbxl") / "records500" / "00000" / "00003_hr.hea"      # under conftest's ecg_data

# An environment without the `ray` extra: a finder first on sys.meta_path refuses those packages.
BLOCK = """
import sys
BLOCKED = {"ray", "optuna", "tensorboardX", "matplotlib", "sklearn"}

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked: the light install)", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
"""

PREDICT = BLOCK + """
import json
import numpy as np
try:
    import ray
    blocked = False
except ModuleNotFoundError:
    blocked = True
import coreecg
from coreecg.inference import predict_paths

result = predict_paths(sys.argv[1], [sys.argv[2]], embeddings=True)
emb = result.embeddings
leaked = sorted({m.partition(".")[0] for m in sys.modules} & BLOCKED)
print(json.dumps({"blocked": blocked, "shape": list(emb.shape), "finite": bool(np.isfinite(emb).all()),
                  "failures": [f.reason for f in result.failures], "leaked": leaked}))
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                          cwd=REPO, timeout=300)


def test_embedding_a_raw_record_needs_no_ray_extra(ecg_data):
    done = _run(PREDICT, str(EXPORT), str(ecg_data / RECORD))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["blocked"] and out["leaked"] == [] and out["failures"] == []
    assert out["shape"] == [1, 32] and out["finite"]


# predict --workers on the light install: exit 2 with the message (checked before the model
# loads, so no model is needed); then any job's init_ray.
JOBS = BLOCK + """
import runpy
sys.argv = ["predict.py", "--model", "no-model", "--input", "no-input", "--output", "no-output", "--workers", "2"]
try:
    runpy.run_path("jobs/predict.py", run_name="__main__")
except SystemExit as e:
    print("predict exit", e.code, flush=True)
from coreecg.cluster import init_ray
init_ray()
"""


def test_a_job_without_the_extra_names_it():
    """Every job joins or starts Ray through coreecg.cluster.init_ray: there the extra is named;
    predict --workers says it as a bad-arguments exit (2), not a traceback."""
    done = _run(JOBS)
    assert "predict exit 2" in done.stdout, done.stderr[-3000:]
    predict_err, _, init_err = done.stderr.partition("Traceback")
    assert "--workers (Ray Data actors) needs ray" in predict_err and "pip install 'coreecg[ray]'" in predict_err
    assert done.returncode != 0
    assert "MissingExtra" in init_err and "needs ray" in init_err
    assert "pip install 'coreecg[ray]'" in init_err


def test_training_checks_the_whole_extra(monkeypatch, tmp_path):
    """Ray alone is not enough to train: a half-installed extra stops at the plan's preflight with
    the install command, before a worker meets a bare ModuleNotFoundError."""
    from coreecg import extras
    from coreecg.config import load_config
    from coreecg.train.plan import preflight

    monkeypatch.setattr(extras, "_installed", lambda m: m not in ("tensorboardX", "sklearn"))
    with pytest.raises(extras.MissingExtra, match=r"training .* needs tensorboardX, sklearn, .*coreecg\[ray\]"):
        preflight(tmp_path / "run", load_config())


TRAIN_JOB = BLOCK + """
import runpy
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("job", [["jobs/pretrain.py"],
                                 ["jobs/finetune.py", "--encoder", "none", "--mode", "scratch", "--corpus", "nowhere",
                                  "--output", "nowhere-out"]])
def test_a_training_job_without_the_extra_names_it_before_importing_ray(job):
    """The training driver's module imports Ray at its top: the job names the extra first, never
    a bare ModuleNotFoundError."""
    done = _run(TRAIN_JOB, *job)
    assert done.returncode != 0
    assert "MissingExtra" in done.stderr and "training (pretraining" in done.stderr, done.stderr[-3000:]
    assert "pip install 'coreecg[ray]'" in done.stderr and "No module named 'ray'" not in done.stderr
