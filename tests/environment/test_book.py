"""The book an agent trades (``environment.book``): long-only or long-short limits restored at every fill, borrow and
financing, a rebalancing cadence, and costs that grow with size against a volume column."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
import torch

from config import EnvConfig, override, preset
from environment.book import LONG_ONLY, Book
from environment.features import WARMUP_DAYS, build_market
from environment.gym_env import PortfolioEnv
from environment.kernel import Fill, cash_weights, equal_weights, trade, with_cash
from environment.prices import load_prices
from environment.vector_env import VectorPortfolioEnv
from models.networks import Actor
from tests.synthetic import make_market
from utils.errors import ConfigError

LONG_SHORT = Book.from_env(EnvConfig(book="long_short"))
BOOKS = {
    "long_only": LONG_ONLY,
    "long_only_capped": Book(max_weight=0.3),
    "long_short": LONG_SHORT,
    "long_short_tight": Book.from_env(
        EnvConfig(book="long_short", gross_leverage=1.5, net_exposure=(-0.2, 0.4), max_weight=0.25)
    ),
}
TOLERANCE = 1e-5


def _within(book: Book, weights: torch.Tensor) -> None:
    """Assert ``weights`` (..., N + 1) are a book its limits allow."""
    assets = weights[..., 1:]
    torch.testing.assert_close(weights.sum(-1), torch.ones_like(weights[..., 0]))
    assert float(assets.abs().max()) <= book.max_weight + TOLERANCE
    if not book.long_short:
        assert float(assets.min()) >= -TOLERANCE and float(weights[..., 0].min()) >= -TOLERANCE
        return
    assert float(assets.abs().sum(-1).max()) <= book.gross_leverage + TOLERANCE
    net = assets.sum(-1)
    assert float(net.max()) <= book.net_high + TOLERANCE and float(net.min()) >= book.net_low - TOLERANCE


@pytest.mark.parametrize("name", list(BOOKS))
@pytest.mark.parametrize("delay", [0, 1])
def test_the_limits_hold_after_every_fill_whatever_the_actions(name, delay):
    """Random targets far outside every limit, for many days: after each fill the book is one its limits allow, in a
    market whose prices drift the held weights between fills."""
    book = BOOKS[name]
    market = make_market(num_days=400, num_assets=6, seed=4)
    market = dataclasses.replace(market, relatives=(1 + 0.05 * torch.randn(400, 6)).clamp(min=0.5))
    env = VectorPortfolioEnv(
        market,
        num_agents=3,
        num_episodes=4,
        episode_days=150,
        lookback=1,
        cost_rate=0.001,
        execution_delay=delay,
        book=book,
        record=True,
    )
    generator = torch.Generator().manual_seed(1)
    env.reset(torch.tensor([10, 40, 80, 120]))
    for _ in range(150):
        raw = 3.0 * torch.randn(3, 4, 7, generator=generator)
        actions = with_cash(raw[..., 1:]) if book.long_short else torch.softmax(raw, -1)
        actions = torch.cat([1.0 - actions[..., 1:].sum(-1, keepdim=True), actions[..., 1:]], -1)
        env.step(actions)
    _within(book, env.held_per_episode)
    if book.long_short:  # the limits bind: without them these targets would break them
        assert float(env.held_per_episode[..., 1:].abs().sum(-1).max()) > 0.9 * book.gross_leverage
        assert float(env.held_per_episode[..., 1:].min()) < 0


@pytest.mark.parametrize("name", ["long_short", "long_short_tight"])
def test_the_actors_weights_are_within_the_limits_and_equal_weight_is_one_of_them(name):
    book = BOOKS[name]
    logits = 4.0 * torch.randn(64, 9)
    logits[:8, 3] = -math.inf  # an asset without a price gets no weight
    weights = book.weights(logits)
    _within(book, weights)
    assert float(weights[:8, 3].abs().max()) == 0.0
    actor = Actor(2, 3, preset("smoke").model, book=book)
    actor.reset_parameters(torch.Generator().manual_seed(0))
    actor.set_equal_weight_()
    from environment.observation import Observation

    obs = Observation(torch.randn(5, 4, 3), torch.zeros(2, 5, 5))
    # equal weight, as far as the limits allow it (a net bound below 1 keeps the rest in cash)
    torch.testing.assert_close(actor(obs), book.limit(equal_weights((2, 5), 4)))
    if book.net_high >= 1:
        torch.testing.assert_close(actor(obs), equal_weights((2, 5), 4))


def test_a_long_only_book_at_max_weight_1_trades_as_before_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    weights = torch.softmax(torch.randn(5, 7, generator=g), -1)
    target = torch.softmax(torch.randn(5, 7, generator=g), -1)
    fill = Fill(held=with_cash(1 + 0.02 * torch.randn(5, 6, generator=g)))
    plain = trade(weights, target, fill, cost_rate=0.001)
    booked = trade(weights, target, fill, cost_rate=0.001, book=Book(max_weight=1.0))
    for a, b in zip(plain, booked, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_a_constant_short_pays_exactly_its_borrow():
    """A book short 50% of its value in an asset whose price never moves, held (the drifted weights its target), cash
    earning nothing: the short's value stays what it was, and the book loses exactly the borrow rate's day on it each
    day, nothing else: after n days it is worth 1 - n * rate / 252 * 0.5."""
    rate = 0.05
    book = Book.from_env(EnvConfig(book="long_short", borrow_rate=rate, financing_spread=0.0, max_weight=1.0))
    weights = torch.tensor([1.5, -0.5, 0.0], dtype=torch.float64)  # cash holds the book and the short's proceeds
    fill = Fill(held=torch.ones(3, dtype=torch.float64))
    days = 60
    total = 0.0
    for _ in range(days):
        result = trade(weights, weights, fill, cost_rate=0.001, book=book)
        assert float(result.turnover) == 0.0 and float(result.costs) == 0.0
        total += float(result.rewards)
        weights = result.next_weights
    assert math.exp(total) == pytest.approx(1 - days * rate / 252 * 0.5, rel=1e-12)


def test_leverage_beyond_the_book_pays_cash_plus_the_spread():
    """150% long, 50% short, cash at 0: the loan of 50% pays cash's rate (here in the cash relative) and the spread."""
    book = Book.from_env(EnvConfig(book="long_short", borrow_rate=0.0, financing_spread=0.02, max_weight=1.5))
    weights = torch.tensor([0.0, 1.5, -0.5], dtype=torch.float64)
    cash_rate_day = 0.03 / 252
    fill = Fill(held=torch.tensor([1.0 + cash_rate_day, 1.0, 1.0], dtype=torch.float64))
    result = trade(weights, weights, fill, cost_rate=0.0, book=book)
    assert float(result.fees) == pytest.approx(0.02 / 252 * 0.5, rel=1e-6)
    assert float(result.rewards) == pytest.approx(math.log(1 - 0.02 / 252 * 0.5), rel=1e-4)
    # the same book 100/0 with a full cash balance earns cash's rate on the short proceeds and pays no spread
    flat = torch.tensor([1.0, 0.5, -0.5], dtype=torch.float64)
    result = trade(flat, flat, fill, cost_rate=0.0, book=book)
    assert result.fees is not None and float(result.fees) == 0.0
    assert float(result.rewards) == pytest.approx(math.log(1 + cash_rate_day), rel=1e-4)


