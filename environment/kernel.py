"""The portfolio step: the one piece of arithmetic both environments share.

Weights are over ``N + 1`` slots, cash first: ``weights[..., 0]`` is cash, ``weights[..., 1:]``
the assets in ``Market.tickers`` order. Every function works on any leading batch shape.

One step, from the close of day ``t`` to the close of day ``t + 1``:

1. Rebalance from the current (drifted) ``weights`` to ``target``. The turnover is
   ``sum_i |target_i - weights_i|`` over the assets (cash is not charged); the cost is
   ``cost_rate * turnover`` as a fraction of the portfolio's value before trading.
2. Hold ``target`` through the day: the gross growth is ``sum_i target_i * relative_i``
   (cash has relative 1).
3. ``reward = log(growth * (1 - cost))``: the log of the net growth of the portfolio's value.
4. The weights drift with prices: ``next_weights_i = target_i * relative_i / growth``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class StepResult(NamedTuple):
    next_weights: torch.Tensor
    """(..., N + 1) weights at the next close, after prices moved."""
    rewards: torch.Tensor
    """(...) log net growth of the portfolio's value."""
    turnover: torch.Tensor
    """(...) traded fraction of the portfolio (assets only)."""
    costs: torch.Tensor
    """(...) transaction costs as a fraction of the portfolio's value."""


def with_cash(relatives: torch.Tensor) -> torch.Tensor:
    """Prepend the cash relative (1) to asset relatives: (..., N) -> (..., N + 1)."""
    ones = torch.ones_like(relatives[..., :1])
    return torch.cat([ones, relatives], dim=-1)


def portfolio_step(
    weights: torch.Tensor, target: torch.Tensor, relatives: torch.Tensor, *, cost_rate: float
) -> StepResult:
    """Rebalance to ``target``, pay costs, hold through one day of price ``relatives``.

    Args:
        weights: (..., N + 1) current weights, each row on the simplex.
        target: (..., N + 1) target weights, each row on the simplex.
        relatives: (..., N + 1) price relatives of the day, cash first (see ``with_cash``).
        cost_rate: cost per unit of turnover.
    """
    turnover = (target[..., 1:] - weights[..., 1:]).abs().sum(-1)
    costs = cost_rate * turnover
    held = target * relatives
    growth = held.sum(-1)
    rewards = torch.log(growth) + torch.log1p(-costs)
    next_weights = held / growth.unsqueeze(-1)
    return StepResult(next_weights, rewards, turnover, costs)


def cash_weights(shape: tuple[int, ...], num_assets: int, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """All-cash weights of the given leading shape: (*shape, N + 1)."""
    weights = torch.zeros(*shape, num_assets + 1, device=device)
    weights.select(-1, 0).fill_(1.0)
    return weights


def equal_weights(shape: tuple[int, ...], num_assets: int, *, device: torch.device | str = "cpu") -> torch.Tensor:
    """Equal weight, the baseline every agent is judged against: 1/N in every asset, no cash: (*shape, N + 1)."""
    weights = torch.full((*shape, num_assets + 1), 1.0 / num_assets, device=device)
    weights.select(-1, 0).fill_(0.0)
    return weights


def scores_to_weights(scores: torch.Tensor) -> torch.Tensor:
    """Non-negative scores (..., N + 1) -> target weights; an all-zero row means all cash."""
    scores = scores.clamp(min=0.0)
    total = scores.sum(-1, keepdim=True)
    cash = torch.zeros_like(scores)
    cash.select(-1, 0).fill_(1.0)
    return torch.where(total > 0, scores / total.clamp(min=torch.finfo(scores.dtype).tiny), cash)
