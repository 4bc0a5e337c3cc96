"""A corpus opened once (coreecg.data.corpus.open_corpus): one pretraining fit reads each corpus
manifest once and hashes each corpus file at most once, from the plan through the fingerprint
check and the run record to the ingest; a process parses a manifest once until its file changes;
and the opened corpus behaves as its path does.

Counted by wrapping io.open / open (every Python read of a manifest.json, the hashing one
included) and coreecg.files.sha256_file where the modules bound it. The fits run in this process
(fit(plan, report_fn=...), streamed shard files): no Ray cluster, every read is seen here."""
from __future__ import annotations

import builtins
import collections
import io
import json
import shutil
import sys
from pathlib import Path

import pytest

from coreecg.data import corpus as corpus_module
from coreecg.data.corpus import MANIFEST, CorpusError, OpenCorpus, load_manifest, open_corpus, verify_corpus
from coreecg.data.fingerprints import FINGERPRINT_FILE, corpus_record
from tests.helpers import build_synthetic, tiny_config


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("open-once")
    return {"a": build_synthetic(root / "a", 24, 1), "b": build_synthetic(root / "b", 24, 2)}


class Reads:
    """Python reads of manifest.json files and sha256_file calls, per resolved path."""

    def __init__(self, monkeypatch):
        import coreecg.files

        self.manifests: collections.Counter = collections.Counter()
        self.hashes: collections.Counter = collections.Counter()
        real_open, real_sha = io.open, coreecg.files.sha256_file

        def counting_open(file, mode="r", *a, **k):
            if isinstance(file, (str, Path)) and Path(file).name == MANIFEST and "r" in mode:
                self.manifests[Path(file).resolve()] += 1
            return real_open(file, mode, *a, **k)

        def counting_sha(path):
            self.hashes[Path(path).resolve()] += 1
            return real_sha(path)

        monkeypatch.setattr(io, "open", counting_open)
        monkeypatch.setattr(builtins, "open", counting_open)
        for mod in [m for m in list(sys.modules.values()) if m is not None and m.__name__.startswith("coreecg")]:
            if getattr(mod, "sha256_file", None) is real_sha:
                monkeypatch.setattr(mod, "sha256_file", counting_sha)


def _fit(corpus: str, out: Path, monkeypatch) -> Reads:
    """Plan and fit one tiny pretraining epoch in this process; the reads made from the plan on."""
    import ray

    from coreecg.train import fit as fitmod
    from coreecg.train.fit import fit
    from coreecg.train.pretraining import plan_pretrain

    cfg = tiny_config(f"data.corpus={corpus}", "data.cache_in_memory_gb=0", "optim.batch_size=8", "optim.epochs=1",
                      "optim.warmup_epochs=0", "train.eval_every_epochs=0", "train.figures=false",
                      "train.num_workers=1", f"train.storage_path={out.parent}", f"train.name={out.name}")
    monkeypatch.setattr(fitmod, "start_ray", lambda config: None)
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(corpus_module, "_MANIFESTS", {})       # as a fresh process: nothing read yet
    reads = Reads(monkeypatch)
    fit(plan_pretrain(cfg), report_fn=lambda metrics: None)
    monkeypatch.undo()
    return reads


def _session_data(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())["sessions"][-1]["data"]


def test_one_pretraining_reads_its_manifest_once_and_hashes_each_file_once(corpora, tmp_path, monkeypatch):
    corpus = tmp_path / "a"
    shutil.copytree(corpora["a"], corpus)
    (corpus / FINGERPRINT_FILE).unlink()        # the fit computes, writes and records them
    reads = _fit(str(corpus), tmp_path / "run", monkeypatch)
    assert reads.manifests == {corpus.resolve() / MANIFEST: 1}
    on_corpus = {p: n for p, n in reads.hashes.items() if p.is_relative_to(corpus.resolve())}
    assert on_corpus == {corpus.resolve() / FINGERPRINT_FILE: 1}       # the manifest's: from the bytes read
    assert (corpus / FINGERPRINT_FILE).is_file()
    # what run.json records is what the path-taking record says, read afresh
    assert _session_data(tmp_path / "run") == corpus_record(corpus)

    again = _fit(str(corpus), tmp_path / "warm", monkeypatch)          # fingerprints current now
    assert again.manifests == {corpus.resolve() / MANIFEST: 1}
    assert max(again.hashes.values()) == 1


