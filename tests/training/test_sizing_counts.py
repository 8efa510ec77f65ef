"""The memory check's counts held against real allocations (training/sizing.py): a population's tensors, the buffer's,
and what a batched DDPG update saves for backward."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from config import Config, override, preset
from environment.observation import WindowGatherer
from models.population import Population
from models.replay import ReplayBatch, ReplayBuffer
from tests.synthetic import make_market, make_population, random_simplex
from training import sizing

POPSIZE, BATCH, ASSETS, WINDOW = 4, 16, 5, 7
WIDTHS = {"model.encoder_hidden": 12, "model.embedding": 6, "model.head_hidden": 10}  # distinct, so no size hides


def _config(**values) -> Config:
    values = {**WIDTHS, "env.lookback": 1, "evolution.popsize": POPSIZE, "ddpg.batch_size": BATCH, **values}
    return override(preset("smoke"), values)


def _population(config: Config, slots: range | None = None) -> Population:
    learning = dataclasses.asdict(config.ddpg)
    return make_population(config.evolution.popsize, WINDOW, model=config.model, slots=slots, **learning)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("slots", [None, range(2, 4)], ids=["whole", "half"])
def test_the_population_count_is_the_bytes_of_a_real_population(slots):
    config = _config()
    population = _population(config, slots)
    agents = len(population.slots)
    sizes = sizing.agent_tensor_sizes(config.model, WINDOW)
    for name, module in (("actor", population.actor), ("critic", population.learner.critic)):
        assert sorted(sizes[name]) == sorted(p[0].numel() for p in module.parameters())

    counted = sizing.population_bytes(config.model, WINDOW, agents=agents)
    state = population.state_tensors()  # every network, the champion, the moments, the exploration stdevs
    moments = [t for key, t in state.items() if key.startswith(("actor_optim.", "critic_optim."))]
    grads = [p.grad for p in [*population.actor.parameters(), *population.learner.critic.parameters()]]
    assert counted[sizing.OPTIMISER] == _bytes(moments) + _bytes(grads)
    assert counted[sizing.NETWORKS] == _bytes(state.values()) - _bytes(moments)

    if slots is None:  # one process: its checkpoint stages each tensor once and the writer encodes it once
        host = sizing.host_bytes(config, num_assets=ASSETS, num_features=WINDOW)
        assert host[sizing.POPULATION_COPIES] == 2 * _bytes(state.values())


def test_the_ring_count_is_the_bytes_of_a_real_ring():
    config = _config(**{"ddpg.buffer_size": 1000, "env.lookback": 1})
    market = make_market(num_assets=ASSETS)
    ring = ReplayBuffer(
        config.ddpg.buffer_size,
        ASSETS,
        WindowGatherer(market.features, 1),
        market.relatives,
        sample_shape=(POPSIZE, BATCH),
        device="cpu",
    )
    assert sum(sizing.buffer_tensor_bytes(config, num_assets=ASSETS)) == ring.nbytes
    needs = sizing.process_bytes(config, num_assets=ASSETS, num_features=market.num_features)
    assert needs[sizing.SAMPLES] == _bytes([ring._windows, ring._next_windows])


class SavedForBackward:
    """Most bytes autograd holds for backward at once, each storage counted once while any saved tensor refers to it;
    storages in ``excluded`` (parameters and batch, counted by other items) are left out."""

    class Handle:
        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor = tensor

    def __init__(self, excluded: set[int]) -> None:
        self.excluded = excluded
        self.references: dict[int, int] = {}
        self.live = self.peak = 0

    def pack(self, tensor: torch.Tensor) -> Handle:
        handle = self.Handle(tensor)
        storage = tensor.untyped_storage()
        pointer, size = storage.data_ptr(), storage.nbytes()
        if pointer not in self.excluded:
            if not self.references.get(pointer):
                self.live += size
                self.peak = max(self.peak, self.live)
            self.references[pointer] = self.references.get(pointer, 0) + 1
            weakref.finalize(handle, self._release, pointer, size)  # when autograd drops the saved tensor
        return handle

    def _release(self, pointer: int, size: int) -> None:
        self.references[pointer] -= 1
        if not self.references[pointer]:
            self.live -= size

    @staticmethod
    def unpack(handle: Handle) -> torch.Tensor:
        return handle.tensor


def _batch(seed: int = 0) -> ReplayBatch:
    g = torch.Generator().manual_seed(seed)
    return ReplayBatch(
        windows=torch.randn(POPSIZE, BATCH, ASSETS, WINDOW, generator=g),
        weights=random_simplex(POPSIZE, BATCH, ASSETS + 1, generator=g),
        actions=random_simplex(POPSIZE, BATCH, ASSETS + 1, generator=g),
        rewards=torch.randn(POPSIZE, BATCH, generator=g) * 0.1,
        next_windows=torch.randn(POPSIZE, BATCH, ASSETS, WINDOW, generator=g),
        next_weights=random_simplex(POPSIZE, BATCH, ASSETS + 1, generator=g),
        next_relatives=torch.cat(
            [torch.ones(POPSIZE, BATCH, 1), 1 + 0.02 * torch.randn(POPSIZE, BATCH, ASSETS, generator=g)], dim=-1
        ),
        terminated=torch.zeros(POPSIZE, BATCH),
        truncated=torch.zeros(POPSIZE, BATCH),
    )


UPDATE_CASES = pytest.mark.parametrize(
    "values",
    [
        {},  # the default: the model objective, gamma 0
        {"ddpg.gamma": 0.9},
        {"ddpg.actor_objective": "critic", "ddpg.gamma": 0.9},
        {"ddpg.tilt_penalty": 0.1},
        {"model.bf16_encoder": True},
        {"model.bf16_encoder": True, "ddpg.actor_objective": "critic", "ddpg.gamma": 0.9},
    ],
    ids=["model", "model-gamma", "critic", "tilt", "bf16", "bf16-critic"],
)


def _update(config: Config, population: Population, batch: ReplayBatch) -> None:
    population.learner.update(batch)


@UPDATE_CASES
def test_the_activation_estimate_covers_what_a_ddpg_update_saves_for_backward(values):
    config = _config(**values)
    population, batch = _population(config), _batch()
    excluded = {t.untyped_storage().data_ptr() for t in [*population.state_tensors().values(), *batch]}
    saved = SavedForBackward(excluded)
    with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
        _update(config, population, batch)
    assert saved.live == 0  # every graph freed: the peak is over the update
    estimate = sizing.ddpg_saved_bytes(config, agents=POPSIZE, num_assets=ASSETS, window=WINDOW)
    assert saved.peak <= estimate <= 1.5 * saved.peak, (estimate, saved.peak)


@UPDATE_CASES
def test_the_update_phase_estimate_covers_every_allocation_of_an_update(values):
    """The profiler's allocations and frees over one update, in order: their running sum's peak."""
    config = _config(**values)
    population, batch = _population(config), _batch()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        _update(config, population, batch)
    events = [e for e in profiler.events() if e.self_cpu_memory_usage]
    changes = sorted((e.time_range.start, e.self_cpu_memory_usage) for e in events)
    running = peak = 0
    for _, change in changes:
        running += change
        peak = max(peak, running)
    estimate = sizing.working_bytes(config, num_assets=ASSETS, num_features=WINDOW)["update"]
    assert peak <= estimate <= 2 * peak, (estimate, peak)
