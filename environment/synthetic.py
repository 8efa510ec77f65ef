"""Markets with a known answer: no signal at all, or one planted signal and the rule that exploits it.

A trainer that finds an edge in a random walk fools itself; one that misses a planted signal cannot learn. These
generators make daily prices for both tests (``python benchmarks/learning.py`` trains on them and compares the
champion with equal weight and with the rule). Every market shares one structure: daily log returns are a common
market factor plus independent asset noise plus the planted signal,

    log(price[t] / price[t - 1])[i] = market[t] + noise[t, i] + signal[t, i],

and every rule decides at the close of day ``t`` from what is known then (returns up to ``t``, or the latent state
of day ``t``), holding its weights through day ``t + 1``. The kinds:

* ``random_walk``: no signal. The rule is equal weight: nothing beats it but luck.
* ``reversal``: the asset with the lowest return on day ``t - 1`` gains ``strength`` on day ``t``. Rule: hold
  yesterday's worst asset.
* ``leaders``: ``leaders`` assets gain ``strength`` a day over the others; leadership persists, each leader being
  replaced by another asset with probability ``1 / persistence`` a day. Rule: hold today's leaders equally.
* ``volatility``: each asset is calm (noise stdev ``calm_vol``) or stormy (``storm_vol``), a regime that persists
  for ``persistence`` days on average; calm assets drift up by ``strength`` a day, stormy ones down by twice that.
  Rule: hold today's calm assets equally (all cash if none).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

KINDS = ("random_walk", "reversal", "leaders", "volatility")


@dataclass(frozen=True)
class SyntheticMarket:
    kind: str
    prices: pd.DataFrame
    """Wide price table: a ``date`` column and one column per asset (``S00``, ``S01``, ...)."""
    rule_weights: np.ndarray
    """(T, N + 1) the rule's target weights decided at the close of each row's day, cash first."""


def make_market(
    kind: str,
    *,
    num_days: int = 3000,
    num_assets: int = 10,
    seed: int = 0,
    market_drift: float = 0.0003,
    market_vol: float = 0.008,
    noise_vol: float = 0.012,
    strength: float | None = None,
    leaders: int = 2,
    persistence: float | None = None,
    calm_vol: float = 0.006,
    storm_vol: float = 0.03,
) -> SyntheticMarket:
    """Daily prices of ``num_assets`` assets over ``num_days`` business days from 2000-01-03 (see the module
    docstring for the kinds). ``strength`` and ``persistence`` default per kind."""
    if kind not in KINDS:
        raise ValueError(f"unknown synthetic market {kind!r} (choose from {', '.join(KINDS)})")
    rng = np.random.default_rng(seed)
    shape = (num_days, num_assets)
    market = rng.normal(market_drift, market_vol, size=(num_days, 1))
    noise = rng.normal(0.0, noise_vol, size=shape)
    signal = np.zeros(shape)
    rule = np.zeros(shape)  # (T, N) asset weights; rows that sum to 0 hold cash

    if kind == "random_walk":
        rule[:] = 1.0 / num_assets
        log_returns = market + noise
    elif kind == "reversal":
        strength = 0.01 if strength is None else strength
        log_returns = market + noise
        for t in range(1, num_days):  # the signal of day t depends on day t - 1's returns, signal included
            log_returns[t, np.argmin(log_returns[t - 1])] += strength
        rule[np.arange(num_days), np.argmin(log_returns, axis=1)] = 1.0
    elif kind == "leaders":
        strength = 0.005 if strength is None else strength
        persistence = 120.0 if persistence is None else persistence
        current = rng.choice(num_assets, size=leaders, replace=False)
        for t in range(num_days):
            for leader in range(leaders):
                if rng.random() < 1.0 / persistence:
                    others = np.setdiff1d(np.arange(num_assets), current)
                    current[leader] = rng.choice(others)
            signal[t, current] = strength
            rule[t, current] = 1.0 / leaders
        # Leadership on day t shows in day t's returns; the rule holds day t's leaders through day t + 1.
        log_returns = market + noise + signal
    else:  # volatility
        strength = 0.001 if strength is None else strength
        persistence = 80.0 if persistence is None else persistence
        calm = rng.random(num_assets) < 0.5
        vol = np.empty(shape)
        for t in range(num_days):
            flips = rng.random(num_assets) < 1.0 / persistence
            calm = np.where(flips, ~calm, calm)
            vol[t] = np.where(calm, calm_vol, storm_vol)
            signal[t] = np.where(calm, strength, -2.0 * strength)
            count = int(calm.sum())
            if count:
                rule[t, calm] = 1.0 / count
        log_returns = market + rng.normal(0.0, 1.0, size=shape) * vol + signal

    prices = 100.0 * np.exp(np.cumsum(log_returns, axis=0))
    frame = pd.DataFrame(prices, columns=[f"S{i:02d}" for i in range(num_assets)])
    frame.insert(0, "date", pd.bdate_range("2000-01-03", periods=num_days).strftime("%Y-%m-%d"))
    cash = 1.0 - rule.sum(axis=1, keepdims=True)
    return SyntheticMarket(kind, frame, np.concatenate([cash.clip(min=0.0), rule], axis=1))
