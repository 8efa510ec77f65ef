"""Fitness: one number per agent from its episode returns (higher is better)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from config import Config, FitnessName
from environment.market import Market
from environment.vector_env import episode_starts
from utils.errors import ConfigError


def episode_returns(rewards_per_episode: torch.Tensor) -> torch.Tensor:
    """(P, E, D) per-step log rewards -> (P, E) total log return of each episode."""
    return rewards_per_episode.sum(dim=-1)


def fitness(returns_per_episode: torch.Tensor, *, kind: FitnessName, worst_k: int) -> torch.Tensor:
    """(P, E) episode log returns -> (P,) fitness.

    * ``mean_log_return``: mean over episodes.
    * ``sharpe``: mean over standard deviation across episodes (population std, +1e-8).
    * ``worst_k``: mean of the ``worst_k`` lowest episodes (all of them if there are fewer).
    """
    if kind == "mean_log_return":
        return returns_per_episode.mean(dim=1)
    if kind == "sharpe":
        mean = returns_per_episode.mean(dim=1)
        return mean / (returns_per_episode.std(dim=1, correction=0) + 1e-8)
    if kind == "worst_k":
        k = min(worst_k, returns_per_episode.shape[1])
        return returns_per_episode.topk(k, dim=1, largest=False).values.mean(dim=1)
    raise ValueError(f"unknown fitness {kind!r}")


class TrainingStarts(NamedTuple):
    """Decision days on which a rollout's episode may start (int64), by what the episode is for (not to be confused
    with an observation's window of the last L days, ``environment.observation``)."""

    learning: torch.Tensor
    """Starts of the learning episodes: their transitions fill the replay buffer."""
    fitness: torch.Tensor
    """Starts of the fitness episodes: noise-free episodes whose returns make the fitness."""


def split_training_days(
    train: range, *, lookback: int, episode_days: int, every: int, execution_delay: int, embargo: int = 0
) -> TrainingStarts:
    """Start days of the learning episodes and of the fitness episodes on the training range.

    With ``every`` > 0 the training range is cut into blocks of ``episode_days`` days and every ``every``-th block
    is a fitness block: fitness episodes trade exactly such a block, and no learning episode (whose transitions
    fill the replay buffer) decides on any of its days. Evolution then selects on days no gradient has fitted, so an
    agent that memorises its training days is not rewarded for it. ``every`` = 0: both are every start day.

    ``embargo``: days on either side of a fitness block on which no learning episode decides either. A day's features
    look back up to 26 days (MACD's slow average), so a learning day next to a block shares most of what its features
    were computed from with the block's first days; the embargo keeps that overlap out of the buffer.
    """
    starts = episode_starts(train, lookback=lookback, episode_days=episode_days, execution_delay=execution_delay)
    every_start = torch.arange(starts.start, starts.stop)
    if every == 0:
        return TrainingStarts(every_start, every_start)
    fitness_decisions = torch.zeros(train.stop + 1, dtype=torch.bool)  # by day
    fitness_starts = []
    for first in range(train.start + (every - 1) * episode_days, train.stop - episode_days + 1, every * episode_days):
        start = first - 1 - execution_delay  # its first target earns the block's first day
        if start in starts:
            fitness_starts.append(start)
            fitness_decisions[max(0, start - embargo) : start + episode_days + embargo] = True
    # A learning episode decides on days start .. start + episode_days - 1: none of them may be a fitness decision.
    seen = torch.cat([torch.zeros(1, dtype=torch.long), fitness_decisions.long().cumsum(0)])
    clear = (seen[every_start + episode_days] - seen[every_start]) == 0
    learning = every_start[clear]
    if not fitness_starts or len(learning) == 0:
        raise ValueError(
            f"{len(train)} training days are too few to set aside every {every}th block of {episode_days} days"
        )
    return TrainingStarts(learning, torch.tensor(fitness_starts))


def training_starts(config: Config, market: Market) -> TrainingStarts:
    """``split_training_days`` for a run's config and market: the fitness blocks when the config asks for them and
    has noise-free and exploring episodes to give them to, else every start day for both.

    Raises:
        ConfigError: the training range is too short for ``rollout.fitness_block_every``.
    """
    rollout = config.rollout
    try:
        return split_training_days(
            market.splits.train,
            lookback=config.env.lookback,
            episode_days=config.env.episode_days,
            execution_delay=config.env.execution_delay,
            embargo=rollout.fitness_embargo_days,
            every=rollout.fitness_block_every if rollout.splits_fitness_days else 0,
        )
    except ValueError as error:
        raise ConfigError(f"rollout.fitness_block_every: {error}") from None
