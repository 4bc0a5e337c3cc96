"""Data knows no training: importing the data package pulls in neither the model nor the
training code (nor torch, which only the float16 decode of corpus reads uses, lazily)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _modules_after(code: str) -> list[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_data_pulls_in_no_model_training_or_torch():
    mods = _modules_after("import coreecg.data, coreecg.data.pipeline, coreecg.data.sources.wfdb_io\n"
                          "from coreecg.data.sources import get_source\nget_source('wfdb')")
    assert "coreecg.data.pipeline" in mods          # the probe did import what it claims
    leaked = [m for m in mods if m.startswith(("coreecg.model", "coreecg.train", "torch"))]
    assert leaked == []


def test_version_is_shared_and_the_top_level_api_stays_lazy():
    mods = _modules_after("import coreecg\nfrom coreecg.version import __version__ as v\n"
                          "assert coreecg.__version__ == v and callable(coreecg.load_encoder)")
    assert "coreecg.version" in mods
    assert not [m for m in mods if m.startswith(("coreecg.train", "coreecg.model", "torch"))]
