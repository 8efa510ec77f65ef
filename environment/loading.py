"""A run's market, from its config: the first thing a start, a resume or a backtest fold loads."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from config import Config
from environment.features import build_market, user_columns
from environment.market import Market
from environment.prices import BUNDLED_BENCHMARK_LABEL, PriceTable, load_prices, load_series
from utils.errors import DataError

SERIES_FILE_ENDINGS = (".csv", ".csv.gz", ".parquet", ".pq")
"""``data.risk_free`` names a file when it ends so (or holds a folder separator), else a column of the data file."""


def risk_free_column(config: Config) -> str:
    """The column of the data file that ``data.risk_free`` names, or "" (none, or a file)."""
    value = config.data.risk_free
    if not value or "/" in value or value.lower().endswith(SERIES_FILE_ENDINGS):
        return ""
    return value


def load_table(config: Config) -> PriceTable:
    """The price table ``config.data`` selects, with the user's feature columns, and the benchmark it names."""
    data = config.data
    column = risk_free_column(config)
    table = load_prices(
        data.path or None,
        tickers=data.tickers,
        start=data.start,
        end=data.end,
        max_fill_days=data.max_fill_days,
        max_assets=data.max_assets,
        universe=data.universe,
        columns=tuple(dict.fromkeys((*user_columns(data.features), *((column,) if column else ())))),
    )
    if data.benchmark:
        levels = load_series(data.benchmark, table.dates, what="benchmark", max_fill_days=data.max_fill_days)
        table = dataclasses.replace(table, benchmark=levels, benchmark_label=benchmark_label(config))
    return table


def benchmark_label(config: Config) -> str | None:
    """What a run's benchmark is, as reports name it: the user's total-return file, or the bundled price index
    (without dividends), or None (a user's data file without one)."""
    if config.data.benchmark:
        return f"{Path(config.data.benchmark).name} (total return)"
    return None if config.data.path else BUNDLED_BENCHMARK_LABEL


def load_risk_free(config: Config, table: PriceTable) -> np.ndarray | None:
    """(rows of ``table``,) cash's annual rate by day from ``data.risk_free`` (a file, or a column that holds one rate
    a day for every ticker), or None (``env.cash_rate`` then)."""
    data = config.data
    if not data.risk_free:
        return None
    column = risk_free_column(config)
    if not column:
        return load_series(data.risk_free, table.dates, what="risk_free", max_fill_days=data.max_fill_days)
    values = table.columns[column]  # (T, N), one rate a day repeated over the tickers
    with np.errstate(invalid="ignore"):
        low, high = np.nanmin(values, axis=1), np.nanmax(values, axis=1)
    differs = np.flatnonzero(~np.isclose(low, high, rtol=0.0, atol=1e-12) & ~np.isnan(low))
    if len(differs):
        day = table.dates[int(differs[0])].strftime("%Y-%m-%d")
        raise DataError(
            f"data.risk_free: column {column!r} differs between tickers on {day}; it must be one rate a day"
        )
    rates = pd.Series(low).ffill().to_numpy(dtype=np.float64)  # a day with no ticker priced keeps the last rate
    if np.isnan(rates).any():
        day = table.dates[int(np.flatnonzero(np.isnan(rates))[0])].strftime("%Y-%m-%d")
        raise DataError(f"data.risk_free: column {column!r} has no rate on or before {day}")
    if (rates > 1.0).any() or (rates < -0.5).any():
        raise DataError(
            f"data.risk_free: column {column!r} holds {rates[(rates > 1.0) | (rates < -0.5)][0]:g}: an annual rate as "
            "a decimal is expected (0.05 = 5%; divide a percentage by 100)"
        )
    return rates


def load_market(config: Config, device: torch.device, *, statistics_rows: int | None = None) -> Market:
    """The market ``config`` names on ``device`` (``statistics_rows``: see ``build_market``)."""
    data, env = config.data, config.env
    table = load_table(config)
    return build_market(
        table,
        lookback=env.lookback,
        episode_days=env.episode_days,
        validation_days=data.validation_days,
        holdout_days=data.holdout_days,
        gap_days=data.gap_days,
        gap_before_validation=data.gap_before_validation,
        features=data.features,
        execution_delay=env.execution_delay,
        cash_rate=env.cash_rate,
        risk_free=load_risk_free(config, table),
        delisting_return=data.delisting_return,
        capital=env.capital,
        impact_coefficient=env.impact_coefficient,
        max_participation=env.max_participation,
        statistics_rows=statistics_rows,
        device=device,
    )
