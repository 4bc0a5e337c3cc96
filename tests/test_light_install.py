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
RECORD = REPO.parent / "shared" / "ecg-data" / "ptbxl" / "records500" / "00000" / "00003_hr.hea"

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


@pytest.mark.skipif(not RECORD.is_file(), reason="../shared/ecg-data not present")
def test_embedding_a_raw_record_needs_no_ray_extra():
    done = _run(PREDICT, str(EXPORT), str(RECORD))
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["blocked"] and out["leaked"] == [] and out["failures"] == []
    assert out["shape"] == [1, 32] and out["finite"]


def test_a_job_without_the_extra_names_it():
    """Every job joins or starts Ray through coreecg.cluster.init_ray: there the extra is named."""
    done = _run(BLOCK + "from coreecg.cluster import init_ray\ninit_ray()\n")
    assert done.returncode != 0
    assert "MissingExtra" in done.stderr and "needs ray" in done.stderr
    assert "pip install 'coreecg[ray]'" in done.stderr
