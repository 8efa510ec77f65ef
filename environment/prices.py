"""Loading and validating daily price files into one aligned ``PriceTable``, and a user's series files.

Formats, chosen by extension: ``.csv``, ``.csv.gz``, ``.parquet`` / ``.pq``.

* **Wide**: a date column (named date, datetime, timestamp or time, in any case; for Parquet also
  the index; otherwise a first column whose values parse as dates), then one price column per ticker.
* **Long**: a date column, a ticker column (ticker, symbol, tic or asset) and price columns such as
  open, high, low, close, adj close and volume, in any capitalisation and with or without spaces or
  underscores. The price is the adjusted close if there is one, else the close, else a ``price``
  column; open, high, low and volume are never used as the price. The table is pivoted to wide.

Order of work: parse and check dates (unparseable or duplicate dates are errors; unsorted dates are
sorted), select ``tickers``, keep the rows between ``start`` and ``end`` (inclusive), check prices
(non-numeric, non-finite or non-positive values are errors), then close the gaps.

Gap policy. Rows where none of the selected tickers has a price (a holiday row, or a day only an
unselected ticker traded) are dropped, with a note. Then the ``universe`` rule applies:

* ``"common"``: the table is trimmed to the dates where every ticker has data: a ticker that starts
  late moves the first date, one that ends early moves the last date, and a note names it and the
  rows dropped. Inside that range, a run of at most ``max_fill_days`` consecutive missing rows of one
  ticker is forward-filled (the asset earns a zero return on those days), with a note per ticker; a
  longer run is a ``DataError`` naming the ticker and the dates. Every price is finite and positive.
* ``"point_in_time"``: every row is kept, so a ticker that lists or delists mid-sample neither
  shortens the others' history nor survives where it did not trade. Each ticker lives from its first
  to its last price and is NaN outside that range. Inside it, a day without a price is untradable
  whatever the gap's length (nobody knows on its first day how long a halt will last):
  ``PriceTable.tradable`` (``quoted``) is False there. A run of at most ``max_fill_days`` such days
  carries the last price forward in ``prices`` for the features' sake only; a longer run stays NaN;
  each with a note. A long file may give a ``delisting_return`` (or ``dlret``) column: on a ticker's
  last row, what holders received after its last close (CRSP's convention), in
  ``PriceTable.delisting_returns``.

A long file's ``volume`` column (shares traded that day) is read as it is, day by day, into
``PriceTable.volumes`` (0 where a day has none): with it, trades pay a cost that grows with their size
against the day's traded value, and none takes more than a fraction of it (``environment.features``).

User columns (``columns``): other numeric columns of a long file, such as volume or the user's own
signal, loaded per asset on the table's dates and tickers. A value is forward-filled within its
ticker's life (the last known value is what is known at the close of a day, however old), and is NaN
before the ticker's first value and outside its life. Booleans read as 0 and 1. A wide file holds
only prices, so it has no user columns.

Series files (``load_series``): a date column and one numeric column, a benchmark's total-return
index level or an annual risk-free rate as a decimal, aligned to the table's dates: the file must
cover them all, and a date it lacks takes the last earlier value if the run of such dates is at most
``max_fill_days`` long.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np
import pandas as pd

from environment.price_files import (
    check_unique_dates,
    filter_dates,
    find_date_column,
    find_price_column,
    iso,
    match_columns,
    normalise,
    parse_dates,
    parse_tickers,
    pivot,
    read_file,
    requested_columns,
    select_tickers,
    wide_columns,
)
from environment.price_gaps import (
    MAX_SHOWN,
    SERIES_VALUES,
    align_columns,
    check_column,
    check_prices,
    check_series,
    close_gaps,
    close_gaps_point_in_time,
    lives,
    missing_runs,
    series_column,
)
from utils.errors import DataError

DATA_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_PRICES = DATA_DIR / "sp500_20_daily_close.csv.gz"
"""Daily closes of 20 S&P 500 stocks, 1990-01-02 to 2022-12-28 (8313 rows)."""
BUNDLED_BENCHMARK = DATA_DIR / "sp500_index_daily.csv.gz"
"""The S&P 500 index on the same dates (column ``SP500``), the bundled data set's benchmark."""
BUNDLED_BENCHMARK_LABEL = "S&P 500 price index (no dividends)"
"""The bundled benchmark is the index's price level: it leaves out the dividends that the bundled stocks' adjusted
closes include (about 2 % a year over 1990-2022), so it is named for what it is wherever it is shown."""
_BENCHMARK_COLUMN = "SP500"

