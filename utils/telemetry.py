"""Process memory and speed figures, measured every generation."""

from __future__ import annotations

import collections
import gc
import itertools
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from typing import NamedTuple

import psutil
import torch

MEMORY_KEYS = (
    "rss_bytes",
    "peak_rss_bytes",
    "cuda_allocated_bytes",
    "cuda_reserved_bytes",
    "live_tensors",
    "python_objects",
    "python_blocks",
    "python_references",
)
"""The memory figures of every generation's metrics row (``Telemetry.measure``), in one place."""


def rss_bytes() -> int:
    """Resident set size of this process now."""
    return psutil.Process().memory_info().rss


def peak_rss_bytes() -> int:
    """Highest resident set size this process has reached."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def memory_snapshot(device: torch.device) -> dict[str, int]:
    """RSS, peak RSS and (on CUDA) allocator figures, in bytes."""
    allocated = reserved = 0
    if device.type == "cuda":
        # The nested statistics, read once: torch.cuda.memory_allocated and memory_reserved each flatten them with a
        # recursive closure, a reference cycle that keeps ~130 objects for the collector on every call.
        stats = torch.cuda.memory_stats_as_nested_dict(device)
        allocated = stats.get("allocated_bytes", {}).get("all", {}).get("current", 0)
        reserved = stats.get("reserved_bytes", {}).get("all", {}).get("current", 0)
    return {
        "rss_bytes": rss_bytes(),
        "peak_rss_bytes": peak_rss_bytes(),
        "cuda_allocated_bytes": allocated,
        "cuda_reserved_bytes": reserved,
    }


class ObjectCounts(NamedTuple):
    objects: int
    """Python objects the garbage collector tracks."""
    tensors: int
    """torch tensors among them."""
    references: int
    """References those objects hold: one more per untracked object (float, string, small numpy array) a list
    keeps, a leak that the object count and Python's allocator blocks (caches fill for a long time) cannot see."""


def count_objects() -> ObjectCounts:
    """Tracked objects, tensors among them, and the references they hold; about 50 ms for 200k objects."""
    objects = gc.get_objects()
    # By type, counted in C; issubclass of the types rather than isinstance of the objects: isinstance touches lazy
    # module attributes that warn when read.
    by_type = collections.Counter(map(type, objects))
    tensors = sum(count for kind, count in by_type.items() if issubclass(kind, torch.Tensor))
    references = len(gc.get_referents(*objects))
    return ObjectCounts(len(objects), tensors, references)


class ObjectCensus:
    """``count_objects`` in a generation only while the census has taken at most ``share`` of the time since it
    began: it costs tens of milliseconds, 1 to 2% of a CPU generation but several times that of a GPU's, so on a
    fast device it counts every few generations. ``share`` 1 counts every generation (the leak tests do).

    A leak is still seen: it grows between two counts as it grows from one generation to the next.
    """

    def __init__(self, share: float) -> None:
        self.share = share
        self.spent = 0.0
        self.started = time.perf_counter()

    def take(self) -> ObjectCounts | None:
        """The counts, or None when this generation's census would go over the budget."""
        now = time.perf_counter()
        if self.spent > self.share * (now - self.started):
            return None
        counts = count_objects()
        self.spent += time.perf_counter() - now
        return counts


class Telemetry:
    """A generation's memory figures (``MEMORY_KEYS``, the object counts when ``ObjectCensus`` takes them, else None)
    and the growth watch over them.

    Args:
        device: the training device (its allocator's figures on CUDA).
        census_fraction: ``ObjectCensus``'s fraction of the run's time.
    """

    def __init__(self, device: torch.device, *, census_fraction: float) -> None:
        self.device = device
        self.census = ObjectCensus(census_fraction)
        self.growth = GrowthWatch()

    def measure(self, *, warm: bool, **figures: int) -> tuple[dict[str, int | None], str | None]:
        """This generation's reading, with ``figures`` added, and a warning (once per streak) when memory keeps
        growing once ``warm``."""
        counts = self.census.take()
        reading = {
            **memory_snapshot(self.device),
            "live_tensors": None if counts is None else counts.tensors,
            "python_objects": None if counts is None else counts.objects,
            "python_blocks": python_blocks(),
            "python_references": None if counts is None else counts.references,
            **figures,
        }
        return reading, self.growth.update(reading, warm=warm)


def python_blocks() -> int:
    """Memory blocks Python's allocator holds: counts what the collector does not track (floats, strings,
    numpy array headers), which ``count_objects`` misses."""
    return sys.getallocatedblocks()


