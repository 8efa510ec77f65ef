"""The memory check's counts held against real allocations (run/sizing.py): a population's tensors, the buffer's,
and what a learner's update allocates."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from config import Config, override, preset
from models.population import Population
from models.replay import ReplayBuffer
from run import sizing
from run.parts import build_phases
from runtime.sharding import Ranks, Sharding
from tests.synthetic import make_market, make_population
from training import rollout as rollout_module
from training.evolution import evolve_, plan_generation

POPSIZE, BATCH, ASSETS, WINDOW = 4, 16, 5, 7
INDEX_BYTES = 8
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
    """What the meta build counts for the population is what a real one holds: every network, the champion, the
    exploration stdevs, the gradients, the moments, and the optimisers' step counts (a few bytes)."""
    config = _config(**learning)
    population = _population(config, slots)
    learner = population.learner
    processes = 1 if slots is None else 2
    counted = sizing.held_bytes(config, sizing.RunShape(ASSETS, WINDOW, processes=processes))
    state = population.state_tensors()  # every network, the champion, the moments, the exploration stdevs
    grads = [p.grad for module in (learner.actor, *learner.critics) for p in module.parameters()]
    assert 0 <= counted[sizing.POPULATION] - _bytes(state.values()) - _bytes(grads) <= 64  # and the step counts

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
    shape = sizing.RunShape(ASSETS, market.num_features)
    assert sum(sizing.measure(config, shape).buffer_tensors) == ring.nbytes
    needs = sizing.process_bytes(config, shape)
    assert needs[sizing.BUFFER] == ring.nbytes
    assert needs[sizing.SAMPLES] == _bytes([ring._windows, ring._next_windows, ring._write_pos])


@pytest.mark.parametrize(
    "values, processes",
    [
        ({}, 1),
        ({"learner.algorithm": "td3", "learner.gamma": 0.9, "learner.observation_noise": 0.1}, 1),
        ({"env.execution_delay": 2, "env.book": "long_short"}, 1),  # the orders as they filled, on a masked panel
        ({"rollout.fitness_block_every": 0}, 2),  # a process of two: its share, and the exchange of each day
    ],
    ids=["ddpg", "td3-noise", "delay-2-long-short", "two-processes"],
)
def test_what_the_parts_hold_is_what_a_real_build_of_them_allocates(values, processes):
    """``sizing.held_bytes`` reads the parts built on the meta device: what they hold is what building the same
    parts on the CPU allocates and keeps (every allocation the profiler sees, less every free), whatever the
    algorithm, the book, the panel and the processes, to the episodes' start days, kept on the host, whose number
    follows the length of the training range."""
    config = _config(**{"learner.buffer_size": 300, **values})
    market = make_market(num_assets=ASSETS, validation_days=config.data.validation_days, num_days=500)
    if config.env.execution_delay == 2:
        tradable = torch.rand(market.num_days, ASSETS, generator=torch.Generator().manual_seed(1)) > 0.2
        market = dataclasses.replace(market, tradable=tradable)
    sharding = Sharding(POPSIZE, Ranks(world_size=processes))
    first = build_phases(config, market, sharding)  # makes what a process makes once; kept, so none of it is freed
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        second = build_phases(config, market, sharding)
    assert second.buffer is not first.buffer
    kept = sum(event.self_cpu_memory_usage for event in profiler.events())
    held = sizing.held_bytes(config, sizing.RunShape.of(market, processes=processes))
    assert (sizing.EXCHANGE in held) == (processes > 1)
    assert (sizing.OBSERVATION_NOISE in held) == (config.learner.observation_noise > 0)
    assert abs(sum(held.values()) - kept) <= 2 * INDEX_BYTES * market.num_days, (held, kept)


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
        {"learner.observation_noise": 0.01},  # noise drawn for every agent's windows
        {"env.execution_delay": 2},  # a masked panel (``_update_phase``): each order kept as it filled, and the mask
    ],
    ids=["model", "model-gamma", "critic", "tilt", "bf16", "bf16-critic", "td3", "no-delay", "noise", "delay-2-masked"],
)


def _profiled_peak(work) -> int:
    """The running sum of the profiler's allocations and frees over ``work()`` on the CPU, in order: its peak."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        work()
    events = [e for e in profiler.events() if e.self_cpu_memory_usage]
    changes = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in events)
    running = peak = 0
    for _, change in changes:
        running += change
        peak = max(peak, running)
    return peak


def _update_phase(config: Config):
    """A real build's update phase on the CPU, its buffer taken as full (as ``sizing.measure`` takes it), and its
    market's shape."""
    market = make_market(num_assets=ASSETS, validation_days=config.data.validation_days, num_days=500)
    if config.env.execution_delay == 2:  # a panel whose assets do not all trade: the batch gathers their mask
        tradable = torch.rand(market.num_days, ASSETS, generator=torch.Generator().manual_seed(1)) > 0.2
        market = dataclasses.replace(market, tradable=tradable)
    parts = build_phases(config, market)
    parts.buffer.commit(parts.buffer.capacity)
    return parts.update_phase, sizing.RunShape.of(market)


