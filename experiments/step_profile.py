"""Where the time of one CoRe-ECG pretraining step goes, per component (issue: training-step efficiency).

    python -m experiments.step_profile                   # CPU, paper config, batch 16, fp32 + bf16
    python -m experiments.step_profile --batch 32 --steps 5 --profile-steps 2

Labels are placed from the outside (forward pre/post hooks and monkeypatched wrappers set up
here; coreecg/ is untouched): each label is both a torch.profiler.record_function range and a
perf_counter accumulator. Per precision it reports

  * components: exclusive ms/step and share of the step, from `--steps` unprofiled steps (the
    hooks stay on; they cost microseconds). Derived rows (mask gather, grid scatter, "other")
    are a parent's time minus its labelled children.
  * isolated: forward and forward+backward of sub-modules re-run alone on the inputs captured
    from the last step (backward is otherwise only measurable as a whole).
  * top_ops: the top ops by self CPU time over `--profile-steps` profiled steps, plus call
    counts of layout copies, cat/scatter/gather and host syncs (aten::item, _local_scalar_dense).

Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import coreecg.methods.core_ecg.method as core_ecg_mod
from coreecg.config import load_config
from coreecg.methods import CoReECG
from coreecg.train.step import PretrainStep, Schedule


class Labels:
    """Nested named ranges: record_function (seen by the profiler) + perf_counter totals."""

    def __init__(self):
        self.ms = defaultdict(float)
        self.stack: list = []
        self.capture: dict[str, tuple] = {}
        self.capturing = False

    def enter(self, name: str) -> None:
        rf = record_function(name)
        rf.__enter__()
        self.stack.append((name, rf, time.perf_counter()))

    def exit(self, name: str) -> None:
        top, rf, t0 = self.stack.pop()
        assert top == name, (top, name)
        rf.__exit__(None, None, None)
        self.ms[name] += (time.perf_counter() - t0) * 1e3

    def wrap(self, name: str, fn, capture: bool = False):
        def wrapped(*args, **kwargs):
            if capture and self.capturing:
                self.capture[name] = args
            self.enter(name)
            try:
                return fn(*args, **kwargs)
            finally:
                self.exit(name)
        return wrapped

    def hook(self, module: torch.nn.Module, name: str, capture: bool = False) -> None:
        def pre(mod, args):
            if capture and self.capturing:
                self.capture[name] = args
            self.enter(name)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(lambda mod, args, out: self.exit(name))

    def reset(self) -> None:
        self.ms.clear()


def instrument(model: CoReECG, step: PretrainStep, lab: Labels) -> None:
    # forward-side module hooks (the teacher is a deepcopy made in __init__, so hooks are separate)
    lab.hook(model, "forward")
    enc = model.encoder
    lab.hook(enc, "student.encoder")
    enc.tokens = lab.wrap("student.tokens", enc.tokens)            # patch embedding + lead/pos embedding
    lab.hook(enc.patch_embed, "student.patch_embed")
    lab.hook(enc.transformer, "student.transformer", capture=True)
    for name, dec in (("time_decoder", model.time_decoder), ("latent_decoder", model.latent_decoder)):
        lab.hook(dec, name, capture=True)
        lab.hook(dec.input, f"{name}.input")
        for blk in dec.transformer.blocks:                          # axial layout bypasses transformer.forward
            lab.hook(blk, f"{name}.blocks")
        lab.hook(dec.transformer.norm, f"{name}.norm")
    lab.hook(model.time_decoder.head, "time_decoder.head")
    lab.hook(model.projection, "projection", capture=True)
    lab.hook(model.fda, "fda", capture=True)
    te = model.teacher_encoder                                      # CoReECG calls .pooled (-> .forward): no hooks fire
    te.pooled = lab.wrap("teacher.encoder", te.pooled, capture=True)
    lab.hook(model.teacher_projection, "teacher.projection")
    # module-level functions CoReECG.forward looks up at call time
    core_ecg_mod.make_masks = lab.wrap("stdm_masks", core_ecg_mod.make_masks)
    core_ecg_mod.patchify = lab.wrap("loss.rec_target", core_ecg_mod.patchify)
    core_ecg_mod.masked_mse = lab.wrap("loss.rec", core_ecg_mod.masked_mse)
    core_ecg_mod.info_nce = lab.wrap("loss.con", core_ecg_mod.info_nce)
    # step-side
    opt = step.optimizer
    opt.step = lab.wrap("optimizer.step", opt.step)
    opt.zero_grad = lab.wrap("zero_grad", opt.zero_grad)
    model.update_teacher = lab.wrap("ema_update", model.update_teacher)


def components(ms: dict[str, float], steps: int) -> dict[str, float]:
    """Exclusive per-step ms; rows sum to the step."""
    g = {k: v / steps for k, v in ms.items()}
    z = lambda k: g.get(k, 0.0)  # noqa: E731
    rows = {
        "patch_embed (conv + layout)": z("student.patch_embed"),
        "lead/pos embedding add": z("student.tokens") - z("student.patch_embed"),
        "stdm_mask_build": z("stdm_masks"),
        "student mask gather (counts, host sync, argsort, gather)":
            z("student.encoder") - z("student.tokens") - z("student.transformer"),
        "student encoder transformer (padded)": z("student.transformer"),
        "time_decoder input+head linears": z("time_decoder.input") + z("time_decoder.head"),
        "time_decoder scatter to grid + embed + axial layout copies":
            z("time_decoder") - z("time_decoder.input") - z("time_decoder.head")
            - z("time_decoder.blocks") - z("time_decoder.norm"),
        "time_decoder blocks (axial)": z("time_decoder.blocks") + z("time_decoder.norm"),
        "latent_decoder input linear": z("latent_decoder.input"),
        "latent_decoder scatter to grid + embed + mean":
            z("latent_decoder") - z("latent_decoder.input") - z("latent_decoder.blocks") - z("latent_decoder.norm"),
        "latent_decoder blocks (joint)": z("latent_decoder.blocks") + z("latent_decoder.norm"),
        "projection (student)": z("projection"),
        "fda (rfft/irfft, quantile, noise)": z("fda"),
        "teacher encoder + projection (forward, grad on)": z("teacher.encoder") + z("teacher.projection"),
        "losses (masked_mse + patchify, info_nce)": z("loss.rec") + z("loss.rec_target") + z("loss.con"),
    }
    rows["forward other (diagnostics, lead_idx, rel norm, cosine)"] = z("forward") - sum(rows.values())
    rows["backward (whole, incl. teacher input-grad)"] = z("backward")
    rows["optimizer.step (AdamW)"] = z("optimizer.step")
    rows["ema_update (teacher lerp)"] = z("ema_update")
    rows["step other (lr, zero_grad, grad norm, dict)"] = (
        z("step") - z("forward") - z("backward") - z("optimizer.step") - z("ema_update"))
    return rows


def _t(fn, reps: int) -> float:
    fn()
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def _leaf(t: torch.Tensor, grad: bool) -> torch.Tensor:
    return t.detach().clone().requires_grad_(grad and t.is_floating_point())


def isolated(model: CoReECG, lab: Labels, precision: str, reps: int) -> dict:
    """Forward and forward+backward of sub-modules alone, on the inputs the last step used."""
    cap = lab.capture
    ac = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if precision == "bf16" else \
        (lambda: torch.autocast("cpu", enabled=False))
    out = {}

    def bench(name, make_inputs, run):
        def fwd():
            with torch.no_grad(), ac():
                run(*make_inputs())

        def fwd_bwd():
            inputs = make_inputs()
            with ac():
                y = run(*inputs)
            y.float().sum().backward()

        f, fb = _t(fwd, reps), _t(fwd_bwd, reps)
        out[name] = {"forward_ms": f, "forward_backward_ms": fb, "backward_ms": fb - f}

    g, valid = cap["student.transformer"]
    out["student_tokens_shape"] = list(g.shape)
    out["student_padding_frac"] = 0.0 if valid is None else float(1 - valid.float().mean())
    bench("student encoder transformer (padded visible tokens)",
          lambda: (_leaf(g, True), valid), lambda a, v: model.encoder.transformer(a, v))
    enc = cap["time_decoder"][0]
    lead = cap["time_decoder"][1]
    mk_enc = lambda: (enc._replace(tokens=_leaf(enc.tokens, True)),)  # noqa: E731
    bench("time_decoder (scatter + axial blocks + head)", mk_enc, lambda e: model.time_decoder(e, lead))
    bench("latent_decoder + projection", mk_enc, lambda e: model.projection(model.latent_decoder(e, lead)))
    x = cap["fda"][0]
    bench("fda (rfft/irfft) -> grad to W", lambda: (x,), lambda a: model.fda(a))
    view = cap["teacher.encoder"][0]
    bench("teacher encoder + projection, input-grad backward (360 tokens)", lambda: (_leaf(view, True),),
          lambda a: model.teacher_projection(model.teacher_encoder.pooled(a)))
    return out


OP_GROUPS = {
    "layout copies": ("aten::copy_", "aten::contiguous", "aten::clone", "aten::_to_copy"),
    "cat/stack": ("aten::cat", "aten::stack"),
    "scatter/gather/index": ("aten::scatter", "aten::scatter_", "aten::gather", "aten::index",
                             "aten::index_select", "aten::scatter_add_", "aten::index_put_"),
    "host syncs": ("aten::item", "aten::_local_scalar_dense"),
}


def top_ops(prof, labels: set[str], steps: int, n: int = 15) -> dict:
    ev = [e for e in prof.key_averages() if e.key not in labels and not e.key.startswith("ProfilerStep")]
    total = sum(e.self_cpu_time_total for e in ev) or 1.0
    ev.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [{"op": e.key, "self_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
            "self_pct": 100 * e.self_cpu_time_total / total, "calls_per_step": e.count / steps} for e in ev[:n]]
    by_key = {e.key: e for e in ev}
    groups = {}
    for g, names in OP_GROUPS.items():
        hit = [by_key[k] for k in names if k in by_key]
        groups[g] = {"calls_per_step": sum(e.count for e in hit) / steps,
                     "self_ms_per_step": sum(e.self_cpu_time_total for e in hit) / 1e3 / steps,
                     "self_pct": 100 * sum(e.self_cpu_time_total for e in hit) / total,
                     "ops": {e.key: e.count / steps for e in hit}}
    return {"top": top, "groups": groups, "profiled_self_ms_per_step": total / 1e3 / steps}


def run_precision(args, precision: str) -> dict:
    cfg = load_config(args.config, [f"train.precision={precision}", *args.set])
    torch.manual_seed(0)
    model = CoReECG(cfg)
    step = PretrainStep(model, cfg, Schedule(steps_per_epoch=1000, epochs=1, warmup_epochs=0))
    lab = Labels()
    instrument(model, step, lab)
    orig_backward = torch.Tensor.backward
    torch.Tensor.backward = lambda self, *a, **k: lab.wrap("backward", orig_backward)(self, *a, **k)
    run_step = lab.wrap("step", step)
    x = torch.randn(args.batch, cfg.model.n_leads, cfg.model.input_samples)
    gen = torch.Generator().manual_seed(0)
    try:
        for _ in range(args.warmup):
            run_step(x, generator=gen)
        lab.reset()
        times = []
        for i in range(args.steps):
            lab.capturing = i == args.steps - 1
            t = time.perf_counter()
            out = run_step(x, generator=gen)
            float(out["loss"])
            times.append(time.perf_counter() - t)
        lab.capturing = False
        comp = components(dict(lab.ms), args.steps)
        label_names = set(lab.ms)
        lab.reset()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.profile_steps):
                run_step(x, generator=gen)
        prof_comp = components(dict(lab.ms), args.profile_steps)
        ops = top_ops(prof, label_names | set(lab.ms), args.profile_steps)
    finally:
        torch.Tensor.backward = orig_backward
    sec = statistics.median(times)
    step_ms = sum(comp.values())
    res = {
        "precision": precision, "seconds_per_step_median": sec, "seconds_per_step_all": times,
        "samples_per_s": args.batch / sec, "loss": float(out["loss"]),
        "visible_frac": float(out["visible_frac"]),
        "components_ms_per_step": {k: round(v, 2) for k, v in comp.items()},
        "components_share": {k: round(v / step_ms, 4) for k, v in comp.items()},
        "components_ms_per_step_profiled": {k: round(v, 2) for k, v in prof_comp.items()},
        "ops": ops,
    }
    if not args.no_isolated:
        res["isolated"] = isolated(model, lab, precision, args.isolated_reps)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=16, help="default 16; the issue's CPU reference is 32")
    p.add_argument("--steps", type=int, default=4, help="unprofiled timed steps")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--profile-steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precisions", default="fp32,bf16")
    p.add_argument("--isolated-reps", type=int, default=3)
    p.add_argument("--no-isolated", action="store_true")
    p.add_argument("--config", default="configs/paper.yaml")
    p.add_argument("--set", action="append", default=[], metavar="A.B=C")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    results = [run_precision(args, pr) for pr in args.precisions.split(",")]
    print(json.dumps({
        "benchmark": "step_profile", "device": "cpu", "cpu": platform.processor() or platform.machine(),
        "batch": args.batch, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "torch": torch.__version__, "config": args.config, "overrides": args.set, "steps": args.steps,
        "warmup": args.warmup, "profile_steps": args.profile_steps, "results": results,
    }, indent=1))


if __name__ == "__main__":
    main()
