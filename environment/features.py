"""Per-asset features, the train/validation/holdout split and the ``Market`` the environments read.

Every feature is causal: the value on day ``t`` uses what is known at the close of ``t`` only. ``data.features``
picks them: the built-in ones below (``BUILT_IN_FEATURES``, all of them by default) and any numeric column of the
user's long data file, whose value dated ``t`` is taken as known at the close of ``t`` (a value published later must
be dated when it was published). The built-in ones, from prices:

* ``log_return_1d``, ``log_return_5d``, ``log_return_21d``: ``log(price[t] / price[t - h])``.
* ``volatility_21d``: standard deviation of the last 21 daily log returns.
* ``rsi_14``: Wilder's relative strength index over 14 days, mapped from [0, 100] to [-1, 1]
  (``(avg_gain - avg_loss) / (avg_gain + avg_loss)``; 0 when the price has not moved).
* ``macd_12_26``: EMA12 - EMA26 of the log price.

The exponential averages (RSI, MACD) have no finite window, so the warm-up counts them as full after
three spans of the slowest one, when the days before the data start would weigh under 0.3 %. The
first ``WARMUP_DAYS`` rows are dropped, whatever the features; then each feature, the user's columns
alike, is z-scored with the mean and standard deviation of the training rows of all assets together
(the asset-days with a value), and clipped to [-5, 5]. A value that is missing (an asset without a
price that day, a window not yet full after it lists, a user's column before its first value) is
neutral: 0, the training mean. In a market some of whose assets lack a price on some training day, a last feature,
``tradable``, is 1 on the days an asset has a price and 0 on the others, so the networks see it (decided on the
training days alone: a day missing only later is masked, not an input). Pooling over assets
matters: a per-asset z-score would subtract each asset's own average return and volatility, and so
hide from the agents exactly the differences between assets that a portfolio is built on (which asset
leads, which is calm). The ``Market`` keeps the statistics (``feature_mean``, ``feature_std``, one row
per asset, all rows equal) so the same normalisation can be applied elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import pandas as pd
import torch

from environment.market import TRADING_DAYS, Market, Splits
from environment.prices import PriceTable
from utils.errors import DataError

_RETURN_HORIZONS = (1, 5, 21)
_VOLATILITY_WINDOW = 21
_RSI_WINDOW = 14
_MACD_FAST, _MACD_SLOW = 12, 26
_EMA_SETTLE_SPANS = 3
_MIN_STD = 1e-12
BUILTIN = "builtin"
"""In ``data.features``, all of ``FEATURE_NAMES``."""
TRADABLE = "tradable"
"""The feature that says which assets have a price on a day (not normalised: 1 or 0)."""
TRADABLE_DEFINITION = "1 on a day the asset has a price, 0 on a day it has none (not normalised)"


class BuiltInFeature(NamedTuple):
    definition: str
    """How the raw value of day ``t`` is computed from the prices up to ``t``."""
    compute: Callable[[pd.DataFrame], pd.DataFrame]
    """(T, N) prices, NaN where an asset has none -> (T, N) raw values, causal in time."""
    window: int
    """Days after an asset's first price before its value is taken as full (an exponential average's: three spans of
    its slowest); before that it is missing, so neutral."""


def _log_return(horizon: int) -> Callable[[pd.DataFrame], pd.DataFrame]:
    return lambda prices: np.log(prices).diff(horizon)


def _volatility(prices: pd.DataFrame) -> pd.DataFrame:
    return np.log(prices).diff().rolling(_VOLATILITY_WINDOW).std(ddof=0)


def _rsi(prices: pd.DataFrame) -> pd.DataFrame:
    change = prices.diff()
    avg_gain = change.clip(lower=0.0).ewm(alpha=1.0 / _RSI_WINDOW).mean()
    avg_loss = (-change).clip(lower=0.0).ewm(alpha=1.0 / _RSI_WINDOW).mean()
    moved = avg_gain + avg_loss
    return ((avg_gain - avg_loss) / moved.where(moved > 0)).fillna(0.0).where(change.notna())


def _macd(prices: pd.DataFrame) -> pd.DataFrame:
    log_price = np.log(prices)
    return log_price.ewm(span=_MACD_FAST).mean() - log_price.ewm(span=_MACD_SLOW).mean()


BUILT_IN_FEATURES: dict[str, BuiltInFeature] = {
    **{
        f"log_return_{h}d": BuiltInFeature(f"log(price[t] / price[t - {h}])", _log_return(h), h)
        for h in _RETURN_HORIZONS
    },
    f"volatility_{_VOLATILITY_WINDOW}d": BuiltInFeature(
        f"population standard deviation (ddof 0) of the last {_VOLATILITY_WINDOW} daily log returns",
        _volatility,
        _VOLATILITY_WINDOW,
    ),
    f"rsi_{_RSI_WINDOW}": BuiltInFeature(
        "(avg_gain - avg_loss) / (avg_gain + avg_loss), 0 when both are 0; avg_* are pandas "
        f"ewm(alpha=1/{_RSI_WINDOW}, adjust=True) means of the positive and negative daily price changes",
        _rsi,
        _EMA_SETTLE_SPANS * (2 * _RSI_WINDOW - 1),  # Wilder's 1/14 smoothing has span 27
    ),
    f"macd_{_MACD_FAST}_{_MACD_SLOW}": BuiltInFeature(
        f"ewm(span={_MACD_FAST}, adjust=True) mean minus ewm(span={_MACD_SLOW}, adjust=True) mean of the log price",
        _macd,
        _EMA_SETTLE_SPANS * _MACD_SLOW,
    ),
}
"""The features computed from prices, by name: a new one added here is a feature ``data.features`` can name."""

FEATURE_NAMES: tuple[str, ...] = tuple(BUILT_IN_FEATURES)
"""The built-in features, in order: the default ``data.features``."""

FEATURE_DEFINITIONS: dict[str, str] = {name: BUILT_IN_FEATURES[name].definition for name in FEATURE_NAMES}
"""How each built-in raw feature of day ``t`` is computed from the prices up to ``t``."""

FEATURE_CLIP: float = 5.0
"""Normalised features are clipped to [-FEATURE_CLIP, FEATURE_CLIP]."""

WARMUP_DAYS: int = max(feature.window for feature in BUILT_IN_FEATURES.values())
"""Leading rows of a price table dropped because some built-in feature's window is not yet full (81). An asset that
lists later has each feature missing (neutral) for that feature's ``window`` days after its first price."""


