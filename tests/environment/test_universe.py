"""The market of a point-in-time universe, the user's own feature columns and what cash earns (``build_market``)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np
import pandas as pd
import pytest

from environment.features import FEATURE_NAMES, TRADABLE, WARMUP_DAYS, build_market, raw_features
from environment.prices import PriceTable
from persistence.provenance import market_fingerprint
from utils.errors import DataError

SETTINGS = {"lookback": 5, "episode_days": 10, "validation_days": 40, "holdout_days": 40}
DAYS, ASSETS = 500, 4
LISTS, DELISTS = 200, 380  # asset 3 lists on row 200; asset 2 trades for the last time on row 379


def prices(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 50.0 * np.exp(np.cumsum(rng.normal(0.0003, 0.01, size=(DAYS, ASSETS)), axis=0))


def table(values: np.ndarray, *, universe: str = "point_in_time", columns=None) -> PriceTable:
    return PriceTable(
        dates=pd.bdate_range("2003-01-01", periods=DAYS),
        tickers=tuple(f"A{i}" for i in range(ASSETS)),
        prices=values,
        universe=universe,
        columns=MappingProxyType(columns or {}),
    )


def listed_and_delisted() -> np.ndarray:
    values = prices()
    values[:LISTS, 3] = np.nan
    values[DELISTS:, 2] = np.nan
    return values


def test_a_universe_of_survivors_is_the_old_market_bit_for_bit():
    """Every asset trades every day: no tradable feature, no mask, the features and relatives as they always were."""
    values = prices()
    market = build_market(table(values, universe="common"), **SETTINGS)
    assert market.tradable is None and market.feature_names == FEATURE_NAMES and market.tradable_fraction == 1.0
    raw = raw_features(values)[WARMUP_DAYS:]
    train = raw[: market.splits.train.stop]
    mean, std = train.mean(axis=(0, 1)), train.std(axis=(0, 1))
    expected = np.clip((raw - mean) / std, -5.0, 5.0).astype(np.float32)
    assert np.array_equal(market.features.numpy(), expected)
    relatives = (values[WARMUP_DAYS:] / values[WARMUP_DAYS - 1 : -1]).astype(np.float32)
    assert np.array_equal(market.relatives.numpy(), relatives)
    assert build_market(table(values, universe="point_in_time"), **SETTINGS).tradable is None  # nothing to mask


def test_whether_the_networks_see_tradable_is_decided_on_the_training_days_alone():
    """An asset that delists in the holdout: its days there are masked (no trade), but the networks get no
    ``tradable`` input, which would be 1 on every day they train on and first read 0 out of sample; the same asset
    gone inside the training days gives them the input."""
    late = prices()
    late[DAYS - 20 :, 2] = np.nan  # the last 20 rows are holdout days
    market = build_market(table(late), **SETTINGS)
    assert market.tradable is not None and not bool(market.tradable.all())
    assert market.feature_names == FEATURE_NAMES  # no input decided by a day it never trains on
    assert not bool(market.tradable[market.splits.holdout][:, 2].all())
    early = prices()
    early[:LISTS, 3] = np.nan  # lists on a training day
    assert build_market(table(early), **SETTINGS).feature_names == (*FEATURE_NAMES, TRADABLE)


def test_assets_trade_from_their_first_price_to_their_last():
    market = build_market(table(listed_and_delisted()), **SETTINGS)
    rows = np.arange(WARMUP_DAYS, DAYS)  # the table's row of each market day
    tradable = market.tradable.numpy()
    assert np.array_equal(tradable[:, 3], rows >= LISTS) and np.array_equal(tradable[:, 2], rows < DELISTS)
    assert tradable[:, :2].all()
    assert market.tradable_fraction == pytest.approx(tradable.mean())
    # The networks see it: a last feature, 1 on the days the asset has a price, unnormalised.
    assert market.feature_names == (*FEATURE_NAMES, TRADABLE)
    assert np.array_equal(market.features[..., -1].numpy(), tradable.astype(np.float32))
    assert market.feature_mean[:, -1].eq(0).all() and market.feature_std[:, -1].eq(1).all()
    # Its other features are neutral (0, the training mean) on the days it has no price...
    assert market.features[~market.tradable][:, :-1].eq(0).all()
    # ... and its relative is 1: a holding keeps its last value, and nothing earns the jump across a missing day.
    assert market.relatives[~market.tradable].eq(1).all()
    assert market.relatives[LISTS - WARMUP_DAYS, 3] == 1.0  # its first day has no day before it
    assert np.isfinite(market.features.numpy()).all()


def test_statistics_come_from_the_asset_days_with_a_value():
    values = listed_and_delisted()
    market = build_market(table(values), **SETTINGS)
    raw = raw_features(values)[WARMUP_DAYS:]
    raw[~market.tradable.numpy()] = np.nan
    train = raw[: market.splits.train.stop]
    np.testing.assert_allclose(market.feature_mean[0, :-1].numpy(), np.nanmean(train, axis=(0, 1)), rtol=1e-6)
    np.testing.assert_allclose(market.feature_std[0, :-1].numpy(), np.nanstd(train, axis=(0, 1)), rtol=1e-5)


def test_a_users_column_is_a_feature_normalised_on_the_training_days():
    values = prices()
    signal = np.random.default_rng(1).normal(3.0, 2.0, size=(DAYS, ASSETS))
    signal[:100, 1] = np.nan  # not known yet: neutral
    market = build_market(table(values, columns={"signal": signal}), **SETTINGS, features=("log_return_1d", "signal"))
    assert market.feature_names == ("log_return_1d", "signal")
    assert "column 'signal'" in market.feature_definitions[1]
    kept = signal[WARMUP_DAYS:]
    train = kept[: market.splits.train.stop]
    mean, std = np.nanmean(train), np.nanstd(train)
    expected = np.nan_to_num(np.clip((kept - mean) / std, -5, 5), nan=0.0).astype(np.float32)
    np.testing.assert_allclose(market.features[..., 1].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert market.features[: 100 - WARMUP_DAYS, 1, 1].eq(0).all()  # asset 1's signal before its first value
    # "builtin" stands for the built-in features, in order.
    both = build_market(table(values, columns={"signal": signal}), **SETTINGS, features=("builtin", "signal"))
    assert both.feature_names == (*FEATURE_NAMES, "signal")


def test_a_feature_that_is_neither_built_in_nor_a_column_is_refused_in_one_line():
    with pytest.raises(DataError, match="volume is neither a built-in feature") as error:
        build_market(table(prices()), **SETTINGS, features=("volume",))
    assert "\n" not in str(error.value)


def test_a_column_without_a_value_on_the_training_days_cannot_be_normalised():
    late = np.full((DAYS, ASSETS), np.nan)
    late[-60:] = 1.0
    with pytest.raises(DataError, match="late has no value on the training days"):
        build_market(table(prices(), columns={"late": late}), **SETTINGS, features=("late",))


def test_cash_earns_the_rate_of_the_close_before():
    market = build_market(table(prices(), universe="common"), **SETTINGS, cash_rate=0.05)
    np.testing.assert_allclose(market.cash_relatives.numpy(), (1.05) ** (1 / 252), rtol=1e-7)
    rates = np.linspace(0.0, 0.1, DAYS)
    by_day = build_market(table(prices(), universe="common"), **SETTINGS, risk_free=rates)
    np.testing.assert_allclose(by_day.cash_relatives.numpy(), (1 + rates[WARMUP_DAYS - 1 : -1]) ** (1 / 252))
    assert build_market(table(prices(), universe="common"), **SETTINGS).cash_relatives is None  # it earns nothing
    assert market.day_relatives(np.arange(3))[:, 0].gt(1).all()


def test_the_fingerprint_counts_the_universe_and_cash_only_where_they_say_something():
    values = prices()
    plain = build_market(table(values, universe="common"), **SETTINGS)
    same = build_market(table(values, universe="point_in_time"), **SETTINGS)
    assert market_fingerprint(plain) == market_fingerprint(same)
    paying = build_market(table(values, universe="common"), **SETTINGS, cash_rate=0.02)
    assert market_fingerprint(paying) != market_fingerprint(plain)
    assert market_fingerprint(build_market(table(listed_and_delisted()), **SETTINGS)) != market_fingerprint(plain)


def test_an_embargo_keeps_the_validation_range_apart_from_the_days_the_gradient_fits():
    market = build_market(table(prices(), universe="common"), **SETTINGS, gap_days=12, gap_before_validation=True)
    splits = market.splits
    assert len(splits.embargo) == 12 and len(splits.gap) == 12
    assert splits.train.stop == splits.embargo.start and splits.embargo.stop == splits.validation.start
    assert splits.validation.stop == splits.gap.start and splits.gap.stop == splits.holdout.start
    before = build_market(table(prices(), universe="common"), **SETTINGS, gap_days=12)  # as earlier versions
    assert len(before.splits.embargo) == 0 and before.splits.validation.start == before.splits.train.stop
    assert before.splits.holdout == splits.holdout and before.splits.validation == splits.validation


@pytest.mark.parametrize("halt", [1, 5, 6, 20])
def test_a_halt_before_a_fall_costs_equal_weight_and_buy_and_hold_the_same_share_whatever_its_length(halt):
    """An asset halted for ``halt`` days that reopens 50% lower: nobody knows on the first day how long the halt will
    last, so no order fills while it lasts (the holding stays at a quarter of the book), and the fall costs equal weight
    and buy and hold an eighth of their value, whether the halt is short or long."""
    import torch

    from environment.vector_env import VectorPortfolioEnv

    days, first_missing = 400, 300
    values = np.full((days, 4), 100.0)
    values[first_missing : first_missing + halt, 0] = np.nan
    values[first_missing + halt :, 0] = 50.0
    frame = PriceTable(
        dates=pd.bdate_range("2003-01-01", periods=days),
        tickers=("A", "B", "C", "D"),
        prices=values,
        universe="point_in_time",
    )
    market = build_market(frame, lookback=1, episode_days=60, validation_days=20, holdout_days=20, execution_delay=1)
    assert not bool(market.tradable[first_missing - WARMUP_DAYS : first_missing + halt - WARMUP_DAYS, 0].any())
    finals = {}
    for baseline in ("equal_weight", "buy_and_hold"):
        env = VectorPortfolioEnv(
            market, num_agents=1, num_episodes=1, episode_days=60, lookback=1, cost_rate=0.0, execution_delay=1
        )
        env.reset(torch.tensor([first_missing - 10 - WARMUP_DAYS]))
        target = torch.empty(1, 4 + 1)
        for day in range(60):
            if baseline == "equal_weight" or day == 0:
                env.equal_weight(out=target)
            else:
                target = env.weights_before_fill()[0].clone()
            in_a = float(env.weights_before_fill()[0, 0, 1])
            env.step(target.unsqueeze(0))
            if 9 <= day < 9 + halt:  # the decision fills a day later, without A's price: A's holding stays
                assert float(env.weights[0, 0, 1]) == pytest.approx(in_a, abs=1e-6)
        finals[baseline] = float(env.rewards_per_episode.sum().exp())
    assert finals["equal_weight"] == pytest.approx(1 - 0.25 * 0.5, abs=1e-5)
    assert finals["buy_and_hold"] == pytest.approx(1 - 0.25 * 0.5, abs=1e-5)


def test_a_delisting_pays_its_return_on_the_first_day_without_a_price():
    """The first day after a ticker's last price earns its delisting return (the file's, else the default given); the
    days after earn nothing, and the market says the asset is gone from then on."""
    values = listed_and_delisted()  # asset 2 trades for the last time on row 379
    market = build_market(table(values), **SETTINGS, delisting_return=-0.3)
    day = DELISTS - WARMUP_DAYS  # the first day without its price
    assert market.relatives[day, 2].item() == pytest.approx(0.7)
    assert market.relatives[day + 1 :, 2].eq(1).all()
    assert int(market.last_day[2]) == day - 1 and int(market.last_day[0]) == market.num_days - 1
    given = dataclasses.replace(table(values), delisting_returns=np.array([np.nan, np.nan, -1.0, np.nan]))
    assert build_market(given, **SETTINGS, delisting_return=-0.3).relatives[day, 2].item() == 0.0  # all lost
    import torch

    fill = market.fill(torch.tensor([day - 2, day - 1, day]), execution_delay=1)
    assert fill.delisted[:, 2].tolist() == [False, True, True]  # filled on its first day without a price: paid out
    assert build_market(table(prices()), **SETTINGS).last_day is None  # nobody delists
