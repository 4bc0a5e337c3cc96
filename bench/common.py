"""What the benchmarks share: the command line, JSON output, fresh child processes, the machine,
model sizes, analytic FLOPs, honest step timing (every step of the window, torch.compile's
compilations, torch's own FLOP count), and the two ingest passes (the training path and plain pyarrow).

Every benchmark is a module run from the repository root against the installed package, and
prints its figures as one JSON object on stdout (progress lines go to stderr):

    python -m bench.<name> [--quick] [...]

`--quick` is each benchmark's smallest setting: a smoke run whose figures mean nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("COREECG_SHARED_DATA", REPO.parent / "shared" / "ecg-data"))
# tests/helpers.TINY: the model of the fast tests, for --quick runs (tests/ is not a package here).
TINY = ["encoders.coreecg.embed_dim=32", "encoders.coreecg.depth=2", "encoders.coreecg.num_heads=2",
        "methods.core.time_decoder.dim=32", "methods.core.time_decoder.depth=2", "methods.core.time_decoder.heads=2",
        "methods.core.latent_decoder.dim=32", "methods.core.latent_decoder.depth=1",
        "methods.core.latent_decoder.heads=2",
        "methods.core.projection.hidden_dim=64", "methods.core.projection.dim=32"]


# ---------------------------------------------------------------------------- command line and output


def parser(doc: str, quick: str) -> argparse.ArgumentParser:
    """A benchmark's parser: its docstring as --help, and --quick (`quick` says what it runs)."""
    name = Path(sys.argv[0]).stem
    p = argparse.ArgumentParser(prog=f"python -m bench.{name}", description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"smallest setting, a smoke run: {quick}")
    return p


def config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML over the paper defaults (default: the paper model)")
    p.add_argument("--set", action="append", default=[], metavar="A.B=C", help="config override (repeatable)")


def sets(overrides: list[str]) -> list[str]:
    """["a=1", "b=2"] -> ["--set", "a=1", "--set", "b=2"]"""
    return [a for s in overrides for a in ("--set", s)]


def dump(obj, level: int = 0) -> str:
    """JSON with the top two levels indented and each row of a table (a list of objects) on one line."""
    pad = " " * (level + 1)
    if isinstance(obj, dict) and level < 2 and obj:
        items = [f"{pad}{json.dumps(k)}: {dump(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * level + "}"
    if isinstance(obj, list) and obj and all(isinstance(x, dict) for x in obj):
        return "[\n" + ",\n".join(pad + json.dumps(x) for x in obj) + "\n" + " " * level + "]"
    return json.dumps(obj)


def emit(result: dict, one_line: bool = False) -> None:
    """The benchmark's figures on stdout (one line for a child process's parent to read)."""
    print(json.dumps(result) if one_line else dump(result), flush=True)


