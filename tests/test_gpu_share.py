"""--gpus-per-trial auto (coreecg.tune.gpu_share): trials share a GPU by their measured memory,
and a trial that fits in none is refused naming what it needs and what there is."""
import argparse

import pytest

from coreecg.cli import gpus_per_trial
from coreecg.tune.gpu_share import HEADROOM, USABLE, GpuShareError, MemoryModel, auto_gpus_per_trial
from tests.helpers import tiny_config

GiB = 2**30
H200 = ("NVIDIA H200", 140 * GiB)


def _config(*extra):
    return tiny_config("train.use_gpu=true", "train.num_workers=1", *extra)


def test_trials_pack_by_measured_memory_per_sample_times_batch():
    memory = MemoryModel(fixed=1 * GiB, per_sample=0.05 * GiB)        # 1 GiB + 50 MiB a sample
    share, why = auto_gpus_per_trial(_config("optim.batch_size=256"), measure=lambda c: memory, gpu=lambda: H200)
    need = (1 + 0.05 * 256) * HEADROOM                                  # 16.56 GiB a trial
    assert share == 1 / int(140 * USABLE // need) == 1 / 7
    assert "1/7 of NVIDIA H200" in why and "16.6 GiB a trial" in why
    # the batch moves the need: at 32 a sample, 23 trials fit
    small, _ = auto_gpus_per_trial(_config("optim.batch_size=32"), measure=lambda c: memory, gpu=lambda: H200)
    assert small == 1 / int(140 * USABLE // ((1 + 0.05 * 32) * HEADROOM))


def test_a_trial_that_fits_no_gpu_is_refused_naming_both_memories():
    memory = MemoryModel(fixed=2 * GiB, per_sample=1 * GiB)
    with pytest.raises(GpuShareError, match=r"needs 309\.6 GiB at optim\.batch_size=256 .* NVIDIA H200 has 140\.0 GiB"):
        auto_gpus_per_trial(_config("optim.batch_size=256"), measure=lambda c: memory, gpu=lambda: H200)


def test_cpu_and_multi_worker_trials_take_no_fraction():
    never = lambda c: pytest.fail("measured a trial that needs no measurement")   # noqa: E731
    assert auto_gpus_per_trial(tiny_config("train.use_gpu=false"), measure=never)[0] == 0.0
    assert auto_gpus_per_trial(tiny_config("train.use_gpu=true", "train.num_workers=2", "optim.batch_size=32"),
                               measure=never)[0] == 1.0


def test_the_flag_takes_a_number_or_auto():
    assert gpus_per_trial("auto") == "auto" and gpus_per_trial("AUTO") == "auto" and gpus_per_trial("0.25") == 0.25
    for bad in ("-1", "half"):
        with pytest.raises(argparse.ArgumentTypeError, match="a number of GPUs >= 0 or 'auto'"):
            gpus_per_trial(bad)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="no CUDA device")
def test_the_measurement_on_a_gpu_grows_with_the_batch():
    from coreecg.tune.gpu_share import measure_memory

    memory = measure_memory(_config())
    assert memory.per_sample > 0 and memory.fixed > 0
    assert memory.need(64) > memory.need(8)