_TICKER_NAMES = ("ticker", "symbol", "tic", "asset")
# Price columns of a long file by normalised name (lower case, letters and digits only), best first.
_DELISTING_NAMES = ("delistingreturn", "dlret")
"""A long file's delisting return column (normalised names): on a ticker's last row, the return from its last close
to what holders received (CRSP's convention)."""

UNIVERSES = ("common", "point_in_time")
"""The rules that decide which dates and prices a table holds (see the module docstring)."""
_DELISTING_KEY = "\0delisting_return"
_VOLUME_KEY = "\0volume"
"""The loader's own name for a long file's volume column (shares traded that day), beside any use as a feature."""
"""The loader's own name for a long file's delisting return column among the columns it reads (no user's name)."""


@dataclass(frozen=True, eq=False)
class PriceTable:
    """Daily prices of N assets on T dates, aligned; NaN only where a point-in-time ticker cannot trade."""

    dates: pd.DatetimeIndex
    """Strictly increasing, unique, tz-naive dates normalised to midnight."""
    tickers: tuple[str, ...]
    """Asset names, in column order."""
    prices: np.ndarray
    """(T, N) float64; every value finite and positive, except NaN on untradable days under point_in_time."""
    benchmark: np.ndarray | None = None
    """(T,) float64 benchmark index levels on the same dates, or None."""
    benchmark_label: str = "benchmark"
    """What the benchmark is, as reports name it."""
    notes: tuple[str, ...] = ()
    """Human-readable lines on what loading did (rows trimmed, days filled, dates sorted)."""
    universe: str = "common"
    """The rule that made the table: "common" (no NaN) or "point_in_time" (NaN outside a ticker's life)."""
    columns: Mapping[str, np.ndarray] = field(default_factory=lambda: MappingProxyType({}))
    """User columns by the name they were asked by: (T, N) float64, NaN where no value is known."""
    quoted: np.ndarray | None = None
    """(T, N) bool, where the file has a price that day (a day whose price a short gap carried forward has none);
    None: wherever ``prices`` is not NaN."""
    delisting_returns: np.ndarray | None = None
    """(N,) float64, each ticker's delisting return from the file (on its last row), NaN where it gives none; None: a
    file without such a column."""
    volumes: np.ndarray | None = None
    """(T, N) float64, the shares of each ticker traded each day from a long file's volume column, 0 where the file
    gives none that day (nothing can be known to trade); None: a file without one (costs do not grow with size)."""

    def __post_init__(self) -> None:
        num_days, num_assets = len(self.dates), len(self.tickers)
        if self.universe not in UNIVERSES:
            raise ValueError(f"universe must be one of {', '.join(UNIVERSES)}, got {self.universe!r}")
        if self.prices.shape != (num_days, num_assets):
            raise ValueError(f"prices have shape {self.prices.shape}, expected ({num_days}, {num_assets})")
        if not self.dates.is_monotonic_increasing or not self.dates.is_unique:
            raise ValueError("dates must be strictly increasing")
        present = self.prices if self.universe == "common" else self.prices[~np.isnan(self.prices)]
        if not (np.isfinite(present).all() and (present > 0).all()):
            allowed = "" if self.universe == "common" else " where present"
            raise ValueError(f"prices must be finite and positive{allowed} (universe={self.universe})")
        if self.benchmark is not None:
            if self.benchmark.shape != (num_days,):
                raise ValueError(f"benchmark has shape {self.benchmark.shape}, expected ({num_days},)")
            if not (np.isfinite(self.benchmark).all() and (self.benchmark > 0).all()):
                raise ValueError("benchmark levels must be finite and positive")
        for name, values in self.columns.items():
            if values.shape != (num_days, num_assets) or values.dtype != np.float64:
                raise ValueError(
                    f"column {name!r} is {values.dtype} of shape {values.shape}, expected float64 "
                    f"({num_days}, {num_assets})"
                )
            if np.isinf(values).any():
                raise ValueError(f"column {name!r} must be finite where present")

    @property
    def num_days(self) -> int:
        return len(self.dates)

    @property
    def num_assets(self) -> int:
        return len(self.tickers)

    @property
    def tradable(self) -> np.ndarray:
        """(T, N) bool, True where the asset has a price that day (``quoted``); all True under common, whose short gaps
        are carried forward and trade."""
        return ~np.isnan(self.prices) if self.quoted is None else self.quoted


