"""Out-of-sample evaluation: the baselines and a known policy on a two-asset market with known prices."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from config import ModelConfig, override, preset
from environment.market import Market, Splits
from models.networks import Actor
from offline.holdout import run_range, score_champion, untrained_actor
from runtime.sharding import Sharding
from tests.synthetic import make_population
from training.rollout import Validation

A, B, INDEX_RELATIVE = 1.10, 0.95, 1.01
COST = 0.01
LOOKBACK = 2


def two_asset_market() -> Market:
    """30 days; asset A gains 10% a day, B loses 5%, the index gains 1%. Holdout: days 24..29 (one episode)."""
    days = 30
    relatives = torch.tensor([[A, B]] * days)
    relatives[0] = 1.0
    benchmark = torch.full((days,), INDEX_RELATIVE)
    return Market(
        dates=tuple(f"2020-01-{i + 1:02d}" for i in range(days)),
        tickers=("A", "B"),
        feature_names=("f",),
        features=torch.randn(days, 2, 1, generator=torch.Generator().manual_seed(0)),
        relatives=relatives,
        splits=Splits(train=range(0, 18), validation=range(18, 24), holdout=range(24, 30)),
        benchmark=benchmark,
    )


def zero_actor() -> Actor:
    """Every logit 0: a third in cash, A and B, every day."""
    actor = Actor(1, LOOKBACK, ModelConfig(encoder_hidden=4, embedding=3, head_hidden=4))
    with torch.no_grad():
        for p in actor.parameters():
            p.zero_()
    return actor.requires_grad_(False)


@pytest.fixture(scope="module")
def holdout():
    market = two_asset_market()
    return run_range(
        market,
        {"champion": zero_actor()},
        market.splits.holdout,
        name="holdout",
        lookback=LOOKBACK,
        cost_rate=COST,
        execution_delay=0,
    )


def test_one_episode_and_its_dates(holdout):
    # decisions on days 23..28 earn days 24..29: the range is one episode, started in cash on day 23
    assert holdout.episode_starts == ["2020-01-24"]
    assert holdout.dates == [f"2020-01-{d:02d}" for d in range(25, 31)]
    assert set(holdout.traces) == {"champion", "equal_weight", "buy_and_hold", "cash", "index"}


def test_cash_and_index(holdout):
    cash = holdout.traces["cash"]
    assert np.all(cash.log_returns == 0) and np.all(cash.turnover == 0) and np.all(cash.costs == 0)
    assert holdout.metrics["cash"].total_return == 0 and math.isnan(holdout.metrics["cash"].sharpe)
    index = holdout.traces["index"]
    np.testing.assert_allclose(index.log_returns, [math.log(INDEX_RELATIVE)] * 6, rtol=1e-6)
    assert holdout.metrics["index"].total_return == pytest.approx(INDEX_RELATIVE**6 - 1, rel=1e-5)


def test_equal_weight_rebalanced_daily(holdout):
    growth = 0.5 * A + 0.5 * B  # 1.025
    # From cash the first trade buys the whole portfolio; later ones undo one day's drift: |0.5 - 0.55/1.025| * 2.
    drift = 2 * abs(0.5 - 0.5 * A / growth)  # 0.0731707...
    episode = [math.log(growth) + math.log(1 - COST), *[math.log(growth) + math.log(1 - COST * drift)] * 5]
    trace = holdout.traces["equal_weight"]
    np.testing.assert_allclose(trace.log_returns, episode, rtol=1e-5)
    np.testing.assert_allclose(trace.turnover, [1.0, *[drift] * 5], rtol=1e-5)
    np.testing.assert_allclose(trace.weights[:, 1:], 0.5)


def test_buy_and_hold_trades_once(holdout):
    trace = holdout.traces["buy_and_hold"]
    np.testing.assert_allclose(trace.turnover, [1.0, 0, 0, 0, 0, 0], atol=1e-6)
    # The episode grows like half in A and half in B bought on its first day, less one cost.
    total = math.log(0.5 * A**6 + 0.5 * B**6) + math.log(1 - COST)
    assert trace.log_returns.sum() == pytest.approx(total, rel=1e-5)
    assert holdout.metrics["buy_and_hold"].costs == pytest.approx(COST, rel=1e-5)


def test_a_known_policy_is_run_deterministically(holdout):
    """A third in each entry (cash, 2 assets) daily: the first trade buys two thirds, later ones undo the drift."""
    w = np.array([1 / 3, 1 / 3, 1 / 3])
    r = np.array([1.0, A, B])
    g = float(w @ r)
    drift = float(np.abs(w[1:] - w[1:] * r[1:] / g).sum())
    episode = [math.log(g) + math.log(1 - COST * 2 / 3), *[math.log(g) + math.log(1 - COST * drift)] * 5]
    trace = holdout.traces["champion"]
    np.testing.assert_allclose(trace.log_returns, episode, rtol=1e-5)
    np.testing.assert_allclose(trace.weights, np.full((6, 3), 1 / 3), rtol=1e-6)
    metrics = holdout.metrics["champion"]
    assert metrics.total_return == pytest.approx(math.exp(sum(episode)) - 1, rel=1e-5)
    assert metrics.turnover == pytest.approx(np.mean([2 / 3, *[drift] * 5]) * 252, rel=1e-5)


def test_too_short_a_range_is_refused():
    market = two_asset_market()
    for days in (range(24, 24), range(0, 6)):  # empty; a first decision without a full lookback window
        with pytest.raises(ValueError, match="full lookback window"):
            run_range(market, {}, days, name="holdout", lookback=LOOKBACK, cost_rate=COST, execution_delay=0)


def test_untrained_is_the_seeded_population_agent_best_on_validation(market):
    """The untrained baseline is what selection would crown from the seed's initial population."""
    config = override(
        preset("smoke"),
        {"env.lookback": 4, "env.episode_days": 10, "evolution.popsize": 5, "model.encoder_hidden": 8},
    )
    window = config.env.lookback * market.num_features
    population = untrained_actor(config, window, market.device)
    # Independently: the trainer's validation over the same range, with the population as agents.
    holder = make_population(5, window, model=config.model)
    with torch.no_grad():
        for mine, theirs in zip(holder.actor.parameters(), population.parameters()):
            mine.copy_(theirs)
    validation = Validation(config, market, holder, sharding=Sharding(5))
    scores = validation.run()[:5].sum(dim=1)
    best = int(scores.argmax())

    results = score_champion(market, config, zero_actor_for(window, config))
    expected = run_range(
        market,
        {"untrained": population.agent(best)},
        market.splits.holdout,
        name="holdout",
        lookback=4,
        cost_rate=config.env.cost_rate,
        execution_delay=config.env.execution_delay,
    )
    np.testing.assert_allclose(
        results["holdout"].traces["untrained"].log_returns, expected.traces["untrained"].log_returns
    )
    assert not np.allclose(
        results["holdout"].traces["untrained"].log_returns, results["holdout"].traces["champion"].log_returns
    )
    # A second construction from the same seed gives the same initial population.
    again = untrained_actor(config, window, market.device)
    assert all(torch.equal(a, b) for a, b in zip(population.parameters(), again.parameters()))


def zero_actor_for(window: int, config) -> Actor:
    actor = Actor(1, window, config.model)
    with torch.no_grad():
        for p in actor.parameters():
            p.zero_()
    return actor.requires_grad_(False)
