"""Honest throughput (issue 41): the benchmarks report samples/s over the whole timed window beside
the median, list slow steps, count torch.compile's compilations with torch's own counters, and
take MFU from torch's FLOP count (bench.common.step_summary, compile_snapshot/compile_diff,
count_flops; bench.pretrain_step.run_variant; bench.pretrain_throughput.bare_step_rate). Tiny, CPU."""
from __future__ import annotations

import argparse
import math
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.common import TINY, compile_diff, compile_snapshot, count_flops, step_summary
from tests.helpers import tiny_config

# ---------------------------------------------------------------------------- the summary (pure)


def test_summary_whole_window_median_and_after_first():
    steps = [5.0, 1.0, 1.2, 0.8, 1.0]      # a first step with compilation, then four steps
    s = step_summary(steps, 8, warmup=1)
    assert s["samples_per_s_whole"] == pytest.approx(8 * 5 / sum(steps))
    assert s["samples_per_s_after_first"] == pytest.approx(8 * 4 / sum(steps[1:]))
    assert s["samples_per_s_median"] == pytest.approx(8 / 1.0)      # the steps after the warm-up
    assert s["first_step_s"] == 5.0 and s["step_s"] == steps and s["window_s"] == pytest.approx(sum(steps))
    assert s["first_step_excess_s"] == pytest.approx(4.0)
    assert [x["index"] for x in s["slow_steps"]] == [0] and s["slow_steps"][0]["warmup"]


def test_summary_lists_an_injected_slow_step_and_its_cost():
    """The case of the issue: a median that hides a recompilation in the middle of the window."""
    steps = [6.1, 0.09, 0.088, 0.089, 0.09, 0.091, 0.089, 4.0, 0.088, 0.09]
    s = step_summary(steps, 256, warmup=0)
    assert [(x["index"], x["s"]) for x in s["slow_steps"]] == [(0, 6.1), (7, 4.0)]
    assert s["samples_per_s_median"] == pytest.approx(256 / 0.09)
    assert s["samples_per_s_whole"] < s["samples_per_s_median"] / 10
    assert s["slow_steps_after_first_excess_s"] == pytest.approx(4.0 - 0.09)
    # a step at exactly twice the median is not slow; just over it is
    assert step_summary([1.0, 2.0, 1.0], 1)["slow_steps"] == []
    assert [x["index"] for x in step_summary([1.0, 2.01, 1.0], 1)["slow_steps"]] == [1]


def test_summary_with_samples_per_step_and_one_step():
    s = step_summary([2.0, 1.0, 1.5], [10, 8, 8], warmup=1)
    assert s["window_samples"] == 26 and s["window_steps"] == 3 and s["samples_per_s_whole"] == pytest.approx(26 / 4.5)
    one = step_summary([3.0], 4, warmup=1)          # only a warm-up step: its own median
    assert one["samples_per_s_after_first"] is None and one["samples_per_s_whole"] == pytest.approx(4 / 3)
    with pytest.raises(ValueError):
        step_summary([], 4)


# ---------------------------------------------------------------------------- compilations


def test_compile_counter_counts_a_first_compile_and_a_recompile_for_a_new_shape():
    def f(x):
        return torch.sin(x) * 2 + 1

    compiled = torch.compile(f, backend="eager", dynamic=False)
    s0 = compile_snapshot()
    compiled(torch.randn(3))
    s1 = compile_snapshot()
    compiled(torch.randn(3))            # same shape: the cached graph
    s2 = compile_snapshot()
    compiled(torch.randn(5))            # a new static shape: compiled again
    s3 = compile_snapshot()
    assert compile_diff(s0, s1)["graphs"] == 1 and compile_diff(s0, s1)["frames"] == 1
    assert compile_diff(s1, s2)["graphs"] == 0
    again = compile_diff(s2, s3)
    assert again["graphs"] == 1 and again["graph_breaks"] == 0
    assert len(again["recompile_reasons"]) == 1 and "size" in again["recompile_reasons"][0]
    assert compile_diff(s0, s3)["graphs"] == 2 and compile_diff(s1, s3)["graphs"] == 1


# ---------------------------------------------------------------------------- FLOPs


