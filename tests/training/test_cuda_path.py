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
from environment import vector_env
from models.learner import Learner
from persistence import checkpoint
from tests.emulated_cuda import DeviceMismatchError, DeviceTensor, HostReadError, emulate_cuda
from tests.run_checks import deterministic, rows, state_digest
from training import loop, parts, rollout
from training.evolution import EvolutionPlan
from training.loop import Trainer
from training.runs import start_run


def train(root: Path, device: str, *, generations: int) -> Trainer:
    """A smoke run of ``generations`` on ``device`` (updates from the first generation on); its trainer, finished."""
    config = override(
        preset("smoke"),
        {
            "runtime.device": device,
            "runtime.generations": generations,
            "runtime.progress": False,
            "checkpoint.uri": str(root),
            "checkpoint.run_name": "r",
        },
    )
    trainer = start_run(config, log=lambda line: None).trainer
    trainer.run(until=generations)
    return trainer


def check_the_checkpoint_holds_the_live_state(trainer: Trainer) -> None:
    written = checkpoint.read_tensors(checkpoint.open_generation(trainer.run_dir), "population")
    live = trainer.population.state_tensors()
    assert all(torch.equal(written[key], tensor.cpu()) for key, tensor in live.items()), "the checkpoint differs"


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
    def with_cash(relatives: torch.Tensor) -> torch.Tensor:  # the cash column made without a device
        return torch.cat([torch.ones(*relatives.shape[:-1], 1), relatives], dim=-1)

    mp.setattr(vector_env, "with_cash", with_cash)


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


INJECTIONS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Any, str]] = {
    "device results not brought to the host (numpy of the device's relatives)": (no_boundary, TypeError, "numpy"),
    "a python float of each update's loss": (
        lambda mp: after(mp, Learner, "update", lambda losses: float(losses["actor"].sum())),
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
    "a host tensor in the portfolio step": (host_mixed_in, DeviceMismatchError, "same device"),
    "the evolution plan left on the host": (plan_left_on_the_host, DeviceMismatchError, "same device"),
    "a host generator for the mutations": (host_generator, DeviceMismatchError, "device type for generator"),
    "the checkpoint's pinned copies read before they landed": (
        staging_without_its_wait,
        (AssertionError, ValueError),  # the checkpoint differs, or a step count staged with it is read as NaN
        "differs|NaN",
    ),
}


def run_with(inject: Callable[[pytest.MonkeyPatch], None], root: Path, device: str) -> None:
    emulation = emulate_cuda() if device == "cuda" else contextlib.nullcontext()
    with emulation, pytest.MonkeyPatch.context() as monkeypatch:  # undone before the emulation ends
        inject(monkeypatch)
        trainer = train(root, device, generations=1)
        check_the_checkpoint_holds_the_live_state(trainer)


@pytest.mark.parametrize("bug", INJECTIONS)
def test_a_cuda_only_bug_fails_on_the_emulated_device_and_passes_on_the_cpu(tmp_path, bug):
    inject, error, match = INJECTIONS[bug]
    run_with(inject, tmp_path / "cpu", "cpu")
    with pytest.raises(error, match=match):
        run_with(inject, tmp_path / "cuda", "cuda")
