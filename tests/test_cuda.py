"""The GPU path (skipped without a CUDA device; bench/gpu_smoke.sh runs it on a lent GPU)."""
import pytest
import torch

from coreecg.methods import CoReECG
from coreecg.train.step import PretrainStep, Schedule
from tests.helpers import tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


def _step(*overrides: str) -> tuple[PretrainStep, torch.Tensor]:
    # the eager step (train.compile=auto would compile on CUDA; tests/test_cuda_compile.py covers that)
    cfg = tiny_config("train.precision=auto", "train.compile=false", *overrides)
    torch.manual_seed(0)
    model = CoReECG(cfg).cuda()
    return PretrainStep(model, cfg, Schedule(10, 2, 0)), torch.randn(16, 12, 2250, device="cuda")


def test_cuda_step_makes_no_host_sync():
    """bf16 autocast, fused AdamW, masks planned on the host: a step never waits on the GPU."""
    step, x = _step()
    gen = torch.Generator().manual_seed(0)       # the training loop's: on the host
    step(x, generator=gen)                       # lazy initialisation may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step(x, generator=gen)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert step.optimizer.defaults["fused"] is True
    assert torch.isfinite(out["loss"]).item()


def test_cuda_checkpointing_lowers_peak_memory():
    peaks = {}
    for on in (False, True):
        step, x = _step(f"train.activation_checkpointing={str(on).lower()}")
        gen = torch.Generator().manual_seed(0)
        step(x, generator=gen)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(x, generator=gen)
        torch.cuda.synchronize()
        peaks[on] = torch.cuda.max_memory_allocated()
        del step, x
        torch.cuda.empty_cache()
    assert peaks[True] < 0.8 * peaks[False], peaks


def _cpu_and_cuda_steps(*overrides: str) -> tuple[dict, dict]:
    """One fp32 step of the same seeded tiny model and host-drawn masks on the CPU and on CUDA,
    without TF32 (CUDA's default for convolutions). methods.core.loss.beta=0: the FDA view's noise is drawn on
    the batch's device (a CUDA generator seeded from the host one: other numbers than the CPU's),
    so only the reconstruction term is the same function on both devices."""
    out = {}
    x = torch.randn(8, 12, 2250, generator=torch.Generator().manual_seed(1))
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        for device in ("cpu", "cuda"):
            cfg = tiny_config("train.precision=fp32", "methods.core.loss.beta=0", "train.compile=false", *overrides)
            torch.manual_seed(0)
            model = CoReECG(cfg).to(device)
            step = PretrainStep(model, cfg, Schedule(10, 2, 0))
            res = step(x.to(device), generator=torch.Generator().manual_seed(0))
            out[device] = {"loss": float(res["loss"]),
                           "grads": {n: p.grad.detach().cpu() for n, p in model.named_parameters()
                                     if p.grad is not None}}
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    return out["cpu"], out["cuda"]


@pytest.mark.parametrize("mode", ["bernoulli", "exact"])
def test_cuda_fp32_step_matches_the_cpu_step(mode):
    """The same seed and host-drawn masks give the same loss and gradients on either device: the
    device moves no masking randomness and changes no arithmetic beyond float rounding."""
    cpu, cuda = _cpu_and_cuda_steps(f"methods.core.masking.mode={mode}")
    assert abs(cpu["loss"] - cuda["loss"]) <= 1e-4 * abs(cpu["loss"]), (cpu["loss"], cuda["loss"])
    assert set(cpu["grads"]) == set(cuda["grads"]) and cpu["grads"]
    for name, g in cpu["grads"].items():
        err = float((g - cuda["grads"][name]).norm())
        assert err <= 1e-3 * float(g.norm()) + 1e-7, (name, err, float(g.norm()))


def test_cuda_bf16_autocast_tracks_fp32():
    losses = {}
    for precision in ("fp32", "bf16"):
        step, x = _step(f"train.precision={precision}")
        losses[precision] = float(step(x, generator=torch.Generator().manual_seed(0))["loss"])
    assert abs(losses["bf16"] - losses["fp32"]) <= 0.03 * abs(losses["fp32"]), losses


