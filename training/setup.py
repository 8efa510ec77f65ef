"""A run's market, from its config: the first thing a start, a resume or a backtest fold loads."""

from __future__ import annotations

import torch

from config import Config
from environment.data import PriceTable, load_prices
from environment.features import build_market
from environment.market import Market


def load_table(config: Config) -> PriceTable:
    """The price table ``config.data`` selects."""
    data = config.data
    return load_prices(
        data.path or None,
        tickers=data.tickers,
        start=data.start,
        end=data.end,
        max_fill_days=data.max_fill_days,
        max_assets=data.max_assets,
    )


def load_market(config: Config, device: torch.device) -> Market:
    data = config.data
    return build_market(
        load_table(config),
        lookback=config.env.lookback,
        episode_days=config.env.episode_days,
        validation_days=data.validation_days,
        holdout_days=data.holdout_days,
        gap_days=data.gap_days,
        device=device,
    )
