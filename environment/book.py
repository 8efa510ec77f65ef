"""The book an agent trades: long-only or long-short, the limits every fill restores, what holding it costs beyond
trading, and how often it rebalances (``env.book`` and the keys beside it).

Weights are over ``N + 1`` entries, cash first, as everywhere (``environment.kernel``); cash is what the book does not
invest: ``w_0 = 1 - sum_i w_i``. Short proceeds are cash the book holds as collateral (they earn cash's rate, and buy
nothing: a loan for longs beyond the book's value is the only borrowed cash).

* **long_only**: ``w_i >= 0``, ``sum_i w_i <= 1``. The actor's logits ``z`` become ``softmax(z)``.
* **long_short**: ``|w_i| <= m`` (``max_weight``), ``sum_i |w_i| <= G`` (``gross_leverage``) and
  ``lo <= sum_i w_i <= hi`` (``net_exposure``), with ``lo <= 0 <= hi``: all cash is always allowed. The actor's logits
  ``z = (z_0, z_1 .. z_N)`` become, before the limits, ``u_i = tanh(z_i)`` (0 for an asset without a price),
  ``g = G * sigmoid(-z_0)`` and ``w_i = g * u_i / max(1, sum_j |u_j|)``: each asset's sign and conviction, a gross
  scale that the cash logit turns down, never more than ``G``.

The limits (``limit``), in this order, each only shrinking what is movable (an asset without a price keeps its
holding): clip each weight to ``[-m, m]`` (long-only: ``[0, m]``, the excess to cash); scale the movable weights so the
gross is at most ``G``; scale the movable long leg down if the net is above ``hi``, the short leg if below ``lo``.
Each step keeps what the earlier ones gave, so all hold after a fill whatever the target (a holding of an asset
without a price cannot move, and a book whose frozen part alone breaks a limit holds the rest at zero).

Holding costs (``fees``), a fraction of the book's value a day, on the weights after the fill: ``borrow * S`` on the
short leg's value ``S = sum_i max(-w_i, 0)`` and ``spread * max(0, L - 1)`` on the loan for a long leg
``L = sum_i max(w_i, 0)`` beyond the book's value; cash's own rate (earned by ``w_0``, paid by it below zero) is the
market's cash relative. A long-only book pays none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

TRADING_DAYS = 252
"""Trading days in a year, what annual rates are divided by (``environment.market.TRADING_DAYS``)."""


@dataclass(frozen=True)
class Book:
    """A book's kind, limits, holding costs and cadence (see the module docstring)."""

    kind: Literal["long_only", "long_short"] = "long_only"
    gross_leverage: float = 1.0
    """G: the most ``sum_i |w_i|`` after a fill."""
    net_low: float = 0.0
    net_high: float = 1.0
    """lo, hi: the bounds of ``sum_i w_i`` after a fill."""
    max_weight: float = 1.0
    """m: the most ``|w_i|`` after a fill."""
    borrow: float = 0.0
    """The fee a day on the short leg's value (``env.borrow_rate`` / 252)."""
    spread: float = 0.0
    """What a day's loan for longs beyond the book's value pays over cash's rate (``env.financing_spread`` / 252)."""
    rebalance_every: int = 1
    """Trading days between decisions; the book drifts with prices in between."""

    @classmethod
    def from_env(cls, env) -> Book:
        """The book of an ``EnvConfig``."""
        if env.book == "long_only":
            return cls(max_weight=env.weight_cap, rebalance_every=env.rebalance_every)
        low, high = env.net_exposure
        return cls(
            kind="long_short",
            gross_leverage=env.gross_leverage,
            net_low=low,
            net_high=high,
            max_weight=env.weight_cap,
            borrow=env.borrow_rate / TRADING_DAYS,
            spread=env.financing_spread / TRADING_DAYS,
            rebalance_every=env.rebalance_every,
        )

    @property
    def long_short(self) -> bool:
        return self.kind == "long_short"

    @property
    def limits(self) -> bool:
        """Whether a fill has limits to restore (a long-only book with ``max_weight`` 1 has none)."""
        return self.long_short or self.max_weight < 1.0

    @property
    def charges(self) -> bool:
        """Whether holding the book costs anything beyond cash's rate."""
        return self.long_short and (self.borrow > 0 or self.spread > 0)

    def equal_weight_logits(self) -> tuple[float, float]:
        """The (every asset's, cash's) logit whose weights are equal weight: 1/N in each asset, no cash."""
        if not self.long_short:
            return 0.0, EQUAL_WEIGHT_CASH_LOGIT
        # tanh saturates to 1 in float32; sigmoid(-z_0) = 1 / G puts the gross at 1
        cash = math.log(self.gross_leverage - 1.0) if self.gross_leverage > 1.0 else EQUAL_WEIGHT_CASH_LOGIT
        return SATURATED_LOGIT, cash

    # ------------------------------------------------------------------ the arithmetic

    def weights(self, logits: torch.Tensor) -> torch.Tensor:
        """An actor's logits (..., N + 1), cash first (an asset without a price at -inf) -> target weights."""
        if not self.long_short:
            return torch.softmax(logits, dim=-1)
        assets = logits[..., 1:]
        conviction = torch.where(torch.isinf(assets), torch.zeros_like(assets), torch.tanh(assets))
        gross = self.gross_leverage * torch.sigmoid(-logits[..., :1])
        signed = gross * conviction / conviction.abs().sum(-1, keepdim=True).clamp_min(1.0)
        return self.limit(cash_first(signed))

    def limit(self, target: torch.Tensor, movable: torch.Tensor | None = None) -> torch.Tensor:
        """``target`` (..., N + 1) within the book's limits, shrinking only the ``movable`` assets (..., N) (all when
        None); cash is what the assets leave."""
        assets = target[..., 1:]
        low = 0.0 if not self.long_short else -self.max_weight
        clipped = assets.clamp(low, self.max_weight)
        assets = clipped if movable is None else torch.where(movable, clipped, assets)
        if self.long_short:
            free = torch.ones_like(assets) if movable is None else movable.to(assets.dtype)
            moving = assets * free
            frozen = assets - moving
            # gross: scale what can move into what the frozen part leaves
            room = (self.gross_leverage - frozen.abs().sum(-1, keepdim=True)).clamp_min(0.0)
            moving = moving * _at_most_one(room, moving.abs().sum(-1, keepdim=True))
            # net: shrink the movable leg that pushes it out of its bounds
            longs, shorts = moving.clamp_min(0.0), moving.clamp_max(0.0)
            net = (moving + frozen).sum(-1, keepdim=True)
            long_sum, short_sum = longs.sum(-1, keepdim=True), -shorts.sum(-1, keepdim=True)
            long_scale = _at_most_one((long_sum - (net - self.net_high)).clamp_min(0.0), long_sum)
            short_scale = _at_most_one((short_sum - (self.net_low - net)).clamp_min(0.0), short_sum)
            assets = longs * long_scale + shorts * short_scale + frozen
        return cash_first(assets)

    def fees(self, weights: torch.Tensor, days: int = 1) -> torch.Tensor | None:
        """(...) what holding ``weights`` (..., N + 1) for ``days`` costs beyond cash's rate, a fraction of the
        book's value; None when the book charges nothing."""
        if not self.charges:
            return None
        assets = weights[..., 1:]
        shorts = (-assets).clamp_min(0.0).sum(-1)
        loan = (assets.clamp_min(0.0).sum(-1) - 1.0).clamp_min(0.0)
        return days * (self.borrow * shorts + self.spread * loan)


EQUAL_WEIGHT_CASH_LOGIT = -40.0
"""Cash logit of the equal-weight policy of a long-only book: below float32 resolution next to N logits of 0."""
SATURATED_LOGIT = 20.0
"""An asset logit whose tanh is 1 in float32: full conviction long."""

LONG_ONLY = Book()
"""The default book: long-only, fully invested or in cash, daily, no limit beyond that."""


def cash_first(assets: torch.Tensor) -> torch.Tensor:
    """Asset weights (..., N) with cash first, what they leave: (..., N + 1)."""
    return torch.cat([1.0 - assets.sum(-1, keepdim=True), assets], dim=-1)


def _at_most_one(allowed: torch.Tensor, have: torch.Tensor) -> torch.Tensor:
    """``min(1, allowed / have)``, 1 where ``have`` is 0."""
    return torch.where(have > allowed, allowed / have.clamp_min(torch.finfo(have.dtype).tiny), torch.ones_like(have))