def test_exact_stdm_on_an_unpadded_batch_runs_on_flash_attention():
    """methods.core.masking.mode=exact gives every sample as many visible tokens; on a batch known to hold no
    padding (step.unpadded, from the corpus manifest) no attention gets a mask, so the flash kernel
    runs the whole step (bench/pretrain_step.py --sdpa flash). Bernoulli STDM's visible sets differ
    in size: their mask leaves the memory-efficient kernel, which must run it."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    step, x = _step("methods.core.masking.mode=exact", "train.precision=bf16")
    step.unpadded = True
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        assert torch.isfinite(step(x, generator=torch.Generator().manual_seed(0))["loss"]).item()
    step, x = _step("methods.core.masking.mode=bernoulli", "train.precision=bf16")
    step.unpadded = True
    with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
        assert torch.isfinite(step(x, generator=torch.Generator().manual_seed(0))["loss"]).item()


def test_compiled_cuda_step_matches_eager():
    losses = {}
    for compiled in (False, True):
        step, x = _step("train.precision=fp32", "methods.core.masking.mode=exact",
                        f"train.compile={str(compiled).lower()}")
        gen = torch.Generator().manual_seed(0)
        losses[compiled] = [float(step(x, generator=gen)["loss"]) for _ in range(2)]
    assert losses[True] == pytest.approx(losses[False], rel=1e-3), losses


@pytest.mark.parametrize("method", ["moco_v3", "cmsc"])
def test_baseline_methods_step_on_cuda_without_host_sync(method):
    from coreecg.methods import build_method

    cfg = tiny_config("train.precision=auto", "train.compile=false", f"pretrain.method={method}")
    torch.manual_seed(0)
    model = build_method(cfg).cuda()
    step = PretrainStep(model, cfg, Schedule(10, 2, 0))
    x = torch.randn(16, 12, 2250, device="cuda")
    kwargs = {"generator": torch.Generator().manual_seed(0)}
    if model.needs_patient_ids:
        kwargs["patient"] = torch.arange(16, device="cuda") // 2
    before = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    step(x, **kwargs)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        out = step(x, **kwargs)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert torch.isfinite(out["loss"]).item()
    after = [p for p in model.parameters() if p.requires_grad]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


def test_embeddings_on_cuda_agree_with_the_cpu_ones(tmp_path):
    """coreecg.embed with device='cuda' runs the export's precision ('auto': bf16 autocast on
    CUDA, fp32 on the CPU): the same embedding up to bf16 rounding (seen on an H200: 1.7e-3 of the
    largest component)."""
    import numpy as np

    import coreecg
    from coreecg.config import STANDARD_LEADS
    from tests.helpers import tiny_models

    models = tiny_models(tmp_path)
    signal = np.random.default_rng(0).standard_normal((12, 5000)).astype(np.float32)
    cpu = coreecg.embed(signal, 500, STANDARD_LEADS, models["encoder"], device="cpu")
    cuda = coreecg.embed(signal, 500, STANDARD_LEADS, models["encoder"], device="cuda")
    assert cpu.shape == cuda.shape and np.isfinite(cuda).all()
    cos = float(cpu @ cuda / (np.linalg.norm(cpu) * np.linalg.norm(cuda)))
    assert cos > 0.9999 and np.abs(cpu - cuda).max() <= 2e-2 * np.abs(cpu).max(), (cos, np.abs(cpu - cuda).max())


@pytest.fixture(scope="module")
def gpu_pretraining(ray_session, tmp_path_factory):
    """jobs/pretrain.py's path (fit: TorchTrainer, Ray Data) with train.use_gpu=true, one worker."""
    from coreecg.config import load_config
    from coreecg.train.fit import fit, plan_run
    from tests.helpers import TINY

    tmp = tmp_path_factory.mktemp("gpu-runs")
    common = [*TINY, "train.use_gpu=true", "train.num_workers=1", "train.cpus_per_worker=1",
              f"train.storage_path={tmp}", "train.eval_every_epochs=0", "data.synthetic_records=256"]
    cfg = load_config(overrides=[*common, "optim.batch_size=8", "optim.epochs=2", "optim.warmup_epochs=0",
                                 "train.name=gpu-pre"])
    return common, cfg, fit(plan_run(cfg, "pretrain"))


