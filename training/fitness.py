"""Fitness: one number per agent from its episode returns (higher is better)."""

from __future__ import annotations

import torch

from config import FitnessName


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