def load_prices(
    path: str | Path | None = None,
    *,
    tickers: Sequence[str] = (),
    start: str = "",
    end: str = "",
    max_fill_days: int = 5,
    max_assets: int = 0,
    universe: str = "common",
    columns: Sequence[str] = (),
) -> PriceTable:
    """Reads, validates and aligns a price file (see the module docstring for formats and gap policy).

    Args:
        path: CSV, gzipped CSV or Parquet file; None or "" loads the bundled 20-stock data set with
            the S&P 500 index as its benchmark. A user's file has no benchmark (see ``load_series``).
        tickers: tickers to keep, in this order; empty keeps every ticker in file order.
        start: first date to keep (YYYY-MM-DD, inclusive); empty keeps from the first date.
        end: last date to keep (YYYY-MM-DD, inclusive); empty keeps to the last date.
        max_fill_days: longest run of missing rows of one ticker that is forward-filled.
        max_assets: with no ``tickers``, keep only the first this many tickers in file order; 0 keeps all.
        universe: "common" trims to the dates every ticker has; "point_in_time" keeps every date and
            leaves NaN where a ticker has not listed yet, has delisted or has a long gap.
        columns: other numeric columns of a long file to load per asset, by name as written in the
            file (a case-insensitive match if it is the only one); ``PriceTable.columns`` holds them
            under these names.

    Raises:
        DataError: the file is missing, unreadable or fails validation; the one-line message says
            what and where.
    """
    if max_fill_days < 0:
        raise DataError(f"max_fill_days must be >= 0, got {max_fill_days}")
    if universe not in UNIVERSES:
        raise DataError(f"universe must be one of {', '.join(UNIVERSES)}, got {universe!r}")
    requested = requested_columns(columns)
    bundled = path is None or str(path) == ""
    file = BUNDLED_PRICES if bundled else Path(path).expanduser()
    frame, values, notes = _load_wide(
        file, tickers=tickers, start=start, end=end, max_assets=max_assets, columns=requested
    )
    delisting = values.pop(_DELISTING_KEY, None)  # (S, N), the file's delisting returns, if it has them
    volume = values.pop(_VOLUME_KEY, None)  # (S, N), the shares traded, if the file has them
    life = lives(frame)
    source_dates = frame.index
    quoted = None
    if universe == "common":
        frame = close_gaps(frame, file, max_fill_days, notes)
    else:
        frame, quoted = close_gaps_point_in_time(frame, file, max_fill_days, notes)
    aligned = align_columns(values, life, source_dates, frame.index, file, notes)
    delisting_returns = None if delisting is None else _delisting_returns(delisting, life, file)
    volumes = None if volume is None else _volumes(volume, frame.index, file)

    prices = frame.to_numpy(dtype=np.float64, copy=True)
    benchmark = _bundled_benchmark(frame.index) if bundled else None
    prices.setflags(write=False)
    return PriceTable(
        dates=frame.index,
        tickers=tuple(frame.columns),
        prices=prices,
        benchmark=benchmark,
        benchmark_label=BUNDLED_BENCHMARK_LABEL if bundled else "benchmark",
        notes=tuple(notes),
        universe=universe,
        columns=MappingProxyType(aligned),
        quoted=quoted,
        delisting_returns=delisting_returns,
        volumes=volumes,
    )


def _volumes(values: pd.DataFrame, dates: pd.DatetimeIndex, file: Path) -> np.ndarray:
    """(T, N) the shares traded on the table's ``dates``: 0 on a day the file gives none (no carry: a day's volume is
    that day's); a negative one is an error."""
    array = values.reindex(dates).to_numpy(dtype=np.float64, copy=True)
    bad = np.argwhere(array < 0)
    if len(bad):
        row, column = bad[0]
        raise DataError(
            f"{file}: volume {array[row, column]:g} for ticker {values.columns[column]} on {iso(dates[row])} is "
            "negative (shares traded that day)"
        )
    array = np.nan_to_num(array, nan=0.0)
    array.setflags(write=False)
    return array


def _delisting_returns(values: pd.DataFrame, life: np.ndarray, file: Path) -> np.ndarray:
    """(N,) each ticker's delisting return, the value on its last priced row (NaN where the file gives none there);
    one below -1 (more than the whole holding lost) is an error."""
    array = values.to_numpy(dtype=np.float64)  # (S, N)
    last = len(life) - 1 - life[::-1].argmax(axis=0)  # (N,) each ticker's last priced row
    returns = array[last, np.arange(array.shape[1])]
    bad = np.flatnonzero(returns < -1.0)
    if len(bad):
        ticker = values.columns[int(bad[0])]
        raise DataError(
            f"{file}: delisting return {returns[bad[0]]:g} for ticker {ticker} is below -1 (a holding cannot lose more "
            "than all of it)"
        )
    return returns


