"""Small model configs for fast tests (benchmarks use the paper's sizes)."""
from coreecg.config import load_config

TINY = [
    "encoders.coreecg.embed_dim=32", "encoders.coreecg.depth=2", "encoders.coreecg.num_heads=2",
    "methods.core.time_decoder.dim=32", "methods.core.time_decoder.depth=2", "methods.core.time_decoder.heads=2",
    "methods.core.latent_decoder.dim=32", "methods.core.latent_decoder.depth=1", "methods.core.latent_decoder.heads=2",
    "methods.core.projection.hidden_dim=64", "methods.core.projection.dim=32",
]


def build_ptbxl(root, ecg_data):
    """The shared PTB-XL records as a small corpus (shards of 32) at root/ptbxl -> its path."""
    from coreecg.data.pipeline import build_corpus

    cfg = load_config(overrides=["data.shard_records=32"]).data
    build_corpus("ptbxl", ecg_data / "ptbxl", root / "ptbxl", cfg, source_options=cfg.sources.for_source("ptbxl", 0))
    return root / "ptbxl"


def tiny_config(*overrides: str):
    return load_config(overrides=[*TINY, *overrides])


def _rank_entry(rank: int, world: int, port: int, fn, args: tuple, results) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results[rank] = fn(rank, world, *args)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn, *args, world: int = 2) -> dict:
    """fn(rank, world, *args) on `world` gloo processes on this CPU -> {rank: its return value}.

    Spawned, never forked (the manager too): the test session's Ray driver must not be copied.
    fn must be a module-level function (it is pickled by name)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with mp.get_context("spawn").Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank_entry, args=(world, port, fn, args, results), nprocs=world, join=True)
        return dict(results)


def kill_after_first(args: list[str], env: dict, cwd, marker: str, timeout: float):
    """Start a job, SIGKILL it once `marker` (an absolute glob pattern)
    matches a file, and return {folder of each match: its metrics.jsonl text} at that moment."""
    import glob
    import signal
    import subprocess
    import time
    from pathlib import Path

    proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not glob.glob(marker) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    finished = [Path(p).parent for p in glob.glob(marker)]
    assert finished, f"nothing matched {marker} before the job ended or {timeout} s passed"
    return {d: (d / "metrics.jsonl").read_text() for d in finished}


def once_settled(read, what: str, quiet_s: float = 3.0, limit_s: float = 60.0):
    """read() once its value has stayed the same for `quiet_s` (bounded at `limit_s`): what a killed
    job left once its Ray tasks and actors are gone. Ray reaps a dead driver's work within a second
    or so, and until then a task may still finish a shard or rank 0 write a checkpoint (CI once saw
    step 4 appear after step 2 was read): a read after a fixed wait raced them."""
    import time

    seen, since, deadline = None, time.time(), time.time() + limit_s
    while time.time() < deadline:
        now = read()
        if now != seen:
            seen, since = now, time.time()
        elif time.time() - since >= quiet_s:
            return seen
        time.sleep(0.2)
    raise AssertionError(f"{what} still changing {limit_s:.0f} s after the job was killed: {seen}")


def crash_on_save(monkeypatch, n: int, message: str = "simulated crash") -> None:
    """Make the in-process loop's `n`-th checkpoint save (counting from 1) raise KeyboardInterrupt
    right after the checkpoint is written: a kill between two checkpoints."""
    from coreecg.train import loop

    real_save, calls = loop.save_step, {"n": 0}

    def save_then_crash(*a, **k):
        real_save(*a, **k)
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt(message)

    monkeypatch.setattr(loop, "save_step", save_then_crash)


class InProcessDataset:
    """Ray Data's from_items(...).map(fn, fn_kwargs=...).take_all(), run in this process."""

    def __init__(self, items):
        self.items = list(items)

    def map(self, fn, fn_kwargs=None, **_):
        return InProcessDataset(fn(item, **(fn_kwargs or {})) for item in self.items)

    def take_all(self):
        return self.items


def tiny_models(root, classes=("NORM", "MI", "STTC"), multilabel: bool = False) -> dict:
    """Model files in a second, without training: a random tiny encoder as pretraining writes it
    (root/pre/encoder.pt) and a 12-lead classifier on it (root/ft/best.pt, class names inside).
    1,500-sample crops of 150-sample patches (120 tokens): cheap forward passes on 2 cores."""
    import torch

    from coreecg.checkpoints import save_checkpoint, save_encoder
    from coreecg.loading import load_encoder
    from coreecg.methods import CoReECG
    from coreecg.model.classifier import Classifier
    from coreecg.config import STANDARD_LEADS

    small = ["model.input_samples=1500", "data.crop_samples=1500", "encoders.coreecg.patch_size=150"]
    torch.manual_seed(0)
    cfg = tiny_config(*small)
    save_encoder(root / "pre" / "encoder.pt", CoReECG(cfg), cfg, step=1)
    fcfg = tiny_config(*small, f"finetune.encoder={root / 'pre' / 'encoder.pt'}")
    clf = Classifier(load_encoder(root / "pre" / "encoder.pt"), len(classes), STANDARD_LEADS, multilabel=multilabel)
    torch.nn.init.normal_(clf.head.weight)          # scores that differ between records, as after training
    save_checkpoint(root / "ft" / "best.pt", clf.state_dict(), fcfg, task="finetune", epoch=0, step=1,
                    class_names=list(classes), multilabel=multilabel)
    return {"encoder": root / "pre", "classifier": root / "ft" / "best.pt"}


def build_synthetic(out, records: int, seed: int, *extra: str):
    """A synthetic corpus of `records` records at `out` (16 records a shard), built in this process
    (no Ray cluster: the shards run here, one by one) -> out."""
    import pytest
    import ray.data

    from coreecg.data.pipeline import build_corpus

    cfg = load_config(overrides=["data.shard_records=16", f"data.sources.synthetic.seed={seed}", *extra]).data
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray.data, "from_items", lambda items, **_: InProcessDataset(items))
        build_corpus("synthetic", None, out, cfg, source_options=cfg.sources.for_source("synthetic", records),
                     log_warnings=False)
    return out