def progress(obj) -> None:
    print(json.dumps(obj), file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------- processes


def child(module: str, args: list[str], env: dict | None = None) -> dict:
    """`python -m bench.<module> ARGS` in a fresh Python (no Ray in it, its own peak memory and
    allocator) -> the one-line JSON object it printed last."""
    done = subprocess.run([sys.executable, "-m", f"bench.{module}", *args], cwd=REPO, env=job_env(env),
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"bench.{module} {' '.join(args)} exited {done.returncode}:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def job_env(extra: dict | None = None, drop: tuple[str, ...] = ()) -> dict:
    """The environment of a child process: it imports the coreecg this benchmark imports (run
    as `python jobs/x.py`, a script would otherwise import whichever coreecg is installed)."""
    import coreecg

    root = str(Path(coreecg.__file__).resolve().parents[1])
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return {**env, **(extra or {})}


def job(name: str, *args: str) -> list[str]:
    """The command line of `jobs/<name>.py`."""
    return [sys.executable, str(REPO / "jobs" / f"{name}.py"), *args]


# ---------------------------------------------------------------------------- the machine


def default_device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def sync(device) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine(device: str = "cpu") -> dict:
    import torch

    cuda = torch.device(device).type == "cuda"
    return {"device": device, "device_name": torch.cuda.get_device_name() if cuda else cpu_name(),
            "cpu_count": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "load_average_1min": os.getloadavg()[0]}


# ---------------------------------------------------------------------------- analytic FLOPs


def transformer_flops(tokens: float, dim: int, depth: int, mlp_ratio: float, seq_len: float | None = None) -> float:
    """Forward FLOPs of `depth` pre-norm blocks on `tokens` tokens (2 per multiply-add), the
    tokens attending within sequences of `seq_len` (default: one sequence of all of them)."""
    seq_len = tokens if seq_len is None else seq_len
    linear = 2 * tokens * dim * dim * (4 + 2 * mlp_ratio)      # qkv (3), out proj (1), MLP (2r)
    attention = 4 * tokens * seq_len * dim                       # QK^T and AV
    return depth * (linear + attention)


def decoder_flops(layout: str, n_leads: int, n_patches: int, dim: int, depth: int, mlp_ratio: float) -> float:
    """A grid decoder's transformer: joint attends over all C * N tokens, lead within each lead
    (N), axial alternates within-lead (N, even blocks) and within-column (C, odd blocks)."""
    grid = n_leads * n_patches
    if layout == "joint":
        return transformer_flops(grid, dim, depth, mlp_ratio)
    if layout == "lead":
        return transformer_flops(grid, dim, depth, mlp_ratio, n_patches)
    lead_blocks = (depth + 1) // 2
    return (transformer_flops(grid, dim, lead_blocks, mlp_ratio, n_patches)
            + transformer_flops(grid, dim, depth - lead_blocks, mlp_ratio, n_leads))


ANALYTIC_METHODS = ("core", "moco_v3", "cmsc")      # the paper ViT's methods counted by formula


def pretrain_flops_per_sample(cfg) -> dict[str, float]:
    """Forward and training matmul FLOPs per sample of `cfg.pretrain.method` (CoRe-ECG below;
    MoCo v3 and CMSC in `_baseline_flops`), counting the expected visible tokens of STDM.

    Training = 3x forward for everything the optimiser updates (forward + 2x backward), and
    2x forward for the frozen teacher when W learns (forward + input-gradient backward), 1x
    when it does not. Padding in bernoulli STDM is *not* counted: it is overhead, not work.
    Another encoder than the paper's ViT, or a method without a formula (CPC, a plugin's): torch's
    count of one step instead (`measured_pretrain_flops`).
    """
    if cfg.model.arch != "coreecg" or cfg.pretrain.method not in ANALYTIC_METHODS:
        return measured_pretrain_flops(cfg)
    if cfg.pretrain.method != "core":
        return _baseline_flops(cfg)
    m, o = cfg.encoders.coreecg, cfg.methods.core      # m: the ViT's sizes
    k, td, ld, pj = o.masking, o.time_decoder, o.latent_decoder, o.projection
    C, N, P = cfg.model.n_leads, cfg.n_patches, m.patch_size
    grid = C * N
    if k.strategy == "stdm":
        visible = (1 - k.p_time) * N * k.k
    elif k.strategy == "random":
        visible = grid - round(k.ratio * grid)
    elif k.strategy == "temporal":
        visible = C * (N - round(k.ratio * N))
    else:
        visible = N * (C - round(k.ratio * C))
    patch = 2 * grid * P * m.embed_dim
    parts = {"student_encoder": patch + transformer_flops(visible, m.embed_dim, m.depth, m.mlp_ratio)}
    if o.loss.alpha > 0:
        parts["time_decoder"] = (2 * visible * m.embed_dim * td.dim
                                 + decoder_flops(td.layout, C, N, td.dim, td.depth, m.mlp_ratio)
                                 + 2 * grid * td.dim * P)
    if o.loss.beta > 0:
        proj = 2 * (m.embed_dim * pj.hidden_dim + pj.hidden_dim * pj.dim)
        parts["latent_decoder"] = (2 * visible * m.embed_dim * ld.dim
                                   + decoder_flops(ld.layout, C, N, ld.dim, ld.depth, m.mlp_ratio)
                                   + proj)
        parts["teacher"] = patch + transformer_flops(grid, m.embed_dim, m.depth, m.mlp_ratio) + proj
    forward = sum(parts.values())
    teacher = parts.get("teacher", 0.0)
    teacher_factor = 2 if (o.fda.enabled and o.fda.learnable) else 1
    train = 3 * (forward - teacher) + teacher_factor * teacher
    return {**{f"forward_{k}": v for k, v in parts.items()}, "forward": forward, "train_step": train}


_MEASURED: dict[str, dict[str, float]] = {}      # one count per (encoder, method) config in a process


def measured_pretrain_flops(cfg, batch: int = 2) -> dict[str, float]:
    """torch's count (FlopCounterMode, `count_flops`) of the method's forward and of a whole
    training step (forward + backward) per sample, on the CPU at `batch`, the model built from a
    fixed seed (the caller's RNG untouched): {"forward", "train_step", "source": "torch"}."""
    key = json.dumps({k: v for k, v in cfg.to_dict().items() if k in ("model", "encoders", "methods", "pretrain",
                                                                     "plugins")}, sort_keys=True, default=str)
    if key not in _MEASURED:
        import torch

        from coreecg.methods import build_method

        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = build_method(cfg).train()
            x = torch.randn(batch, cfg.model.n_leads, cfg.model.input_samples)
            gen = torch.Generator().manual_seed(0)
            forward = count_flops(lambda: model(x, generator=gen))["total"]
            gen.manual_seed(0)
            step = count_flops(lambda: model(x, generator=gen)["loss"].backward())["total"]
        _MEASURED[key] = {"forward": forward / batch, "train_step": step / batch}
    return {**_MEASURED[key], "source": "torch"}


def _mlp_flops(layers: int, in_dim: int, hidden: int, out_dim: int) -> float:
    dims = [in_dim] + [hidden] * (layers - 1) + [out_dim]
    return sum(2 * a * b for a, b in zip(dims, dims[1:]))


def _baseline_flops(cfg) -> dict[str, float]:
    """MoCo v3: two views through the query path (encoder, projector, predictor: trained, 3x) and
    the key path (momentum encoder, projector: forward only, 1x). CMSC: `segments` segments of
    C * N / segments tokens each through the encoder and its linear head (3x)."""
    m = cfg.encoders.coreecg                           # the ViT's sizes
    grid = cfg.model.n_leads * cfg.n_patches
    patch = 2 * grid * m.patch_size * m.embed_dim
    if cfg.pretrain.method == "moco_v3":
        o = cfg.methods.moco_v3
        encoder = patch + transformer_flops(grid, m.embed_dim, m.depth, m.mlp_ratio)
        projector = _mlp_flops(o.proj_layers, m.embed_dim, o.hidden_dim, o.dim)
        query = 2 * (encoder + projector + _mlp_flops(o.pred_layers, o.dim, o.hidden_dim, o.dim))
        key = 2 * (encoder + projector)
        return {"forward_query": query, "forward_key": key, "forward": query + key, "train_step": 3 * query + key}
    if cfg.pretrain.method == "cmsc":
        o = cfg.methods.cmsc
        one = transformer_flops(grid // o.segments, m.embed_dim, m.depth, m.mlp_ratio) + 2 * m.embed_dim * o.dim
        forward = o.segments * one + o.segments * patch        # the patch conv runs on the whole crop per segment
        return {"forward_segments": forward, "forward": forward, "train_step": 3 * forward}
    raise ValueError(f"no FLOP count for pretrain.method={cfg.pretrain.method!r}")


# ---------------------------------------------------------------------------- honest timing (issue 41)


def middle(values: list[float]) -> float:
    """The middle value (the upper of the two middle ones for an even count): the benchmarks'
    `seconds_per_step_median` since issue 10, kept so that earlier figures compare."""
    return sorted(values)[len(values) // 2]


def step_summary(step_s: list[float], samples: int | list[int], warmup: int = 0, slow_factor: float = 2.0) -> dict:
    """Throughput over a whole timed window, beside the median: a median hides a recompilation,
    the whole window does not. A pure function of the step times, so that it can be tested.

    step_s: the seconds of every step of the window in order, warm-up steps first (the window
    starts at the first step's start); samples: the samples of each step (one int: every step).
    The median is that of the steps after the `warmup` ones (all of them when there are no more);
    slow steps are those over `slow_factor` x the median, the warm-up steps included, each with
    its index in `step_s` (0: the first step) and its excess over the median.
    """
    if not step_s:
        raise ValueError("step_summary: no step times")
    n = len(step_s)
    per = [samples] * n if isinstance(samples, int) else list(samples)
    if len(per) != n:
        raise ValueError(f"step_summary: {len(per)} sample counts for {n} steps")
    timed = list(range(warmup, n)) if warmup < n else list(range(n))
    median = middle([step_s[i] for i in timed])
    median_rate = middle([per[i] / step_s[i] for i in timed]) if len(set(per)) > 1 else per[0] / median
    slow = [{"index": i, "s": t, "x_median": t / median, "warmup": i < warmup}
            for i, t in enumerate(step_s) if t > slow_factor * median]
    return {
        "window_steps": n, "warmup_steps": min(warmup, n), "window_samples": sum(per),
        "window_s": sum(step_s),
        "samples_per_s_median": median_rate,
        "samples_per_s_whole": sum(per) / sum(step_s),
        "samples_per_s_after_first": sum(per[1:]) / sum(step_s[1:]) if n > 1 else None,
        "first_step_s": step_s[0],
        # what the first step and the later slow steps (recompilations, ...) cost over a median step
        "first_step_excess_s": step_s[0] - median,
        "slow_steps_after_first_excess_s": sum(s["s"] - median for s in slow if s["index"] > 0),
        "step_s": list(step_s),
        "slow_steps": slow,
    }


def compile_snapshot() -> dict:
    """torch.compile's own counters now (`torch._dynamo.utils.counters`: process-wide, and not
    reset by `torch._dynamo.reset()`), to diff with `compile_diff`. graphs: FX graphs dynamo
    produced (`counters["stats"]["unique_graphs"]`: a first compile, each recompile for a new
    shape or a failed guard, each piece around a graph break); frames: frames dynamo compiled
    (`counters["frames"]["total"]`); graph_breaks: `counters["graph_break"]`, summed."""
    from torch._dynamo.utils import counters, get_compilation_metrics

    from coreecg.train.speed import graphs_compiled

    return {"graphs": graphs_compiled(),           # the count the training loop records too
            "frames": counters.get("frames", {}).get("total", 0),
            "graph_breaks": sum(counters.get("graph_break", {}).values()),
            "metrics": list(get_compilation_metrics())}     # the latest compiles (torch keeps 64)


def compile_diff(before: dict, after: dict) -> dict:
    """What was compiled between two `compile_snapshot`s: graphs, frames, graph breaks, and the
    reasons torch gave for the recompilations among them (guard failures, from its compile
    metrics; at most the 64 latest compiles are kept by torch)."""
    seen = {id(m) for m in before["metrics"]}
    reasons = [str(m.recompile_reason)[:300] for m in after["metrics"]
               if id(m) not in seen and getattr(m, "recompile_reason", None)]
    return {"graphs": after["graphs"] - before["graphs"], "frames": after["frames"] - before["frames"],
            "graph_breaks": after["graph_breaks"] - before["graph_breaks"], "recompile_reasons": reasons}


def _sdpa_shapes(q, k, v) -> tuple[int, int, int, int, int]:
    """(batch x heads, query length, key length, q/k width, v width) of (..., L, E) shapes."""
    *lead, sq, d = q
    bh = 1
    for x in lead:
        bh *= x
    return bh, sq, k[-2], d, v[-1]


def _sdpa_cpu_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    """CPU's fused attention (`_scaled_dot_product_flash_attention_for_cpu`, masked or not):
    QK^T and AV, as torch counts its GPU kernels (FlopCounterMode has no formula for the CPU op)."""
    bh, sq, sk, d, dv = _sdpa_shapes(q, k, v)
    return 2 * bh * sq * sk * d + 2 * bh * sq * sk * dv


def _sdpa_cpu_backward_flops(grad_out, q, k, v, *args, out_shape=None, **kwargs) -> int:
    """Its backward: dV, dP (grad_out V^T), dQ and dK, as torch counts its GPU kernels' backward."""
    bh, sq, sk, d, dv = _sdpa_shapes(q, k, v)
    return 2 * bh * sq * sk * dv * 2 + 2 * bh * sq * sk * d * 2


def count_flops(fn, *args, **kwargs) -> dict:
    """Run `fn(*args, **kwargs)` once under torch's `FlopCounterMode` -> {"total": FLOPs,
    "by_op": {op: FLOPs}, "result": fn's return}. torch's formulas cover matmuls, convolutions
    and the GPU attention kernels; CPU's fused attention is added here (torch 2.13 counts it as
    nothing). Compiled code (train.compile) runs eagerly here (`torch.compiler.set_stance
    ("force_eager")`): the same arithmetic, and no compilation for the counting mode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    aten = torch.ops.aten
    mapping = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", _sdpa_cpu_flops),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward", _sdpa_cpu_backward_flops)):
        if hasattr(aten, name):
            mapping[getattr(aten, name)] = formula
    with torch.compiler.set_stance("force_eager"), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        result = fn(*args, **kwargs)
    by_op = {str(op): int(n) for op, n in counter.get_flop_counts().get("Global", {}).items()}
    return {"total": int(counter.get_total_flops()), "by_op": by_op, "result": result}


# ---------------------------------------------------------------------------- ingest


def pyarrow_pass(files: list[Path], shape: tuple[int, ...], dtype: str, batch_rows: int = 1024) -> dict:
    """The limit: one process reading the signal column and decoding it to float32."""
    import pyarrow.parquet as pq

    from coreecg.data.corpus import decode_signals

    n, t0 = 0, time.perf_counter()
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(batch_size=batch_rows, columns=["signal"]):
            n += len(decode_signals(batch.column(0), shape, dtype))
    return {"windows": n, "windows_per_s": round(n / (time.perf_counter() - t0))}


def worker_source(corpus: Path, cache_gb: float, seed: int = 0):
    """What rank 0 of one Ray Train worker iterates: `ShardFiles` (streamed, the split at or
    above `cache_gb`) or Ray Train's split of the materialised dataset (its default options)."""
    import ray.train

    from coreecg.train.ingest import ShardFiles, training_dataset

    ds = training_dataset(corpus, seed, cache_gb)
    if isinstance(ds, ShardFiles):
        return ds
    return ray.train.DataConfig().configure({"train": ds}, world_size=1, worker_handles=None,
                                            worker_node_ids=None)[0]["train"]


def ingest_pass(source, batch_size: int, epoch: int, shuffle_buffer: int, crop: int, seed: int = 0,
                t0: float | None = None) -> dict:
    """One epoch of training ingest with no model: the float16 batches `epoch_batches` yields,
    taken as fast as they come. `to_model_input` (crop + float32, which the step does on the
    training device) is timed apart, on the last batch. t0: when the clock started (default now;
    pass the time before `worker_source` to count building the dataset)."""
    import torch

    from coreecg.train.ingest import ShardFiles, epoch_batches, to_model_input

    t0 = time.perf_counter() if t0 is None else t0
    n, first, batch = 0, None, None
    for batch in epoch_batches(source, batch_size, epoch, seed, 0, shuffle_buffer, torch.device("cpu")):
        first = first or time.perf_counter()
        n += len(batch[1])
    end = time.perf_counter()
    if batch is None:
        raise SystemExit(f"the train split gave no batch of {batch_size}")
    t1 = time.perf_counter()
    for _ in range(10):
        to_model_input(*batch, seed, epoch, crop)
    model_input_s = (time.perf_counter() - t1) / 10
    return {"streamed": isinstance(source, ShardFiles), "windows": n,
            "time_to_first_batch_s": round(first - t0, 3), "windows_per_s": round(n / (end - t0)),
            "windows_per_s_after_first_batch": round(n / (end - first)) if end > first else None,
            "to_model_input_us_per_window": round(model_input_s / batch_size * 1e6, 1)}
