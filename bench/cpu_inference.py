"""Scoring a hospital's archive on its own CPUs (issue 63): what the processor can do, what one record
costs, what the real inference path gets per precision, and whether reading keeps up, in one run.

    python -m bench.cpu_inference                          # 200 records per setting, 2 interleaved rounds
    python -m bench.cpu_inference --families merl-vit_tiny,xecg --records 100
    python -m bench.cpu_inference --simulate-units none    # as a processor without bf16 / int8 units
    python -m bench.cpu_inference --quick                  # tiny models, 16 records: a smoke run

On this machine, at torch's default threads (the cores; recorded in "machine"):

1. matrix: the processor's limit, GFLOP/s of square products (--matrix-size, best of
   --matrix-repeats after one warm-up; 2 M N K FLOPs) in float32 and bfloat16, each by torch.mm,
   F.linear and a 1x1 conv1d (torch's BLAS and oneDNN can differ by 2x and more), and in int8 by
   torch._int_mm (int8 x int8 -> int32, where torch has it on the CPU) and a dynamically quantised
   nn.Linear (what the int8 path runs); the limit of a precision is its best route ("method"),
   every route's rate beside it ("routes"), measured before and after the encoders ("at_start",
   "at_end"; on a shared machine the better one is the limit).
   cpu_units: coreecg.inference.precision.cpu_units().describe().
2. encoders: per encoder, the FLOPs of one 10 s record as the engine runs it: its windows (PTB-XL's
   10 s: one; ECG-FM's contract: two 5 s windows) x the crops of each (finetune.eval_crops) x one
   crop's forward (FlopCounterMode, attention through SDPA's math kernel: bench.published_encoders.
   forward_gflop). coreecg's own encoders (--encoders: coreecg, the ViT; xresnet1d; s4) at their
   paper size (the default config) with random weights, saved and loaded as bench.predict_scale's
   model (coreecg.hub.load_model); the published families (--families, default every model of
   bench.published_encoders.MODELS, "none" for none) at their released size (its `published_size`),
   their config the loader's for the family (the fixture's file loaded, its sizes replaced by
   `published_config`'s).
3. records/s of `run_inference(loaded, items, embeddings=True, precision=P, batch_size=B)` per
   precision P (fp32, bf16, int8), on the same in-memory records (`array_record` of real PTB-XL
   500 Hz records, --records of them, repeated when fewer are on disk): so reading is not in it,
   the model's preprocessing is (its rate alone: preprocess_records_per_s). The precisions are
   interleaved (fp32, bf16, int8, fp32, ... for --repeats rounds) so that the machine's noise hits
   all alike; the median is reported, and its ratio to fp32's. A path that is refused
   (InferenceError / PrecisionError: int8 for a convolutional encoder, bf16 on a processor without
   bf16 units) carries its reason ("refused"); one that fails otherwise its error ("error"). Each
   path first scores one warm-up pass of records, then its accuracy against fp32 on them is
   recorded beside the model (precision_checks.json, as jobs/export.py records it), so the timed
   runs are those of a checked model: no first-pass fp32 check in them (one per run, not per record).
   default: what precision="auto" resolves to (result.precision, result.precision_reason), on a
   fresh model (before the checks are recorded). batch_sizes: the ViT's fp32 and bf16 at each of
   --batch-sizes (the first one is the batch of every other figure: the engine's default, 8).
   compiled: with --compile (the default; --no-compile leaves them out) the fp32 and bf16 paths of
   coreecg's own encoders (--quick: the ViT's) also run with inference.compile=true ("fp32+compile", "bf16+compile":
   the feature pass compiled by inductor with frozen weights, coreecg.inference.compiled): the
   warm-up pass compiles (compile_s: the warm-up's seconds over the eager warm-up's, of the
   same records) and checks against eager; the timed runs are the compiled graph's. A long run's
   default (inference.compile=auto from compile_min_windows windows) keeps whichever of the two
   its first passes time faster. unfused: "bf16+unfused" (inference.fuse=false) runs the
   CPU bf16 path with torch's own Linear and GELU instead of oneDNN's fused products
   (coreecg.inference.fused), its ratio_to_default the unfused over the default bf16 path.
   before: S4's "fp32+before" is its path when issue 63 was filed (the kernel's spectrum
   recomputed every pass, the whole batch in one pass: `as_filed`), its ratio_to_default over
   today's fp32 path; the default over it is today's gain.
4. fraction of the limit: achieved GFLOP/s = records/s x GFLOP per record, over the matrix rate of
   the path's precision (fp32 over fp32's, bf16 over bf16's, int8 over int8's).
5. onnx: the ViT exported by coreecg.hub.onnx_export.export_onnx, in an onnxruntime
   InferenceSession on the CPU (intra_op_num_threads = torch's threads), fp32 and int8
   (onnxruntime.quantization.quantize_dynamic, QInt8 weights), on the same crops (8 windows x
   eval_crops crops): crops/s beside torch's bare `encoder.pooled` in inference_mode, fp32 and a
   bfloat16 copy, interleaved, medians of --onnx-repeats; max abs difference from torch fp32.
   Skipped, saying why, where onnxruntime is not importable (the `onnx` extra).
6. reading: the same ECGs written as WFDB, DICOM, MUSE XML and EDF (--formats; bench.export_formats'
   writers), each folder listed (list_inputs) and read + preprocessed for the ViT
   (coreecg.inference.reading.prepared_records with its spec), in this process, best of
   --read-repeats; starves: true where that is slower than the fastest model path measured
   (the model would wait for its input).

7. vit_products: the ViT's ceiling in bf16 were it only its matrix products and attention, each
   timed alone at the path's shapes (the batch's crops of N tokens): its records/s and fraction
   of the bf16 limit bound what any path built of torch's kernels on this processor can reach
   (LayerNorm, residual adds and the patch embedding counted as free).

COREECG_CPU_UNITS (a simulated processor) is set only by --simulate-units; one inherited from the
environment is dropped (and named in the output), so by default the processor's own units decide.
Prints one JSON object on stdout (progress on stderr). On a shared machine the figures mean little:
see load_average_1min before and after.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.common import SHARED, TINY, emit, machine, parser, progress
from bench.export_formats import DicomWriter, MuseWriter, write_aecg, write_edf, write_wfdb
from bench.published_encoders import MODELS, PUBLISHED, QUICK, forward_gflop, published_size
from coreecg.checkpoints import save_encoder
from coreecg.config import STANDARD_LEADS, load_config
from coreecg.config.encoders import EncoderOptions
from coreecg.encoders.build import build_encoder
from coreecg.eval.downstream import eval_offsets
from coreecg.hub import LoadedModel, input_contract, load_model
from coreecg.hub.onnx_export import export_onnx
from coreecg.inference import FORWARD_WINDOWS, InferenceError, array_record, input_spec, list_inputs, run_inference
from coreecg.inference.fused import FusedLinear, available as onednn_bf16_linear
from coreecg.inference.precision import UNITS_ENV, PrecisionError, cpu_units
from coreecg.inference.precision_check import bounds_of, check_entry, compare, record_checks
from coreecg.inference.reading import prepare, prepared_records
from coreecg.model.published.registry import published_config
from coreecg.model.s4 import S4DKernel, unchunked

PRECISIONS = ("fp32", "bf16", "int8")
BATCH_PRECISIONS = ("fp32", "bf16")                        # the ViT's at each of --batch-sizes
ENCODERS = ("coreecg", "xresnet1d", "s4")
FORMATS = ("wfdb", "dicom", "muse", "edf")
WRITERS = {"wfdb": lambda: write_wfdb, "dicom": DicomWriter, "muse": MuseWriter, "edf": lambda: write_edf,
           "aecg": lambda: write_aecg}
# --quick: the tiny test sizes (coreecg.encoders.options' tiny(); bench.predict_scale's tiny ViT)
QUICK_ENCODERS = {
    "coreecg": [*TINY, "model.input_samples=1500", "data.crop_samples=1500", "encoders.coreecg.patch_size=150"],
    "xresnet1d": ["encoders.xresnet1d.stem=[8,8,16]", "encoders.xresnet1d.widths=[16,32]",
                  "encoders.xresnet1d.layers=[1,1]", "encoders.xresnet1d.expansion=1"],
    "s4": ["encoders.s4.d_model=16", "encoders.s4.n_layers=2", "encoders.s4.d_state=8", "encoders.s4.stem=[16,16]",
           "encoders.s4.stem_strides=[5,3]", "encoders.s4.dropout=0.0"],
}
QUICK_FAMILIES = "ecgfm_ked"


# ---------------------------------------------------------------------------- 1. the processor's limit


def _best_rate(fn, flops: float, repeats: int) -> dict:
    fn()                                                   # warm-up (allocation, kernel choice)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"gflop_per_s": round(flops / min(times) / 1e9, 1),
            "gflop_per_s_median": round(flops / statistics.median(times) / 1e9, 1)}


def quantised_linear(n: int) -> tuple[nn.Module, torch.Tensor]:
    """A dynamically quantised n x n nn.Linear (the int8 path's layer) and an (n, n) float32 input."""
    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                    # torch.ao's deprecation for torchao
        layer = quantize_dynamic(nn.Sequential(nn.Linear(n, n, bias=False)).eval(), {nn.Linear}, dtype=torch.qint8)
    return layer, torch.randn(n, n)


def matrix_rates(n: int, repeats: int) -> dict:
    """GFLOP/s of (n x n) x (n x n) products per precision (module docstring, 1), each by every route
    torch offers (its BLAS's torch.mm; F.linear and a 1x1 conv1d, oneDNN's kernels where it takes
    them): one route can be far below another (on an AMD EPYC, bf16 torch.mm at 0.4x bf16 F.linear),
    so the limit is the best route's, and each route's rate is kept."""
    flops = 2.0 * n ** 3
    gen = torch.Generator().manual_seed(0)
    out = {"size": n, "repeats": repeats, "flops_per_product": flops,
           "statistic": "per route: best of repeats (and median); gflop_per_s: the best route's"}
    routes: dict[str, dict[str, dict]] = {}
    with torch.inference_mode():
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
            x, w = a[None], b[..., None]                             # (1, n, n) signal, (n, n, 1) kernels
            routes[name] = {f"torch.mm {dtype}": _best_rate(lambda: torch.mm(a, b), flops, repeats),
                            f"torch.nn.functional.linear {dtype}": _best_rate(lambda: F.linear(a, b), flops, repeats),
                            f"torch.conv1d 1x1 {dtype}": _best_rate(lambda: torch.conv1d(x, w), flops, repeats)}
        layer, x = quantised_linear(n)
        routes["int8"] = {"torch.ao.quantization.quantize_dynamic nn.Linear (qint8 weights, activations quantised "
                          "per call, float32 in and out)": _best_rate(lambda: layer(x), flops, repeats)}
        a8, b8 = (torch.randint(-128, 128, (n, n), dtype=torch.int8, generator=gen) for _ in range(2))
        try:
            routes["int8"]["torch._int_mm, int8 x int8 -> int32"] = _best_rate(lambda: torch._int_mm(a8, b8), flops,
                                                                             repeats)
        except (RuntimeError, NotImplementedError) as e:
            out["int_mm_unavailable"] = f"{type(e).__name__}: {str(e)[:200]}"
    for name, by in routes.items():
        best = max(by, key=lambda k: by[k]["gflop_per_s"])
        out[name] = {"gflop_per_s": by[best]["gflop_per_s"], "method": best, "routes": by}
    return out


# ---------------------------------------------------------------------------- records and models


def ptbxl_signals(n: int) -> tuple[np.ndarray, list[str]]:
    """n 10 s PTB-XL 500 Hz records of the shared data (repeated when fewer), physical mV, rows in
    STANDARD_LEADS order -> ((n, 12, 5000) float32, their record names)."""
    import wfdb

    sources = sorted((SHARED / "ptbxl").glob("records500/*/*.hea"))[:n]
    if not sources:
        raise SystemExit(f"no PTB-XL 500 Hz records under {SHARED / 'ptbxl'}")
    upper = [x.upper() for x in STANDARD_LEADS]
    signals = []
    for src in sources:
        rec = wfdb.rdrecord(str(src.with_suffix("")))
        rows = [[x.upper() for x in rec.sig_name].index(lead) for lead in upper]
        signals.append(rec.p_signal.T[rows].astype(np.float32))
    names = [src.stem for src in sources]
    return (np.stack([signals[i % len(signals)] for i in range(n)]),
            [f"{names[i % len(names)]}-{i:05d}" for i in range(n)])


def own_encoder(folder: Path, arch: str, overrides: list[str]) -> LoadedModel:
    """A random encoder of `arch` (paper size unless overridden) saved as pretraining writes it
    (encoder.pt: bench.predict_scale.make_model's way) and loaded. The ViT's config pretrains with
    CoRe-ECG; the others' with MoCo v3 (CoRe-ECG's decoders take the ViT's width only)."""
    method = [] if arch == "coreecg" else ["pretrain.method=moco_v3"]
    cfg = load_config(overrides=[f"model.arch={arch}", *method, *overrides])
    folder.mkdir(parents=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        save_encoder(folder / "encoder.pt", nn.ModuleDict({"encoder": build_encoder(cfg)}), cfg, step=0)
    return load_model(folder)


def published_model(folder: Path, name: str, quick: bool) -> LoadedModel:
    """A published model of bench.published_encoders.MODELS: --quick, the fixture's own file loaded;
    else its released size with random weights (`published_size`) in the loader's config for that
    file (the fixture loaded: its family's contract preprocessing), its sizes `published_config`'s.
    Its source is `folder` (precision checks are recorded there, never beside the fixtures)."""
    _, fam, n_leads, sizes = next(m for m in MODELS if m[0] == name)
    fixture = load_model(PUBLISHED / QUICK[name])
    folder.mkdir(parents=True)
    if quick:
        return dataclasses.replace(fixture, source=folder)
    sections = published_config(fam, sizes if isinstance(sizes, str) else "", n_leads)
    if isinstance(sizes, dict) and sizes:
        sections["encoders"] = EncoderOptions({fam: dataclasses.replace(getattr(sections["encoders"], fam), **sizes)})
    cfg = dataclasses.replace(fixture.config, **sections)
    return LoadedModel(published_size(fam, n_leads, sizes), "encoder", cfg, input_contract(cfg, "encoder"), folder)


# ---------------------------------------------------------------------------- 2. FLOPs of one record


def record_cost(loaded: LoadedModel, record) -> dict:
    """One 10 s record as the engine runs it: its windows x crops x one crop's forward FLOPs."""
    spec = input_spec(loaded)
    windows = prepare(record, spec.preprocess)                     # (W, C, stored samples) float16
    start = eval_offsets(windows.shape[-1], spec.crop, spec.n_crops)[0]
    crop = torch.from_numpy(windows[:1, :, start:start + spec.crop].astype(np.float32))
    per_crop = forward_gflop(loaded.model, crop)
    return {"parameters": sum(p.numel() for p in loaded.model.parameters()),
            "windows_per_record": int(len(windows)), "crops_per_window": spec.n_crops,
            "crop": [len(spec.leads), spec.crop], "gflop_per_crop": round(per_crop, 4),
            "gflop_per_record": round(per_crop * spec.n_crops * len(windows), 4)}


def preprocess_rate(loaded: LoadedModel, items: list) -> float:
    """records/s of the model's preprocessing alone of in-memory records (part of every timed run)."""
    spec = input_spec(loaded)
    t0 = time.perf_counter()
    for _ in prepared_records(items, spec.preprocess):
        pass
    return round(len(items) / (time.perf_counter() - t0), 1)


# ---------------------------------------------------------------------------- 3. the inference path


VARIANTS = ("compile", "unfused", "before")                # "<precision>+<variant>" settings


@contextlib.contextmanager
def as_filed(model: nn.Module):
    """`model`'s S4 encoders as they ran when issue 63 was filed: the kernel's spectrum recomputed on
    every pass (no S4DKernel.spectrum cache) and a whole batch in one pass (no CPU chunks)."""
    kept = S4DKernel.spectrum
    S4DKernel.spectrum = lambda self, L: torch.fft.rfft(self(L), 2 * L)
    try:
        with unchunked(model):
            yield
    finally:
        S4DKernel.spectrum = kept


def score(loaded: LoadedModel, items: list, setting: str, batch: int):
    """run_inference in `setting`: a precision, "<precision>+compile" (inference.compile=true; a
    plain precision runs eagerly: inference.compile=false) or "<precision>+unfused"
    (inference.fuse=false: torch's own Linear and GELU in the CPU bf16 path) or
    "<precision>+before" (S4 as when issue 63 was filed: `as_filed`)."""
    precision, _, variant = setting.partition("+")
    if variant and variant not in VARIANTS:
        raise ValueError(f"setting {setting!r}: the variant is one of {VARIANTS}")
    compiled = variant == "compile"
    loaded.config = dataclasses.replace(loaded.config, inference=dataclasses.replace(
        loaded.config.inference, compile=compiled, fuse=variant != "unfused"))
    with as_filed(loaded.model) if variant == "before" else contextlib.nullcontext():
        result = run_inference(loaded, items, embeddings=True, precision=precision, batch_size=batch,
                               progress_every_s=math.inf)
    if result.failures:
        raise RuntimeError(f"{result.failures[0].record_id}: {result.failures[0].reason}")
    if compiled and not result.compiled:
        raise RuntimeError(f"not compiled: {result.compile_reason}")
    return result


def attempt(loaded: LoadedModel, items: list, precision: str, batch: int) -> tuple[object, dict]:
    """(result or None, its status): {} when it ran, else {"refused": reason} or {"error": ...}."""
    try:
        return score(loaded, items, precision, batch), {}
    except (InferenceError, PrecisionError) as e:
        return None, {"refused": str(e)}
    except Exception as e:                                 # a path that breaks: said, the others go on
        return None, {"error": f"{type(e).__name__}: {str(e)[:400]}"}


def measure_encoder(name: str, loaded: LoadedModel, items: list, settings: list[tuple[str, int]], repeats: int
                    ) -> dict:
    """The encoder's figures (module docstring, 2-4): its cost, default, and each (precision, batch)
    setting warmed up, checked, then timed in `repeats` interleaved rounds."""
    out = {**record_cost(loaded, items[0]), "preprocess_records_per_s": preprocess_rate(loaded, items[:32])}
    batch0 = settings[0][1]
    warm = items[:max(batch0, 8)]
    auto, status = attempt(loaded, warm, "auto", batch0)
    out["default"] = ({"precision": auto.precision, "reason": auto.precision_reason} if auto is not None
                      else {"precision": None, **status})
    status, checks, ref, warm_s, compiled = {}, {}, None, {}, {}
    for precision, batch in settings:                      # fp32 first: the reference of the checks
        t0 = time.perf_counter()
        result, status[precision, batch] = attempt(loaded, warm, precision, batch)
        warm_s[precision, batch] = time.perf_counter() - t0
        if result is None:
            continue
        if precision == "fp32" and ref is None:
            ref = result.embeddings
        elif "+" in precision and ref is not None:         # a variant of a path: against fp32, not recorded
            compiled[precision, batch] = {"embedding": compare(None, ref, None, result.embeddings)["embedding"],
                                          "reason": result.precision_reason}
            if precision.endswith("+compile"):
                compiled[precision, batch].update(
                    compile_s=round(warm_s[precision, batch] - warm_s.get((precision.split("+")[0], batch), 0.0), 1),
                    reason=result.compile_reason)
        elif precision != "fp32" and precision not in checks and ref is not None:
            diffs = compare(None, ref, None, result.embeddings)
            checks[precision] = check_entry(precision, diffs, bounds_of(loaded.config),
                                            f"bench.cpu_inference warm-up, {len(warm)} PTB-XL records")
    for precision, entry in checks.items():
        if not entry["accepted"]:                          # the record-level check broke a bound
            for s in settings:
                status[s] = status[s] if s[0].split("+")[0] != precision else {"refused": entry["reason"]}
    if checks:
        record_checks(loaded.source, checks)
    runs: dict[tuple[str, int], list[dict]] = {s: [] for s in settings if not status[s]}
    for r in range(repeats):
        for setting in runs:
            t0 = time.perf_counter()
            result = score(loaded, items, *setting)
            runs[setting].append({"records_per_s": len(items) / result.seconds,
                                  "setup_s": time.perf_counter() - t0 - result.seconds})
            progress({"encoder": name, "round": r, "precision": setting[0], "batch": setting[1],
                      "records_per_s": round(runs[setting][-1]["records_per_s"], 3)})

    def figures(setting: tuple[str, int]) -> dict:
        precision, batch = setting
        if status[setting]:
            return dict(status[setting])
        rps = statistics.median(x["records_per_s"] for x in runs[setting])
        achieved = rps * out["gflop_per_record"]
        fp32 = runs.get(("fp32", batch))
        f = {"records_per_s": round(rps, 3),
             "records_per_s_runs": [round(x["records_per_s"], 3) for x in runs[setting]],
             "ratio_to_fp32": (round(rps / statistics.median(x["records_per_s"] for x in fp32), 3) if fp32 else None),
             "achieved_gflop_per_s": round(achieved, 2),
             "setup_s": round(statistics.median(x["setup_s"] for x in runs[setting]), 2)}
        if precision in checks:
            f["check"] = {k: checks[precision][k] for k in ("accepted", "reason", "embedding")}
        if setting in compiled:
            f["compiled" if precision.endswith("+compile") else "variant"] = compiled[setting]
            eager = runs.get((precision.split("+")[0], batch))
            if eager:
                key = "ratio_to_eager" if precision.endswith("+compile") else "ratio_to_default"
                f[key] = round(rps / statistics.median(x["records_per_s"] for x in eager), 3)
        return f

    out["batch_size"] = batch0
    out["precisions"] = {p: figures((p, b)) for p, b in settings if b == batch0}
    others = sorted({b for _, b in settings if b != batch0})
    if others:
        out["batch_sizes"] = {str(b): {p: figures((p, bb)) for p, bb in settings if bb == b and p in BATCH_PRECISIONS}
                              for b in [batch0, *others]}
        for b in others:
            for p, f in out["batch_sizes"][str(b)].items():
                base = out["precisions"].get(p, {}).get("records_per_s")
                if "records_per_s" in f and base:
                    f["ratio_to_batch_" + str(batch0)] = round(f["records_per_s"] / base, 3)
    return out


def vit_products(loaded: LoadedModel, crops: int, repeats: int) -> dict:
    """The ViT's ceiling in bfloat16 if it were only its products: each of a block's matrix
    products at the path's own shapes (batch `crops` crops of N tokens; oneDNN's fused linear, bias
    and the MLP's GELU in its epilogue, as the CPU bf16 path runs them: coreecg.inference.fused)
    and its attention (SDPA, (crops, heads, N, D / heads)), each timed alone (best of `repeats`
    after a warm-up), their rates, and the records/s of depth x (their sum) per forward pass:
    the LayerNorms, residual adds and patch embedding left out (free), so no path of torch's
    kernels can reach it. Its fraction of the bf16 limit is added by add_fractions' caller."""
    o, cfg = loaded.config.encoders.coreecg, loaded.config
    n, d, heads = cfg.model.n_leads * cfg.n_patches, o.embed_dim, o.num_heads
    hidden = int(d * o.mlp_ratio)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(crops, n, d, generator=gen).bfloat16()
    h = torch.randn(crops, n, hidden, generator=gen).bfloat16()
    qkv = [torch.randn(crops, heads, n, d // heads, generator=gen).bfloat16() for _ in range(3)]

    def product(i: int, j: int, gelu: str | None = None) -> nn.Module:
        # FusedLinear runs the plain Linear and GELU where oneDNN has no bf16 linear (as the path does)
        return FusedLinear(nn.Linear(i, j).bfloat16().requires_grad_(False), gelu)

    ops = {"qkv": (product(d, 3 * d), x, 2.0 * crops * n * d * 3 * d),
           "attention": (None, None, 4.0 * crops * heads * n * n * (d // heads)),
           "proj": (product(d, d), x, 2.0 * crops * n * d * d),
           "mlp_in+gelu": (product(d, hidden, "none"), x, 2.0 * crops * n * d * hidden),
           "mlp_out": (product(hidden, d), h, 2.0 * crops * n * hidden * d)}
    out = {"crops": crops, "tokens": n, "dim": d, "heads": heads, "depth": o.depth,
           "fused_linear": onednn_bf16_linear(), "ops": {},
           "statistic": f"each op alone, best of {repeats} after a warm-up"}
    block_s = 0.0
    with torch.inference_mode():
        for name, (layer, inp, flops) in ops.items():
            fn = (lambda: F.scaled_dot_product_attention(*qkv)) if layer is None else (lambda: layer(inp))
            fn()
            best = min(_timed(fn) for _ in range(repeats))
            block_s += best
            out["ops"][name] = {"ms": round(best * 1e3, 3), "gflop_per_s": round(flops / best / 1e9, 1)}
    out["forward_s"] = round(block_s * o.depth, 5)
    out["crops_per_s"] = round(crops / (block_s * o.depth), 2)
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# ---------------------------------------------------------------------------- 5. ONNX Runtime


def onnx_runtime(encoder: nn.Module, loaded: LoadedModel, items: list, folder: Path, repeats: int) -> dict:
    """The ViT in onnxruntime (fp32, int8) beside torch's bare forward (fp32, bf16) on one engine pass
    of crops (FORWARD_WINDOWS windows x eval_crops crops)."""
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        return {"skipped": f"onnxruntime is not importable ({e}): pip install 'coreecg[onnx]'"}
    spec = input_spec(loaded)
    windows = np.concatenate([prepare(r, spec.preprocess) for r in items[:FORWARD_WINDOWS]])[:FORWARD_WINDOWS]
    offsets = eval_offsets(windows.shape[-1], spec.crop, spec.n_crops)
    x = torch.from_numpy(np.concatenate([windows[..., o:o + spec.crop] for o in offsets]).astype(np.float32))
    fp32 = encoder.eval()
    bf16 = copy.deepcopy(encoder).to(torch.bfloat16).eval()
    file, qfile = folder / "model.onnx", folder / "model.int8.onnx"
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):           # the exporter's progress lines: not the JSON's stdout
        export_onnx(encoder, file)
    export_s = time.perf_counter() - t0
    quantize_dynamic(str(file), str(qfile), weight_type=QuantType.QInt8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    sessions = {k: ort.InferenceSession(str(f), options, providers=["CPUExecutionProvider"])
                for k, f in (("ort_fp32", file), ("ort_int8", qfile))}
    feed = {"ecg": x.numpy()}

    def torch_run(model, dtype):
        with torch.inference_mode():
            return model.pooled(x.to(dtype)).float().numpy()

    runs = {"torch_fp32": lambda: torch_run(fp32, torch.float32), "torch_bf16": lambda: torch_run(bf16, torch.bfloat16),
            "ort_fp32": lambda: sessions["ort_fp32"].run(["pooled"], feed)[0],
            "ort_int8": lambda: sessions["ort_int8"].run(["pooled"], feed)[0]}
    outputs = {k: fn() for k, fn in runs.items()}          # warm-up, and the outputs compared
    times = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    ref = outputs["torch_fp32"].astype(np.float64)
    norm = np.maximum(np.linalg.norm(ref, axis=1), 1e-12)
    paths = {}
    for k in runs:
        out = outputs[k].astype(np.float64)
        paths[k] = {"crops_per_s": round(len(x) / statistics.median(times[k]), 2),
                    "max_abs_diff_from_torch_fp32": float(np.abs(out - ref).max()),
                    "max_relative_l2_diff_from_torch_fp32": float((np.linalg.norm(out - ref, axis=1) / norm).max())}
    for k in paths:
        for base in ("torch_fp32", "torch_bf16"):
            paths[k][f"ratio_to_{base}"] = round(paths[k]["crops_per_s"] / paths[base]["crops_per_s"], 3)
    best_ort = max(paths["ort_fp32"]["crops_per_s"], paths["ort_int8"]["crops_per_s"])
    best_torch = max(paths["torch_fp32"]["crops_per_s"], paths["torch_bf16"]["crops_per_s"])
    return {"onnxruntime": ort.__version__, "intra_op_num_threads": options.intra_op_num_threads,
            "input": list(x.shape), "repeats": repeats, "export_s": round(export_s, 1),
            "int8": "onnxruntime.quantization.quantize_dynamic, weight_type QInt8", "paths": paths,
            "ort_best_over_torch_best": round(best_ort / best_torch, 3), "ort_faster_than_torch": best_ort > best_torch}


# ---------------------------------------------------------------------------- 6. reading keeps up


def reading_rates(loaded: LoadedModel, signals: np.ndarray, formats: list[str], folder: Path, repeats: int) -> dict:
    """Per format: the same ECGs written (bench.export_formats' writers), listed and read +
    preprocessed for `loaded`'s input (prepared_records), best of `repeats`."""
    spec = input_spec(loaded)
    out = {}
    for fmt in formats:
        sub = folder / fmt
        sub.mkdir(parents=True)
        writer = WRITERS[fmt]()
        for i, signal in enumerate(signals):
            writer(sub / f"ecg{i:05d}", signal, f"P{i:06d}")
        best_list, best_read = math.inf, math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            items, failures = list_inputs([sub], loaded.config)
            t1 = time.perf_counter()
            bad = [f.reason for *_, f in prepared_records(items, spec.preprocess) if f is not None]
            t2 = time.perf_counter()
            if failures or bad or len(items) != len(signals):
                raise AssertionError(f"{fmt}: {len(items)} of {len(signals)} records listed; "
                                     f"{(failures[0].reason if failures else bad[0]) if failures or bad else ''}")
            best_list, best_read = min(best_list, t1 - t0), min(best_read, t2 - t1)
        out[fmt] = {"records": len(signals), "list_s": round(best_list, 4),
                    "read_preprocess_records_per_s": round(len(signals) / best_read, 1),
                    "with_listing_records_per_s": round(len(signals) / (best_list + best_read), 1)}
        progress({"reading": fmt, **out[fmt]})
    return out


# ---------------------------------------------------------------------------- the run


def limits(first: dict, last: dict) -> dict:
    """The limit per precision: the better of the measurements before and after the encoders (on a
    shared machine another process takes cores now and then; a limit is what the processor can do)."""
    out = {k: first[k] for k in ("size", "repeats", "flops_per_product")}
    out["statistic"] = first["statistic"] + ", of the two measurements (before and after the encoders)"
    for p in PRECISIONS:
        best = max((first, last), key=lambda m: m[p]["gflop_per_s"])
        out[p] = {"gflop_per_s": best[p]["gflop_per_s"], "method": best[p]["method"],
                  "at_start": first[p], "at_end": last[p]}
    return out


def add_fractions(encoders: dict, matrix: dict) -> None:
    """fraction_of_matrix_rate of every timed path: its achieved GFLOP/s over its precision's limit."""
    for e in encoders.values():
        for figures in [e["precisions"], *e.get("batch_sizes", {}).values()]:
            for p, f in figures.items():
                if "achieved_gflop_per_s" in f and "fraction_of_matrix_rate" not in f:
                    limit = matrix[p.split("+")[0]]["gflop_per_s"]
                    f["fraction_of_matrix_rate"] = round(f["achieved_gflop_per_s"] / limit, 4)


def fastest(encoders: dict) -> dict | None:
    best = None
    for name, e in encoders.items():
        groups = [(e["batch_size"], e["precisions"])] + [(int(b), f) for b, f in e.get("batch_sizes", {}).items()]
        for batch, figures in groups:
            for p, f in figures.items():
                if "records_per_s" in f and (best is None or f["records_per_s"] > best["records_per_s"]):
                    best = {"encoder": name, "precision": p, "batch_size": batch, "records_per_s": f["records_per_s"]}
    return best


def main() -> None:
    p = parser(__doc__, "tiny models, 16 records, 1 round, matrix 512, WFDB only, one published fixture")
    p.add_argument("--records", type=int, default=200, help="records per timed setting (default 200)")
    p.add_argument("--repeats", type=int, default=2, help="interleaved rounds of the precisions (default 2)")
    p.add_argument("--encoders", default=",".join(ENCODERS), help="coreecg's own encoders (comma list, or none)")
    p.add_argument("--families", default=None,
                   help="published models of bench.published_encoders (comma list; default all, none for none)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[FORWARD_WINDOWS, 16],
                   help="the ViT's fp32 and bf16 at these batches (the first: every setting's batch)")
    p.add_argument("--matrix-size", type=int, default=2048)
    p.add_argument("--matrix-repeats", type=int, default=5)
    p.add_argument("--onnx-repeats", type=int, default=5)
    p.add_argument("--formats", default=",".join(FORMATS), help=f"comma list of {', '.join(WRITERS)} (or none)")
    p.add_argument("--read-repeats", type=int, default=2)
    p.add_argument("--simulate-units", default=None, metavar="UNITS",
                   help=f"set ${UNITS_ENV} (none, or a comma list of bf16, int8, amx): a simulated processor")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="also time coreecg's encoders' fp32 and bf16 paths compiled (inference.compile=true)")
    p.add_argument("--set", action="append", default=[], metavar="A.B=C",
                   help="config override of coreecg's own encoders (repeatable)")
    args = p.parse_args()
    dropped = None
    if args.simulate_units is not None:
        os.environ[UNITS_ENV] = args.simulate_units
    else:
        dropped = os.environ.pop(UNITS_ENV, None)            # the processor's own units decide
    if args.quick:
        args.records, args.repeats, args.matrix_size, args.matrix_repeats = 16, 1, 512, 3
        args.onnx_repeats, args.read_repeats, args.formats = 2, 1, "wfdb"
        args.families = args.families or QUICK_FAMILIES
    encoders = [e for e in args.encoders.split(",") if e and e != "none"]
    families = [m for m, *_ in MODELS] if args.families is None else \
        [f for f in args.families.split(",") if f and f != "none"]
    unknown = [f for f in families if f not in QUICK] + [e for e in encoders if e not in ENCODERS]
    formats = [f for f in args.formats.split(",") if f and f != "none"]
    if unknown or [f for f in formats if f not in WRITERS]:
        raise SystemExit(f"unknown encoder, family or format: {unknown or formats}")
    result = {"benchmark": "cpu_inference", **machine(), "load_average_1min_start": os.getloadavg()[0],
              "cpu_units": cpu_units().describe(), "units_env": os.environ.get(UNITS_ENV),
              "units_env_dropped": dropped, "quick": args.quick,
              "settings": {"records": args.records, "repeats": args.repeats, "batch_sizes": args.batch_sizes,
                           "encoders": encoders, "families": families, "formats": formats,
                           "overrides": args.set,
                           "command": " ".join(["python -m bench.cpu_inference", *sys.argv[1:]])}}
    progress({"matrix": args.matrix_size})
    first = matrix_rates(args.matrix_size, args.matrix_repeats)
    progress({"matrix_at_start": first})
    signals, names = ptbxl_signals(args.records)
    items = [array_record(s, 500, STANDARD_LEADS, n) for s, n in zip(signals, names)]
    result["records"] = {"count": len(items), "distinct": len(set(n.rsplit("-", 1)[0] for n in names)),
                         "source": "ptbxl records500 (10 s at 500 Hz, 12 leads), in memory (array_record)"}
    batch0 = args.batch_sizes[0]
    measured = {}
    with tempfile.TemporaryDirectory(prefix="cpu_inference_") as tmp:
        tmp = Path(tmp)
        vit = None
        for arch in encoders:
            progress(f"{arch} ...")
            overrides = [*(QUICK_ENCODERS[arch] if args.quick else []), *args.set]
            loaded = own_encoder(tmp / arch, arch, overrides)
            vit = loaded if arch == "coreecg" else vit
            settings = [(p, batch0) for p in PRECISIONS]
            if args.compile and (arch == "coreecg" or not args.quick):      # --quick: the ViT's only
                settings += [(f"{p}+compile", batch0) for p in BATCH_PRECISIONS]
            if arch == "coreecg" or not args.quick:
                settings.append(("bf16+unfused", batch0))
            if arch == "s4":
                settings.append(("fp32+before", batch0))
            if arch == "coreecg":
                settings += [(p, b) for b in args.batch_sizes[1:] for p in BATCH_PRECISIONS]
            measured[arch] = {"source": f"random encoder, {'tiny' if args.quick else 'paper'} size",
                              "overrides": overrides,
                              **measure_encoder(arch, loaded, items, settings, args.repeats)}
            progress({arch: {k: v for k, v in measured[arch].items() if k != "overrides"}})
        for name in families:
            progress(f"{name} ...")
            loaded = published_model(tmp / name, name, args.quick)
            measured[name] = {"source": f"fixture {QUICK[name]}" if args.quick else "published size, random weights",
                              "family": loaded.config.model.arch,
                              **measure_encoder(name, loaded, items, [(p, batch0) for p in PRECISIONS],
                                                args.repeats)}
            progress({name: measured[name]})
        result["encoders"] = measured
        if vit is not None:
            cost = measured["coreecg"]
            crops = batch0 * cost["crops_per_window"]
            progress("the ViT's products alone ...")
            result["vit_products"] = vit_products(vit, crops, max(3, args.matrix_repeats))
            result["vit_products"]["records_per_s"] = round(
                result["vit_products"]["crops_per_s"] / (cost["crops_per_window"] * cost["windows_per_record"]), 3)
        if vit is None:
            result["onnx"] = {"skipped": "the ViT (coreecg) is not among --encoders"}
        else:
            progress("onnx ...")
            result["onnx"] = onnx_runtime(vit.model, vit, items, tmp, args.onnx_repeats)
            progress({"onnx": result["onnx"]})
        reader = vit or own_encoder(tmp / "reader", "coreecg", QUICK_ENCODERS["coreecg"] if args.quick else [])
        reading = reading_rates(reader, signals, formats, tmp / "formats", args.read_repeats)
    last = matrix_rates(args.matrix_size, args.matrix_repeats)
    progress({"matrix_at_end": last})
    result["matrix"] = limits(first, last)
    add_fractions(measured, result["matrix"])
    if "vit_products" in result:                            # the ceiling of any path of torch's kernels
        vp = result["vit_products"]
        vp["fraction_of_matrix_rate"] = round(vp["records_per_s"] * measured["coreecg"]["gflop_per_record"]
                                              / result["matrix"]["bf16"]["gflop_per_s"], 4)
    top = fastest(measured)
    for f in reading.values():
        f["starves"] = bool(top and f["read_preprocess_records_per_s"] < top["records_per_s"])
        f["over_fastest_model_path"] = (round(f["read_preprocess_records_per_s"] / top["records_per_s"], 2)
                                        if top else None)
    result["reading"] = {"preprocess": "the ViT's (coreecg.inference.reading.prepared_records, its input_spec)",
                         "fastest_model_path": top, "formats": reading}
    result["load_average_1min_end"] = os.getloadavg()[0]
    emit(result)


if __name__ == "__main__":
    main()
