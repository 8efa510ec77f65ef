"""The memory check's counts held against real allocations (run/sizing.py): a population's tensors, the buffer's,
and what a learner's update allocates."""

from __future__ import annotations

import dataclasses

import pytest
from torch.profiler import ProfilerActivity, profile

from config import Config, override, preset
from models.population import Population
from models.replay import ReplayBatch, ReplayBuffer
from run import sizing
from tests.synthetic import make_market, make_population, replay_batch

POPSIZE, BATCH, ASSETS, WINDOW = 4, 16, 5, 7
WIDTHS = {"model.encoder_hidden": 12, "model.embedding": 6, "model.head_hidden": 10}  # distinct, so no size hides


def _config(**values) -> Config:
    values = {**WIDTHS, "env.lookback": 1, "evolution.popsize": POPSIZE, "learner.batch_size": BATCH, **values}
    return override(preset("smoke"), values)


def _population(config: Config, slots: range | None = None) -> Population:
    learning = dataclasses.asdict(config.learner)
    return make_population(config.evolution.popsize, WINDOW, model=config.model, slots=slots, **learning)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


LEARNERS = pytest.mark.parametrize(
    "learning",
    [{}, {"learner.algorithm": "td3", "learner.gamma": 0.9, "learner.actor_objective": "critic"}],
    ids=["ddpg", "td3"],
)


@LEARNERS
@pytest.mark.parametrize("slots", [None, range(2, 4)], ids=["whole", "half"])
def test_the_population_count_is_the_bytes_of_a_real_population(slots, learning):
    config = _config(**learning)
    population = _population(config, slots)
    agents = population.share.agents
    learner = population.learner
    counted = sizing.population_bytes(config, WINDOW, agents=agents)
    state = population.state_tensors()  # every network, the champion, the moments, the exploration stdevs
    moments = [t for key, t in state.items() if "_optim." in key]
    grads = [p.grad for module in (learner.actor, *learner.critics) for p in module.parameters()]
    assert counted[sizing.OPTIMISER] == _bytes(moments) + _bytes(grads)
    assert counted[sizing.NETWORKS] == _bytes(state.values()) - _bytes(moments)

    if slots is None:  # one process: its checkpoint stages each tensor once and the writer encodes it once
        host = sizing.host_bytes(config, sizing.RunShape(ASSETS, WINDOW))
        assert host[sizing.POPULATION_COPIES] == 2 * _bytes(state.values())


def test_the_ring_count_is_the_bytes_of_a_real_ring():
    config = _config(**{"learner.buffer_size": 1000, "env.lookback": 1})
    market = make_market(num_assets=ASSETS)
    ring = ReplayBuffer(
        config.learner.buffer_size,
        market,
        lookback=1,
        execution_delay=config.env.execution_delay,
        sample_shape=(POPSIZE, BATCH),
    )
    assert sum(sizing.buffer_tensor_bytes(config, sizing.RunShape(ASSETS, market.num_features))) == ring.nbytes
    needs = sizing.process_bytes(config, sizing.RunShape(ASSETS, market.num_features))
    assert needs[sizing.SAMPLES] == _bytes([ring._windows, ring._next_windows])


def _batch(config: Config, seed: int = 0) -> ReplayBatch:
    return replay_batch(POPSIZE, BATCH, ASSETS, WINDOW, seed=seed, execution_delay=config.env.execution_delay)


UPDATE_CASES = pytest.mark.parametrize(
    "values",
    [
        {},  # the default: the model objective, gamma 0
        {"learner.gamma": 0.9},
        {"learner.actor_objective": "critic", "learner.gamma": 0.9},
        {"learner.tilt_penalty": 0.1},
        {"model.bf16_encoder": True},
        {"model.bf16_encoder": True, "learner.actor_objective": "critic", "learner.gamma": 0.9},
        {"learner.algorithm": "td3", "learner.gamma": 0.9},
        {"env.execution_delay": 0},  # the target fills at the close it observed: no fill day to drift through
    ],
    ids=["model", "model-gamma", "critic", "tilt", "bf16", "bf16-critic", "td3", "no-delay"],
)


def _update(config: Config, population: Population, batch: ReplayBatch) -> None:
    population.learner.update(batch)


def _allocated_peak(config: Config) -> int:
    """The profiler's allocations and frees over one real update on the CPU, in order: their running sum's peak."""
    population, batch = _population(config), _batch(config)
    _update(config, population, batch)  # the first update allocates TD3's smoothing buffers, kept afterwards
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        _update(config, population, batch)
    events = [e for e in profiler.events() if e.self_cpu_memory_usage]
    changes = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in events)
    running = peak = 0
    for _, change in changes:
        running += change
        peak = max(peak, running)
    return peak


@UPDATE_CASES
def test_the_update_measured_on_the_meta_device_allocates_what_it_allocates_on_the_cpu(values):
    """``sizing.update_working_bytes`` runs the learner's real update on tensors without memory: what it finds is what
    the same update allocates on the CPU, to the profiler's rounding of small allocations (bf16 is measured in float32,
    and its weights' bf16 copies are counted apart by ``working_bytes``)."""
    config = _config(**values)
    measured = sizing.update_working_bytes(config, agents=POPSIZE, num_assets=ASSETS, window=WINDOW)
    real = _allocated_peak(config)
    assert 0.95 * real <= measured <= 1.05 * real, (measured, real)


@UPDATE_CASES
def test_the_update_phase_estimate_covers_every_allocation_of_an_update(values):
    config = _config(**values)
    peak = _allocated_peak(config)
    estimate = sizing.working_bytes(config, sizing.RunShape(ASSETS, WINDOW))["update"]
    assert peak <= estimate <= 2 * peak, (estimate, peak)
