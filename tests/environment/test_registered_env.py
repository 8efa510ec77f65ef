"""The env a ``gymnasium.make`` away: ``import environment`` registers ``erl_trader/Portfolio-v0``, built from a data
file and dotted settings on the market a run would build, started on a date, dated in every ``info``."""

from __future__ import annotations

import gymnasium
import numpy as np
import pandas as pd
import pytest
import torch
from gymnasium.utils.env_checker import check_env

import environment  # noqa: F401  (registers the env)
from config import override, preset
from environment.gym_env import ENV_ID, PortfolioEnv
from environment.loading import load_market
from persistence.provenance import market_fingerprint
from utils.errors import ConfigError

SETTINGS = {"data.validation_days": "60", "data.holdout_days": 60, "env.lookback": 3, "env.episode_days": 10}


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    """Three tickers over 500 business days; C lists on row 100."""
    rng = np.random.default_rng(1)
    dates = pd.bdate_range("2004-01-01", periods=500).strftime("%Y-%m-%d")
    rows = []
    for ticker in "ABC":
        price = 20.0 * np.exp(np.cumsum(rng.normal(0.0002, 0.01, 500)))
        rows += [(dates[d], ticker, price[d]) for d in range(500) if ticker != "C" or d >= 100]
    path = tmp_path_factory.mktemp("data") / "prices.csv"
    pd.DataFrame(rows, columns=["date", "ticker", "close"]).to_csv(path, index=False)
    return str(path)


def make(long_file, split="train", **settings):
    return gymnasium.make(ENV_ID, data=long_file, split=split, settings={**SETTINGS, **settings})


@pytest.mark.parametrize("split", ["train", "validation", "holdout"])
def test_it_is_made_on_the_market_a_run_builds_and_passes_the_env_checker(long_file, split):
    env = make(long_file, split)
    unwrapped = env.unwrapped
    assert isinstance(unwrapped, PortfolioEnv)
    config = override(preset("default"), {"data.path": long_file, **SETTINGS})
    assert market_fingerprint(unwrapped.market) == market_fingerprint(load_market(config, torch.device("cpu")))
    assert unwrapped.starts.start >= getattr(unwrapped.market.splits, split).start - 2  # its decisions earn the split
    check_env(unwrapped, skip_render_check=True)


def test_a_start_date_starts_there_and_every_info_dates_the_decision(long_file):
    env = make(long_file, "validation")
    market, starts = env.unwrapped.market, env.unwrapped.starts
    date = market.dates[starts.start + 3]
    _, info = env.reset(options={"start_date": date})
    assert info == {"day": starts.start + 3, "date": date}
    for step in range(1, 4):
        _, _, _, _, info = env.step(env.action_space.sample())
        assert info["date"] == market.dates[starts.start + 3 + step] and info["day"] == starts.start + 3 + step
    with pytest.raises(ValueError, match="not a trading day of the data"):
        env.reset(options={"start_date": "2004-01-03"})  # a Saturday
    with pytest.raises(ValueError, match="cannot start an episode of 10 days in this split"):
        env.reset(options={"start_date": market.dates[starts.start - 1]})


def test_a_point_in_time_observation_always_says_which_assets_trade(long_file, tmp_path):
    env = make(long_file)  # C lists late: its first days are untradable
    observation, _ = env.reset(options={"start_day": env.unwrapped.starts.start})
    assert observation["tradable"].tolist() == [1, 1, 0]
    full = tmp_path / "full.csv"
    frame = pd.read_csv(long_file)
    frame[frame["ticker"] != "C"].to_csv(full, index=False)  # every asset trades every day
    assert make(str(full)).reset()[0]["tradable"].tolist() == [1, 1]  # the same space whatever the panel
    assert "tradable" not in make(str(full), **{"data.universe": "common"}).reset()[0]


def test_a_bad_split_or_key_is_refused_in_one_line(long_file):
    with pytest.raises(ValueError, match="split must be train, validation or holdout"):
        make(long_file, "test")
    with pytest.raises(ConfigError, match=r"unknown config key 'env\.lookbak'"):
        make(long_file, **{"env.lookbak": 3})