def load_series(
    path: str | Path,
    dates: pd.DatetimeIndex,
    *,
    what: Literal["benchmark", "risk_free"],
    max_fill_days: int = 5,
) -> np.ndarray:
    """Reads a user's one-value-a-day file (a date column and one numeric column) on the table's dates.

    Args:
        path: CSV, gzipped CSV or Parquet file.
        dates: the price table's dates; the file must cover the first to the last of them.
        what: "benchmark" for total-return index levels (positive) or "risk_free" for annual rates as
            decimals (0.05 is 5 %; a value above 1 is taken for a percentage and rejected).
        max_fill_days: longest run of table dates the file lacks that take the last earlier value.

    Returns:
        (T,) float64, read-only.

    Raises:
        DataError: the file is missing, unreadable, does not cover the dates or holds a bad value.
    """
    if what not in SERIES_VALUES:
        raise ValueError(f"what must be one of {', '.join(SERIES_VALUES)}, got {what!r}")
    dates = pd.DatetimeIndex(dates)
    if len(dates) == 0 or not dates.is_monotonic_increasing or not dates.is_unique:
        raise ValueError("dates must be non-empty and strictly increasing")
    if max_fill_days < 0:
        raise DataError(f"max_fill_days must be >= 0, got {max_fill_days}")
    label = SERIES_VALUES[what]
    file = Path(path).expanduser()
    raw, where = read_file(file, label=f"{what.replace('_', '-')} file")
    if raw.empty:
        raise DataError(f"{file}: empty file (no rows)")
    date_col = find_date_column(raw, file)
    file_dates = parse_dates(raw[date_col], file, date_col, where)
    check_unique_dates(file_dates, file, where)
    column = series_column(raw, file, date_col)

    present = raw[column].notna().to_numpy()
    if not present.any():
        raise DataError(f"{file}: column {column!r} has no values")
    order = np.argsort(file_dates.to_numpy(), kind="stable")
    order = order[present[order]]  # (R,) rows with a value, by date
    known = file_dates[order]
    first, last = known[0], known[-1]
    uncovered = dates[(dates < first) | (dates > last)]
    if len(uncovered):
        raise DataError(
            f"{file}: no {label} on {iso(uncovered[0])}; the file has values from {iso(first)} to {iso(last)}, "
            f"the prices run from {iso(dates[0])} to {iso(dates[-1])}"
        )
    at = known.searchsorted(dates, side="right") - 1  # (T,) the last row on or before each date
    used = order[at[0] : at[-1] + 1]
    numbers = check_series(raw[column].iloc[used], file_dates[used], file, column, what)

    lacking = np.asarray(known[at] != dates)  # (T,)
    runs = missing_runs(lacking)
    if runs:
        begin, length = max(runs, key=lambda run: run[1])
        if length > max_fill_days:
            raise DataError(
                f"{file}: no {label} on {length} consecutive price dates, {iso(dates[begin])} to "
                f"{iso(dates[begin + length - 1])}, more than max_fill_days={max_fill_days}"
            )
    series = numbers[at - at[0]].copy()
    series.setflags(write=False)
    return series


def _value_columns(
    raw: pd.DataFrame, file: Path, columns: Sequence[str], *, exclude: tuple[str, ...]
) -> tuple[list[str], tuple[str, ...]]:
    """The file's columns read beside the price in a long file, and the names they are read as: the requested
    ``columns``, then a delisting return and a volume where the file has them."""
    normalised = {c: normalise(c) for c in raw.columns}
    sources = match_columns(columns, raw, file, exclude=exclude)
    columns = tuple(columns)
    delisting_col = next((c for c in raw.columns if normalised[c] in _DELISTING_NAMES), None)
    if delisting_col is not None and delisting_col not in sources:
        sources.append(delisting_col)
        columns = (*columns, _DELISTING_KEY)
    volume_col = next((c for c in raw.columns if normalised[c] == "volume"), None)
    if volume_col is not None:  # read on its own too: a feature's copy is forward-filled, a day's volume is not
        sources.append(volume_col)
        columns = (*columns, _VOLUME_KEY)
    return sources, columns


