"""Out-of-sample evaluation: the champion against the obvious alternatives, on the same episodes and costs.

A range (validation or holdout) is run as one episode, the way validation scores the champion during training:
every strategy starts in cash on the decision day whose target earns the range's first day (``env.execution_delay``
days before the day before it) and trades every day of it.
Every strategy runs in one ``VectorPortfolioEnv`` (one row each, as an agent), so all of them see the same days, pay
the same ``cost_rate`` per unit of turnover and are measured by the same kernel:

* ``champion``: the run's champion actor, deterministic (no exploration noise); equal weight when no agent
  proved an edge (``training.selection``).
* ``untrained``: the population's initial agents (the run's seed, before any training), the one that scores best on
  the validation range: what selection would have crowned with no learning at all. The difference to
  ``champion`` is what training bought.
* ``equal_weight``: 1/N in every tradable asset, rebalanced to it every day.
* ``buy_and_hold``: 1/N in every tradable asset on the first day, then left to drift (a delisted holding goes to
  cash).
* ``cash``: never invests (it earns the cash rate, ``env.cash_rate`` or ``data.risk_free``: the floor).
* ``index``: the data set's benchmark (``data.benchmark``; the bundled data has the S&P 500 price index, without
  dividends), held without costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from config import Config
from environment.book import LONG_ONLY, Book
from environment.kernel import cash_weights, equal_weights
from environment.market import Market, first_decision
from environment.observation import window_size
from environment.vector_env import VectorPortfolioEnv
from models.networks import Actor
from offline.risk import RiskMetrics, risk_metrics
from run.parts import build_population
from run.streams import make_generators

RULE_STRATEGIES = ("equal_weight", "buy_and_hold", "cash")
"""Strategies driven by a fixed rule."""
INDEX = "index"
RANGES = ("validation", "holdout")


@dataclass(frozen=True)
class Trace:
    """One strategy's days on one range."""

    log_returns: np.ndarray
    """(D,) daily log growth net of costs."""
    turnover: np.ndarray
    """(D,) traded fraction of the portfolio each day."""
    costs: np.ndarray
    """(D,) costs each day as a fraction of the portfolio's value before the trade."""
    weights: np.ndarray | None
    """(D, N + 1) the weights held through each day, cash first: the target as it filled (None for the index)."""
    fees: np.ndarray | None = None
    """(D,) what holding the book cost each day beyond cash's rate (borrow and financing), a fraction of its value."""
    impact: np.ndarray | None = None
    """(D,) the part of ``costs`` that grew with size (a volume column's square-root impact)."""
    orders: np.ndarray | None = None
    """(D, N + 1) the target each decision sent, cash first, before its fill (``trade`` prints the next one)."""
    decided: tuple[str, ...] = ()
    """(D,) the date of each decision (the close it observed)."""

    def exposure(self) -> dict[str, float | None]:
        """What the book held and paid for it: mean and largest gross exposure (sum of |weights|), mean net exposure
        (sum of weights), the smallest weight held (below 0: a short), the borrow and impact costs summed, and the
        days it traded (every ``env.rebalance_every``-th day at most)."""
        if self.weights is None:
            return {}
        assets = self.weights[:, 1:]
        gross = np.abs(assets).sum(axis=1)
        return {
            "gross_exposure": float(gross.mean()),
            "net_exposure": float(assets.sum(axis=1).mean()),
            "max_gross_exposure": float(gross.max()),
            "min_weight": float(assets.min()),
            "borrow_costs": float(0.0 if self.fees is None else self.fees.sum()),
            "impact_costs": float(0.0 if self.impact is None else self.impact.sum()),
            "trading_days": int((self.turnover > 0).sum()),
        }


@dataclass(frozen=True)
class RangeResult:
    name: str
    """'validation' or 'holdout'."""
    dates: list[str]
    """(D,) the day each return is earned (the close it is measured at)."""
    episode_starts: list[str]
    """The first decision day (the episode starts in cash at its close)."""
    traces: dict[str, Trace]
    metrics: dict[str, RiskMetrics]
    cash_returns: np.ndarray | None = None
    """(D,) daily log return of cash, which Sharpe and Sortino are measured over; None when cash earns nothing."""


def untrained_actor(config: Config, window_size: int, device: torch.device) -> Actor:
    """The run's population as its seed initialised it, before any training: the whole population as one actor."""
    return build_population(
        config, window_size, device=device, generators=make_generators(config.runtime.seed, device)
    ).actor


@torch.no_grad()
def _traces(
    env: VectorPortfolioEnv,
    market: Market,
    rows: dict[str, int],
    sent: torch.Tensor,
    *,
    starts: list[int],
    episode_days: int,
    cost_rate: float,
) -> dict[str, Trace]:
    """Each strategy's recorded episode (its row of ``env``'s records and of ``sent``, the orders) on the host, in
    float64, in time order."""

    def series(tensor: torch.Tensor) -> np.ndarray:  # (S, W, D, ...) -> (S, W * D, ...), windows in time order
        return tensor.reshape(tensor.shape[0], -1, *tensor.shape[3:]).double().cpu().numpy()

    rewards, turnover, weights = (
        series(env.rewards_per_episode),
        series(env.turnover_per_episode),
        series(env.held_per_episode),
    )
    fees, impact = series(env.fees_per_episode), series(env.impact_per_episode)
    costs = cost_rate * turnover + impact  # on the host in float64, as the flat cost always was
    orders = series(sent)
    decided = tuple(market.dates[start + k] for start in starts for k in range(episode_days))
    traces = {
        strategy: Trace(rewards[i], turnover[i], costs[i], weights[i], fees[i], impact[i], orders[i], decided)
        for strategy, i in rows.items()
    }
    return traces


