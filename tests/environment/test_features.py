"""Features, splits and the Market: causality, training-only normalisation, relatives, row counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from environment.features import (
    BUILT_IN_FEATURES,
    FEATURE_CLIP,
    FEATURE_DEFINITIONS,
    FEATURE_NAMES,
    WARMUP_DAYS,
    build_market,
    raw_features,
)
from environment.prices import PriceTable, load_prices
from utils.errors import DataError

SETTINGS = {"lookback": 10, "episode_days": 20, "validation_days": 50, "holdout_days": 50}
NEEDED = WARMUP_DAYS + sum(SETTINGS.values())


def make_table(num_days: int = 600, num_assets: int = 4, *, benchmark: bool = True, seed: int = 0) -> PriceTable:
    """Geometric random walks with asset-specific drift and volatility, plus a benchmark index."""
    rng = np.random.default_rng(seed)
    vol = np.linspace(0.005, 0.03, num_assets)
    steps = rng.normal(0.0003, 1.0, size=(num_days, num_assets)) * vol
    prices = 50.0 * np.exp(np.cumsum(steps, axis=0))
    index = 1000.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, size=num_days))) if benchmark else None
    return PriceTable(
        dates=pd.bdate_range("2001-01-01", periods=num_days),
        tickers=tuple(f"A{i}" for i in range(num_assets)),
        prices=prices,
        benchmark=index,
    )


def replace_prices(table: PriceTable, prices: np.ndarray) -> PriceTable:
    return PriceTable(dates=table.dates, tickers=table.tickers, prices=prices, benchmark=table.benchmark)


def test_feature_constants() -> None:
    assert FEATURE_NAMES == (
        "log_return_1d",
        "log_return_5d",
        "log_return_21d",
        "volatility_21d",
        "rsi_14",
        "macd_12_26",
    )
    assert WARMUP_DAYS >= 21  # the longest finite window
    assert tuple(FEATURE_DEFINITIONS) == FEATURE_NAMES


def test_market_shapes_types_and_finiteness() -> None:
    table = make_table()
    market = build_market(table, **SETTINGS)
    num_days = 600 - WARMUP_DAYS
    assert market.features.shape == (num_days, 4, len(FEATURE_NAMES))
    assert market.relatives.shape == (num_days, 4)
    assert market.benchmark is not None and market.benchmark.shape == (num_days,)
    for tensor in (market.features, market.relatives, market.benchmark):
        assert tensor.dtype == torch.float32
        assert tensor.device == torch.device("cpu")
        assert tensor.is_contiguous()
        assert torch.isfinite(tensor).all()
    assert market.features.abs().max() <= 5.0
    assert market.tickers == table.tickers and market.feature_names == FEATURE_NAMES
    assert market.num_days == num_days and market.num_assets == 4 and market.num_features == len(FEATURE_NAMES)


def test_dates_are_iso_strings_of_the_kept_rows() -> None:
    table = make_table()
    market = build_market(table, **SETTINGS)
    assert market.dates == tuple(d.strftime("%Y-%m-%d") for d in table.dates[WARMUP_DAYS:])


def test_splits_are_contiguous_and_cover_every_row() -> None:
    market = build_market(make_table(), **SETTINGS)
    splits = market.splits
    assert splits.train.start == 0
    assert splits.train.stop == splits.validation.start
    assert splits.validation.stop == splits.holdout.start
    assert splits.holdout.stop == market.num_days
    assert len(splits.validation) == 50 and len(splits.holdout) == 50
    assert all(r.step == 1 for r in (splits.train, splits.validation, splits.holdout))


def test_relatives_are_exact() -> None:
    table = make_table()
    market = build_market(table, **SETTINGS)
    prices = table.prices
    expected = (prices[WARMUP_DAYS:] / prices[WARMUP_DAYS - 1 : -1]).astype(np.float32)
    assert np.array_equal(market.relatives.numpy(), expected)
    index = table.benchmark
    assert index is not None and market.benchmark is not None
    expected_index = (index[WARMUP_DAYS:] / index[WARMUP_DAYS - 1 : -1]).astype(np.float32)
    assert np.array_equal(market.benchmark.numpy(), expected_index)


def test_no_benchmark_when_the_table_has_none() -> None:
    assert build_market(make_table(benchmark=False), **SETTINGS).benchmark is None


def test_raw_features_follow_their_definitions() -> None:
    prices = make_table(num_days=200).prices
    raw = raw_features(prices)  # (T, N, K)
    log_price = np.log(prices)
    t = 150
    np.testing.assert_allclose(raw[t, :, 0], log_price[t] - log_price[t - 1], rtol=1e-12)
    np.testing.assert_allclose(raw[t, :, 1], log_price[t] - log_price[t - 5], rtol=1e-12)
    np.testing.assert_allclose(raw[t, :, 2], log_price[t] - log_price[t - 21], rtol=1e-12)
    daily = np.diff(log_price, axis=0)[t - 21 : t]  # the 21 daily returns ending on day t
    np.testing.assert_allclose(raw[t, :, 3], daily.std(axis=0), rtol=1e-9)
    assert np.all(np.abs(raw[WARMUP_DAYS:, :, 4]) <= 1.0)


def test_rsi_and_macd_signs_on_trends() -> None:
    days = np.arange(200, dtype=np.float64)[:, None]
    prices = np.hstack([np.exp(0.01 * days), np.exp(-0.01 * days), np.full_like(days, 7.0)])  # up, down, flat
    raw = raw_features(prices)[WARMUP_DAYS:]
    np.testing.assert_allclose(raw[:, 0, 4], 1.0)
    np.testing.assert_allclose(raw[:, 1, 4], -1.0)
    np.testing.assert_array_equal(raw[:, 2], 0.0)
    assert (raw[:, 0, 5] > 0).all() and (raw[:, 1, 5] < 0).all()


def test_constant_prices_give_finite_features() -> None:
    table = make_table()
    prices = table.prices.copy()
    prices[:, 1] = 3.0
    market = build_market(replace_prices(table, prices), **SETTINGS)
    assert torch.isfinite(market.features).all()
    # A flat asset carries no information: the same features every day (pooled statistics make them
    # the z-score of zero, not zero itself).
    assert (market.features[:, 1] == market.features[:1, 1]).all()


def test_raw_features_are_causal() -> None:
    prices = make_table(num_days=300).prices
    t = 180
    changed = prices.copy()
    changed[t + 1 :] *= np.random.default_rng(1).uniform(0.5, 2.0, size=changed[t + 1 :].shape)
    before, after = raw_features(prices), raw_features(changed)
    assert np.array_equal(before[: t + 1], after[: t + 1], equal_nan=True)
    assert not np.array_equal(before[t + 1 :], after[t + 1 :], equal_nan=True)


def test_changing_holdout_prices_leaves_train_and_validation_features_bit_identical() -> None:
    table = make_table()
    base = build_market(table, **SETTINGS)
    holdout_rows = WARMUP_DAYS + base.splits.holdout.start  # first holdout row of the raw table
    prices = table.prices.copy()
    prices[holdout_rows:] *= np.random.default_rng(2).uniform(0.5, 2.0, size=prices[holdout_rows:].shape)
    changed = build_market(replace_prices(table, prices), **SETTINGS)
    assert changed.splits == base.splits
    kept = slice(0, base.splits.validation.stop)
    assert torch.equal(base.features[kept], changed.features[kept])
    assert torch.equal(base.relatives[kept], changed.relatives[kept])
    assert not torch.equal(base.features[base.splits.holdout], changed.features[changed.splits.holdout])


def test_normalisation_uses_training_rows_only() -> None:
    table = make_table(num_days=1500, seed=3)
    # Ten times the volatility after the training range: normalising with those rows would show.
    market_rows = 1500 - WARMUP_DAYS
    train_stop = market_rows - SETTINGS["validation_days"] - SETTINGS["holdout_days"]
    log_price = np.log(table.prices)
    steps = np.diff(log_price, axis=0)
    steps[WARMUP_DAYS + train_stop - 1 :] *= 10.0
    prices = np.exp(np.concatenate([log_price[:1], log_price[:1] + np.cumsum(steps, axis=0)]))
    market = build_market(replace_prices(table, prices), **SETTINGS)
    assert market.splits.train.stop == train_stop

    train = market.features[market.splits.train].double().flatten(0, 1)  # (T_train * N, K), pooled
    torch.testing.assert_close(train.mean(dim=0), torch.zeros_like(train[0]), atol=2e-3, rtol=0)
    torch.testing.assert_close(train.std(dim=0, correction=0), torch.ones_like(train[0]), atol=5e-3, rtol=0)
    volatility = FEATURE_NAMES.index("volatility_21d")
    assert market.features[market.splits.holdout, :, volatility].mean() > 3.0


def test_market_keeps_the_statistics_that_reproduce_its_features() -> None:
    table = make_table(seed=4)
    prices = table.prices.copy()
    prices[:, 2] = 7.0  # a constant asset: pooled statistics still give it a finite z-score
    market = build_market(replace_prices(table, prices), **SETTINGS)
    num_assets, num_features = market.num_assets, market.num_features
    for stat in (market.feature_mean, market.feature_std):
        assert stat is not None
        assert stat.shape == (num_assets, num_features)
        assert stat.dtype == torch.float32
    assert (market.feature_std == market.feature_std[:1]).all()  # one statistic per feature, pooled

    raw = torch.from_numpy(raw_features(prices)[WARMUP_DAYS:])  # (T, N, K) float64
    again = ((raw - market.feature_mean.double()) / market.feature_std.double()).clamp(-FEATURE_CLIP, FEATURE_CLIP)
    torch.testing.assert_close(again.float(), market.features, atol=1e-5, rtol=1e-5)


def test_the_smallest_table_that_fits() -> None:
    market = build_market(make_table(num_days=NEEDED), **SETTINGS)
    assert market.splits.train.stop == SETTINGS["lookback"] + SETTINGS["episode_days"]


def test_too_few_rows_names_the_numbers_and_settings() -> None:
    with pytest.raises(DataError) as info:
        build_market(make_table(num_days=NEEDED - 1), **SETTINGS)
    message = str(info.value)
    assert f"has {NEEDED - 1} rows" in message
    assert f"needs at least {NEEDED}" in message
    for phrase in ("env.lookback 10", "env.episode_days 20", "data.validation_days 50", "data.holdout_days 50"):
        assert phrase in message
    assert f"{WARMUP_DAYS} feature warm-up" in message
    assert "\n" not in message


def test_bundled_data_set_market() -> None:
    table = load_prices(tickers=["AAPL", "KO", "XOM"], start="2012-01-01")
    market = build_market(table, lookback=16, episode_days=21, validation_days=126, holdout_days=126)
    assert market.num_days == table.num_days - WARMUP_DAYS
    assert market.benchmark is not None and torch.isfinite(market.benchmark).all()
    assert torch.isfinite(market.features).all()


def test_tensors_on_cuda(cuda) -> None:
    market = build_market(make_table(), **SETTINGS, device="cuda")
    assert market.features.is_cuda and market.relatives.is_cuda and market.benchmark is not None
    assert market.benchmark.is_cuda and market.device.type == "cuda"
    cpu = build_market(make_table(), **SETTINGS)
    assert torch.equal(market.features.cpu(), cpu.features)


def test_pooled_normalisation_keeps_the_differences_between_assets() -> None:
    # Asset 0 drifts up, asset 1 down, asset 2 is calm: a per-asset z-score would erase all of it.
    days = np.arange(600, dtype=np.float64)[:, None]
    noise = np.random.default_rng(5).normal(0, 0.01, size=(600, 3)).cumsum(axis=0)
    prices = np.exp(np.hstack([0.002 * days, -0.002 * days, np.zeros_like(days)]) + noise * [1, 1, 0.1])
    table = make_table(num_days=600, num_assets=3)
    market = build_market(replace_prices(table, prices), **SETTINGS)
    train = market.features[market.splits.train]
    momentum = FEATURE_NAMES.index("log_return_21d")
    volatility = FEATURE_NAMES.index("volatility_21d")
    assert train[:, 0, momentum].mean() > 0.5 > -0.5 > train[:, 1, momentum].mean()
    assert train[:, 2, volatility].mean() < train[:, 0, volatility].mean() - 0.5


@pytest.mark.parametrize("name", FEATURE_NAMES)
def test_every_indicator_is_missing_until_its_window_is_full_after_a_listing(name) -> None:
    """An asset that lists late starts with no value of a feature for that feature's window (an exponential average's
    three spans), so the network sees it neutral; the asset listed from the start is untouched."""
    rng = np.random.default_rng(3)
    listing = 150
    prices = 50.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, (400, 2)), axis=0))
    prices[:listing, 1] = np.nan  # the second asset lists on row 150
    raw = raw_features(prices, (name,))[..., 0]  # (T, N)
    window = BUILT_IN_FEATURES[name].window
    assert np.isnan(raw[listing : listing + window, 1]).all()
    assert np.isfinite(raw[listing + window :, 1]).all()
    assert np.isfinite(raw[window:, 0]).all()  # the first asset's values start as they did
    alone = raw_features(prices[:, :1], (name,))[..., 0]
    assert np.array_equal(raw[:, 0], alone[:, 0], equal_nan=True)
