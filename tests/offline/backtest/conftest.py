"""The backtest tests' market: about six years of a 5-asset random walk."""

from __future__ import annotations

from pathlib import Path

import pytest

from environment.synthetic import make_market


@pytest.fixture(scope="module")
def prices(tmp_path_factory) -> Path:
    """About six years of a 5-asset random walk from 2000-01-03."""
    path = tmp_path_factory.mktemp("backtest-data") / "prices.csv"
    make_market("random_walk", num_days=1560, num_assets=5, seed=3).prices.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def wide_prices(tmp_path_factory) -> Path:
    """The same six years of a random walk over 20 assets: wide enough that a fold's figures depend on torch's thread
    count (the kernels of its update split their sums by thread), as the default preset's do."""
    path = tmp_path_factory.mktemp("backtest-wide-data") / "prices.csv"
    make_market("random_walk", num_days=1560, num_assets=20, seed=3).prices.to_csv(path, index=False)
    return path
