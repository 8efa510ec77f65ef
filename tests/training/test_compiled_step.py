"""The per-day forwards traced whole, for the GPU's launch-bound loops (``training.rollout.StepPolicies``).

On the CPU the graphs run through torch.compile's ``eager`` backend: what is checked is that each day's forward is
one graph (``fullgraph``, the precondition of a CUDA graph) and that the traced path gives the eager numbers bit
for bit, through a rollout with exploration noise and a validation. The CUDA run of ``mode="reduce-overhead"`` is
the ``gpu`` test below.
"""

from __future__ import annotations

import pytest
import torch

from config import override, preset
from training.loop import Trainer
from training.rollout import StepPolicies, validate
from training.runs import load_market


def make_trainer(tmp_path, device: str = "cpu", **settings) -> Trainer:
    config = override(preset("smoke"), {"runtime.device": device, "ddpg.buffer_size": 2000, **settings})
    return Trainer(config, load_market(config, torch.device(device)), tmp_path, log=lambda line: None)


def run_day_loops(trainer: Trainer, policies: StepPolicies | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One rollout (fresh exploration stream) and one validation with ``policies``; their returns."""
    trainer.generators["exploration"].manual_seed(11)
    starts = trainer.learning_starts[: trainer.config.rollout.episodes].to(trainer.device)
    rewards = trainer.collect_episodes(starts, policies=policies).clone()
    daily = validate(trainer.population, trainer.validation_env, trainer.validation_starts, policies=policies)
    return rewards, daily.clone()


def test_the_traced_forwards_are_whole_graphs_with_the_eager_numbers(tmp_path):
    torch._dynamo.reset()
    trainer = make_trainer(tmp_path)
    eager = run_day_loops(trainer, None)
    traced = StepPolicies.compiled(trainer.population, backend="eager")  # fullgraph: a break raises
    again = run_day_loops(trainer, traced)
    for mine, theirs in zip(again, eager):
        assert torch.equal(mine, theirs)


def test_a_trained_and_crowned_population_is_read_live_by_the_graphs(tmp_path):
    """Training, evolution and crowning change the parameters in place: graphs traced before keep reading them."""
    torch._dynamo.reset()
    trainer = make_trainer(tmp_path)
    traced = StepPolicies.compiled(trainer.population, backend="eager")
    run_day_loops(trainer, traced)  # traced here, before anything changes
    with torch.no_grad():
        for parameter in trainer.population.actor.parameters():
            parameter.mul_(1.5)
        trainer.population.crown(1)
    assert all(torch.equal(a, b) for a, b in zip(run_day_loops(trainer, traced), run_day_loops(trainer, None)))


def test_compile_on_the_cpu_trains_as_eager(tmp_path):
    """``runtime.compile`` is for CUDA; on the CPU the run stays as it was (the fallback), bit for bit."""
    runs = {}
    for flag in (False, True):
        trainer = make_trainer(tmp_path / str(flag), **{"runtime.compile": flag})
        assert trainer.policies == StepPolicies.eager(trainer.population)
        runs[flag] = run_day_loops(trainer, trainer.policies)
    assert all(torch.equal(a, b) for a, b in zip(runs[False], runs[True]))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphs_give_the_eager_numbers_to_float_tolerance(tmp_path):
    torch._dynamo.reset()
    trainer = make_trainer(tmp_path, "cuda", **{"runtime.compile": True})
    graphs = run_day_loops(trainer, trainer.policies)
    eager = run_day_loops(trainer, StepPolicies.eager(trainer.population))
    for mine, theirs in zip(graphs, eager):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-6)
