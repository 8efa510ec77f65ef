"""Per-asset features, the train/validation/holdout split and the ``Market`` the environments read.

Every feature is causal: the value on day ``t`` uses prices up to and including ``t`` only.

* ``log_return_1d``, ``log_return_5d``, ``log_return_21d``: ``log(price[t] / price[t - h])``.
* ``volatility_21d``: standard deviation of the last 21 daily log returns.
* ``rsi_14``: Wilder's relative strength index over 14 days, mapped from [0, 100] to [-1, 1]
  (``(avg_gain - avg_loss) / (avg_gain + avg_loss)``; 0 when the price has not moved).
* ``macd_12_26``: EMA12 - EMA26 of the log price.

The exponential averages (RSI, MACD) have no finite window, so the warm-up counts them as full after
three spans of the slowest one, when the days before the data start would weigh under 0.3 %. The
first ``WARMUP_DAYS`` rows are dropped; then each feature is z-scored with the mean and standard
deviation of the training rows of all assets together, and clipped to [-5, 5]. Pooling over assets
matters: a per-asset z-score would subtract each asset's own average return and volatility, and so
hide from the agents exactly the differences between assets that a portfolio is built on (which asset
leads, which is calm). The ``Market`` keeps the statistics (``feature_mean``, ``feature_std``, one row
per asset, all rows equal) so the same normalisation can be applied elsewhere.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from environment.data import PriceTable
from environment.market import Market, Splits
from utils.errors import DataError

_RETURN_HORIZONS = (1, 5, 21)
_VOLATILITY_WINDOW = 21
_RSI_WINDOW = 14
_MACD_FAST, _MACD_SLOW = 12, 26
_EMA_SETTLE_SPANS = 3
_MIN_STD = 1e-12

FEATURE_NAMES: tuple[str, ...] = (
    *(f"log_return_{h}d" for h in _RETURN_HORIZONS),
    f"volatility_{_VOLATILITY_WINDOW}d",
    f"rsi_{_RSI_WINDOW}",
    f"macd_{_MACD_FAST}_{_MACD_SLOW}",
)
"""Names of the K per-asset features, in the order of the last axis of ``Market.features``."""

FEATURE_DEFINITIONS: dict[str, str] = {
    "log_return_1d": "log(price[t] / price[t - 1])",
    "log_return_5d": "log(price[t] / price[t - 5])",
    "log_return_21d": "log(price[t] / price[t - 21])",
    "volatility_21d": "population standard deviation (ddof 0) of the last 21 daily log returns",
    "rsi_14": "(avg_gain - avg_loss) / (avg_gain + avg_loss), 0 when both are 0; avg_* are pandas "
    "ewm(alpha=1/14, adjust=True) means of the positive and negative daily price changes",
    "macd_12_26": "ewm(span=12, adjust=True) mean minus ewm(span=26, adjust=True) mean of the log price",
}
"""How each raw feature of day ``t`` is computed from the prices up to ``t`` (the code is ``raw_features``)."""

FEATURE_CLIP: float = 5.0
"""Normalised features are clipped to [-FEATURE_CLIP, FEATURE_CLIP]."""

WARMUP_DAYS: int = max(
    max(_RETURN_HORIZONS),  # log_return_21d needs price[t - 21]
    _VOLATILITY_WINDOW,  # 21 daily returns reach back to price[t - 21]
    _EMA_SETTLE_SPANS * max(_MACD_SLOW, 2 * _RSI_WINDOW - 1),  # Wilder's 1/14 smoothing has span 27
)
"""Leading rows of a price table dropped because some feature's window is not yet full (81)."""


def raw_features(prices: np.ndarray) -> np.ndarray:
    """Unnormalised features of every row, causal in time.

    Args:
        prices: (T, N) positive prices.

    Returns:
        (T, N, K) float64 in ``FEATURE_NAMES`` order; rows before ``WARMUP_DAYS`` hold NaN or
        features of incomplete windows.
    """
    log_price = pd.DataFrame(np.log(np.asarray(prices, dtype=np.float64)))  # (T, N)
    daily = log_price.diff()
    columns = [log_price.diff(h) for h in _RETURN_HORIZONS]
    columns.append(daily.rolling(_VOLATILITY_WINDOW).std(ddof=0))

    change = pd.DataFrame(np.asarray(prices, dtype=np.float64)).diff()
    avg_gain = change.clip(lower=0.0).ewm(alpha=1.0 / _RSI_WINDOW).mean()
    avg_loss = (-change).clip(lower=0.0).ewm(alpha=1.0 / _RSI_WINDOW).mean()
    moved = avg_gain + avg_loss
    columns.append(((avg_gain - avg_loss) / moved.where(moved > 0)).fillna(0.0).where(change.notna()))

    fast = log_price.ewm(span=_MACD_FAST).mean()
    slow = log_price.ewm(span=_MACD_SLOW).mean()
    columns.append(fast - slow)
    return np.stack([c.to_numpy() for c in columns], axis=-1)


