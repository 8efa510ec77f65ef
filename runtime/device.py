"""The training device a run names, and the process-wide settings a run on it needs."""

from __future__ import annotations

import ctypes
import os
import sys

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


MMAP_THRESHOLD = 64 * 2**20
"""Host allocations up to this size come from the heap, which keeps what is freed for the next ones."""
TRIM_THRESHOLD = 256 * 2**20
"""Free memory at the heap's top kept from the operating system up to this much."""
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (glibc's malloc.h)


def keep_freed_host_memory() -> bool:
    """Let glibc's allocator keep freed host memory for reuse instead of returning it to the operating system.

    A CPU generation allocates and frees the same activations and gradients (megabytes each) thousands of times. By
    default glibc serves a block that large from a fresh mapping and unmaps it on free (its threshold adapts only
    upward, to the largest block freed so far), so every allocation pays a page fault per 4 kB when first written:
    on this project's CPU the default update phase took 2.1 s instead of 1.4 s (BENCHMARKS.md). Process-wide and
    idempotent; a user's own ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_`` is left as set. Returns whether
    the settings were applied (not on another C library or system)."""
    if sys.platform != "linux" or {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & set(os.environ):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