def _first_tickers(selected: list[str], max_assets: int) -> tuple[list[str], str]:
    """The first ``max_assets`` tickers in file order (``data.max_assets``), and the note that names the others."""
    left_out = selected[max_assets:]
    shown = ", ".join(left_out[:MAX_SHOWN]) + (
        f" and {len(left_out) - MAX_SHOWN} more" if len(left_out) > MAX_SHOWN else ""
    )
    note = (
        f"data.max_assets={max_assets} keeps the file's first {max_assets} of {len(selected)} tickers, in file "
        f"order; left out: {shown} (name them with data.tickers to choose)"
    )
    return selected[:max_assets], note


def _load_wide(
    file: Path,
    *,
    tickers: Sequence[str],
    start: str,
    end: str,
    max_assets: int = 0,
    columns: Sequence[str] = (),
) -> tuple[pd.DataFrame, dict[str, pd.DataFrame], list[str]]:
    """A float64 wide frame indexed by sorted dates, restricted to tickers and [start, end]; may hold NaN.

    With it, each requested user column as a float64 wide frame on the same dates and tickers.
    """
    raw, where = read_file(file)
    if raw.empty:
        raise DataError(f"{file}: empty file (no rows)")
    notes: list[str] = []
    date_col = find_date_column(raw, file)
    dates = parse_dates(raw[date_col], file, date_col, where)
    sources: list[str] = []

    normalised = {c: normalise(c) for c in raw.columns}
    ticker_col = next((c for name in _TICKER_NAMES for c in raw.columns if normalised[c] == name), None)
    if ticker_col is None:
        if columns:
            raise DataError(
                f"{file}: column {columns[0]!r} needs a long file (date, ticker and value columns); "
                "a wide file holds only prices, one column per ticker"
            )
        frame = wide_columns(raw, file, date_col, dates, where)
        available = list(frame.columns)
    else:
        price_col = find_price_column(raw, file, exclude=(date_col, ticker_col))
        sources, columns = _value_columns(raw, file, columns, exclude=(date_col, ticker_col))
        frame = pd.DataFrame(
            {
                "ticker": parse_tickers(raw[ticker_col], file, ticker_col, where),
                "price": raw[price_col],
                **{f"column{k}": raw[source] for k, source in enumerate(sources)},
            }
        )
        frame.index = dates
        available = list(pd.unique(frame["ticker"]))

    if not frame.index.is_monotonic_increasing:
        frame = frame.iloc[np.argsort(frame.index.to_numpy(), kind="stable")]
        notes.append("dates were not in ascending order: sorted them")

    selected = select_tickers(tickers, available, file)
    if max_assets and not tickers and len(selected) > max_assets:
        selected, note = _first_tickers(selected, max_assets)
        notes.append(note)
    frame = filter_dates(frame, file, start, end)
    if ticker_col is None:
        checked = {t: check_prices(frame[t], file, lambda _i, t=t: t) for t in selected}
        return pd.DataFrame(checked, index=frame.index, columns=selected), {}, notes

    frame = frame[frame["ticker"].isin(selected)]
    ticker_at = frame["ticker"].to_numpy()
    frame = frame.assign(
        price=check_prices(frame["price"], file, lambda i: ticker_at[i]),
        **{
            f"column{k}": check_column(frame[f"column{k}"], file, source, lambda i: ticker_at[i])
            for k, source in enumerate(sources)
        },
    )
    pairs = pd.MultiIndex.from_arrays([frame.index, frame["ticker"]])
    if pairs.has_duplicates:
        date, ticker = pairs[pairs.duplicated()][0]
        raise DataError(f"{file}: more than one row for ticker {ticker} on {iso(date)}")
    wide = pivot(frame, "price", selected)
    values = {name: pivot(frame, f"column{k}", selected) for k, name in enumerate(columns)}
    return wide, values, notes


def _bundled_benchmark(dates: pd.DatetimeIndex) -> np.ndarray:
    index, _, _ = _load_wide(BUNDLED_BENCHMARK, tickers=(_BENCHMARK_COLUMN,), start="", end="")
    levels = index[_BENCHMARK_COLUMN].reindex(dates)
    if levels.isna().any():
        missing = levels.index[levels.isna()][0]
        raise DataError(f"{BUNDLED_BENCHMARK}: no {_BENCHMARK_COLUMN} level on {iso(missing)}")
    benchmark = levels.to_numpy(dtype=np.float64, copy=True)
    benchmark.setflags(write=False)
    return benchmark