@pytest.mark.parametrize("every", [1, 5, 21])
@pytest.mark.parametrize("delay", [0, 1, 3])
def test_rebalance_every_k_trades_on_one_day_in_k(every, delay):
    """Equal weight at a cadence of k trades only on the first of every k days of its window (its turnover is 0 on
    the others, though prices move), and the agents' rows likewise."""
    market = make_market(num_days=400, num_assets=5, seed=2)
    days = 100
    env = VectorPortfolioEnv(
        market,
        num_agents=2,
        num_episodes=2,
        episode_days=days,
        lookback=1,
        cost_rate=0.001,
        execution_delay=delay,
        book=Book(rebalance_every=every),
    )
    env.reset(torch.tensor([30, 90]))
    generator = torch.Generator().manual_seed(0)
    equal = equal_weights((2,), 5)
    for _ in range(days):
        actions = torch.stack([equal, torch.softmax(torch.randn(2, 6, generator=generator), -1)])
        env.step(actions)
    traded = env.turnover_per_episode > 0
    on_cadence = torch.arange(days) % every == 0
    assert bool(traded[..., on_cadence].all())
    assert not bool(traded[..., ~on_cadence].any())


def test_the_gym_env_follows_the_cadence_and_the_limits():
    market = make_market(num_days=400, num_assets=4, seed=5)
    book = dataclasses.replace(LONG_SHORT, rebalance_every=3)
    env = PortfolioEnv(market, lookback=2, episode_days=30, cost_rate=0.001, execution_delay=1, book=book)
    env.reset(seed=0)
    turnovers = []
    for step in range(30):
        _, _, _, _, info = env.step(np.array([0.0, 2.0, -2.0, 0.1, 0.5], dtype=np.float32))
        turnovers.append(info["turnover"])
        if step % 3 == 0:  # the order as it filled (a delay of one day): within the limits; drifting after
            _within(book, env._held)
    assert all(t == 0 for i, t in enumerate(turnovers) if i % 3)
    assert turnovers[0] > 0
    assert env.action_space.low.min() < 0 and env.observation_space["weights"].low.min() < 0