class GrowthWatch:
    """Warns when memory sets a new high ``patience`` generations in a row once the run is warm (the replay buffer
    full): a healthy run allocates nothing new then. It keeps one reading, a high and a streak per figure.

    Args:
        settle: warm generations ignored first; RSS still rises for a few generations after the buffer fills
            while the allocator settles (measured: +67 MB over 5 generations at the default scale, then flat).
        rss_step_bytes, objects_step: growth per generation that counts (below it is allocator noise).
    """

    def __init__(
        self, *, patience: int = 5, settle: int = 10, rss_step_bytes: int = 2_000_000, objects_step: int = 500
    ) -> None:
        self.patience = patience
        self.settle = settle
        self._warm_generations = 0
        self.steps = {
            "rss_bytes": rss_step_bytes,
            "python_objects": objects_step,
            "python_references": objects_step,
            "live_tensors": 1,
        }
        self._previous: dict[str, int] | None = None
        self._streaks = dict.fromkeys(self.steps, 0)
        self._highs: dict[str, int] = {}

    def update(self, reading: dict[str, int], *, warm: bool) -> str | None:
        """Feed one generation's figures; returns a warning the generation the streak reaches ``patience``."""
        counted = {key: int(reading[key]) for key in self.steps if reading.get(key) is not None}
        previous, self._previous = self._previous, {**(self._previous or {}), **counted}
        self._warm_generations = self._warm_generations + 1 if warm else 0
        if previous is None or self._warm_generations <= self.settle:
            return None
        warnings = []
        for key, step in self.steps.items():
            if key not in counted or key not in previous:  # not counted this generation (ObjectCensus)
                continue
            # Growth means a new high since settling: RSS wanders in a band (the allocator keeps and returns
            # ~10 MB blocks), which a rise over the previous generation alone would mistake for a leak.
            high = self._highs.get(key, previous[key])
            grew = self._previous[key] - high >= step
            self._highs[key] = max(high, self._previous[key])
            self._streaks[key] = self._streaks[key] + 1 if grew else 0
            if self._streaks[key] == self.patience:
                warnings.append(f"{key} grew in each of the last {self.patience} generations")
        return ("memory warning: " + "; ".join(warnings) + " (a leak?)") if warnings else None


def leak_findings(
    rows: Sequence[dict],
    *,
    rss_slope_bytes: float,
    objects_slack: int,
    blocks_slope_limit: float,
    references_slope_limit: float | None = None,
    tensors_exact: bool = True,
) -> list[str]:
    """What in a run's metrics rows (all after warm-up) looks like a leak; empty when memory is flat. MEMORY.md
    gives the measurements behind each bound. The object figures are judged over the rows that have them
    (``ObjectCensus`` counts every few generations on a fast device).

    Args:
        rss_slope_bytes: largest acceptable median RSS change from one generation to the next: a single step (the
            allocator keeping a block once) is not a trend, a leak grows every generation.
        objects_slack: largest acceptable rise of the Python object count over the rows.
        blocks_slope_limit: largest acceptable least-squares growth of Python's allocated blocks per generation;
            never 0, since CPython and PyTorch fill internal caches for thousands of calls.
        references_slope_limit: largest acceptable median change of ``python_references`` from one generation to the
            next (a median, since a collection of start-up garbage may dip the count once, anywhere in the rows);
            None does not judge them (rows from before the figure existed).
        tensors_exact: require the same live tensor count in every row (else allow no net rise).
    """
    findings = []
    counted = [row for row in rows if row.get("python_objects") is not None]  # the generations ObjectCensus counted
    tensors = [row["live_tensors"] for row in counted]
    if tensors and ((tensors_exact and len(set(tensors)) > 1) or tensors[-1] > tensors[0]):
        findings.append(f"live tensors changed: {tensors}")
    objects = [row["python_objects"] for row in counted]
    if objects and max(objects) - objects[0] > objects_slack:
        findings.append(f"python objects rose by {max(objects) - objects[0]} (> {objects_slack})")
    if references_slope_limit is not None:
        references = [(row.get("generation", index), row["python_references"]) for index, row in enumerate(counted)]
        pairs = list(itertools.pairwise(references))
        slope = statistics.median((b - a) / (gb - ga) for (ga, a), (gb, b) in pairs) if pairs else 0
        if slope > references_slope_limit:
            findings.append(f"python references grow {slope:.1f} per generation (> {references_slope_limit})")
    blocks_slope = least_squares_slope([row["python_blocks"] for row in rows])
    if blocks_slope > blocks_slope_limit:
        findings.append(f"python blocks grow {blocks_slope:.0f} per generation (> {blocks_slope_limit})")
    rss = [row["rss_bytes"] for row in rows]
    growth = statistics.median(b - a for a, b in itertools.pairwise(rss)) if len(rss) > 1 else 0
    if growth > rss_slope_bytes:
        findings.append(f"RSS grows {growth / 1e6:.2f} MB per generation (> {rss_slope_bytes / 1e6:.2f})")
    if any(row.get("cuda_allocated_bytes") != rows[0].get("cuda_allocated_bytes") for row in rows):
        findings.append("CUDA allocated bytes changed")
    return findings


def least_squares_slope(values: Sequence[float]) -> float:
    """Slope of the least-squares line through ``values`` against 0, 1, 2, ..."""
    return statistics.linear_regression(range(len(values)), values).slope if len(values) > 1 else 0.0


def format_count(count: float) -> str:
    """500, 12.3k, 1.0M."""
    if count < 1000:
        return f"{count:.0f}"
    if count < 1_000_000:
        return f"{count / 1000:.1f}k"
    return f"{count / 1_000_000:.1f}M"


def format_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(count) < 1000 or unit == "TB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000


class PhaseTimer:
    """Wall time of consecutive phases without synchronising the host in between: on CUDA the marks are events on
    the stream, read after the generation's one synchronisation; on the CPU ``perf_counter`` readings."""

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
