"""Process memory and speed figures, measured every generation."""

from __future__ import annotations

import resource
import sys
import time

import psutil
import torch


def rss_bytes() -> int:
    """Resident set size of this process now."""
    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    """Highest resident set size this process has reached."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def memory_snapshot(device: torch.device) -> dict[str, int]:
    """RSS, peak RSS and (on CUDA) allocator figures, in bytes."""
    cuda = device.type == "cuda"
    return {
        "rss_bytes": rss_bytes(),
        "peak_rss_bytes": peak_rss_bytes(),
        "cuda_allocated_bytes": torch.cuda.memory_allocated(device) if cuda else 0,
        "cuda_reserved_bytes": torch.cuda.memory_reserved(device) if cuda else 0,
    }


def format_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


class PhaseTimer:
    """Wall time of consecutive phases without synchronising the host in between.

    On CUDA the marks are events on the stream, read after the generation's one synchronisation;
    on the CPU they are ``perf_counter`` readings.
    """

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._marks: list[tuple[str, object]] = []

    def start(self) -> None:
        self._marks.clear()
        self.mark("start")

    def mark(self, name: str) -> None:
        """End of phase ``name`` (the first mark is the start)."""
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self._marks.append((name, event))
        else:
            self._marks.append((name, time.perf_counter()))

    def durations(self) -> dict[str, float]:
        """Seconds of each phase since the previous mark; call after the host has synchronised."""
        out = {}
        for (_, before), (name, after) in zip(self._marks, self._marks[1:]):
            if self._cuda:
                after.synchronize()
                out[name] = before.elapsed_time(after) / 1000.0
            else:
                out[name] = after - before
        return out
