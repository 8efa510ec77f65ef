"""The portfolio step: the one piece of arithmetic both environments share.

Weights are over ``N + 1`` entries, cash first: ``weights[..., 0]`` is cash, ``weights[..., 1:]``
the assets in ``Market.tickers`` order. Every function works on any leading batch shape.

One step (``portfolio_step``), from the close at which a target fills to the next close:

1. Rebalance from the current (drifted) ``weights`` to ``target``. The turnover is
   ``sum_i |target_i - weights_i|`` over the assets (cash is not charged); the cost is
   ``cost_rate * turnover`` as a fraction of the portfolio's value before trading.
2. Hold ``target`` through the day: the gross growth is ``sum_i target_i * relative_i``
   (cash's relative is what cash earns that day, 1 at a zero rate).
3. ``reward = log(growth * (1 - cost))``: the log of the net growth of the portfolio's value.
4. The weights drift with prices: ``next_weights_i = target_i * relative_i / growth``.

A decision's step (``decision_step``) is that step at the close its target fills. When it fills at the close the
decision observed (``env.execution_delay`` 0), the decision's weights are the holdings then. When it fills later, the
weights a decision sees are the previous order's (each order is the whole portfolio, so the orders still pending
before it do not change what it earns): that order drifts through the fill day, then this one replaces it. Either way
every day's return is earned by exactly one decision, the one whose target is held through it.

Assets without a price (``trade``'s ``Fill``, ``fill_untradable``): no order fills at a price nobody quoted. At a fill,
an asset without a price that day keeps what is held in it (a halted holding frozen at its last value, nothing in one
not listed yet), and the target's other weights, cash included, are scaled to fill the rest; whoever holds a halted
asset when trading resumes earns the move from its last price (the market's relative of that day). After a ticker's
last price its holding earns the delisting return on the first day without one and is paid out in cash at the next
fill, without a trade's cost.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from environment.book import LONG_ONLY, Book, cash_first


class StepResult(NamedTuple):
    next_weights: torch.Tensor
    """(..., N + 1) weights at the next close, after prices moved."""
    rewards: torch.Tensor
    """(...) log net growth of the portfolio's value."""
    turnover: torch.Tensor
    """(...) traded fraction of the portfolio (assets only)."""
    costs: torch.Tensor
    """(...) transaction costs as a fraction of the portfolio's value (impact included)."""
    target: torch.Tensor | None = None
    """(..., N + 1) the weights held through the day: the target as it filled (``trade``)."""
    fees: torch.Tensor | None = None
    """(...) what holding the book cost beyond cash's rate (borrow, financing); None: nothing."""
    impact: torch.Tensor | None = None
    """(...) the part of ``costs`` that grows with size (a volume column's square-root impact); None: none."""


def with_cash(relatives: torch.Tensor, cash: torch.Tensor | None = None) -> torch.Tensor:
    """Prepend cash's relative to asset relatives: (..., N) -> (..., N + 1); ``cash`` (...) or None for 1."""
    cash = torch.ones_like(relatives[..., :1]) if cash is None else cash.unsqueeze(-1)
    return torch.cat([cash, relatives], dim=-1)


def portfolio_step(
    weights: torch.Tensor,
    target: torch.Tensor,
    relatives: torch.Tensor,
    *,
    cost_rate: float,
    next_weights: torch.Tensor | None = None,
    fees: torch.Tensor | None = None,
    impact: torch.Tensor | None = None,
) -> StepResult:
    """Rebalance to ``target``, pay costs, hold through one day of price ``relatives``.

    Args:
        weights: (..., N + 1) current weights, each row on the simplex.
        target: (..., N + 1) target weights, each row on the simplex.
        relatives: (..., N + 1) price relatives of the day, cash first (see ``with_cash``).
        cost_rate: cost per unit of turnover.
        next_weights: what the next decision sees instead of the weights drifted through the day (``decision_step``
            with a delay: the order itself); None for the drifted weights.
        fees: (...) what holding ``target`` costs beyond cash's rate over the day (``Book.fees``), paid from cash.
        impact: (..., N) each asset's square-root impact scale at this fill (``Fill.impact``): an asset's trade
            ``|dw|`` costs ``impact * |dw| ** 1.5`` beside ``cost_rate * |dw|``.
    """
    trades = (target[..., 1:] - weights[..., 1:]).abs()
    turnover = trades.sum(-1)
    costs = cost_rate * turnover
    impact_cost = None
    if impact is not None:
        impact_cost = (impact * trades.pow(1.5)).sum(-1)  # pow: a gradient of 0 at no trade (sqrt would give NaN)
        costs = (costs + impact_cost).clamp_max(RUIN)
    held = target * relatives
    if fees is not None:  # paid from cash; a levered book can lose all it has
        held = torch.cat([held[..., :1] - fees.unsqueeze(-1), held[..., 1:]], dim=-1)
    growth = held.sum(-1)
    if fees is not None or impact is not None:
        growth = growth.clamp_min(1.0 - RUIN)
    rewards = torch.log(growth) + torch.log1p(-costs)
    if next_weights is None:
        next_weights = held / growth.unsqueeze(-1)
    return StepResult(next_weights, rewards, turnover, costs, target, fees, impact_cost)


