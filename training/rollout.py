"""Running policies in the vectorised environment: training rollouts and validation."""

from __future__ import annotations

from collections.abc import Callable

import torch

from environment.vector_env import Step, VectorPortfolioEnv
from models.population import Population
from models.replay import ReplayBuffer
from training.sharding import Sharding


@torch.no_grad()
def collect(
    population: Population,
    env: VectorPortfolioEnv,
    start_days: torch.Tensor,
    *,
    exploring: torch.Tensor,
    buffer: ReplayBuffer,
    stored_episodes: int,
    generator: torch.Generator,
    share: Callable[[Step], Step] = lambda step: step,
) -> torch.Tensor:
    """Every agent held here runs every window; episodes where ``exploring`` (E,) is True add Gaussian noise of
    the agent's stdev to its logits. The transitions of the first ``stored_episodes`` episodes go to ``buffer``
    (the others are fitness windows that no gradient may see), through ``share``: with the population sharded over
    processes it returns every rank's transitions of the step (``SharedSteps``).

    Returns:
        (P, E, D) per-step rewards of the agents held here (the environment's history, valid until its next reset).
    """
    obs = env.reset(start_days)
    # (P, E, 1): each agent's stdev on its exploring episodes, 0 on the others.
    noise_scale = population.exploration_stdev.view(-1, 1, 1) * exploring.view(1, -1, 1).to(obs.weights.dtype)
    slots = population.slots
    while obs is not None:
        logits = population.actor.logits(obs.windows.unsqueeze(0), obs.weights)  # (P, E, N + 1)
        # Drawn for the whole population, each process keeping its slots' rows: a slot's noise is the same
        # however the population is split.
        shape = (population.popsize, *logits.shape[1:])
        noise = torch.randn(shape, generator=generator, device=generator.device)[slots.start : slots.stop]
        actions = torch.softmax(logits + noise.to(logits.device) * noise_scale, dim=-1)
        step, obs = env.step(actions)
        step = share(step)
        kept = slice(0, stored_episodes)  # (P, E, ...) -> (P, stored, ...): views, no copy
        buffer.add(
            days=step.days[kept],
            weights=step.weights[:, kept],
            actions=step.actions[:, kept],
            rewards=step.rewards[:, kept],
            next_weights=step.next_weights[:, kept],
            terminated=False,
            truncated=step.truncated,
        )
    return env.rewards_per_episode


@torch.no_grad()
def validate(
    population: Population,
    env: VectorPortfolioEnv,
    start_days: torch.Tensor,
) -> torch.Tensor:
    """Deterministic policies of the P agents, the champion and equal weight on the same days.

    ``env`` has P + 2 agents: the population (the agents held here), then the champion, then equal weight (1/N in
    every asset, rebalanced daily), the baseline of ``training.selection``. Validation runs its range as one episode.

    Returns:
        (P + 2, E * D) daily log returns net of costs, episodes in order, the champion and equal weight last.
    """
    popsize = len(population.slots)
    obs = env.reset(start_days)
    num_assets = obs.weights.shape[-1] - 1
    equal = torch.full_like(obs.weights[-1:], 1.0 / num_assets)  # (1, E, N + 1)
    equal.select(-1, 0).fill_(0.0)
    while obs is not None:
        windows = obs.windows.unsqueeze(0)
        actions = torch.cat(
            [
                population.actor(windows, obs.weights[:popsize]),
                population.champion(windows, obs.weights[popsize : popsize + 1]),
                equal,
            ]
        )  # (P + 2, E, N + 1)
        _, obs = env.step(actions)
    return env.rewards_per_episode.flatten(1)


class SharedSteps:
    """Every rank's transitions of a step, for the replay ring that every rank holds whole: one gather per step
    into buffers allocated once.

    Args:
        sharding: how the population is split over processes.
        num_episodes: E.
        num_assets: N.
    """

    def __init__(self, sharding: Sharding, *, num_episodes: int, num_assets: int) -> None:
        self.sharding = sharding
        self.width = num_assets + 1
        if sharding.distributed:
            values = 3 * self.width + 1  # weights, actions, next weights, reward
            self._mine = torch.empty(sharding.per_rank, num_episodes, values, device=sharding.device)
            self._all = torch.empty(sharding.popsize, num_episodes, values, device=sharding.device)

    def __call__(self, step: Step) -> Step:
        """The step of the agents held here -> the step of the whole population, in slot order."""
        if not self.sharding.distributed:
            return step
        n1 = self.width
        torch.cat([step.weights, step.actions, step.next_weights, step.rewards.unsqueeze(-1)], dim=-1, out=self._mine)
        gathered = self.sharding.gather(self._mine, out=self._all)  # (P, E, 3 (N + 1) + 1)
        return step._replace(
            weights=gathered[..., :n1],
            actions=gathered[..., n1 : 2 * n1],
            next_weights=gathered[..., 2 * n1 : 3 * n1],
            rewards=gathered[..., 3 * n1],
        )
