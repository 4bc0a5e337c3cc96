"""The typed run plan, the one split reader and the package's layering rules."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from coreecg.data.locate import synthetic_corpus
from coreecg.data.reading import patient_index, read_split, split_rows
from coreecg.train.finetuning import plan_finetune
from coreecg.train.plan import FinetuneSpec, PlanError, RunPlan, plan_local
from coreecg.train.pretraining import plan_pretrain
from tests.helpers import tiny_config

PACKAGE = Path(__file__).resolve().parents[1] / "coreecg"


@pytest.fixture(scope="module")
def corpus(ray_session, tmp_path_factory):
    cache = tmp_path_factory.mktemp("plan-cache")
    return synthetic_corpus(tiny_config("data.synthetic_records=120", f"data.cache_dir={cache}")), cache


def _cfg(corpus_and_cache, tmp_path, *extra):
    corpus, cache = corpus_and_cache
    return tiny_config("data.synthetic_records=120", f"data.cache_dir={cache}", "optim.batch_size=8",
                       f"train.storage_path={tmp_path}", "train.name=run", *extra)


def test_pretrain_plan_resolves_everything_before_a_worker(corpus, tmp_path):
    plan = plan_pretrain(_cfg(corpus, tmp_path, "train.num_workers=2"))
    n = split_rows(corpus[0], "train")
    assert plan.task == "pretrain" and plan.corpus == corpus[0] and plan.train_windows == n
    assert plan.steps_per_epoch == (n // 2) // 4 and plan.probe_corpus == corpus[0]   # labelled: its own probe
    assert plan.run_dir == tmp_path.resolve() / "run" and not plan.run_dir.exists()  # planning writes nothing
    # A worker receives plain data and rebuilds the same plan.
    wire = json.loads(json.dumps(plan.to_dict()))
    assert RunPlan.from_dict(wire) == plan


def test_a_worker_reads_the_probe_and_figure_windows_only_where_something_evaluates(corpus, tmp_path):
    """Rank 0's task holds the probe's data and the figure's windows when the run evaluates; with
    train.eval_every_epochs=0 nothing reads them (seconds of every such run's start-up), and no
    other rank reads them either way."""
    from coreecg.train.pretraining import task_from_plan

    on = task_from_plan(plan_pretrain(_cfg(corpus, tmp_path, "train.eval_every_epochs=1")), rank=0)
    assert on.probe is not None and on.figure_windows is not None and len(on.figure_windows) > 0
    off = task_from_plan(plan_pretrain(_cfg(corpus, tmp_path, "train.eval_every_epochs=0")), rank=0)
    assert off.probe is None and off.figure_windows is None
    other = task_from_plan(plan_pretrain(_cfg(corpus, tmp_path, "train.eval_every_epochs=1")), rank=1)
    assert other.probe is None and other.figure_windows is None


def test_finetune_plan_round_trips_with_its_spec_but_not_its_subset(corpus, tmp_path):
    plan = plan_finetune(_cfg(corpus, tmp_path, "finetune.mode=scratch", "finetune.batch_size=8",
                              "finetune.train_fraction=0.5"))
    spec = plan.finetune
    assert isinstance(spec, FinetuneSpec) and spec.encoder == "" and spec.lead_rows == tuple(range(12))
    assert plan.keep is not None and int(plan.keep.sum()) == plan.train_windows < split_rows(corpus[0])
    back = RunPlan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert back == plan and back.keep is None and back.finetune.meta["train_fraction"] == 0.5


def test_a_plan_that_cannot_run_is_refused_naming_the_key(corpus, tmp_path):
    with pytest.raises(PlanError, match="optim.batch_size"):
        plan_pretrain(_cfg(corpus, tmp_path, "optim.batch_size=4096"))
    with pytest.raises(PlanError, match="fewer than one batch"):
        plan_local(tiny_config("optim.batch_size=8"), 5, tmp_path / "x")
    plan = plan_local(tiny_config("optim.batch_size=8"), 20, tmp_path / "x")
    assert plan.run_dir == (tmp_path / "x").resolve() and plan.steps_per_epoch == 2 and plan.corpus is None
    with pytest.raises(PlanError, match="FinetuneSpec"):
        RunPlan("finetune", plan.config, None, 20, 2)
    with pytest.raises(PlanError, match="task"):
        RunPlan("distill", plan.config, None, 20, 2)


def test_read_split_numbers_rows_as_training_ingest_does(corpus):
    from coreecg.data.corpus import load_manifest, split_files
    from coreecg.data.corpus import read_windows

    path = corpus[0]
    manifest = load_manifest(path)
    whole = read_split(path, "train", ["signal", "labels", "record_id"], as_stored=True)
    assert whole["signal"].dtype == np.float16 and list(whole["uid"]) == list(range(split_rows(path)))
    first = 0
    for f, s in zip(split_files(path, "train"), [s for s in manifest["shards"] if s["split"] == "train"]):
        shard = read_windows({"path": [str(f)], "first_uid": [first]}, tuple(manifest["signal"]["shape"]),
                            manifest["signal"]["dtype"])
        assert np.array_equal(whole["signal"][shard["uid"]], shard["signal"])
        first += s["rows"]
    spread = read_split(path, "train", ["signal", "labels"], max_windows=7)
    stride = -(-len(whole["uid"]) // 7)
    assert len(spread["uid"]) <= 7 and all(u % stride == 0 for u in spread["uid"])
    assert np.array_equal(spread["signal"], whole["signal"][spread["uid"]].astype(np.float32))
    assert np.array_equal(spread["multihot"], whole["multihot"][spread["uid"]])
    ids = patient_index(path)
    meta = read_split(path, "train", ["dataset", "patient_id", "record_id"])
    assert ids.shape == whole["uid"].shape and len(set(ids)) == len(set(meta["patient_id"]))
    assert len(set(ids)) < len(set(meta["record_id"]))      # synthetic patients have several recordings
    for p in set(meta["patient_id"]):                       # one index per patient, its own
        assert len(set(ids[meta["patient_id"] == p])) == 1


def test_the_library_logs_and_never_prints():
    for p in PACKAGE.rglob("*.py"):
        tree = ast.parse(p.read_text())
        prints = [n.lineno for n in ast.walk(tree)
                  if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print"]
        quiet = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.arg) and n.arg == "quiet"]
        assert not prints and not quiet, f"{p}: print() at lines {prints}, a quiet flag at lines {quiet}"
