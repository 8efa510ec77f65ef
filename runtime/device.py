"""The training device a run names, and the process-wide settings a run on it needs."""

from __future__ import annotations

import torch

from config import Config
from runtime.sharding import Ranks
from utils.errors import ConfigError


def resolve_device(name: str, ranks: Ranks | None = None) -> torch.device:
    """The training device ``runtime.device`` names; with several processes on a GPU pod, each its own GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("runtime.device is cuda but no CUDA device is available (use --device cpu or auto)")
    if name == "cuda" and ranks is not None and ranks.distributed:
        if ranks.local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"process {ranks.rank} has local rank {ranks.local_rank} but this node has "
                f"{torch.cuda.device_count()} GPUs: start at most one process per GPU"
            )
        torch.cuda.set_device(ranks.local_rank)
        return torch.device("cuda", ranks.local_rank)
    return torch.device(name)


def set_matmul_precision(config: Config, device: torch.device) -> None:
    """torch's float32 matmul precision for a run on ``device``. Process-wide, so every run sets it: TF32 on CUDA
    tensor cores with ``runtime.matmul_precision=high``; exact float32 on the CPU, where "high" could let oneDNN use
    bfloat16 passes and a CPU run must stay comparable bit for bit."""
    torch.set_float32_matmul_precision(config.runtime.matmul_precision if device.type == "cuda" else "highest")
