"""Benchmark one pretraining step at the paper's model size: CoRe-ECG against a plain masked
autoencoder built from the same Encoder and against the contrastive baselines, timed in the same run.

    python -m bench.pretrain_step                       # CPU: batch 32, fp32 + bf16, ~6 min
    python -m bench.pretrain_step --device cuda         # GPU: batch 256, bf16 (bench/gpu_smoke.sh)
    python -m bench.pretrain_step --set train.compile=true --variants core
    python -m bench.pretrain_step --variants core,moco_v3,cmsc --precisions fp32   # the methods
    python -m bench.pretrain_step --quick               # tiny model, batch 4, one step: a smoke run
    python -m bench.pretrain_step --device cuda --modes exact --sdpa flash,efficient   # attention kernels
    python -m bench.pretrain_step --device cuda --variants core --profile 3            # where the step goes

Variants, each in a fresh subprocess so that peak-memory figures do not mix:
  core       the paper config (or --config), every speed option at its default;
  core_ckpt  the same with train.activation_checkpointing=true (the memory option);
  mae        a plain masked autoencoder of the same width: the project's Encoder on 25 % of
             the tokens (random masking), the Time Decoder as one joint 360-token sequence of
             the same width and depth, masked MSE; no teacher, no FDA, no Latent Decoder;
  moco_v3    MoCo v3 (pretrain.method=moco_v3, its paper-size heads), two views per window;
  cmsc       CMSC (pretrain.method=cmsc), two 15-patch segments per window.
The random windows hold no short-record padding, so the step runs as on a corpus whose manifest
counts none (MIMIC-IV-ECG's 10 s records): no key-padding mask where none is needed
(`coreecg.model.padding.unpadded`); --padded keeps the mask everywhere (a corpus with short records).
--sdpa runs every variant under each named scaled-dot-product-attention backend (torch's
`sdpa_kernel`: flash, efficient, cudnn, math; auto = torch's own choice). Flash takes no attention
mask: the student gets none under `--modes exact` (every sample has as many visible tokens) on an
unpadded batch; bernoulli STDM pads the visible sets, and its mask leaves the memory-efficient kernel.
--profile N profiles N more steps after the timed ones (torch.profiler) and reports the device
time by kind of kernel (matmul, attention, norm, elementwise, optimizer, ...), the top kernels,
and the share of the step the device is idle (host-bound launches and syncs).

Prints one JSON object: per variant samples/s, seconds/step, peak memory (per sample), FLOPs per
sample, achieved FLOP/s and its ratio to a matmul peak measured in the same process; then the
ratios the issue's goals are stated in (core/mae utilisation, bf16 over fp32 samples/s, memory per
sample against the stated reference).

Every step is timed, the warm-up ones too (issue 41): `samples_per_s` (= `samples_per_s_median`)
is the middle of the steps after the warm-up, as before; `samples_per_s_whole` is every sample
over every step's time from the first step's start (compilation and recompilations included),
`samples_per_s_after_first` the same without the first step; `first_step_s`, `step_s` (every
step, warm-up first) and `slow_steps` (over 2x the median: index in `step_s`, seconds) beside
them; `compilations_total` and `compilations_after_first_step` are torch.compile's graphs
(`torch._dynamo.utils.counters`; the goal after the first step is 0). MFU (`flops_utilisation`)
uses torch's FLOP count of one more training step (`FlopCounterMode`, after the timed window):
`flops_per_sample_torch`; the analytic count (`bench.common.pretrain_flops_per_sample`) stays as a
cross-check (`flops_per_sample_analytic`, `flops_ratio_analytic_over_torch`,
`flops_utilisation_analytic`). docs/bench.md says more.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import re
import resource
import time

import torch

from bench.common import (TINY, child, compile_diff, compile_snapshot, config_args, count_flops, default_device, emit,
                          machine, middle, parser, pretrain_flops_per_sample, progress, sets, step_summary, sync)
from coreecg.config import load_config

VARIANTS = {
    "core": [],
    "core_ckpt": ["train.activation_checkpointing=true"],
    "mae": ["methods.core.masking.strategy=random", "methods.core.masking.ratio=0.75", "methods.core.loss.beta=0",
            "methods.core.time_decoder.layout=joint"],
    "moco_v3": ["pretrain.method=moco_v3"],
    "cmsc": ["pretrain.method=cmsc"],
}
# Peak RSS per sample of the fp32 paper step at batch 32 before issue 10 (commit bd76838, this
# benchmark: 7.36 GB / 32). The memory goal is 30 % below it at the same batch.
REFERENCE_FP32_BYTES_PER_SAMPLE = 7356485632 / 32
SDPA_BACKENDS = ("auto", "flash", "efficient", "cudnn", "math")

# Kernel (CUDA) or operator (CPU) names -> the kind of work, first match wins. The order matters:
# an attention kernel's name can contain "gemm", a fused optimizer's "elementwise".
KINDS = [
    ("optimizer", r"adam|multi_tensor|foreach"),
    ("compiled", r"^triton_"),          # inductor's fused kernels (train.compile): norms, GELU, casts
    ("attention", r"flash|fmha|attention|attn|sdpa|scaled_dot"),
    ("matmul", r"gemm|gemv|cutlass|xmma|nvjet|cublas|wgmma|matmul|aten::mm|aten::bmm|addmm|aten::linear"),
    ("norm", r"layer_norm|layernorm|native_layer_norm|rms_norm"),
    ("fft", r"fft|radix"),
    ("reduction", r"reduce|sum_kernel|aten::sum|mean|norm_kernel|softmax|log_softmax|nll"),
    ("copy", r"memcpy|memset|copy|cat|index|gather|scatter|masked|nonzero|where|clone|contiguous"),
    ("elementwise", r"elementwise|vectorized|unrolled|gelu|add|mul|div|sub|triton|fused"),
]


def kind_of(name: str) -> str:
    low = name.lower()
    return next((kind for kind, pattern in KINDS if re.search(pattern, low)), "other")


def sdpa_context(backend: str):
    """The scaled-dot-product-attention backends a step may use: torch's choice, or one forced."""
    if backend == "auto":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel({"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                        "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[backend])


def merged_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (microseconds): device busy time."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def profile_steps(step, x, kwargs: dict, device: torch.device, steps: int) -> dict:
    """Where a step's time goes: device time per kind of kernel (CPU: self time per operator),
    the top ten kernels, and the device's busy share of the wall time of the profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            out = step(x, **kwargs)
            float(out["loss"])
        sync(device)
    wall_us = (time.perf_counter() - t0) * 1e6
    per_name: dict[str, float] = {}
    spans = []
    if cuda:   # every kernel, memcpy and memset the device ran: their own start and end
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                spans.append((e.time_range.start, e.time_range.end))
                per_name[e.name] = per_name.get(e.name, 0.0) + e.time_range.elapsed_us()
    else:      # operators' self time: an operator's children are counted once, under their own name
        for e in prof.key_averages():
            if e.key.startswith("aten::") and e.self_cpu_time_total > 0:
                per_name[e.key] = per_name.get(e.key, 0.0) + e.self_cpu_time_total
    total = sum(per_name.values()) or 1.0
    kinds: dict[str, float] = {}
    for name, us in per_name.items():
        kinds[kind_of(name)] = kinds.get(kind_of(name), 0.0) + us
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:10]
    out = {"steps": steps, "wall_ms_per_step": wall_us / 1e3 / steps,
           "timed": "device kernel time" if cuda else "CPU operator self time",
           "ms_per_step_by_kind": {k: round(v / 1e3 / steps, 3)
                                   for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
           "share_by_kind": {k: round(v / total, 4) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
           "top": [{"name": n[:120], "kind": kind_of(n), "ms_per_step": round(us / 1e3 / steps, 3),
                    "share": round(us / total, 4)} for n, us in top]}
    if cuda:
        busy = merged_us(spans)
        out.update(device_busy_ms_per_step=busy / 1e3 / steps, device_busy_share_of_wall=busy / wall_us,
                   kernels_per_step=len(spans) / steps)
    return out


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int | None = None, reps: int = 20) -> float:
    """Best-of FLOP/s of an n x n matmul: the ceiling the model's FLOP/s is compared with
    (n = 2048 on CPU, 8192 on GPU, where a smaller product does not fill the device)."""
    n = n or (8192 if device.type == "cuda" else 2048)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * n ** 3 / best


def flop_count(step, x, kwargs: dict, device: torch.device, batch: int) -> dict:
    """torch's FLOP count of one more training step (forward, backward, optimiser: the real
    PretrainStep), outside the timed window -> FLOPs per sample, overall and per operator.
    A failure is reported, not raised: MFU then falls back to the analytic count."""
    t = time.perf_counter()
    try:
        counted = count_flops(step, x, **kwargs)
        sync(device)
    except Exception as e:      # noqa: BLE001  reported in the JSON beside the analytic count
        return {"flops_per_sample_torch": None, "flops_count_error": f"{type(e).__name__}: {e}"[-1000:]}
    return {"flops_per_sample_torch": counted["total"] / batch,
            "flops_per_sample_torch_by_op": {op: n / batch for op, n in
                                             sorted(counted["by_op"].items(), key=lambda kv: -kv[1])},
            "flops_count_seconds": time.perf_counter() - t}


def host_after_first(first: resource.struct_rusage, last: resource.struct_rusage, step_s: list[float],
                     launch_s: list[float]) -> dict:
    """Per step after the first: this process's minor page faults and system CPU seconds, and the
    share of the steps' wall time spent before `step()` returned (launch_s: the host's own work
    and any sync inside the step; the rest of a step is the wait for the device at its end). Not
    the process's CPU seconds over the wall: a CUDA sync spin-waits by default, so those would
    count the wait for the device as the host's work."""
    n, wall = len(step_s) - 1, sum(step_s[1:])
    if n < 1:
        return {}
    return {"minor_faults_per_step_after_first": (last.ru_minflt - first.ru_minflt) / n,
            "system_seconds_per_step_after_first": (last.ru_stime - first.ru_stime) / n,
            "launch_share_after_first": sum(launch_s[1:]) / wall if wall > 0 else None}