def run_range(
    market: Market,
    actors: dict[str, nn.Module],
    days: range,
    *,
    name: str,
    lookback: int,
    cost_rate: float,
    execution_delay: int,
    book: Book = LONG_ONLY,
) -> RangeResult:
    """Every actor (one agent each) and every rule on the days of ``days``, as one episode from cash.

    Raises:
        ValueError: ``days`` is empty or its first decision would lack a full lookback window.
    """
    if len(days) == 0 or first_decision(days, execution_delay) < lookback - 1:
        raise ValueError(f"the {name} range has no day that a full lookback window of {lookback} days can trade")
    starts = [first_decision(days, execution_delay)]
    episode_days = len(days)
    strategies = [*actors, *RULE_STRATEGIES]
    rows = {strategy: i for i, strategy in enumerate(strategies)}
    n = market.num_assets
    env = VectorPortfolioEnv(
        market,
        num_agents=len(strategies),
        num_episodes=len(starts),
        episode_days=episode_days,
        lookback=lookback,
        cost_rate=cost_rate,
        execution_delay=execution_delay,
        book=book,
        record=True,
    )
    device = market.device
    sent = torch.zeros(len(strategies), len(starts), episode_days, n + 1, device=device)
    equal = equal_weights((len(starts),), n, device=device)
    cash = cash_weights((len(starts),), n, device=device)

    obs = env.reset(torch.tensor(starts, device=device))
    while obs is not None:
        step = env.step_index
        actions = torch.empty(len(strategies), len(starts), n + 1, device=device)
        for strategy, actor in actors.items():
            i = rows[strategy]
            actions[i] = actor(obs._replace(weights=obs.weights[i : i + 1]))[0]
        actions[rows["equal_weight"]] = env.equal_weight(out=equal)
        held_on = env.weights_before_fill()[rows["buy_and_hold"]]  # holding them trades nothing
        actions[rows["buy_and_hold"]] = equal if step == 0 else held_on
        actions[rows["cash"]] = cash
        sent[:, :, step] = actions
        _, obs = env.step(actions)

    traces = _traces(env, market, rows, sent, starts=starts, episode_days=episode_days, cost_rate=cost_rate)
    earned = [start + execution_delay + 1 + k for start in starts for k in range(episode_days)]
    earned_days = torch.tensor(earned, device=device)
    if market.benchmark is not None:
        index_returns = torch.log(market.benchmark[earned_days]).double().cpu().numpy()
        zeros = np.zeros_like(index_returns)
        traces[INDEX] = Trace(index_returns, zeros, zeros, None)
    cash_returns = None
    if market.cash_relatives is not None:
        cash_returns = torch.log(market.cash_relatives[earned_days]).double().cpu().numpy()
    metrics = {
        strategy: risk_metrics(trace.log_returns, turnover=trace.turnover, costs=trace.costs, risk_free=cash_returns)
        for strategy, trace in traces.items()
    }
    return RangeResult(
        name=name,
        dates=[market.dates[day] for day in earned],
        episode_starts=[market.dates[start] for start in starts],
        traces=traces,
        metrics=metrics,
        cash_returns=cash_returns,
    )


def score_champion(market: Market, config: Config, champion: Actor) -> dict[str, RangeResult]:
    """The champion and the baselines on the validation and the holdout ranges (see the module docstring)."""
    return score_traders(market, config, {"champion": champion})


def score_traders(market: Market, config: Config, traders: dict[str, nn.Module]) -> dict[str, RangeResult]:
    """``traders`` (one agent each, ``champion`` first) and the baselines on the validation and the holdout
    ranges."""
    env = config.env
    settings = {
        "lookback": env.lookback,
        "cost_rate": env.cost_rate,
        "execution_delay": env.execution_delay,
        "book": Book.from_env(env),
    }
    size = window_size(env.lookback, market.num_features)
    population = untrained_actor(config, size, market.device)
    # The untrained agent is chosen the way the champion is: by its validation score.
    scores = run_range(
        market,
        {f"agent{i}": population.agent(i) for i in range(population.popsize)},
        market.splits.validation,
        name="validation",
        **settings,
    )
    best = max(range(population.popsize), key=lambda i: float(scores.traces[f"agent{i}"].log_returns.sum()))
    actors = {
        **{name: actor.requires_grad_(False) for name, actor in traders.items()},
        "untrained": population.agent(best),
    }
    return {name: run_range(market, actors, getattr(market.splits, name), name=name, **settings) for name in RANGES}
