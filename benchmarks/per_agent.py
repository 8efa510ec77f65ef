"""The per-agent reference: how ERL implementations usually run a population, on this project's parts.

Not part of the product. It exists so ``throughput.py`` can measure, in one run on one machine, what batching the
population buys. It uses the same networks (``Actor``/``Critic`` with a population of one), the same environment
kernel, the same replay buffer and the same learner update as the trainer, but drives them the usual way:

* evaluation: one agent at a time, one episode at a time, one batch-1 actor forward per step, the step kernel on
  one portfolio, each transition appended to a replay store on its own;
* validation: the same loop without noise or storage;
* updates: one agent after another, each with its own batch of B transitions and its own optimiser step.

It is kept lean on purpose (tensors throughout, no numpy round trip per step, no gymnasium wrapper), so the
speed-up measured against it is what batching buys, not what a slow loop loses.
"""

from __future__ import annotations

import dataclasses

import torch

from environment.kernel import cash_weights, trade
from environment.market import Market
from environment.observation import WindowGatherer
from models.learner import Learner
from models.population import Population
from models.replay import ReplayBuffer


def split_population(population: Population, *, generator: torch.Generator) -> list[Population]:
    """One single-agent population per agent, holding that agent's learner (its networks and targets) and exploration
    stdev, with the same learner settings."""
    template = population.actor.encoder.mlp.layers[0].weight
    window_size = template.shape[1]
    learner = population.learner
    agents = []
    for index in range(population.popsize):
        stdev = float(population.exploration_stdev[index])
        single = Learner(
            1,
            window_size,
            population.actor.widths,
            dataclasses.replace(learner.settings, exploration_min=stdev, exploration_max=stdev),
            cost_rate=learner.cost_rate,
            device=template.device,
            generator=generator,
        )
        agent = Population(1, single, generator=generator)
        with torch.no_grad():
            for single, stacked in zip(agent.learner.networks().values(), learner.networks().values()):
                for mine, theirs in zip(single.parameters(), stacked.parameters()):
                    mine.copy_(theirs[index : index + 1])
        agents.append(agent)
    return agents


class TransitionStore:
    """What a per-agent loop appends to every step: one transition at a time into preallocated arrays."""

    def __init__(self, capacity: int, num_assets: int, device: torch.device) -> None:
        self.capacity = capacity
        self.pos = 0
        self.days = torch.zeros(capacity, dtype=torch.long, device=device)
        self.weights = torch.zeros(capacity, num_assets + 1, device=device)
        self.actions = torch.zeros(capacity, num_assets + 1, device=device)
        self.rewards = torch.zeros(capacity, device=device)
        self.next_weights = torch.zeros(capacity, num_assets + 1, device=device)

    def add(self, day: int, weights, action, reward, next_weights) -> None:
        i = self.pos
        self.days[i] = day
        self.weights[i] = weights
        self.actions[i] = action
        self.rewards[i] = reward
        self.next_weights[i] = next_weights
        self.pos = (i + 1) % self.capacity


@torch.no_grad()
def run_episodes(
    agents: list[Population],
    market: Market,
    gatherer: WindowGatherer,
    start_days: list[int],
    *,
    episode_days: int,
    cost_rate: float,
    execution_delay: int,
    exploring: list[bool] | None = None,
    store: TransitionStore | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Every agent runs every episode, one agent, one episode and one batch-1 step at a time.

    Returns:
        (P, E) total log return of each episode.
    """
    device = market.device
    totals = torch.zeros(len(agents), len(start_days), device=device)
    for a, agent in enumerate(agents):
        stdev = agent.exploration_stdev[0]
        for e, start in enumerate(start_days):
            weights = cash_weights((), market.num_assets, device=device)
            day = start
            for _ in range(episode_days):
                obs = gatherer.observe(torch.tensor([day], device=device), weights.view(1, 1, -1))  # one window
                logits = agent.actor.logits(obs)[0, 0]
                if exploring is not None and exploring[e]:
                    logits = logits + stdev * torch.randn(logits.shape, generator=generator, device=device)
                action = torch.softmax(logits, dim=-1)
                fill = market.fill(torch.tensor(day, device=device), execution_delay=execution_delay)
                result = trade(weights, action, fill, cost_rate=cost_rate)
                if store is not None:
                    store.add(day, weights, action, result.rewards, result.next_weights)
                totals[a, e] += result.rewards
                weights = result.next_weights
                day += 1
    return totals


def update_agents(agents: list[Population], buffer: ReplayBuffer, updates: int, *, generator: torch.Generator) -> None:
    """``updates`` updates of every agent's learner, one agent after another, each on its own batch of B.

    ``buffer`` must have been made with ``sample_shape=(1, B)``.
    """
    for agent in agents:
        for index in range(updates):
            batch = buffer.sample(generator)
            agent.learner.update(batch, actor_step=agent.learner.takes_actor_step(index))


def single_sample_view(buffer: ReplayBuffer, batch_size: int) -> ReplayBuffer:
    """A buffer sharing ``buffer``'s transitions that samples (1, B) batches, as one agent at a time needs."""
    view = ReplayBuffer(
        1,
        buffer.market,
        lookback=buffer.gatherer.lookback,
        execution_delay=buffer.execution_delay,
        held_days=buffer.held_days,
        sample_shape=(1, batch_size),
    )
    view.storage = buffer.storage
    view.capacity, view.size, view.pos = buffer.capacity, buffer.size, buffer.pos
    return view
