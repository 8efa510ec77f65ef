"""Where device results come to the host (``runtime.boundary``): host tensors, detached, in the dtype asked."""

from __future__ import annotations

import torch

from runtime.boundary import to_host
from tests.emulated_cuda import DeviceTensor, emulate_cuda


def test_device_results_come_over_as_detached_host_tensors():
    with emulate_cuda():
        weights = torch.ones(3, device="cuda", requires_grad=True)
        loss = (weights * 2).sum()
        host = to_host(loss)
        assert type(host) is torch.Tensor and host.device.type == "cpu" and not host.requires_grad
        assert float(host) == 6.0  # a host value may be read as Python's
        wide = to_host(weights, torch.float64)
        assert isinstance(weights, DeviceTensor) and wide.dtype == torch.float64 and wide.device.type == "cpu"


def test_on_the_cpu_a_host_tensor_stays_itself_unless_its_dtype_changes():
    tensor = torch.arange(3.0)
    assert to_host(tensor).data_ptr() == tensor.data_ptr()
    assert to_host(tensor, torch.float64).dtype == torch.float64
