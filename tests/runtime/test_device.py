"""A run's device and its arithmetic (``training.setup``)."""

from __future__ import annotations

import pytest
import torch

from config import override, preset
from runtime.device import resolve_device, set_matmul_precision
from utils.errors import ConfigError


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_on_a_machine_without_it_is_refused_in_one_line_and_auto_is_the_cpu():
    with pytest.raises(ConfigError, match="no CUDA device is available"):
        resolve_device("cuda")
    assert resolve_device("auto") == torch.device("cpu")


def test_tf32_is_for_cuda_alone_a_cpu_run_stays_exact(cuda):
    config = override(preset("paper"), {"runtime.matmul_precision": "high"})
    try:
        set_matmul_precision(config, torch.device("cpu"))
        assert torch.get_float32_matmul_precision() == "highest"
        set_matmul_precision(config, resolve_device("cuda"))
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision("highest")