def feature_names(requested: Sequence[str]) -> tuple[str, ...]:
    """``data.features`` as the names it stands for: empty or ``builtin`` for every built-in feature, in order."""
    names: list[str] = []
    for name in requested or (BUILTIN,):
        names.extend(FEATURE_NAMES if name == BUILTIN else (name,))
    return tuple(dict.fromkeys(names))


def user_columns(requested: Sequence[str]) -> tuple[str, ...]:
    """The names in ``data.features`` that are no built-in feature: columns of the user's data file."""
    return tuple(name for name in feature_names(requested) if name not in BUILT_IN_FEATURES)


def raw_features(prices: np.ndarray, names: Sequence[str] = FEATURE_NAMES) -> np.ndarray:
    """Unnormalised built-in features of every row, causal in time.

    Args:
        prices: (T, N) positive prices, NaN where an asset has none.
        names: built-in features, in the order of the result's last axis.

    Returns:
        (T, N, K) float64; rows before ``WARMUP_DAYS`` hold NaN or features of incomplete windows.
    """
    frame = pd.DataFrame(np.asarray(prices, dtype=np.float64))  # (T, N)
    listed = frame.notna().to_numpy()
    first = np.where(listed.any(axis=0), listed.argmax(axis=0), len(frame))  # (N,) each asset's first price
    rows = np.arange(len(frame))[:, None]  # (T, 1)
    values = []
    for name in names:
        feature = BUILT_IN_FEATURES[name]
        value = feature.compute(frame).to_numpy()  # (T, N)
        values.append(np.where(rows < first + feature.window, np.nan, value))  # not yet full after the listing
    return np.stack(values, axis=-1)


