"""A generation's CUDA path on every machine: roll out, validate, the gate, evolve, update, the record and the
checkpoint, on the emulated CUDA device of ``tests/emulated_cuda.py``, which refuses what a GPU refuses.

The first GPU found in 5 s a crash that every CPU test had missed, since on the CPU a device tensor is a host tensor.
Here each class of CUDA-only bug, injected into the trainer, fails the emulated run while the same run on the CPU
passes: a CPU test alone could not tell.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from config import override, preset
from environment import market as market_module
from persistence import checkpoint
from run import parts
from run.launch import start_run
from run.trainer import Trainer
from runtime import graphs
from tests.emulated_cuda import (
    DeviceMismatchError,
    DeviceTensor,
    HostReadError,
    NondeterministicError,
    RaceError,
    SyncError,
    emulate_cuda,
)
from tests.run_checks import deterministic, rows, state_digest
from training import loop, rollout, update
from training.evolution import EvolutionPlan


def train(root: Path, device: str, *, generations: int, **settings: Any) -> Trainer:
    """A smoke run of ``generations`` on ``device`` (updates from the first generation on); its trainer, finished."""
    config = override(
        preset("smoke"),
        {
            "runtime.device": device,
            "runtime.generations": generations,
            "runtime.progress": False,
            "checkpoint.uri": str(root),
            "checkpoint.run_name": "r",
            **settings,
        },
    )
    trainer = start_run(config, log=lambda line: None).trainer
    trainer.run(until=generations)
    return trainer


def check_the_checkpoint_holds_the_live_state(trainer: Trainer) -> None:
    written = checkpoint.read_tensors(checkpoint.open_generation(trainer.run_dir), "population")
    live = trainer.population.state_tensors()
    assert all(torch.equal(written[key], tensor.cpu()) for key, tensor in live.items()), "the checkpoint differs"


@pytest.mark.slow
def test_the_cuda_path_trains_the_cpus_numbers_on_the_device(tmp_path):
    with emulate_cuda():
        on_cuda = train(tmp_path / "cuda", "cuda", generations=3)
        held = [*on_cuda.population.agent_tensors().values(), *on_cuda.buffer.storage.values(), on_cuda.market.features]
        assert all(isinstance(tensor, DeviceTensor) for tensor in held)  # the whole loop ran on the device
        check_the_checkpoint_holds_the_live_state(on_cuda)
    on_cpu = train(tmp_path / "cpu", "cpu", generations=3)
    assert rows(on_cuda.run_dir)[-1]["updates"] > 0
    assert state_digest(on_cuda.run_dir) == state_digest(on_cpu.run_dir)
    assert [deterministic(row) for row in rows(on_cuda.run_dir)] == [deterministic(row) for row in rows(on_cpu.run_dir)]


@pytest.mark.slow
def test_a_point_in_time_universe_with_cash_that_earns_trains_the_cpus_numbers_on_the_device(tmp_path):
    """Assets that list and delist (the actor's mask, the fill's, the tradable feature), a user's column, a cash rate
    and a fill a day later, down the CUDA path: the graphed days and update on the device give the CPU's numbers."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    dates = pd.bdate_range("2001-01-01", periods=900)
    prices = pd.DataFrame(50 * np.exp(np.cumsum(rng.normal(0, 0.01, (900, 6)), axis=0)), columns=list("ABCDEF"))
    prices.iloc[:200, 4] = np.nan  # E lists late
    prices.iloc[700:, 5] = np.nan  # F delists
    prices.iloc[400:420, 1] = np.nan  # B pauses for longer than data.max_fill_days
    frame = prices.assign(date=dates).melt(id_vars="date", var_name="ticker", value_name="close").dropna()
    frame["signal"] = rng.normal(size=len(frame))
    path = tmp_path / "universe.csv"
    frame.to_csv(path, index=False)
    settings = {"data.path": str(path), "data.features": ("builtin", "signal"), "env.cash_rate": 0.03}
    with emulate_cuda():
        on_cuda = train(tmp_path / "cuda", "cuda", generations=2, **settings)
        assert on_cuda.market.tradable is not None and on_cuda.config.env.execution_delay == 1
    on_cpu = train(tmp_path / "cpu", "cpu", generations=2, **settings)
    assert rows(on_cuda.run_dir)[-1]["updates"] > 0
    assert state_digest(on_cuda.run_dir) == state_digest(on_cpu.run_dir)
    assert [deterministic(row) for row in rows(on_cuda.run_dir)] == [deterministic(row) for row in rows(on_cpu.run_dir)]