def test_flop_count_of_a_linear_model_is_six_flops_per_weight_and_token():
    """Forward 2 m n k a matmul, backward twice that (input and weight gradients): 6 x weights x
    tokens for a training step; the bias, the ReLU and the optimiser count nothing."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 5, 16, requires_grad=True)        # 20 tokens; a gradient for the input too
    tokens, weights = 4 * 5, 16 * 32 + 32 * 8

    def train_step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()

    counted = count_flops(train_step)
    assert counted["total"] == 6 * weights * tokens
    assert sum(counted["by_op"].values()) == counted["total"]
    # without an input gradient the first layer's backward makes only its weight gradient
    no_input_grad = count_flops(lambda: model(x.detach()).sum().backward())["total"]
    assert no_input_grad == 6 * weights * tokens - 2 * 16 * 32 * tokens


def test_flop_count_includes_masked_attention_on_cpu():
    """torch 2.13's FlopCounterMode has no formula for CPU's fused attention; count_flops adds one,
    so that attention with a boolean key-padding mask counts 4 b h s^2 d forward, twice that backward."""
    b, h, s, d = 2, 3, 10, 8
    q, k, v = (torch.randn(b, h, s, d, requires_grad=True) for _ in range(3))
    mask = torch.ones(b, 1, s, s, dtype=torch.bool)
    mask[0, ..., 7:] = False
    forward = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask))["total"]
    assert forward == 4 * b * h * s * s * d
    step = count_flops(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask).sum().backward())["total"]
    assert step == 3 * forward


# ---------------------------------------------------------------------------- bench.pretrain_step


def _variant_args(**kw) -> argparse.Namespace:
    args = dict(device="cpu", precision="fp32", mode="bernoulli", variant="core", set=list(TINY), config=None,
                padded=False, batch=2, steps=3, warmup=1, sdpa_backend="auto", profile=0, quick=True,
                cudagraph_skip_dynamic=False, host_cache=False, static_shapes=False, short_attention=0)
    return argparse.Namespace(**{**args, **kw})


def test_pretrain_step_reports_the_whole_window_a_slow_step_and_torch_flops(monkeypatch):
    """One tiny run with the last timed step made slow: every step timed (warm-up first), the
    whole-window figure is every sample over the summed step times, the slow step is listed
    with its index, the old keys keep their meaning, and MFU comes from torch's FLOP count."""
    from bench import pretrain_step
    from coreecg.train.step import PretrainStep

    original, calls = PretrainStep.__call__, []

    def timed_call(self, *a, **kw):
        if len(calls) == 3:     # the last timed step: 3x the slowest timed step before it, and more
            time.sleep(3 * max(calls[1:]) + 0.3)
        t = time.perf_counter()
        out = original(self, *a, **kw)
        calls.append(time.perf_counter() - t)
        return out

    monkeypatch.setattr(PretrainStep, "__call__", timed_call)
    r = pretrain_step.run_variant(_variant_args())
    step_s = r["step_s"]
    assert len(step_s) == 1 + 3 and len(calls) == 5          # warm-up + timed, then the FLOP-counting step
    assert r["samples_per_s_whole"] == pytest.approx(2 * len(step_s) / sum(step_s))
    assert r["samples_per_s_after_first"] == pytest.approx(2 * 3 / sum(step_s[1:]))
    assert r["first_step_s"] == r["first_step_seconds"] == step_s[0]
    assert r["seconds_per_step_all"] == step_s[1:]
    assert r["samples_per_s"] == r["samples_per_s_median"] == pytest.approx(2 / r["seconds_per_step_median"])
    assert 3 in [x["index"] for x in r["slow_steps"]]
    assert r["samples_per_s_whole"] < r["samples_per_s_median"]
    # nothing compiled on a CPU (train.compile auto), and certainly not after the first step
    assert r["compilations_after_first_step"] == 0 and r["compilations_total"] == 0
    # torch's count of the real step, the analytic one beside it, MFU from torch's
    torch_flops, analytic = r["flops_per_sample_torch"], r["flops_per_sample_analytic"]
    assert r["flops_source"] == "torch" and torch_flops > 0 and analytic == r["train_flops_per_sample"]
    assert r["flops_ratio_analytic_over_torch"] == pytest.approx(analytic / torch_flops)
    assert 0.7 < r["flops_ratio_analytic_over_torch"] < 1.3
    assert any("scaled_dot_product" in op for op in r["flops_per_sample_torch_by_op"])
    peak = r["matmul_peak_flops_per_s"]
    assert r["flops_utilisation"] == pytest.approx(torch_flops * r["samples_per_s"] / peak)
    assert r["flops_utilisation_analytic"] == pytest.approx(analytic * r["samples_per_s"] / peak)
    assert r["flops_utilisation_whole"] == pytest.approx(torch_flops * r["samples_per_s_whole"] / peak)
    line = pretrain_step.summarise([r])["runs"][0]
    assert "whole window" in line and "#3" in line and "GFLOP" in line
    # On the CPU the step runs within its call (the slept step too): the host's launch is the wall.
    assert r["minor_faults_per_step_after_first"] >= 0 and r["system_seconds_per_step_after_first"] >= 0
    assert 0.9 < r["launch_share_after_first"] <= 1.0