def run_variant(args) -> dict:
    from coreecg.methods import build_method
    from coreecg.train.step import PretrainStep, Schedule

    device = torch.device(args.device)
    cfg = load_config(args.config, [f"train.precision={args.precision}", f"methods.core.masking.mode={args.mode}",
                                    *VARIANTS[args.variant], *args.set])
    torch.manual_seed(0)
    model = build_method(cfg).to(device)
    step = PretrainStep(model, cfg, Schedule(steps_per_epoch=1000, epochs=1, warmup_epochs=0))
    # Experiments beside the settings (after PretrainStep, whose speed options set the defaults).
    if args.cudagraph_skip_dynamic:
        torch._inductor.config.triton.cudagraph_skip_dynamic_graphs = True
    torch._dynamo.config.automatic_dynamic_shapes = not args.static_shapes
    if args.short_attention:
        from coreecg.model.layers import Attention

        for m in model.modules():
            if isinstance(m, Attention):
                m.batched_up_to = args.short_attention
    if args.host_cache:
        from coreecg.train.speed import keep_freed_memory

        keep_freed_memory()
    # Random windows hold no padding, as a corpus of full 10 s records (MIMIC-IV-ECG): the loop
    # then drops the key-padding mask where it can. --padded keeps it (a corpus with short records).
    step.unpadded = not args.padded
    x = torch.randn(args.batch, cfg.model.n_leads, cfg.model.input_samples, device=device)
    gen = torch.Generator().manual_seed(0)   # on the host, as in the training loop
    patient = torch.arange(args.batch, device=device) if model.needs_patient_ids else None
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    kwargs = {"generator": gen, **({"patient": patient} if patient is not None else {})}
    # Every step is timed, warm-up included: the whole window from the first step's start is what a
    # run pays (compilation, autotuning, lazy initialisation and any recompilation); the median of
    # the steps after the warm-up is the figure reported since issue 10.
    step_s: list[float] = []
    launch_s: list[float] = []
    compiles = [compile_snapshot()]
    with sdpa_context(args.sdpa_backend):
        for i in range(args.warmup + args.steps):
            if i == args.warmup:
                usage0 = resource.getrusage(resource.RUSAGE_SELF)
            t = time.perf_counter()
            out = step(x, **kwargs)
            launch_s.append(time.perf_counter() - t)   # the host's part: the device may still be running
            float(out["loss"])      # the host sync a real loop pays when it logs
            sync(device)
            step_s.append(time.perf_counter() - t)
            if i == 0:
                compiles.append(compile_snapshot())
                usage_first = resource.getrusage(resource.RUSAGE_SELF)
        usage1 = resource.getrusage(resource.RUSAGE_SELF)
        compiles.append(compile_snapshot())
        profiled = profile_steps(step, x, kwargs, device, args.profile) if args.profile else None
        # Memory before the FLOP-counting step and the matmul peak's own matrices (384-768 MiB on a GPU).
        if device.type == "cuda":
            peak_bytes = torch.cuda.max_memory_allocated()
        else:   # ru_maxrss is KiB on Linux; the growth during the steps is the step's working set
            peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        torch_flops = flop_count(step, x, kwargs, device, args.batch)
    times = step_s[args.warmup:]
    timing = step_summary(step_s, args.batch, args.warmup)
    sec = middle(times)
    flops = pretrain_flops_per_sample(cfg)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    peak = matmul_peak(device, dtype, 256 if args.quick else None)
    # the analytic count models the paper's ViT; another encoder has torch's count only
    analytic = flops["train_step"] if cfg.model.arch == "coreecg" else math.nan
    per_sample = torch_flops.get("flops_per_sample_torch") or analytic   # analytic where torch's count failed
    total, after_first = compile_diff(compiles[0], compiles[2]), compile_diff(compiles[1], compiles[2])
    result = {
        "variant": args.variant, "precision": args.precision, "stdm_mode": args.mode, "sdpa": args.sdpa_backend,
        "key_padding_mask": args.padded, "compile": cfg.train.compile,
        "cudagraph_skip_dynamic": args.cudagraph_skip_dynamic, "host_cache": args.host_cache,
        "static_shapes": args.static_shapes, "short_attention": args.short_attention,
        # whether torch.compile is on here (counted on the model, not read from the config)
        "compiled": any(getattr(m, "_compiled_call_impl", None) is not None for m in model.modules()),
        "batch": args.batch, "first_step_seconds": step_s[0] if args.warmup else None,
        "seconds_per_step_median": sec, "seconds_per_step_all": times,
        "samples_per_s": args.batch / sec,
        # issue 41: the whole window beside the median (bench.common.step_summary)
        **timing,
        "compilations_total": total["graphs"], "compilations_after_first_step": after_first["graphs"],
        "compiled_frames_total": total["frames"], "graph_breaks_total": total["graph_breaks"],
        "recompile_reasons_after_first_step": after_first["recompile_reasons"],
        # FLOPs of one training step: torch's count (FlopCounterMode, one extra step after the timed
        # window) and the analytic one (bench.common.pretrain_flops_per_sample) as a cross-check
        "train_flops_per_sample": analytic if cfg.model.arch == "coreecg" else per_sample,
        "forward_flops_per_sample": flops["forward"] if cfg.model.arch == "coreecg" else math.nan,
        **torch_flops, "flops_per_sample_analytic": analytic,
        "flops_ratio_analytic_over_torch": analytic / torch_flops["flops_per_sample_torch"]
        if torch_flops.get("flops_per_sample_torch") else None,
        "flops_source": "torch" if torch_flops.get("flops_per_sample_torch") else "analytic",
        "achieved_flops_per_s": per_sample * args.batch / sec,
        "achieved_flops_per_s_analytic": analytic * args.batch / sec,
        "matmul_peak_flops_per_s": peak,
        "flops_utilisation": per_sample * args.batch / sec / peak,
        "flops_utilisation_analytic": analytic * args.batch / sec / peak,
        "flops_utilisation_whole": per_sample * timing["samples_per_s_whole"] / peak,
        "loss": float(out["loss"]),
        # Page faults and kernel time per timed step: what train.host_memory_cache removes.
        "minor_faults_per_step": (usage1.ru_minflt - usage0.ru_minflt) / args.steps,
        "system_seconds_per_step": (usage1.ru_stime - usage0.ru_stime) / args.steps,
        # The same after the first step (which holds compilation, autotuning, cuDNN's plans and
        # the compile workers' fork), and the share of the wall before step() returned: near 1 on
        # a GPU, the device waits on the host (Python, launches, faults) or on a sync in the step.
        **host_after_first(usage_first, usage1, step_s, launch_s),
        "device_type": device.type, "peak_memory_bytes": peak_bytes,
        "peak_memory_bytes_per_sample": peak_bytes / args.batch,
    }
    if device.type == "cpu":
        result["peak_rss_growth_bytes"] = peak_bytes - rss0 * 1024
    if profiled:
        result["profile"] = profiled
    return result