# ---------------------------------------------------------------------- costs that grow with size


def _volume_file(tmp_path, *, volume: float = 1e5, days: int = 420, assets: int = 3):
    rng = np.random.default_rng(0)
    dates = pd.bdate_range("2015-01-01", periods=days)
    rows = []
    for a in range(assets):
        prices = 50 * np.exp(np.cumsum(0.01 * rng.standard_normal(days)))
        for d, date in enumerate(dates):
            rows.append({"date": date.date().isoformat(), "ticker": f"T{a}", "close": prices[d], "volume": volume})
    path = tmp_path / "long.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _market(path, **size):
    table = load_prices(path, universe="point_in_time")
    return build_market(table, lookback=1, episode_days=20, validation_days=40, holdout_days=40, **size)


def _one_trade(market, size: float) -> tuple[float, float]:
    """A move of ``size`` of the book from cash into asset 1 on day 200: its impact and its cost."""
    fill = market.fill(torch.tensor(200), execution_delay=1)
    before = cash_weights((), market.num_assets)
    target = before.clone()
    target[0], target[1] = 1 - size, size
    result = trade(before, target, fill, cost_rate=0.0)
    return (0.0 if result.impact is None else float(result.impact)), float(result.costs)


def test_impact_is_zero_without_a_volume_column_and_grows_as_the_square_root_of_size(tmp_path):
    path = _volume_file(tmp_path)
    without = tmp_path / "prices.csv"
    pd.read_csv(path).drop(columns="volume").to_csv(without, index=False)
    plain = _market(without)
    assert plain.impact is None and plain.capacity is None
    assert _one_trade(plain, 0.1) == (0.0, 0.0)
    # the cost per unit traded grows as sqrt(traded value): with capital, and with the size of the trade
    small, large = (_market(path, capital=c, max_participation=1.0) for c in (1e5, 4e5))
    per_unit = {c: _one_trade(m, 0.05)[0] / 0.05 for c, m in ((1e5, small), (4e5, large))}
    assert per_unit[4e5] == pytest.approx(2.0 * per_unit[1e5], rel=1e-4)
    assert _one_trade(small, 0.2)[0] / 0.2 == pytest.approx(2.0 * per_unit[1e5], rel=1e-4)
    assert per_unit[1e5] > 0
    # as a fraction: coefficient x sigma x sqrt(traded / average daily traded value)
    table = load_prices(path, universe="point_in_time")
    prices = table.prices[:, 0]
    day = 200 + 1 + WARMUP_DAYS  # the fill day's row of the table
    sigma = np.std(np.diff(np.log(prices[day - 21 : day])), ddof=1)  # the 20 returns before the fill day
    adv = float(np.mean(prices[day - 20 : day] * 1e5))
    expected = 0.5 * sigma * math.sqrt(0.05 * 1e5 / adv)
    assert per_unit[1e5] == pytest.approx(expected, rel=1e-3)


def test_a_fill_takes_at_most_its_share_of_the_days_volume_and_the_rest_carries(tmp_path):
    path = _volume_file(tmp_path, volume=1000.0)
    market = _market(path, capital=1e6, max_participation=0.1)
    capacity = float(market.capacity[201, 0])  # 10% of about 50 x 1000 against a book of 1e6: about 0.5%
    assert 0 < capacity < 0.01
    fill = market.fill(torch.tensor(200), execution_delay=1)
    before = cash_weights((), market.num_assets)
    target = equal_weights((), market.num_assets)
    result = trade(before, target, fill, cost_rate=0.0)
    torch.testing.assert_close(result.target[1:], market.capacity[201])  # each asset filled up to its cap
    assert float(result.target[0]) == pytest.approx(1 - float(market.capacity[201].sum()), rel=1e-5)
    # the next day's fill goes on from there toward the target
    again = trade(result.next_weights, target, market.fill(torch.tensor(201), execution_delay=1), cost_rate=0.0)
    assert float(again.target[1]) > float(result.target[1])