def test_pretraining_on_the_gpu_through_ray_train(gpu_pretraining):
    """Both epochs ran on the GPU worker (fit holds one GPU for it, coreecg.cluster.check_gpus), the
    weights come back finite, and they load on a CPU-only machine (map_location=cpu)."""
    import json
    import math

    from coreecg.checkpoints import load_checkpoint

    _, cfg, pre = gpu_pretraining
    assert math.isfinite(pre.metrics["loss"])
    payload, _ = load_checkpoint(pre.checkpoint, map_location="cpu")
    assert all(torch.isfinite(v).all() for v in payload["model"].values() if v.is_floating_point())
    lines = [json.loads(x) for x in (pre.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["epoch"] for x in lines if x.get("kind") == "epoch"] == [1, 2]


def test_finetuning_on_the_gpu_through_ray_train(gpu_pretraining):
    import math

    from coreecg.config import load_config
    from coreecg.data.locate import synthetic_corpus
    from coreecg.train.fit import fit, plan_run

    common, cfg, pre = gpu_pretraining
    ft_cfg = load_config(overrides=[*common, f"data.corpus={synthetic_corpus(cfg)}", f"finetune.encoder={pre.model}",
                                    "finetune.epochs=1", "finetune.batch_size=8", "finetune.bootstrap_resamples=20",
                                    "train.name=gpu-ft"])
    ft = fit(plan_run(ft_cfg, "finetune"))
    numbers = [v for split in ("val", "test") for v in ft.metrics[split].values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers), ft.metrics


def test_plan_devices_picks_cuda_and_one_worker_per_device():
    """train.use_gpu / train.num_workers auto (issue 41) where torch sees CUDA: the GPUs, one
    worker each, named on the console line; Ray counts the same GPUs on the cluster it starts."""
    from coreecg import cluster
    from coreecg.config import load_config

    n = torch.cuda.device_count()
    local = cluster._local_devices()
    assert (local.gpus, local.names[0]) == (n, torch.cuda.get_device_name(0))
    cfg, lines = cluster.plan_devices(load_config())
    assert (cfg.train.use_gpu, cfg.train.num_workers) == (True, n)
    assert lines[0].startswith(f"device: {n} GPU")
    assert lines[0].endswith(f"-> train.use_gpu=true (auto), train.num_workers={n} (one per GPU, auto), "
                             "train.compile=true (auto)")


def test_an_auto_run_trains_on_the_gpus_and_records_the_chosen_values(ray_session, tmp_path):
    """jobs/pretrain.py's path with the defaults: the run folder's config holds use_gpu true and one
    worker per GPU, and the same config planned again finds nothing changed (a resume)."""
    from coreecg.config import load_config
    from coreecg.train.fit import fit, plan_run
    from coreecg.train.resume_check import changed_keys
    from tests.helpers import TINY

    n = torch.cuda.device_count()
    sets = [*TINY, f"train.storage_path={tmp_path}", "train.name=auto", "train.eval_every_epochs=0",
            "data.synthetic_records=256", "optim.batch_size=8", "finetune.batch_size=8", "optim.epochs=1",
            "optim.warmup_epochs=0"]
    result = fit(plan_run(load_config(overrides=sets), "pretrain"))
    saved = load_config(result.run_dir / "config.yaml")
    assert (saved.train.use_gpu, saved.train.num_workers) == (True, n)
    again = plan_run(load_config(overrides=sets), "pretrain")
    assert changed_keys(saved, again.config) == [] and not again.resume_notes