def build_market(
    table: PriceTable,
    *,
    lookback: int,
    episode_days: int,
    validation_days: int,
    holdout_days: int,
    gap_days: int = 0,
    gap_before_validation: bool = False,
    features: Sequence[str] = (),
    execution_delay: int = 0,
    cash_rate: float = 0.0,
    risk_free: np.ndarray | None = None,
    delisting_return: float = 0.0,
    capital: float = 1_000_000.0,
    impact_coefficient: float = 0.5,
    max_participation: float = 0.1,
    statistics_rows: int | None = None,
    device: torch.device | str = "cpu",
) -> Market:
    """Builds the features, relatives and splits of a price table, on ``device``.

    The first ``WARMUP_DAYS`` rows of the table are dropped; of the T rows left, the holdout is the
    last ``holdout_days``, then ``gap_days`` that no decision trades, validation the ``validation_days``
    before them, then (``gap_before_validation``) ``gap_days`` more, the embargo, and train everything before (see
    the time conventions in ``environment.market``).

    It reads whole: past its arguments, documented once here, the body is five calls (the splits, the inputs, the
    daily relatives, cash and the trades' size terms) and the ``Market`` they fill.

    Args:
        features: ``data.features``: built-in names and columns of ``table.columns`` (empty: the built-in ones).
        execution_delay: days from a decision to its fill; the training range must hold one episode after it.
        cash_rate: what cash earns, an annual rate.
        risk_free: (rows of ``table``,) cash's annual rate by day, instead of ``cash_rate``; a day's rate is known at
            its close and earned over the next day.
        delisting_return: what a holding earns on the first day after its ticker's last price when the file gives
            no delisting return for it (``data.delisting_return``).
        capital, impact_coefficient, max_participation: with a volume column (``table.volumes``), what sizes the
            book's trades against each day's traded value (``size_terms``).
        statistics_rows: the rows after the warm-up whose features give the normalisation statistics and decide the
            ``tradable`` input; None: the training range. A run's own count when the table extends its data (``trade``:
            the same rows give the same statistics, bit for bit).

    Raises:
        DataError: the table has too few rows for one training episode plus validation and holdout, or a feature
            is neither built in nor a column of the table, or a column has no value on the training days.
    """
    splits = _splits(
        table,
        lookback=lookback,
        episode_days=episode_days,
        validation_days=validation_days,
        holdout_days=holdout_days,
        gap_days=gap_days,
        gap_before_validation=gap_before_validation,
        execution_delay=execution_delay,
    )
    fitted = splits.train.stop if statistics_rows is None else statistics_rows  # the rows the inputs are fitted on
    values, mean, std, names, definitions, tradable = _inputs(table, feature_names(features), fitted)
    relatives, levels, last_day = _daily_relatives(table, delisting_return)
    benchmark = None if table.benchmark is None else _relatives(table.benchmark)  # (T,)
    cash = _cash_relatives(table.num_days, cash_rate, risk_free)
    impact = capacity = None
    if table.volumes is not None:
        impact, capacity = size_terms(
            levels, table.volumes, capital=capital, coefficient=impact_coefficient, participation=max_participation
        )
        impact, capacity = impact[WARMUP_DAYS:], capacity[WARMUP_DAYS:]
    device = torch.device(device)
    return Market(
        dates=tuple(table.dates[WARMUP_DAYS:].strftime("%Y-%m-%d")),
        tickers=tuple(table.tickers),
        feature_names=tuple(names),
        feature_definitions=tuple(definitions),
        features=_to_tensor(values, device),
        relatives=_to_tensor(relatives, device),
        splits=splits,
        benchmark=None if benchmark is None else _to_tensor(benchmark, device),
        benchmark_label=table.benchmark_label,
        tradable=None if tradable is None else _to_tensor(tradable, device),
        tradable_fraction=1.0 if tradable is None else float(tradable.mean()),
        last_day=None
        if (last_day >= table.num_days - 1).all()
        else torch.as_tensor(last_day - WARMUP_DAYS, dtype=torch.long, device=device),
        cash_relatives=None if cash is None else _to_tensor(cash, device),
        feature_mean=_to_tensor(mean.astype(np.float32), device),  # (N, K)
        feature_std=_to_tensor(std.astype(np.float32), device),  # (N, K)
        impact=None if impact is None else _to_tensor(impact, device),
        capacity=None if capacity is None else _to_tensor(capacity, device),
        notes=(
            *(note for note in table.notes if note.startswith("data.max_assets=")),
            *universe_notes(table.tradable[WARMUP_DAYS:], table.dates[WARMUP_DAYS:], table.tickers),
        ),
    )