def test_book_settings_are_checked():
    for values in (
        {"env.book": "short_only"},
        {"env.net_exposure": "0.2,1"},
        {"env.net_exposure": "-3,1"},
        {"env.gross_leverage": 0.5},
        {"env.rebalance_every": 0},
        {"env.max_participation": 0},
        {"env.capital": -1},
    ):
        with pytest.raises(ConfigError):
            override(preset("smoke"), values)
    config = override(preset("smoke"), {"env.book": "long_short", "env.net_exposure": "[-0.5, 0.5]"})
    assert config.env.net_exposure == (-0.5, 0.5)


def test_the_learners_model_of_a_decision_at_a_cadence_holds_it_k_days():
    """A decision at a cadence of k is modelled as held k days: its fill's relatives are each asset's growth over the
    k days after the fill (a drifting holding's), and its holding fees are charged k times."""
    market = make_market(num_days=300, num_assets=3, seed=9)
    market = dataclasses.replace(market, cash_relatives=torch.full((300,), 1.0001))
    days = torch.tensor([10, 100, 250])
    fill = market.fill(days, execution_delay=1, held_days=5)
    rows = market.day_relatives(torch.arange(300))  # (T, N + 1), cash first
    for i, day in enumerate(days.tolist()):
        torch.testing.assert_close(fill.held[i], rows[day + 2 : day + 7].prod(0))
    assert fill.days == 5
    # the last days of the market: the days after its end count as 1
    torch.testing.assert_close(market.span_relatives(5)[-1], rows[-1])
    weights = torch.tensor([1.0, 0.5, -0.5, 0.0])
    one = LONG_SHORT.fees(weights)
    assert float(LONG_SHORT.fees(weights, 5)) == pytest.approx(5 * float(one))


def test_the_model_objectives_gradient_is_finite_through_the_impact_and_the_limits():
    """The learner differentiates the fill rule: at an asset that does not trade (|dw| = 0) the impact's gradient is
    0, not NaN, and the limits' clips pass finite gradients."""
    weights = torch.tensor([[0.5, 0.25, -0.25, 0.5]])
    logits = torch.tensor([[0.0, 3.0, -3.0, 0.2]], requires_grad=True)
    target = LONG_SHORT.weights(logits)
    fill = Fill(held=torch.tensor([[1.0, 1.01, 0.99, 1.0]]), impact=torch.full((1, 3), 0.1), capacity=torch.ones(1, 3))
    result = trade(weights, target, fill, cost_rate=0.001, book=LONG_SHORT)
    result.rewards.sum().backward()
    assert torch.isfinite(logits.grad).all()
    held = cash_weights((1,), 3)
    same = held.clone().requires_grad_(True)
    unmoved = trade(held, same, fill, cost_rate=0.001, book=LONG_SHORT)
    assert float(unmoved.impact.detach()) == 0.0
    unmoved.rewards.sum().backward()
    assert torch.isfinite(same.grad).all()


def test_a_volume_column_is_read_day_by_day_and_a_negative_one_is_refused(tmp_path):
    from utils.errors import DataError

    path = _volume_file(tmp_path, days=200)
    frame = pd.read_csv(path)
    frame.loc[(frame["ticker"] == "T1") & (frame.index % 7 == 0), "volume"] = np.nan  # days the file gives none
    frame.to_csv(path, index=False)
    table = load_prices(path, universe="point_in_time")
    assert table.volumes is not None and (table.volumes[:, 1] == 0).sum() > 0  # no carry: 0, nothing traded known
    assert (table.volumes[:, 0] == 1e5).all()
    frame.loc[5, "volume"] = -1.0
    frame.to_csv(path, index=False)
    with pytest.raises(DataError, match=r"volume -1 for ticker \S+ on \S+ is negative"):
        load_prices(path, universe="point_in_time")