# ------------------------------------------------------------------------------------------- the injected bugs


def after(monkeypatch: pytest.MonkeyPatch, owner: object, name: str, then: Callable) -> None:
    """``owner.name`` calls ``then(result)`` on each result before returning it."""
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        then(result)
        return result

    monkeypatch.setattr(owner, name, wrapper)


def no_boundary(mp: pytest.MonkeyPatch) -> None:
    # The crash that killed every CUDA run in 5 s: the gate's block length took the device's relatives to numpy.
    passed_through = lambda tensor, dtype=None: tensor.detach() if dtype is None else tensor.to(dtype)  # noqa: E731
    mp.setattr(parts, "to_host", passed_through)
    mp.setattr(loop, "to_host", passed_through)


def host_mixed_in(mp: pytest.MonkeyPatch) -> None:
    def with_cash(relatives: torch.Tensor, cash: torch.Tensor | None = None) -> torch.Tensor:  # made without a device
        return torch.cat([torch.ones(*relatives.shape[:-1], 1), relatives], dim=-1)

    mp.setattr(market_module, "with_cash", with_cash)


def host_generator(mp: pytest.MonkeyPatch) -> None:
    after(mp, parts, "make_generators", lambda generators: generators.update(mutation=torch.Generator()))


def plan_left_on_the_host(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(EvolutionPlan, "to", lambda plan, device: plan)


class WithoutWaits:
    """A stream whose ``synchronize`` returns at once; anything else is the stream's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def synchronize(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def staging_without_its_wait(mp: pytest.MonkeyPatch) -> None:
    # The pinned copies are queued, and the writer reads the buffers without the host ever waiting for them.
    current_stream = torch.cuda.current_stream
    mp.setattr(torch.cuda, "current_stream", lambda device=None: WithoutWaits(current_stream(device)))


def results_brought_over_without_waiting(mp: pytest.MonkeyPatch) -> None:
    # A non-blocking copy to the host returns pinned memory that the GPU fills later: the gate reads it before.
    def to_host(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        return tensor.detach().to("cpu", dtype=dtype, non_blocking=True)

    mp.setattr(parts, "to_host", to_host)
    mp.setattr(loop, "to_host", to_host)


def plan_through_one_pinned_buffer(mp: pytest.MonkeyPatch) -> None:
    # Each field of the plan staged through the same pinned buffer: the next field overwrites the buffer while the
    # copy of the previous one to the device may still be reading it.
    def to(plan: EvolutionPlan, device: torch.device | str) -> EvolutionPlan:
        device = torch.device(device)
        staging = torch.empty(plan.parents.shape, dtype=torch.float64, pin_memory=device.type == "cuda")
        fields = []
        for field in plan:
            staging.copy_(field)
            fields.append(staging.to(device, non_blocking=True).to(field.dtype))
        return EvolutionPlan(*fields)

    mp.setattr(EvolutionPlan, "to", to)


def positive_losses_picked_by_a_mask(mp: pytest.MonkeyPatch) -> None:
    # Inside the captured update: a boolean mask's result has as many rows as the device says, so the host waits.
    after(mp, update.UpdatePhase, "update", lambda losses: losses["actor"][losses["actor"] > 0].sum())


def episode_returns_by_index_add(mp: pytest.MonkeyPatch) -> None:
    # Each episode's return as a segment sum of its days: on CUDA the days' atomic additions come in any order.
    def episode_returns(rewards: torch.Tensor) -> torch.Tensor:  # (P, E, D) -> (P, E)
        episode = torch.zeros(rewards.shape[-1], dtype=torch.long, device=rewards.device)
        return torch.zeros(*rewards.shape[:-1], 1, device=rewards.device).index_add_(2, episode, rewards)[..., 0]

    mp.setattr(rollout, "episode_returns", episode_returns)


def side_stream_not_waited_for(mp: pytest.MonkeyPatch) -> None:
    # The graphed calls' eager calls and captures run on a side stream; without the wait back, the default stream
    # reads the parameters and states they wrote while they may still be running.
    def on_side_stream(step: graphs.GraphedCall, work: Callable[[], None]) -> None:
        step._stream.wait_stream(torch.cuda.current_stream(step.device))
        with torch.cuda.stream(step._stream):
            work()

    mp.setattr(graphs.GraphedCall, "_on_side_stream", on_side_stream)


def side_stream_not_waiting(mp: pytest.MonkeyPatch) -> None:
    # The side stream starts on tensors the default stream has just written, without waiting for it.
    def on_side_stream(step: graphs.GraphedCall, work: Callable[[], None]) -> None:
        current = torch.cuda.current_stream(step.device)
        with torch.cuda.stream(step._stream):
            work()
        current.wait_stream(step._stream)

    mp.setattr(graphs.GraphedCall, "_on_side_stream", on_side_stream)


INJECTIONS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Any, str]] = {
    "device results not brought to the host (numpy of the device's relatives)": (no_boundary, TypeError, "numpy"),
    "a python float of each update's loss": (
        lambda mp: after(mp, update.UpdatePhase, "update", lambda losses: float(losses["actor"].sum())),
        HostReadError,
        "reads a value",
    ),
    "the fitness read as a list": (
        lambda mp: after(mp, rollout, "fitness", lambda f: f.tolist()),
        HostReadError,
        "tolist",
    ),
    "numpy of the validation returns": (
        lambda mp: after(mp, rollout.Validation, "run", lambda d: d.numpy()),
        TypeError,
        "numpy",
    ),
    "the evolution plan left on the host": (plan_left_on_the_host, DeviceMismatchError, "same device"),
    "a host generator for the mutations": (host_generator, DeviceMismatchError, "device type for generator"),
    "the checkpoint's pinned copies read before they landed": (
        staging_without_its_wait,
        (AssertionError, ValueError),  # the checkpoint differs, or a step count staged with it is read as NaN
        "differs|NaN",
    ),
    "the decisions' evidence copied to the host without waiting": (
        results_brought_over_without_waiting,
        ValueError,  # the gate's bound, computed from the NaN the buffers held, cannot be recorded
        "is nan",
    ),
    "the evolution plan staged through one pinned buffer": (plan_through_one_pinned_buffer, RaceError, "reading"),
    "a boolean mask inside the captured update": (positive_losses_picked_by_a_mask, SyncError, "capturing"),
    "episode returns summed with index_add_ (atomics)": (episode_returns_by_index_add, NondeterministicError, "order"),
    "the graphed calls' side stream not waited for": (side_stream_not_waited_for, RaceError, "without waiting"),
    "the graphed calls' side stream not waiting": (side_stream_not_waiting, RaceError, "without waiting"),
}


def run_with(inject: Callable[[pytest.MonkeyPatch], None], root: Path, device: str) -> None:
    emulation = emulate_cuda() if device == "cuda" else contextlib.nullcontext()
    with emulation, pytest.MonkeyPatch.context() as monkeypatch:  # undone before the emulation ends
        inject(monkeypatch)
        trainer = train(root, device, generations=1)
        check_the_checkpoint_holds_the_live_state(trainer)


@pytest.mark.slow
@pytest.mark.parametrize("bug", INJECTIONS)
def test_a_cuda_only_bug_fails_on_the_emulated_device_and_passes_on_the_cpu(tmp_path, bug):
    inject, error, match = INJECTIONS[bug]
    run_with(inject, tmp_path / "cpu", "cpu")
    with pytest.raises(error, match=match):
        run_with(inject, tmp_path / "cuda", "cuda")


@pytest.mark.slow
def test_a_host_tensor_mixed_into_the_device_s_fails_on_every_device_before_anything_is_allocated(tmp_path):
    """No longer a CUDA-only bug: the memory check builds the run's parts on the meta device (``run.sizing``), whose
    tensors, like a GPU's, do not mix with the host's, so the CPU's run fails too, at start-up."""
    with pytest.raises(RuntimeError, match="device meta"):
        run_with(host_mixed_in, tmp_path / "cpu", "cpu")
    with pytest.raises(DeviceMismatchError, match="same device"):
        run_with(host_mixed_in, tmp_path / "cuda", "cuda")