RUIN = 1.0 - 1e-6
"""The most of its value a book can lose in a day or pay to trade: a levered book's loss floors there (its reward at
about log 1e-6), so a ruinous day is a finite, very bad reward rather than the log of a negative number."""


def drift(weights: torch.Tensor, relatives: torch.Tensor) -> torch.Tensor:
    """Weights (..., N + 1) held through a day of ``relatives`` (..., N + 1), as they stand at its close."""
    held = weights * relatives
    return held / held.sum(-1, keepdim=True)


def fill_untradable(target: torch.Tensor, before: torch.Tensor, tradable: torch.Tensor) -> torch.Tensor:
    """What of a ``target`` (..., N + 1) fills when only the ``tradable`` assets (..., N) have a price: on each other
    asset the holding ``before`` (..., N + 1) stays as it is (a halted one frozen at its last value; nothing in one not
    listed yet or paid out), and the target's other weights, cash included, are scaled to fill the rest (all of it
    in cash when the target wanted nothing else). A target equal to ``before`` trades nothing."""
    untradable = ~tradable
    held = before[..., 1:] * untradable  # (..., N)
    free = 1.0 - held.sum(-1, keepdim=True)  # what the fill can place
    rest = 1.0 - (target[..., 1:] * untradable).sum(-1, keepdim=True)  # what the target placed off the others
    wanted = rest > 0
    scale = torch.where(wanted, free / rest.clamp_min(torch.finfo(rest.dtype).tiny), torch.zeros_like(rest))
    cash = target[..., :1] * scale + torch.where(wanted, torch.zeros_like(free), free)
    return torch.cat([cash, torch.where(untradable, held, target[..., 1:] * scale)], dim=-1)


def pay_out(weights: torch.Tensor, delisted: torch.Tensor) -> torch.Tensor:
    """``weights`` (..., N + 1) with the holdings in ``delisted`` assets (..., N) paid into cash: no trade, no cost
    (their delisting return was earned the day after their last price)."""
    assets = weights[..., 1:] * ~delisted
    return torch.cat([weights[..., :1] + (weights[..., 1:] - assets).sum(-1, keepdim=True), assets], dim=-1)


def decision_step(
    weights: torch.Tensor,
    target: torch.Tensor,
    relatives: torch.Tensor,
    *,
    cost_rate: float,
    fill_relatives: torch.Tensor | None = None,
    tradable: torch.Tensor | None = None,
    delisted: torch.Tensor | None = None,
    book: Book = LONG_ONLY,
    rebalance: torch.Tensor | None = None,
    impact: torch.Tensor | None = None,
    capacity: torch.Tensor | None = None,
    days: int = 1,
) -> StepResult:
    """A decision's trade at its fill and the day it earns (see the module docstring).

    Args:
        weights: (..., N + 1) the weights the decision saw: the holdings at its close when it fills there, else the
            previous order.
        target: (..., N + 1) the decision's target weights.
        relatives: (..., N + 1) the relatives of the day after the fill, cash first: what the target earns.
        cost_rate: cost per unit of turnover.
        fill_relatives: (..., N + 1) the relatives of the fill day, through which the previous order drifts before
            the target fills; None when the target fills at the close the decision observed.
        tradable: (..., N) the assets that can trade at the fill; None when all can. A holding in one that cannot
            stays as it is, and the target's other weights fill the rest (``fill_untradable``).
        delisted: (..., N) the assets past their last price at the fill, whose holdings are paid out in cash first;
            None when none is.
        book: the book's limits (restored at the fill) and holding costs (``environment.book``).
        rebalance: (...) or broadcastable, False where this is not a decision day of the book's cadence: nothing
            trades and the holdings drift on; None: every day is one.
        impact: (..., N) the square-root impact scale of each asset at the fill (``Fill.impact``); None: no impact.
        capacity: (..., N) the most of each asset's weight a fill can move (``Fill.capacity``); None: no cap. What
            cannot fill carries: the holding stays nearer where it was.
        days: how many days ``relatives`` span (the learner's model of a cadence): the holding costs are charged
            for each.

    Returns:
        The step; its ``next_weights`` are the weights the next decision sees: the drifted holdings when targets fill
        at the close they observed, else this order as it filled.
    """
    before = weights if fill_relatives is None else drift(weights, fill_relatives)
    if delisted is not None:
        before = pay_out(before, delisted)
    if tradable is not None:
        target = fill_held(target, before, tradable) if book.long_short else fill_untradable(target, before, tradable)
    if book.limits:
        target = book.limit(target, tradable)
    if capacity is not None:
        target = fill_within(target, before, capacity, book)
    if rebalance is not None:  # off the cadence the holdings drift on untouched
        target = torch.where(rebalance, target, before)
    filled = None if fill_relatives is None else target  # a delayed decision sees its order next
    return portfolio_step(
        before,
        target,
        relatives,
        cost_rate=cost_rate,
        next_weights=filled,
        fees=book.fees(target, days),
        impact=impact,
    )