def _splits(
    table: PriceTable,
    *,
    lookback: int,
    episode_days: int,
    validation_days: int,
    holdout_days: int,
    gap_days: int,
    gap_before_validation: bool,
    execution_delay: int,
) -> Splits:
    """The ranges of the rows after the warm-up (``build_market``'s docstring), once the table is checked to hold
    them."""
    for name, value in (
        ("lookback", lookback),
        ("episode_days", episode_days),
        ("validation_days", validation_days),
        ("holdout_days", holdout_days),
    ):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if gap_days < 0 or execution_delay < 0:
        raise ValueError(f"gap_days and execution_delay must be >= 0, got {gap_days} and {execution_delay}")
    # The first training decision needs `lookback` days of features (day lookback - 1) and an episode
    # earns `episode_days` returns from `execution_delay` days after it, all inside train.
    gaps = 2 * gap_days if gap_before_validation else gap_days
    needed = WARMUP_DAYS + lookback + episode_days + execution_delay + validation_days + gaps + holdout_days
    if table.num_days < needed:
        span = f" ({_iso(table.dates[0])} to {_iso(table.dates[-1])})" if table.num_days else ""
        gap = f" + data.gap_days {gap_days}{' x 2' if gap_before_validation else ''}" if gap_days else ""
        delay = f" + env.execution_delay {execution_delay}" if execution_delay else ""
        raise DataError(
            f"the price data has {table.num_days} rows{span} but needs at least {needed}: "
            f"{WARMUP_DAYS} feature warm-up + env.lookback {lookback} + env.episode_days {episode_days}{delay} "
            f"+ data.validation_days {validation_days}{gap} + data.holdout_days {holdout_days}; "
            "use more data (an earlier data.start) or smaller settings"
        )

    num_days = table.num_days - WARMUP_DAYS
    holdout_start = num_days - holdout_days
    validation_start = holdout_start - gap_days - validation_days
    train_stop = validation_start - (gap_days if gap_before_validation else 0)
    return Splits(
        train=range(0, train_stop),
        validation=range(validation_start, validation_start + validation_days),
        holdout=range(holdout_start, num_days),
        gap=range(validation_start + validation_days, holdout_start),
        embargo=range(train_stop, validation_start),
    )


def _inputs(
    table: PriceTable, names: Sequence[str], fitted: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, tuple[str, ...], list[str], np.ndarray | None]:
    """What the networks see, from the rows after the warm-up: the features normalised by the statistics of the first
    ``fitted`` rows (T, N, K) with their mean and spread (N, K), names and definitions (a ``tradable`` input added
    where an asset lacks a price on a training day), and the days each asset trades (T, N; None: every day)."""
    names = tuple(names)
    all_tradable = bool(table.tradable.all())
    raw = _raw_values(table, names)[WARMUP_DAYS:]  # (T, N, K), NaN where missing
    if not all_tradable:
        raw[~table.tradable[WARMUP_DAYS:]] = np.nan  # a day without a price has no feature
    train = raw[:fitted]
    num_assets = raw.shape[1]
    missing = np.isnan(train).any()
    if missing:
        for k in np.flatnonzero(np.isnan(train).all(axis=(0, 1))):
            raise DataError(
                f"data.features: {names[k]} has no value on the training days ({_iso(table.dates[WARMUP_DAYS])} to "
                f"{_iso(table.dates[WARMUP_DAYS + fitted - 1])}), so it cannot be normalised; drop it or use "
                "data from when it has values"
            )
    # One mean and spread per feature over all assets' training days, repeated per asset: (N, K).
    average, spread = (np.nanmean, np.nanstd) if missing else (np.mean, np.std)
    mean = np.broadcast_to(average(train, axis=(0, 1)), (num_assets, train.shape[2])).copy()
    std = np.broadcast_to(spread(train, axis=(0, 1)), (num_assets, train.shape[2])).copy()
    std = np.where(std > _MIN_STD, std, 1.0)  # a constant feature becomes 0, not NaN
    values = np.clip((raw - mean) / std, -FEATURE_CLIP, FEATURE_CLIP).astype(np.float32)
    if np.isnan(values).any():
        values = np.nan_to_num(values, nan=0.0)  # missing is neutral: the training mean
    if not np.isfinite(values).all():
        raise RuntimeError("non-finite features from finite values")
    definitions = [_definition(name) for name in names]

    tradable = None if all_tradable else table.tradable[WARMUP_DAYS:]  # (T, N): the days each asset can trade
    # Whether the networks see a ``tradable`` input is decided on the training days alone, as everything they see is:
    # a market whose only missing prices come after them trains no input it would first meet out of sample.
    if tradable is not None and not tradable[:fitted].all():
        values = np.concatenate([values, tradable[..., None].astype(np.float32)], axis=-1)
        mean = np.concatenate([mean, np.zeros((num_assets, 1))], axis=1)
        std = np.concatenate([std, np.ones((num_assets, 1))], axis=1)
        names, definitions = (*names, TRADABLE), [*definitions, TRADABLE_DEFINITION]
    return values, mean, std, names, definitions, tradable


