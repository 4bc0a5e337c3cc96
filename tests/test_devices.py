"""One device resolver (coreecg.devices.resolve_device) for the in-process loop and inference."""
import pytest
import torch

from coreecg.devices import DeviceError, resolve_device


def test_auto_cpu_and_names_torch_does_not_know():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(DeviceError, match="'gpu0'"):
        resolve_device("gpu0")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_cuda_without_a_gpu_is_an_error_never_a_silent_cpu_run():
    with pytest.raises(DeviceError, match="'cuda'.*no CUDA device"):
        resolve_device("cuda")