def fill_held(target: torch.Tensor, before: torch.Tensor, tradable: torch.Tensor) -> torch.Tensor:
    """A long-short book's fill when only the ``tradable`` assets (..., N) have a price: each other asset keeps its
    holding ``before`` (..., N + 1), the tradable ones take the target's weights, and cash is what they leave
    (``Book.limit`` then shrinks what can move until the limits hold)."""
    return cash_first(torch.where(tradable, target[..., 1:], before[..., 1:]))


def fill_within(target: torch.Tensor, before: torch.Tensor, capacity: torch.Tensor, book: Book) -> torch.Tensor:
    """What of ``target`` (..., N + 1) fills when no asset's weight can move more than its ``capacity`` (..., N) from
    ``before``: each trade is cut to its cap (the rest carries), then buys are cut to what sales and cash pay for
    (long-only) or the limits restored (long-short)."""
    move = (target[..., 1:] - before[..., 1:]).clamp(-capacity, capacity)
    assets = before[..., 1:] + move
    if book.long_short:
        return book.limit(cash_first(assets))
    buys = move.clamp_min(0.0)
    spend = buys.sum(-1, keepdim=True)
    funds = (before[..., :1] - move.clamp_max(0.0).sum(-1, keepdim=True)).clamp_min(0.0)
    scale = torch.where(spend > funds, funds / spend.clamp_min(torch.finfo(spend.dtype).tiny), torch.ones_like(spend))
    return cash_first(before[..., 1:] + move.clamp_max(0.0) + buys * scale)


class Fill(NamedTuple):
    """What a decision meets at its fill, market data by the decision's day (``environment.market.Market.fill``): the
    one place the days after a decision are counted, for every environment and the learner's model of the step."""

    held: torch.Tensor
    """(..., N + 1) the relatives of the day after the fill, cash first: what the target earns."""
    drift: torch.Tensor | None = None
    """(..., N + 1) the relatives of the fill day, through which the previous order drifts before the target fills;
    None when it fills at the close the decision observed (``env.execution_delay`` 0)."""
    tradable: torch.Tensor | None = None
    """(..., N) the assets that can trade at the fill; None when all always can."""
    delisted: torch.Tensor | None = None
    """(..., N) the assets past their last price at the fill: a holding in one is paid out in cash; None: none is."""
    impact: torch.Tensor | None = None
    """(..., N) each asset's square-root impact scale at the fill, ``coefficient * volatility * sqrt(capital /
    average daily traded value)``: a trade of ``|dw|`` of the book costs ``impact * |dw| ** 1.5``; None: no volume."""
    capacity: torch.Tensor | None = None
    """(..., N) the most of the book's value a fill can trade in each asset, ``max_participation * the day's traded
    value / capital``; None: no volume."""
    days: int = 1
    """How many days ``held`` spans: 1 for a day's step; the cadence for the learner's model of a decision."""


def trade(
    weights: torch.Tensor,
    target: torch.Tensor,
    fill: Fill,
    *,
    cost_rate: float,
    book: Book = LONG_ONLY,
    rebalance: torch.Tensor | None = None,
) -> StepResult:
    """The fill rule: a decision's ``target`` (..., N + 1) traded from the ``weights`` it saw at its ``fill`` within
    the ``book``'s limits (off its cadence, where ``rebalance`` is False, nothing trades), and the day it earns
    (``decision_step``). The vectorised env, the gymnasium env and the learner's model objective all trade through
    it."""
    return decision_step(
        weights,
        target,
        fill.held,
        cost_rate=cost_rate,
        fill_relatives=fill.drift,
        tradable=fill.tradable,
        delisted=fill.delisted,
        book=book,
        rebalance=rebalance,
        impact=fill.impact,
        capacity=fill.capacity,
        days=fill.days,
    )


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


def equal_tradable_weights(tradable: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Equal weight over each row's tradable assets (``tradable`` (..., N) bool), all cash where none is: (..., N + 1)
    (into ``out`` when given)."""
    assets = tradable.to(torch.float32)
    count = assets.sum(-1, keepdim=True)
    cash = (count == 0).to(assets.dtype)
    weights = torch.cat([cash, assets / count.clamp(min=1.0)], dim=-1)
    return weights if out is None else out.copy_(weights)


def scores_to_weights(scores: torch.Tensor) -> torch.Tensor:
    """Non-negative scores (..., N + 1) -> target weights; an all-zero row means all cash."""
    scores = scores.clamp(min=0.0)
    total = scores.sum(-1, keepdim=True)
    cash = torch.zeros_like(scores)
    cash.select(-1, 0).fill_(1.0)
    return torch.where(total > 0, scores / total.clamp(min=torch.finfo(scores.dtype).tiny), cash)
