"""Where a backtest's folds run: which process of a ``torchrun`` job takes each fold, which GPU each worker process
sees, how many torch threads a fold uses, and whether the folds that run at once fit in their device's memory.

A fold's figures on the CPU depend on torch's thread count (its kernels split their sums by thread), so every fold
runs with ``--threads`` threads (1 by default), whatever ``--jobs``: N folds at once then give the figures of one
fold at a time, bit for bit, and use N x ``--threads`` cores.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Iterator, Sequence

import torch

from offline.backtest.plan import Fold
from run.sizing import CUDA_CONTEXT_BYTES, RunShape, available_bytes, host_bytes, process_bytes
from runtime.sharding import Ranks
from utils.errors import ConfigError
from utils.telemetry import format_bytes

FOLD_THREADS = 1
"""torch threads of every fold on the CPU unless ``--threads`` says otherwise."""


def folds_of(folds: Sequence[Fold], ranks: Ranks) -> list[Fold]:
    """The folds this process of the job runs: every W-th in plan order from its rank. The same world size gives
    every fold the same process (and node) on every start, so a resumed job finds each fold's checkpoint."""
    return list(folds[ranks.rank :: ranks.world_size])


def worker_gpus(device: torch.device, workers: int, ranks: Ranks) -> list[int | None]:
    """The CUDA device (this process's ordinal) of each of ``workers`` worker processes: under torchrun this
    process's own GPU, else the machine's GPUs in turn (worker k on GPU k mod G). None on the CPU."""
    if device.type != "cuda":
        return [None] * workers
    if ranks.distributed:
        return [ranks.local_rank] * workers
    count = torch.cuda.device_count()
    return [k % count for k in range(workers)]


def visible_device(ordinal: int | None) -> str | None:
    """What a worker on this process's CUDA device ``ordinal`` sets as its ``CUDA_VISIBLE_DEVICES``: that GPU alone,
    named as this process sees it (an entry of its own ``CUDA_VISIBLE_DEVICES``, where that is set)."""
    if ordinal is None:
        return None
    listed = [name.strip() for name in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if name.strip()]
    return listed[ordinal] if ordinal < len(listed) else str(ordinal)


def check_jobs_fit(
    folds: Sequence[Fold], *, device: torch.device, gpus: Sequence[int | None], host_runs: int, jobs: int
) -> None:
    """A one-line ConfigError, before anything starts, when the folds that run at once do not fit: on each GPU the
    runs of the workers on it (``gpus``: one entry per worker), each with a CUDA context of its own; in the host's
    memory ``host_runs`` runs' checkpoint copies (on the CPU, their whole runs). Each run is sized as the largest
    fold's (``run.sizing``); every run checks itself again when it starts."""

    def sizes(fold: Fold) -> tuple[dict[str, int], dict[str, int]]:
        shape = RunShape(fold.num_assets, fold.num_features, device=device, tradable_mask=fold.tradable_mask)
        return process_bytes(fold.config, shape), host_bytes(fold.config, shape)

    on_device, on_host = max((sizes(fold) for fold in folds), key=lambda pair: sum(pair[0].values()))
    if device.type == "cpu":
        _require(jobs, host_runs, {**on_device, **on_host}, torch.device("cpu"), "the CPU")
        return
    on_device = {**on_device, "CUDA context of each worker process": CUDA_CONTEXT_BYTES}
    for ordinal, runs in sorted(Counter(gpus).items()):
        _require(jobs, runs, on_device, torch.device("cuda", ordinal), f"cuda:{ordinal}")
    _require(jobs, host_runs, on_host, torch.device("cpu"), "the host")


def _require(jobs: int, runs: int, each: dict[str, int], device: torch.device, where: str) -> None:
    one = sum(each.values())
    free = available_bytes(device)
    if runs * one > free:
        largest = max(each, key=each.__getitem__)
        raise ConfigError(
            f"--jobs {jobs}: {runs} folds at once on {where} need at least {format_bytes(runs * one)} of memory "
            f"({format_bytes(one)} each, {format_bytes(each[largest])} of it for the {largest}), but {where} has "
            f"{format_bytes(free)} free; lower --jobs or those settings"
        )


def crowding_note(*, workers: int, threads: int, processes: int) -> str | None:
    """A line when the folds at once (``workers`` in each of this machine's ``processes``) ask for more threads
    than it has cores: they share them, slower, with the same figures."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    wanted = workers * threads * processes
    if wanted <= cores:
        return None
    return (
        f"note: {workers * processes} folds at once x {threads} torch thread{'s' if threads > 1 else ''} on "
        f"{cores} cores: they share them (the same figures, each fold slower)"
    )


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to ``threads`` for the block (a fold run in this process), then as before."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)