def in_process(p: argparse.ArgumentParser, cmd: list[str]) -> dict:
    """One variant in this process (--in-process: no interpreter and CUDA start-up per variant, a
    few seconds each on a lent GPU). Peak memory stays per variant: the previous variant's tensors
    are freed and the allocator's peak is reset before each (run_variant); compiled graphs too."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    torch._dynamo.reset()       # each variant compiles afresh (and within the recompile limit)
    try:
        return run_variant(p.parse_args(cmd))
    except Exception as e:      # as a child's failure: recorded, the other variants still run
        raise RuntimeError(f"{type(e).__name__}: {e}") from e


def run_line(r: dict) -> str:
    """One run in one line: the median and the whole window, the first step, slow steps and
    compilations after the first step, MFU (torch's FLOP count, and the analytic one), memory, the
    share of the wall in the host's launch after the first step, and the experiments' settings."""
    slow = [s for s in r.get("slow_steps", []) if s["index"] > 0]
    slow_text = "".join(f", #{s['index']} {s['s']:.2f} s" for s in slow[:5])
    nan = float("nan")
    flops = (f"{r['flops_per_sample_torch'] / 1e9:.2f} GFLOP a sample "
             f"(analytic {r['flops_per_sample_analytic'] / 1e9:.2f})" if r.get("flops_per_sample_torch")
             else "analytic FLOPs only")
    return (f"{r['variant']} {r['precision']} stdm={r['stdm_mode']} sdpa={r.get('sdpa', 'auto')}"
            f"{' compiled' if r.get('compiled', r.get('compile')) else ''}"
            f"{' padded' if r.get('key_padding_mask') else ''}: "
            f"{r['samples_per_s']:.1f} samples/s median, {r.get('samples_per_s_whole', nan):.1f} whole window "
            f"(first step {r.get('first_step_s', nan):.2f} s, "
            f"{len(slow)} slow step{'s' if len(slow) != 1 else ''} after it"
            f"{slow_text}), "
            f"{r.get('compilations_after_first_step', 0)} compilations after the first step, "
            f"MFU {r['flops_utilisation']:.3f} (analytic {r.get('flops_utilisation_analytic', nan):.3f}), {flops}, "
            f"peak {r['peak_memory_bytes'] / 2**30:.2f} GiB"
            + (f", {r['launch_share_after_first']:.2f} of the wall in the host's launch after the first step"
               if r.get("launch_share_after_first") is not None else "")
            + (f", batched attention up to {r['short_attention']} tokens" if r.get("short_attention") else ""))


def summarise(results: list[dict]) -> dict:
    """The issue's figures from the variants that ran: ratios, so that machine noise cancels."""
    ok = [r for r in results if "error" not in r]
    by: dict = {}
    for r in ok:     # the first run of a variant (default STDM mode, torch's own attention choice)
        by.setdefault((r.get("variant"), r.get("precision")), r)
    # Every run in one line each: what the STDM mode and attention backend change.
    out = {"runs": [run_line(r) for r in ok]}
    if ok:   # the goal: nothing compiled once the first step is done (a recompilation is a slow step)
        out["compilations_after_first_step"] = sum(r.get("compilations_after_first_step", 0) for r in ok)
    for prec in ("fp32", "bf16"):
        core, mae = by.get(("core", prec)), by.get(("mae", prec))
        if core:
            out[f"{prec}_utilisation"] = core["flops_utilisation"]
        if core and mae:
            out[f"{prec}_utilisation_core_over_mae"] = core["flops_utilisation"] / mae["flops_utilisation"]
        ckpt = by.get(("core_ckpt", prec))
        if core and ckpt:
            out[f"{prec}_checkpointing_memory_ratio"] = ckpt["peak_memory_bytes"] / core["peak_memory_bytes"]
            out[f"{prec}_checkpointing_speed_ratio"] = ckpt["samples_per_s"] / core["samples_per_s"]
        for method in ("moco_v3", "cmsc"):     # each baseline against CoRe-ECG, same run and precision
            other = by.get((method, prec))
            if core and other:
                out[f"{prec}_{method}_over_core_samples_per_s"] = other["samples_per_s"] / core["samples_per_s"]
                # CPU: the RSS growth during the steps (the process's baseline cancels)
                mem = "peak_rss_growth_bytes" if "peak_rss_growth_bytes" in core else "peak_memory_bytes"
                out[f"{prec}_{method}_over_core_peak_memory"] = other[mem] / core[mem]
    if ("core", "fp32") in by and ("core", "bf16") in by:
        out["bf16_over_fp32_samples_per_s"] = (by[("core", "bf16")]["samples_per_s"]
                                               / by[("core", "fp32")]["samples_per_s"])
        out["bf16_over_fp32_matmul_peak"] = (by[("core", "bf16")]["matmul_peak_flops_per_s"]
                                             / by[("core", "fp32")]["matmul_peak_flops_per_s"])
    first = next(iter(by.values()), {})
    if first.get("batch") == 32 and first.get("device_type") == "cpu":   # the reference is a CPU RSS
        for (variant, prec), r in by.items():
            if variant.startswith("core"):
                out[f"{variant}_{prec}_memory_per_sample_vs_reference"] = (
                    r["peak_memory_bytes_per_sample"] / REFERENCE_FP32_BYTES_PER_SAMPLE)
    return out


def main() -> None:
    p = parser(__doc__, "the tests' tiny model, batch 4, one step of core in fp32")
    p.add_argument("--device", default=default_device())
    p.add_argument("--batch", type=int, default=None, help="default: 32 on CPU, 256 on CUDA")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--precisions", default=None, help="default: fp32,bf16 on CPU, bf16 on CUDA")
    p.add_argument("--modes", default="bernoulli", help="STDM modes of the core variants (bernoulli,exact)")
    p.add_argument("--variants", default="core,core_ckpt,mae")
    p.add_argument("--sdpa", default="auto", help=f"attention backends, comma-separated, of {','.join(SDPA_BACKENDS)}")
    p.add_argument("--profile", type=int, default=0, metavar="N", help="profile N steps after the timed ones")
    p.add_argument("--in-process", action="store_true",
                   help="run the variants in this process, one after another (GPU: no start-up per variant)")
    p.add_argument("--padded", action="store_true",
                   help="keep the key-padding mask (as on a corpus with short records): no flash attention")
    p.add_argument("--cudagraph-skip-dynamic", action="store_true",
                   help="experiment (train.compile_mode=reduce-overhead): run the dynamic-length graphs without "
                        "CUDA graphs (the behaviour before 2026-11-27) instead of one graph per length")
    p.add_argument("--static-shapes", action="store_true",
                   help="experiment (train.compile): no automatic dynamic shapes, so every block shape but the "
                        "one marked dynamic (bernoulli's visible length) gets a static graph of its own")
    p.add_argument("--short-attention", type=int, default=0, metavar="N",
                   help="experiment: attention over sequences of at most N tokens in batched matmuls instead of "
                        "SDPA's fused kernels (coreecg.model.layers.Attention.batched_up_to; the axial Time "
                        "Decoder's 12- and 30-token sequences at N=32)")
    p.add_argument("--host-cache", action="store_true",
                   help="experiment: train.host_memory_cache's malloc settings on a GPU too (they apply on the CPU)")
    config_args(p)
    p.add_argument("--precision", help=argparse.SUPPRESS)     # child process: one variant
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--variant", default="core", help=argparse.SUPPRESS)
    p.add_argument("--sdpa-backend", default="auto", choices=SDPA_BACKENDS, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.in_process and not args.device.startswith("cuda"):
        # the CPU's memory figure is the process's lifetime peak RSS: per variant only in a fresh process
        p.error("--in-process is for CUDA (per-variant peak memory there is the allocator's, reset per variant)")
    unknown = set(args.sdpa.split(",")) - set(SDPA_BACKENDS)
    if unknown:
        p.error(f"--sdpa: unknown backend(s) {sorted(unknown)}; choose from {list(SDPA_BACKENDS)}")
    if args.quick and not args.precision:
        args.set = [*TINY, *args.set]
        args.batch, args.steps, args.warmup = args.batch or 4, 1, 1
        args.variants, args.precisions = "core", args.precisions or "fp32"
    args.batch = args.batch or (256 if args.device.startswith("cuda") else 32)
    if args.precisions is None:
        args.precisions = "bf16" if args.device.startswith("cuda") else "fp32,bf16"
    if args.precision:
        emit(run_variant(args), one_line=True)
        return
    results = []
    for precision in args.precisions.split(","):
        for variant in args.variants.split(","):
            for mode in (args.modes.split(",") if variant.startswith("core") else ["bernoulli"]):
                for backend in args.sdpa.split(","):
                    cmd = ["--device", args.device, "--batch", str(args.batch), "--steps", str(args.steps),
                           "--warmup", str(args.warmup), "--precision", precision, "--mode", mode,
                           "--variant", variant, "--sdpa-backend", backend, "--profile", str(args.profile),
                           *(["--padded"] if args.padded else []),
                           *(["--cudagraph-skip-dynamic"] if args.cudagraph_skip_dynamic else []),
                           *(["--host-cache"] if args.host_cache else []),
                           *(["--static-shapes"] if args.static_shapes else []),
                           *(["--short-attention", str(args.short_attention)] if args.short_attention else []),
                           *(["--config", args.config] if args.config else []), *(["--quick"] if args.quick else []),
                           *sets(args.set)]
                    try:
                        results.append(in_process(p, cmd) if args.in_process else child("pretrain_step", cmd))
                    except RuntimeError as e:
                        results.append({"variant": variant, "precision": precision, "stdm_mode": mode,
                                        "sdpa": backend, "error": str(e)[-1500:]})
                    progress({k: results[-1].get(k) for k in (
                        "variant", "precision", "stdm_mode", "sdpa", "samples_per_s", "samples_per_s_whole",
                        "first_step_s", "compilations_after_first_step", "flops_utilisation",
                        "flops_ratio_analytic_over_torch", "peak_memory_bytes_per_sample", "error")})
    emit({"benchmark": "pretrain_step", **machine(args.device), "batch": args.batch, "overrides": args.set,
          "results": results, "summary": summarise(results)})


if __name__ == "__main__":
    main()
