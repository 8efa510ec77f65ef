"""The generation's device work as CUDA graphs (``runtime.graphs``): the same numbers as the eager calls.

On the emulated CUDA device of ``tests/emulated_cuda.py`` a capture runs nothing and a replay runs the recorded
operations with what was baked in at the capture, as on a GPU; so a step that were not graph-safe (a Python count
advanced inside, a host read, a draw from an unregistered generator) would give other numbers here, or fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from config import override, preset
from run.launch import resume_run, start_run
from run.trainer import Trainer
from runtime.graphs import GraphedCall
from tests.emulated_cuda import SyncError, emulate_cuda
from tests.run_checks import deterministic, rows, state_digest

GENERATIONS = 4


def smoke(root: Path, *, graphs: bool, generations: int = GENERATIONS, **settings):
    return override(
        preset("smoke"),
        {
            "runtime.device": "cuda",
            "runtime.cuda_graphs": graphs,
            "runtime.generations": generations,
            "runtime.progress": False,
            "checkpoint.uri": str(root),
            "checkpoint.run_name": "r",
            "learner.buffer_size": 400,  # full in generation 3: the update's graph is captured again until then
            **settings,
        },
    )


def train(root: Path, *, graphs: bool, generations: int = GENERATIONS) -> Trainer:
    trainer = start_run(smoke(root, graphs=graphs, generations=generations), log=lambda line: None).trainer
    trainer.run(until=generations)
    return trainer


@pytest.mark.slow
def test_replayed_graphs_train_the_eager_numbers_bit_for_bit(tmp_path):
    with emulate_cuda():
        graphed = train(tmp_path / "graphs", graphs=True)
        eager = train(tmp_path / "eager", graphs=False)
    assert state_digest(graphed.run_dir) == state_digest(eager.run_dir)
    assert [deterministic(row) for row in rows(graphed.run_dir)] == [deterministic(row) for row in rows(eager.run_dir)]
    assert all(row["updates"] == 4 for row in rows(graphed.run_dir))
    # The rollout's days and validation's are one graph each, captured once; the update's is captured again while the
    # buffer fills (its size bounds the draws), then kept: sizes 168, 336 and then the full 400.
    assert graphed.rollouts.graphed.captures == 1 and graphed.validation.graphed.captures == 1
    assert graphed.update_phase.graphed[True].captures == 3
    assert eager.update_phase.graphed[True].captures == eager.rollouts.graphed.captures == 0


@pytest.mark.slow
def test_replayed_graphs_train_the_eager_numbers_on_the_device(tmp_path, cuda):
    """The graphed run's first replayed generation against the eager run's: three generations, since a graphed step
    runs eagerly twice (its warm-up) and captures in the third call. On the emulated device the numbers are equal bit
    for bit; on a GPU cuBLAS may choose other kernels on the capture's stream, so to float tolerance (more generations
    could part at an evolution decision on a near tie)."""
    graphed = train(tmp_path / "graphs", graphs=True, generations=3)
    eager = train(tmp_path / "eager", graphs=False, generations=3)
    assert graphed.rollouts.graphed.captures == graphed.validation.graphed.captures == 1
    # Each generation's row counts the graphs it captured: the update's while the buffer fills, the days' in the third.
    captured = [row["graph_captures"] for row in rows(graphed.run_dir)]
    steps = [graphed.rollouts.graphed, graphed.validation.graphed, *graphed.update_phase.graphed.values()]
    assert sum(captured) == sum(step.captures for step in steps) and captured[2] >= 2
    assert all(row["graph_captures"] == 0 for row in rows(eager.run_dir))
    exact = cuda.kind == "emulated"
    for key, tensor in eager.population.state_tensors().items():
        got, tensor = graphed.population.state_tensors()[key].cpu(), tensor.cpu()  # compared on the host
        if exact:
            assert torch.equal(got, tensor), key
        else:
            torch.testing.assert_close(got, tensor, rtol=1e-4, atol=1e-6, msg=key)


@pytest.mark.slow
def test_a_run_with_graphs_resumes_bit_for_bit(tmp_path, cuda):
    whole = train(tmp_path / "whole", graphs=True)
    train(tmp_path / "parts", graphs=True, generations=2)
    config = smoke(tmp_path / "parts", graphs=True)
    resumed = resume_run(config, {"runtime.generations": GENERATIONS}, log=lambda line: None).trainer
    resumed.run(until=GENERATIONS)
    assert state_digest(resumed.run_dir) == state_digest(whole.run_dir)


def test_graphs_on_the_cpu_are_the_eager_steps(tmp_path):
    trainer = start_run(smoke(tmp_path, graphs=True, **{"runtime.device": "cpu"}), log=lambda line: None).trainer
    trainer.run(until=1)
    steps = [trainer.rollouts.graphed, trainer.validation.graphed, *trainer.update_phase.graphed.values()]
    assert not any(step.enabled for step in steps) and not any(step.captures for step in steps)


# ------------------------------------------------------------------------------------------ what a capture bakes in


def test_a_replay_repeats_the_captured_work_with_the_capture_s_python_values():
    with emulate_cuda():
        generator = torch.Generator(device="cuda").manual_seed(1)
        total = torch.zeros(3, device="cuda")
        bound = [5]
        step = GraphedCall(
            lambda: total.add_(torch.randint(bound[0], (3,), generator=generator, device="cuda")),
            device=torch.device("cuda", 0),
            enabled=True,
            generators=[generator],
            warmup=1,
        )
        reference = torch.Generator().manual_seed(1)
        for call in range(4):
            if call == 2:
                bound[0] = 1000  # read at the capture (call 1): the replays keep drawing below 5
            step()
        expected = sum(torch.randint(5, (3,), generator=reference) for _ in range(4))
        assert torch.equal(total.cpu(), expected.float()) and step.captures == 1
        step.invalidate()
        step()  # eagerly, with the new bound
        assert step.captures == 1 and bool((total.cpu() - expected).max() >= 5)
        step()  # captured again, with it
        assert step.captures == 2


def test_a_value_that_changes_is_compiled_for_outside_any_capture():
    """A compiled function compiles for each Python value it meets (``runtime.compiled``: static shapes and
    constants), and compiling inside a CUDA capture fails. After ``invalidate`` (the replay buffer filling, a
    resume) the step runs eagerly once before it is captured again, so what the new value compiles, it compiles
    there: here a stand-in for ``torch.compile`` that fails as compiling does when the stream is capturing."""
    with emulate_cuda():
        compiled_for: list[int] = []

        def compiled(tensor: torch.Tensor, bound: int) -> None:
            if bound not in compiled_for:
                assert not torch.cuda.is_current_stream_capturing(), f"compiled for {bound} inside a capture"
                compiled_for.append(bound)
            tensor.add_(bound)

        total, bound = torch.zeros(3, device="cuda"), [5]
        step = GraphedCall(lambda: compiled(total, bound[0]), device=torch.device("cuda", 0), enabled=True)
        for _ in range(4):
            step()
        bound[0] = 7  # the buffer grew: the step reads a new value
        step.invalidate()
        for _ in range(3):
            step()
        assert compiled_for == [5, 7] and step.captures == 2
        assert torch.equal(total.cpu(), torch.full((3,), 4 * 5.0 + 3 * 7.0))


@pytest.mark.parametrize(
    ("work", "error"),
    [
        (lambda t, g: t.add_(float(t.sum())), "reads a value"),  # a Python decision on a device value
        (lambda t, g: t.add_(t.cpu().to("cuda")), "not permitted when stream is capturing"),
        (lambda t, g: t.add_(torch.rand(3, generator=g, device="cuda")), "not registered"),
    ],
    ids=["host read", "copy back", "unregistered generator"],
)
def test_a_step_that_is_not_graph_safe_fails_at_its_capture(work, error):
    with emulate_cuda():
        tensor = torch.zeros(3, device="cuda")
        generator = torch.Generator(device="cuda")
        step = GraphedCall(lambda: work(tensor, generator), device=torch.device("cuda", 0), enabled=True, warmup=0)
        with pytest.raises((SyncError, RuntimeError), match=error):
            step()


@pytest.mark.slow
def test_a_long_short_book_at_a_cadence_replays_the_eager_numbers_bit_for_bit(tmp_path):
    """The long-short book's arithmetic and the cadence's day count (on the device: ``day % k``) are graph-safe: the
    replayed days and updates train the eager run's numbers on the emulated device."""
    book = {"env.book": "long_short", "env.rebalance_every": 3, "env.execution_delay": 2}
    with emulate_cuda():
        runs = {}
        for graphs in (True, False):
            config = smoke(tmp_path / str(graphs), graphs=graphs, generations=3, **book)
            runs[graphs] = start_run(config, log=lambda line: None).trainer
            runs[graphs].run(until=3)
    assert runs[True].rollouts.graphed.captures == 1
    assert state_digest(runs[True].run_dir) == state_digest(runs[False].run_dir)
