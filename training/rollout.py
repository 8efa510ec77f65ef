"""Running policies in the vectorised environment: training rollouts and validation."""

from __future__ import annotations

import torch

from environment.vector_env import VectorPortfolioEnv
from models.population import Population
from models.replay import ReplayBuffer


@torch.no_grad()
def collect(
    population: Population,
    env: VectorPortfolioEnv,
    start_days: torch.Tensor,
    *,
    exploring: torch.Tensor,
    buffer: ReplayBuffer,
    generator: torch.Generator,
) -> torch.Tensor:
    """Every agent runs every window; episodes where ``exploring`` (E,) is True add Gaussian noise of the
    agent's stdev to its logits. All transitions go to ``buffer``.

    Returns:
        (P, E, D) per-step rewards (the environment's history array, valid until its next reset).
    """
    obs = env.reset(start_days)
    # (P, E, 1): each agent's stdev on its exploring episodes, 0 on the others.
    noise_scale = population.exploration_stdev.view(-1, 1, 1) * exploring.view(1, -1, 1).to(obs.weights.dtype)
    while obs is not None:
        logits = population.actor.logits(obs.windows.unsqueeze(0), obs.weights)  # (P, E, N + 1)
        noise = torch.randn(logits.shape, generator=generator, device=generator.device).to(logits.device)
        actions = torch.softmax(logits + noise * noise_scale, dim=-1)
        step, obs = env.step(actions)
        buffer.add(
            days=step.days,
            weights=step.weights,
            actions=step.actions,
            rewards=step.rewards,
            next_weights=step.next_weights,
            terminated=False,
            truncated=step.truncated,
        )
    return env.rewards_per_episode


@torch.no_grad()
def validate(population: Population, env: VectorPortfolioEnv, start_days: torch.Tensor) -> torch.Tensor:
    """Deterministic policies of the P agents, the champion and equal weight on the same days.

    ``env`` has P + 2 agents: the population, then the champion, then equal weight (1/N in every asset,
    rebalanced daily), the baseline of ``training.selection``. Validation runs its range as one episode.

    Returns:
        (P + 2, E * D) daily log returns net of costs, episodes in order, the champion and equal weight last.
    """
    popsize = population.popsize
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