def test_a_manifest_is_parsed_once_per_process_until_its_file_changes(corpora, tmp_path, monkeypatch):
    """The per-process read (coreecg.data.corpus._MANIFESTS): a second open reads nothing; a
    rewritten manifest (a rebuilt corpus) is read anew; a caller's edit of its copy changes no
    other caller's; a worker adopts the driver's read (RunPlan.to_dict) unless its file differs."""
    import os

    from coreecg.data.corpus import adopt_corpus

    corpus = tmp_path / "c"
    shutil.copytree(corpora["a"], corpus)
    first = open_corpus(corpus)
    f = corpus / MANIFEST
    text = f.read_text()
    reads = Reads(monkeypatch)
    second = open_corpus(corpus)
    second.manifest["class_names"] = ["edited"]
    assert reads.manifests == {} and first.manifest["class_names"] != ["edited"]
    assert load_manifest(corpus)["class_names"] == first.manifest["class_names"]
    assert adopt_corpus(first.to_dict()).manifest == first.manifest and reads.manifests == {}
    f.write_text(text)                                    # rewritten: a new modification time
    os.utime(f, ns=(f.stat().st_atime_ns, first.stamp[0] + 10**9))
    assert open_corpus(corpus).stamp != first.stamp and reads.manifests == {f.resolve(): 1}
    stale = adopt_corpus(first.to_dict())                # the driver's read is older than this file
    assert stale.stamp != first.stamp and reads.manifests == {f.resolve(): 1}     # this process's newer one
    monkeypatch.undo()


def test_a_mixture_reads_each_manifest_once(corpora, tmp_path, monkeypatch):
    reads = _fit(f"[{corpora['a']}, {corpora['b']}]", tmp_path / "mix", monkeypatch)
    assert reads.manifests == {corpora[c].resolve() / MANIFEST: 1 for c in ("a", "b")}
    assert max(reads.hashes.values()) == 1
    data = _session_data(tmp_path / "mix")
    for entry, c in zip(data["corpora"], ("a", "b")):
        assert {k: entry[k] for k in corpus_record(corpora[c])} == corpus_record(corpora[c])


def test_an_opened_corpus_reads_as_its_path(corpora, tmp_path, monkeypatch):
    path = corpora["a"]
    opened = open_corpus(path)
    assert open_corpus(opened) is opened and Path(opened) == path and str(opened) == str(path)
    reads = Reads(monkeypatch)
    assert load_manifest(opened) is opened.manifest == load_manifest(path)
    assert opened.split_files("train") == opened.split_files("train") and opened.signal_shape == (12, 2500)
    assert opened.manifest_sha256 == opened.sha256(MANIFEST) and corpus_record(opened) == corpus_record(path)
    assert reads.manifests == {}          # neither: this process read the manifest when it opened `opened`
    monkeypatch.undo()

    with pytest.raises(CorpusError, match=f"no {MANIFEST}.*{tmp_path}"):
        open_corpus(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    shard = load_manifest(copy)["shards"][0]["path"]
    (copy / shard).write_bytes((copy / shard).read_bytes() + b"x")
    assert verify_corpus(copy) == [shard] and isinstance(open_corpus(copy), OpenCorpus)


def test_a_fine_tuning_plan_reads_its_corpus_manifest_once(tmp_path, monkeypatch):
    """plan_finetune opens its corpus once (it read the manifest 4 times at 60eda33: the planner,
    the split reader of train, val and test) and hands the opened corpus to the run plan."""
    from coreecg.train.finetune_plan import plan_finetune

    corpus = build_synthetic(tmp_path / "labelled", 96, 1)
    cfg = tiny_config(f"data.corpus={corpus}", "finetune.mode=scratch", "finetune.batch_size=4",
                      "train.num_workers=1", "train.use_gpu=false", f"train.storage_path={tmp_path / 'runs'}")
    monkeypatch.setattr(corpus_module, "_MANIFESTS", {})       # as a fresh process (the build read it)
    reads = Reads(monkeypatch)
    plan = plan_finetune(cfg)
    monkeypatch.undo()
    assert dict(reads.manifests) == {(corpus / MANIFEST).resolve(): 1}
    assert plan.corpus == corpus and plan.open(corpus).path == corpus     # the opened one, kept by the plan
