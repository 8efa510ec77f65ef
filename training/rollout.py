"""Running policies in the vectorised environment: training rollouts and validation.

Each is a loop over the days of its windows. A day (``rollout_day``, ``validation_day``) is device work alone, on
tensors that live as long as the run, so the trainer can capture it once and replay it as a CUDA graph
(``training.graphs``); the host's part of a day (the ring's count) stays in the loop.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from environment.vector_env import Step, VectorPortfolioEnv
from models.population import Population
from models.replay import ReplayBuffer
from training.sharding import Sharding


def exploration_scale(population: Population, exploring: torch.Tensor) -> torch.Tensor:
    """(P, E, 1): each held agent's exploration stdev on the episodes where ``exploring`` (E,) is True, 0 on the
    others."""
    return population.exploration_stdev.view(-1, 1, 1) * exploring.view(1, -1, 1).to(population.exploration_stdev)


@torch.no_grad()
def rollout_day(
    population: Population,
    env: VectorPortfolioEnv,
    buffer: ReplayBuffer,
    *,
    noise_scale: torch.Tensor,
    stored_episodes: int,
    generator: torch.Generator,
    share: Callable[[Step], Step] = lambda step: step,
) -> None:
    """One day of every held agent on every window, on the device alone (it can be replayed as a CUDA graph): the
    actions with noise of ``noise_scale`` (``exploration_scale``) on the logits, the environment's step, and the
    transitions of the first ``stored_episodes`` episodes written to ``buffer`` (the others are fitness windows that
    no gradient may see), through ``share``: with the population sharded over processes it returns every rank's
    transitions of the step (``SharedSteps``). The caller commits ``population.popsize * stored_episodes``
    transitions to the ring after each day."""
    logits = population.actor.logits(env.windows.unsqueeze(0), env.weights)  # (P, E, N + 1)
    # Drawn for the whole population, each process keeping its slots' rows: a slot's noise is the same however the
    # population is split.
    slots = population.slots
    shape = (population.popsize, *logits.shape[1:])
    noise = torch.randn(shape, generator=generator, device=generator.device)[slots.start : slots.stop]
    actions = torch.softmax(logits + noise.to(logits.device) * noise_scale, dim=-1)
    step = share(env.apply(actions))
    kept = slice(0, stored_episodes)  # (P, E, ...) -> (P, stored, ...): views, no copy
    buffer.write(
        days=step.days[kept],
        weights=step.weights[:, kept],
        actions=step.actions[:, kept],
        rewards=step.rewards[:, kept],
        next_weights=step.next_weights[:, kept],
        terminated=False,
        truncated=step.truncated,
    )


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
    day: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Every agent held here runs every window from ``start_days``, a ``rollout_day`` at a time; episodes where
    ``exploring`` (E,) is True add Gaussian noise of the agent's stdev to its logits.

    Args:
        day: ``rollout_day`` bound to these arguments, as the trainer keeps it (graphed on CUDA, ``training.graphs``);
            by default it is bound here.

    Returns:
        (P, E, D) per-step rewards of the agents held here (the environment's history, valid until its next reset).
    """
    env.reset(start_days)
    if day is None:
        scale = exploration_scale(population, exploring)
        arguments = {"noise_scale": scale, "stored_episodes": stored_episodes, "generator": generator, "share": share}
        day = functools.partial(rollout_day, population, env, buffer, **arguments)
    written = population.popsize * stored_episodes  # every rank's transitions of a day
    for _ in range(env.episode_days):
        day()
        buffer.commit(written)
    return env.rewards_per_episode


def equal_weights(env: VectorPortfolioEnv) -> torch.Tensor:
    """(1, E, N + 1) the equal-weight policy's target: 1/N in every asset, nothing in cash."""
    num_assets = env.weights.shape[-1] - 1
    equal = torch.full_like(env.weights[-1:], 1.0 / num_assets)
    equal.select(-1, 0).fill_(0.0)
    return equal


@torch.no_grad()
def validation_day(population: Population, env: VectorPortfolioEnv, equal: torch.Tensor) -> None:
    """One day of the deterministic policies of the held agents, the champion and equal weight (``equal_weights``),
    on the device alone (it can be replayed as a CUDA graph)."""
    popsize = len(population.slots)
    windows = env.windows.unsqueeze(0)
    actions = torch.cat(
        [
            population.actor(windows, env.weights[:popsize]),
            population.champion(windows, env.weights[popsize : popsize + 1]),
            equal,
        ]
    )  # (P + 2, E, N + 1)
    env.apply(actions)


@torch.no_grad()
def validate(
    population: Population,
    env: VectorPortfolioEnv,
    start_days: torch.Tensor,
    *,
    day: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Deterministic policies of the P agents, the champion and equal weight on the same days, a ``validation_day``
    at a time (``day``: bound to these arguments, as the trainer keeps it; by default bound here).

    ``env`` has P + 2 agents: the population (the agents held here), then the champion, then equal weight (1/N in
    every asset, rebalanced daily), the baseline of ``training.selection``. Validation runs its range as one episode.

    Returns:
        (P + 2, E * D) daily log returns net of costs, episodes in order, the champion and equal weight last.
    """
    env.reset(start_days)
    day = day or functools.partial(validation_day, population, env, equal_weights(env))
    for _ in range(env.episode_days):
        day()
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