def _daily_relatives(table: PriceTable, delisting_return: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each asset's daily price relatives after the warm-up (T, N), the price levels they come from (rows, N: the last
    price carried through every gap) and each ticker's last quoted row (N,)."""
    # A day without a price earns nothing and the day trading resumes earns the move from the last price; the first
    # day after a ticker's last price pays its delisting return to whoever holds it then.
    levels = pd.DataFrame(table.prices).ffill().to_numpy()  # (rows, N): the last price carried through every gap
    relatives = _relatives(levels)  # (T, N)
    last_day = _last_days(table.tradable)  # (N,) each ticker's last quoted row of the table
    delisted = np.flatnonzero((last_day < table.num_days - 1) & (last_day + 1 >= WARMUP_DAYS))
    if len(delisted):
        given = table.delisting_returns
        paid = [delisting_return if given is None or np.isnan(given[j]) else given[j] for j in delisted]
        relatives[last_day[delisted] + 1 - WARMUP_DAYS, delisted] = (1.0 + np.asarray(paid)).astype(np.float32)
    return relatives, levels, last_day


SIZE_WINDOW = 20
"""Trading days over which an asset's daily volatility and average daily traded value are measured for its impact."""


def size_terms(
    levels: np.ndarray, volumes: np.ndarray, *, capital: float, coefficient: float, participation: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each day's square-root impact scale and fill capacity of every asset, (rows, N) float32 each.

    A trade of ``|dw|`` of a book worth ``capital`` is ``|dw| * capital`` of traded value; it pays
    ``coefficient * sigma * sqrt(|dw| * capital / adv)`` of itself, so ``impact = coefficient * sigma *
    sqrt(capital / adv)`` and the cost is ``impact * |dw| ** 1.5``. ``sigma`` is the asset's daily log-return
    volatility and ``adv`` its average daily traded value (price x volume), both over the ``SIZE_WINDOW`` days before
    the fill day (known before it trades). A fill takes at most ``participation`` of the fill day's own traded value:
    ``capacity = participation * price * volume / capital``. An asset with no traded value yet cannot trade.
    """
    traded = pd.DataFrame(np.nan_to_num(levels, nan=0.0) * volumes)  # (rows, N) the value traded each day
    with np.errstate(divide="ignore", invalid="ignore"):
        returns = pd.DataFrame(np.log(levels[1:] / levels[:-1]))
    window = dict(window=SIZE_WINDOW, min_periods=2)
    sigma = returns.rolling(**window).std().shift(1).to_numpy()  # (rows - 1, N): the days before each day
    sigma = np.concatenate([np.full((1, levels.shape[1]), np.nan), sigma])
    fallback = np.nanmedian(sigma) if np.isfinite(sigma).any() else 0.02
    sigma = np.where(np.isfinite(sigma) & (sigma > 0), sigma, fallback)
    adv = traded.rolling(window=SIZE_WINDOW, min_periods=1).mean().shift(1).to_numpy()  # before each day
    with np.errstate(divide="ignore", invalid="ignore"):
        impact = np.where(adv > 0, coefficient * sigma * np.sqrt(capital / adv), 0.0)
    capacity = participation * traded.to_numpy() / capital
    return impact.astype(np.float32), capacity.astype(np.float32)


def universe_notes(tradable: np.ndarray, dates: pd.DatetimeIndex, tickers: Sequence[str]) -> list[str]:
    """One line on the tickers whose lives do not span the panel: those that list late, delist, or halt inside their
    life, with counts and the first few named (and when); nothing for a panel where every asset trades every day."""
    late, gone, halted, halt_days = [], [], [], 0
    for j, ticker in enumerate(tickers):
        has = tradable[:, j]
        first, last = int(has.argmax()), len(has) - 1 - int(has[::-1].argmax())
        if first > 0:
            late.append(f"{ticker} on {_iso(dates[first])}")
        if last < len(has) - 1:
            gone.append(f"{ticker} after {_iso(dates[last])}")
        missing = ~has[first : last + 1]
        if missing.any():
            gaps = int((missing[1:] & ~missing[:-1]).sum() + missing[0])
            halted.append(f"{ticker}: {gaps} gap{'s' * (gaps > 1)}, {int(missing.sum())} days")
            halt_days += int(missing.sum())

    def listed(what: str, names: list[str]) -> str:
        more = f"; and {len(names) - 3} more" if len(names) > 3 else ""
        return f"{what} {len(names)} ({'; '.join(names[:3])}{more})"

    parts = [listed(what, names) for what, names in (("listing late", late), ("delisting", gone)) if names]
    if halted:
        parts.append(f"{listed('halting', halted)}, {halt_days} asset-days without a price inside their lives")
    return [f"universe: tickers {', '.join(parts)}"] if parts else []


def _raw_values(table: PriceTable, names: Sequence[str]) -> np.ndarray:
    """(rows, N, K) float64 raw values of the named features: built-in ones from the prices, the others the table's
    columns."""
    unknown = [name for name in names if name not in BUILT_IN_FEATURES and name not in table.columns]
    if unknown:
        raise DataError(
            f"data.features: {unknown[0]} is neither a built-in feature ({', '.join(BUILT_IN_FEATURES)}) nor a "
            "column of the data file"
        )
    built_in = [name for name in names if name in BUILT_IN_FEATURES]
    computed = raw_features(table.prices, built_in) if built_in else None  # (rows, N, K built in)
    if len(built_in) == len(names):  # the prices' features alone, in order
        return computed
    columns = {name: computed[..., k] for k, name in enumerate(built_in)} | dict(table.columns)
    return np.stack([np.asarray(columns[name], dtype=np.float64) for name in names], axis=-1)


def _definition(name: str) -> str:
    if name in BUILT_IN_FEATURES:
        return BUILT_IN_FEATURES[name].definition
    return f"the data file's column {name!r}, its value dated t known at the close of t (the last one carried on)"


def _last_days(quoted: np.ndarray) -> np.ndarray:
    """(N,) each asset's last row with a price (``quoted`` (T, N))."""
    return len(quoted) - 1 - quoted[::-1].argmax(axis=0)


def _relatives(levels: np.ndarray) -> np.ndarray:
    """price[t] / price[t - 1] for the rows kept after the warm-up, the first from the row before it; 1 where either
    price is missing (a holding keeps the value it last had)."""
    levels = np.asarray(levels, dtype=np.float64)
    relatives = levels[WARMUP_DAYS:] / levels[WARMUP_DAYS - 1 : -1]
    if np.isnan(relatives).any():
        relatives = np.where(np.isnan(relatives), 1.0, relatives)
    return relatives.astype(np.float32)


def _cash_relatives(rows: int, cash_rate: float, risk_free: np.ndarray | None) -> np.ndarray | None:
    """(rows after the warm-up,) what cash earns each day, ``(1 + annual rate) ** (1 / 252)`` at the rate of the close
    before; None when it earns nothing."""
    if risk_free is None:
        if cash_rate == 0.0:
            return None
        rates = np.full(rows - WARMUP_DAYS, cash_rate)
    else:
        rates = np.asarray(risk_free, dtype=np.float64)[WARMUP_DAYS - 1 : -1]
    if not rates.any():
        return None
    return np.power(1.0 + rates, 1.0 / TRADING_DAYS).astype(np.float32)


def _to_tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array)).to(device).contiguous()


def _iso(date: pd.Timestamp) -> str:
    return pd.Timestamp(date).strftime("%Y-%m-%d")