def test_the_wait_for_the_device_is_not_counted_as_the_hosts_launch(monkeypatch):
    """A step whose end waits on the device (the sync after step() returns) has a launch share well
    under 1: the wait is the device's, not the host's (a CUDA sync spin-waits, so the process's CPU
    seconds could not tell them apart)."""
    from bench import pretrain_step

    waits = []
    monkeypatch.setattr(pretrain_step, "sync", lambda device: waits.append(time.sleep(0.5)))
    r = pretrain_step.run_variant(_variant_args(steps=2))
    after_first = r["step_s"][1:]
    assert len(waits) >= 3 and all(t >= 0.5 for t in after_first)
    assert r["launch_share_after_first"] < (sum(after_first) - 0.5 * len(after_first)) / sum(after_first) + 0.01


# ---------------------------------------------------------------------------- bench.pretrain_throughput


def test_bare_step_reports_every_step_and_the_old_figure():
    from bench.pretrain_throughput import bare_step_rate, epoch_summary

    cfg = tiny_config("optim.batch_size=2")
    windows = np.random.default_rng(0).standard_normal(
        (6, cfg.model.n_leads, cfg.data.crop_samples)).astype(np.float16)
    threads = torch.get_num_threads()
    try:
        bare = bare_step_rate(cfg, windows, steps=2, warmup=1, threads=threads)
    finally:
        torch.set_num_threads(threads)
    assert len(bare["step_s"]) == 3 and bare["step_clock"] == "host"
    assert bare["samples_per_s_whole"] == pytest.approx(2 * 3 / sum(bare["step_s"]))
    # the figure of before (one clock around the timed steps) spans the same steps as after_first
    assert bare["samples_per_s"] == pytest.approx(bare["samples_per_s_after_first"], rel=0.05)
    assert bare["compilations_after_first_step"] == 0
    # the Ray path's epochs, the first as the warm-up
    epochs = [{"seconds": 10.0, "samples_per_s": 3.2}, {"seconds": 4.0, "samples_per_s": 8.0},
              {"seconds": 4.2, "samples_per_s": 32 / 4.2}]
    e = epoch_summary(epochs)
    assert e["samples_per_s_whole"] == pytest.approx(96 / 18.2) and e["first_epoch_s"] == 10.0
    assert e["samples_per_s_median"] == pytest.approx(float(np.median([8.0, 32 / 4.2])))
    assert [x["index"] for x in e["slow_epochs"]] == [0] and e["epoch_s"] == [10.0, 4.0, 4.2]
    assert epoch_summary([]) is None and math.isclose(e["window_s"], 18.2)


def test_the_short_attention_experiment_reaches_the_model(monkeypatch):
    """--short-attention N sets every Attention's batched_up_to, so the step runs its short
    sequences in batched matmuls (else the lease would time SDPA under the experiment's name)."""
    from bench import pretrain_step
    from coreecg.model import layers

    calls = []
    real = layers.batched_attention
    monkeypatch.setattr(layers, "batched_attention", lambda q, *a: calls.append(q.shape[2]) or real(q, *a))
    r = pretrain_step.run_variant(_variant_args(steps=1, short_attention=32))
    assert r["short_attention"] == 32 and calls and max(calls) <= 32
    n = len(calls)
    pretrain_step.run_variant(_variant_args(steps=1))
    assert len(calls) == n                                          # off by default