def build_market(
    table: PriceTable,
    *,
    lookback: int,
    episode_days: int,
    validation_days: int,
    holdout_days: int,
    gap_days: int = 0,
    device: torch.device | str = "cpu",
) -> Market:
    """Builds the features, relatives and splits of a price table, on ``device``.

    The first ``WARMUP_DAYS`` rows of the table are dropped; of the T rows left, the holdout is the
    last ``holdout_days``, then ``gap_days`` that no decision trades, validation the ``validation_days``
    before them, and train everything before (see the time conventions in ``environment.market``).

    Raises:
        DataError: the table has too few rows for one training episode plus validation and holdout.
    """
    for name, value in (
        ("lookback", lookback),
        ("episode_days", episode_days),
        ("validation_days", validation_days),
        ("holdout_days", holdout_days),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if gap_days < 0:
        raise ValueError(f"gap_days must be >= 0, got {gap_days}")
    # The first training decision needs `lookback` days of features (day lookback - 1) and an episode
    # earns `episode_days` returns after it, all inside train: train.stop >= lookback + episode_days.
    needed = WARMUP_DAYS + lookback + episode_days + validation_days + gap_days + holdout_days
    if table.num_days < needed:
        span = f" ({_iso(table.dates[0])} to {_iso(table.dates[-1])})" if table.num_days else ""
        gap = f" + data.gap_days {gap_days}" if gap_days else ""
        raise DataError(
            f"the price data has {table.num_days} rows{span} but needs at least {needed}: "
            f"{WARMUP_DAYS} feature warm-up + env.lookback {lookback} + env.episode_days {episode_days} "
            f"+ data.validation_days {validation_days}{gap} + data.holdout_days {holdout_days}; "
            "use more data (an earlier data.start) or smaller settings"
        )

    num_days = table.num_days - WARMUP_DAYS
    holdout_start = num_days - holdout_days
    train_stop = holdout_start - gap_days - validation_days
    splits = Splits(
        train=range(0, train_stop),
        validation=range(train_stop, train_stop + validation_days),
        holdout=range(holdout_start, num_days),
        gap=range(train_stop + validation_days, holdout_start),
    )

    features = raw_features(table.prices)[WARMUP_DAYS:]  # (T, N, K)
    train = features[:train_stop]
    num_assets = features.shape[1]
    # One mean and spread per feature over all assets' training days, repeated per asset: (N, K).
    mean = np.broadcast_to(train.mean(axis=(0, 1)), (num_assets, train.shape[2])).copy()
    std = np.broadcast_to(train.std(axis=(0, 1)), (num_assets, train.shape[2])).copy()
    std = np.where(std > _MIN_STD, std, 1.0)  # a constant feature becomes 0, not NaN
    features = np.clip((features - mean) / std, -FEATURE_CLIP, FEATURE_CLIP).astype(np.float32)
    if not np.isfinite(features).all():
        raise RuntimeError("non-finite features from finite, positive prices")

    relatives = _relatives(table.prices)  # (T, N)
    benchmark = None if table.benchmark is None else _relatives(table.benchmark)  # (T,)
    device = torch.device(device)
    return Market(
        dates=tuple(table.dates[WARMUP_DAYS:].strftime("%Y-%m-%d")),
        tickers=tuple(table.tickers),
        feature_names=FEATURE_NAMES,
        features=_to_tensor(features, device),
        relatives=_to_tensor(relatives, device),
        splits=splits,
        benchmark=None if benchmark is None else _to_tensor(benchmark, device),
        feature_mean=_to_tensor(mean.astype(np.float32), device),  # (N, K)
        feature_std=_to_tensor(std.astype(np.float32), device),  # (N, K)
    )


def _relatives(levels: np.ndarray) -> np.ndarray:
    """price[t] / price[t - 1] for the rows kept after the warm-up, the first from the row before it."""
    levels = np.asarray(levels, dtype=np.float64)
    return (levels[WARMUP_DAYS:] / levels[WARMUP_DAYS - 1 : -1]).astype(np.float32)


def _to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device).contiguous()


def _iso(date: pd.Timestamp) -> str:
    return pd.Timestamp(date).strftime("%Y-%m-%d")
