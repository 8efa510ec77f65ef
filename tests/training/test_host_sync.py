"""No host synchronisation inside a phase: evaluation, validation and learner updates stay on the device.

On the CPU there is no device to wait for, so the test watches the operators that would wait on a GPU: reading a
tensor's value on the host (``.item()``, ``float(t)``, ``if t:``), ``nonzero`` (its size depends on the data) and
making a tensor from host data (on CUDA a copy from pageable memory, which the copy waits for). On CUDA the same
phases run under ``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronising call.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from config import override, preset
from environment.loading import load_market
from run.trainer import Trainer

SYNCING = frozenset(
    {
        "aten._local_scalar_dense.default",  # .item(), float(t), bool(t)
        "aten.lift_fresh.default",  # torch.tensor(host data), t[i] = python scalar
        "aten.nonzero.default",
        "aten.is_nonzero.default",
        "aten.equal.default",
    }
)


class SyncWatch(TorchDispatchMode):
    """Counts the operators that synchronise with the host on a GPU."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) in SYNCING:
            self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))


def make_trainer(tmp_path, device: str) -> Trainer:
    # Eager: each call launches the phase's kernels from Python (as under torchrun), where a read-back could hide; a
    # replayed graph cannot synchronise (a capture fails on any wait), and capturing is a one-off, not a step.
    settings = {"runtime.device": device, "learner.buffer_size": 2000, "runtime.cuda_graphs": False}
    config = override(preset("smoke"), settings)
    return Trainer(config, load_market(config, torch.device(device)), tmp_path, log=lambda line: None)


def phases(trainer: Trainer) -> dict[str, callable]:
    starts = trainer.rollouts.sample_starts()  # drawn on the host once per generation, outside the phases

    def update() -> None:
        for _ in range(3):
            trainer.update_phase.update()

    return {
        "evaluate": lambda: trainer.rollouts.run(starts),
        "validate": lambda: trainer.validation.run(),
        "update": update,
    }


def test_phases_never_read_device_values_on_the_host(tmp_path):
    trainer = make_trainer(tmp_path, "cpu")
    for name, phase in phases(trainer).items():
        with SyncWatch() as watch:
            phase()
        assert watch.calls == Counter(), f"{name}: {dict(watch.calls)}"


def test_the_watch_sees_a_per_step_read(tmp_path):
    """The watch is not blind: a value read back per step, as loss logging per update does, is caught."""
    trainer = make_trainer(tmp_path, "cpu")
    with SyncWatch() as watch:
        phases(trainer)["evaluate"]()
        for _ in range(3):
            float(trainer.rollouts.env.rewards_per_episode.sum())
        trainer.buffer.add(
            days=torch.tensor([40]),  # made from host data
            weights=torch.ones(1, 7) / 7,
            actions=torch.ones(1, 7) / 7,
            rewards=torch.zeros(1),
            next_weights=torch.ones(1, 7) / 7,
            terminated=torch.tensor(False),  # made from host data
            truncated=False,
        )
    assert watch.calls["aten._local_scalar_dense.default"] == 3
    assert watch.calls["aten.lift_fresh.default"] == 2


@pytest.mark.slow
def test_phases_run_clean_under_cuda_sync_debug_mode(tmp_path, cuda):
    trainer = make_trainer(tmp_path, "cuda")
    steps = phases(trainer)
    steps["evaluate"]()  # warm-up: the first calls may initialise cuBLAS and the caching allocator
    steps["update"]()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for phase in steps.values():
            phase()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