@UPDATE_CASES
def test_the_update_measured_on_the_meta_device_allocates_what_it_allocates_on_the_cpu(values):
    """``sizing.measure`` runs one update of the update phase built on the meta device (its batch drawn and gathered,
    the observation noise, the learner's update with every part): what it finds is what the same first update of a
    real build allocates at once on the CPU, to the profiler's rounding of small allocations (a bf16 encoder is
    measured in float32, and its weights' bf16 copies are counted apart by ``working_bytes``)."""
    config = _config(**{"learner.buffer_size": 300, **values})
    phase, shape = _update_phase(config)
    real = _profiled_peak(phase.update)
    measured = sizing.measure(config, shape).update
    assert 0.95 * real <= measured <= 1.05 * real, (measured, real)


@UPDATE_CASES
def test_the_update_phase_estimate_covers_every_allocation_of_an_update(values):
    """The memory check's estimate of the update phase covers what a real update allocates at once on the CPU, but
    for the Python numbers an operation wraps as 8-byte tensors outside the dispatcher (a few alive at once)."""
    config = _config(**{"learner.buffer_size": 300, **values})
    phase, shape = _update_phase(config)
    peak = _profiled_peak(phase.update)
    estimate = sizing.working_bytes(config, shape)["update"]
    assert peak <= estimate + 4 * INDEX_BYTES and estimate <= 2 * peak, (estimate, peak)


def _roll_out(rollouts) -> None:
    rollouts.run(rollouts.sample_starts())


@pytest.mark.parametrize("phase", ["rollout", "validation"])
def test_a_phase_of_days_holds_one_block_at_a_time_within_its_estimate(phase, monkeypatch):
    """The rollout and validation go through their days in blocks (``training.rollout``), each block's windows' part
    computed at once and held while its days decide. On the CPU, in blocks of 2 and of 6 days: each day a block
    holds adds at most ``block_bytes_per_day`` to what the phase allocates at once (one block's part alive at a time:
    were the next block's computed while the last is still held, each day would cost more), and the memory check's
    estimate (``sizing.working_bytes``) covers what it allocates, not far above it."""
    config = _config(**{"data.validation_days": 36, "env.episode_days": 24, "rollout.episodes": 6})
    market = make_market(num_assets=ASSETS, validation_days=36, num_days=400)
    rows, episodes = (POPSIZE, 6) if phase == "rollout" else (POPSIZE + 1, 1)
    per_day = rollout_module.block_bytes_per_day(config.model, agents=rows, episodes=episodes, assets=ASSETS)
    peaks = {}
    for days in (2, 6):
        monkeypatch.setitem(rollout_module.BLOCK_BYTES, "cpu", days * per_day)
        sizing.measure.cache_clear()  # its build's blocks follow the budget, which a run never changes
        parts = build_phases(config, market)
        blocks = parts.rollouts.blocks if phase == "rollout" else parts.validation.blocks
        assert len(blocks) > 2 and set(blocks) == {days}, blocks
        run = functools.partial(_roll_out, parts.rollouts) if phase == "rollout" else parts.validation.run
        run()  # what a first call allocates once (the buffer's first writes) is not the phase's working memory
        peaks[days] = _profiled_peak(run)
        estimate = sizing.working_bytes(config, sizing.RunShape.of(market))[phase]
        assert peaks[days] <= estimate <= 2 * peaks[days], (days, peaks[days], estimate)
    sizing.measure.cache_clear()  # none of its figures at these budgets is left for a later test
    assert (peaks[6] - peaks[2]) / 4 <= per_day, (peaks, per_day)


@LEARNERS
def test_evolution_allocates_within_its_estimate(learning):
    """What one generation's evolution (``training.evolution.evolve_``: copies, blends and mutations of every
    offspring, one tensor at a time) allocates at once on the CPU is within the memory check's estimate of it, and not
    far below it."""
    config = _config(**{"evolution.popsize": 8, "evolution.elites": 1, **learning})
    market = make_market(num_assets=ASSETS, validation_days=config.data.validation_days, num_days=500)
    population = build_phases(config, market).population
    settings, generator = config.evolution, torch.Generator().manual_seed(0)
    fitness = torch.randn(settings.popsize, generator=generator)
    plan = plan_generation(
        fitness,
        elites=settings.elites,
        tournament_size=settings.tournament_size,
        crossover_prob=1.0,  # every offspring a blend, mutated: the most evolution does at once
        mutation_prob=1.0,
        generator=generator,
    )
    evolve = functools.partial(
        evolve_,
        population,
        plan,
        mutation_fraction=settings.mutation_fraction,
        mutation_stdev=settings.mutation_stdev,
        generator=generator,
    )
    evolve()
    peak = _profiled_peak(evolve)
    estimate = sizing.working_bytes(config, sizing.RunShape.of(market))["evolution"]
    assert peak <= estimate <= 2 * peak, (peak, estimate)
