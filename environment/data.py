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
against the day's traded value, and none takes more than a share of it (``environment.features``).

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

import re
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Literal

import numpy as np
import pandas as pd

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

_DATE_NAMES = ("date", "datetime", "timestamp", "time")
_TICKER_NAMES = ("ticker", "symbol", "tic", "asset")
# Price columns of a long file by normalised name (lower case, letters and digits only), best first.
_PRICE_NAMES = (
    ("adjusted close", ("adjclose", "adjustedclose", "adjcloseprice", "adjustedcloseprice")),
    ("close", ("close", "closeprice", "closingprice")),
    ("price", ("price",)),
)
_OHLCV_NAMES = {"open", "high", "low", "volume", "close", "adjclose", "adjustedclose"}
_DELISTING_NAMES = ("delistingreturn", "dlret")
"""A long file's delisting return column (normalised names): on a ticker's last row, the return from its last close
to what holders received (CRSP's convention)."""
_READ_ERRORS = (ValueError, TypeError, OSError, EOFError, UnicodeDecodeError, zlib.error, pd.errors.ParserError)

UNIVERSES = ("common", "point_in_time")
"""The rules that decide which dates and prices a table holds (see the module docstring)."""
_SERIES_VALUES = {"benchmark": "benchmark level", "risk_free": "risk-free rate"}
_MAX_NOTED = 10
"""More tickers than this that start late or end early are summed up in one note."""
_MAX_SHOWN = 3
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
    requested = _requested_columns(columns)
    bundled = path is None or str(path) == ""
    file = BUNDLED_PRICES if bundled else Path(path).expanduser()
    frame, values, notes = _load_wide(
        file, tickers=tickers, start=start, end=end, max_assets=max_assets, columns=requested
    )
    delisting = values.pop(_DELISTING_KEY, None)  # (S, N), the file's delisting returns, if it has them
    volume = values.pop(_VOLUME_KEY, None)  # (S, N), the shares traded, if the file has them
    life = _lives(frame)
    source_dates = frame.index
    quoted = None
    if universe == "common":
        frame = _close_gaps(frame, file, max_fill_days, notes)
    else:
        frame, quoted = _close_gaps_point_in_time(frame, file, max_fill_days, notes)
    aligned = _align_columns(values, life, source_dates, frame.index, file, notes)
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
            f"{file}: volume {array[row, column]:g} for ticker {values.columns[column]} on {_iso(dates[row])} is "
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
    if what not in _SERIES_VALUES:
        raise ValueError(f"what must be one of {', '.join(_SERIES_VALUES)}, got {what!r}")
    dates = pd.DatetimeIndex(dates)
    if len(dates) == 0 or not dates.is_monotonic_increasing or not dates.is_unique:
        raise ValueError("dates must be non-empty and strictly increasing")
    if max_fill_days < 0:
        raise DataError(f"max_fill_days must be >= 0, got {max_fill_days}")
    label = _SERIES_VALUES[what]
    file = Path(path).expanduser()
    raw, where = _read_file(file, label=f"{what.replace('_', '-')} file")
    if raw.empty:
        raise DataError(f"{file}: empty file (no rows)")
    date_col = _find_date_column(raw, file)
    file_dates = _parse_dates(raw[date_col], file, date_col, where)
    _check_unique_dates(file_dates, file, where)
    column = _series_column(raw, file, date_col)

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
            f"{file}: no {label} on {_iso(uncovered[0])}; the file has values from {_iso(first)} to {_iso(last)}, "
            f"the prices run from {_iso(dates[0])} to {_iso(dates[-1])}"
        )
    at = known.searchsorted(dates, side="right") - 1  # (T,) the last row on or before each date
    used = order[at[0] : at[-1] + 1]
    numbers = _check_series(raw[column].iloc[used], file_dates[used], file, column, what)

    lacking = np.asarray(known[at] != dates)  # (T,)
    runs = _missing_runs(lacking)
    if runs:
        begin, length = max(runs, key=lambda run: run[1])
        if length > max_fill_days:
            raise DataError(
                f"{file}: no {label} on {length} consecutive price dates, {_iso(dates[begin])} to "
                f"{_iso(dates[begin + length - 1])}, more than max_fill_days={max_fill_days}"
            )
    series = numbers[at - at[0]].copy()
    series.setflags(write=False)
    return series


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
    raw, where = _read_file(file)
    if raw.empty:
        raise DataError(f"{file}: empty file (no rows)")
    notes: list[str] = []
    date_col = _find_date_column(raw, file)
    dates = _parse_dates(raw[date_col], file, date_col, where)
    sources: list[str] = []

    normalised = {c: _normalise(c) for c in raw.columns}
    ticker_col = next((c for name in _TICKER_NAMES for c in raw.columns if normalised[c] == name), None)
    if ticker_col is None:
        if columns:
            raise DataError(
                f"{file}: column {columns[0]!r} needs a long file (date, ticker and value columns); "
                "a wide file holds only prices, one column per ticker"
            )
        frame = _wide_columns(raw, file, date_col, dates, where)
        available = list(frame.columns)
    else:
        price_col = _find_price_column(raw, file, exclude=(date_col, ticker_col))
        sources = _match_columns(columns, raw, file, exclude=(date_col, ticker_col))
        delisting_col = next((c for c in raw.columns if normalised[c] in _DELISTING_NAMES), None)
        if delisting_col is not None and delisting_col not in sources:
            sources.append(delisting_col)
            columns = (*columns, _DELISTING_KEY)
        volume_col = next((c for c in raw.columns if normalised[c] == "volume"), None)
        if volume_col is not None:  # read on its own too: a feature's copy is forward-filled, a day's volume is not
            sources.append(volume_col)
            columns = (*columns, _VOLUME_KEY)
        frame = pd.DataFrame(
            {
                "ticker": _parse_tickers(raw[ticker_col], file, ticker_col, where),
                "price": raw[price_col],
                **{f"column{k}": raw[source] for k, source in enumerate(sources)},
            }
        )
        frame.index = dates
        available = list(pd.unique(frame["ticker"]))

    if not frame.index.is_monotonic_increasing:
        frame = frame.iloc[np.argsort(frame.index.to_numpy(), kind="stable")]
        notes.append("dates were not in ascending order: sorted them")

    selected = _select_tickers(tickers, available, file)
    if max_assets and not tickers and len(selected) > max_assets:
        left_out = selected[max_assets:]
        shown = ", ".join(left_out[:_MAX_SHOWN]) + (
            f" and {len(left_out) - _MAX_SHOWN} more" if len(left_out) > _MAX_SHOWN else ""
        )
        notes.append(
            f"data.max_assets={max_assets} keeps the file's first {max_assets} of {len(selected)} tickers, in file "
            f"order; left out: {shown} (name them with data.tickers to choose)"
        )
        selected = selected[:max_assets]
    frame = _filter_dates(frame, file, start, end)
    if ticker_col is None:
        checked = {t: _check_prices(frame[t], file, lambda _i, t=t: t) for t in selected}
        return pd.DataFrame(checked, index=frame.index, columns=selected), {}, notes

    frame = frame[frame["ticker"].isin(selected)]
    ticker_at = frame["ticker"].to_numpy()
    frame = frame.assign(
        price=_check_prices(frame["price"], file, lambda i: ticker_at[i]),
        **{
            f"column{k}": _check_column(frame[f"column{k}"], file, source, lambda i: ticker_at[i])
            for k, source in enumerate(sources)
        },
    )
    pairs = pd.MultiIndex.from_arrays([frame.index, frame["ticker"]])
    if pairs.has_duplicates:
        date, ticker = pairs[pairs.duplicated()][0]
        raise DataError(f"{file}: more than one row for ticker {ticker} on {_iso(date)}")
    wide = _pivot(frame, "price", selected)
    values = {name: _pivot(frame, f"column{k}", selected) for k, name in enumerate(columns)}
    return wide, values, notes


def _pivot(frame: pd.DataFrame, key: str, selected: list[str]) -> pd.DataFrame:
    wide = frame.pivot(columns="ticker", values=key)
    wide = wide.reindex(columns=selected)
    wide.columns.name = None
    wide.index.name = None
    return wide.astype(np.float64)


def _requested_columns(columns: Sequence[str]) -> tuple[str, ...]:
    if isinstance(columns, str):
        columns = [columns]
    names = tuple(str(name).strip() for name in columns)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(f"column(s) requested more than once: {', '.join(repeated)}")
    return names


def _match_columns(requested: Sequence[str], raw: pd.DataFrame, file: Path, *, exclude: tuple[str, str]) -> list[str]:
    """The file's column for each requested name: the exact name, else the only case-insensitive match."""
    sources: dict[str, str] = {}
    for name in requested:
        found = [name] if name in raw.columns else [c for c in raw.columns if c.lower() == name.lower()]
        if len(found) > 1:
            raise DataError(
                f"{file}: no column {name!r}, and it matches {', '.join(found)} but for case; use the exact name"
            )
        if not found:
            numeric = [c for c in raw.columns if c not in exclude and pd.api.types.is_numeric_dtype(raw[c])]
            raise DataError(f"{file}: no column {name!r}; numeric columns: {', '.join(numeric) if numeric else 'none'}")
        if found[0] in exclude:
            raise DataError(f"{file}: column {found[0]!r} holds the dates or the tickers, not values to load")
        twice = next((other for other, source in sources.items() if source == found[0]), None)
        if twice is not None:
            raise DataError(f"{file}: columns {twice!r} and {name!r} both name column {found[0]!r}; ask for it once")
        sources[name] = found[0]
    return list(sources.values())


def _read_file(file: Path, label: str = "price file") -> tuple[pd.DataFrame, Callable[[int], str]]:
    """The file as pandas reads it, with string column names, and a function naming a row's position."""
    name = file.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        kind = "csv"
    elif name.endswith((".parquet", ".pq")):
        kind = "parquet"
    else:
        raise DataError(f"{file}: unknown file type; expected .csv, .csv.gz, .parquet or .pq")
    if file.is_dir():
        raise DataError(f"{file} is a folder, not a {label}; pass the CSV or Parquet file itself")
    if not file.is_file():
        raise DataError(f"{label} not found: {file}")
    try:
        if kind == "csv":
            # pandas renames a repeated header ("AAA", "AAA.1"): read the header as it is written first.
            header = pd.read_csv(file, header=None, nrows=1, dtype=str, skipinitialspace=True).iloc[0].tolist()
            raw = pd.read_csv(file, skipinitialspace=True)
        else:
            import pyarrow.parquet

            header = list(pyarrow.parquet.read_schema(file).names)
            _check_unique_columns(header, file)  # pyarrow cannot read a file with repeated names
            raw = pd.read_parquet(file)
            if not isinstance(raw.index, pd.RangeIndex):
                raw = raw.reset_index()
    except pd.errors.EmptyDataError:
        raise DataError(f"{file}: empty file") from None
    except _READ_ERRORS as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataError(f"{file}: cannot read it as {kind.upper()} ({reason})") from None
    _check_unique_columns(header, file)
    if kind == "csv" and len(header) == 1:
        _check_delimiter(str(header[0]), file)
    raw.columns = [str(c).strip() for c in raw.columns]
    if kind == "csv":
        return raw, lambda i: f"line {i + 2}"
    return raw, lambda i: f"row {i + 1}"


_DELIMITERS = {";": "semicolons", "\t": "tabs", "|": "pipes", " ": "spaces"}


def _check_unique_columns(header: Sequence[object], file: Path) -> None:
    names = [str(name).strip() for name in header]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(
            f"{file}: more than one column named {repeated[0]!r}; keep one price column per ticker (rename or drop "
            "the others)"
        )


def _check_delimiter(header: str, file: Path) -> None:
    """One column whose name holds another separator: a file written with ';', tabs, '|' or spaces."""
    for delimiter, name in _DELIMITERS.items():
        if len(header.strip().split(delimiter)) > 1:
            raise DataError(
                f"{file}: its columns are separated by {name}, not commas; save it as comma-separated CSV "
                "(or as Parquet)"
            )


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _find_date_column(raw: pd.DataFrame, file: Path) -> str:
    lowered = {c: c.lower() for c in raw.columns}
    for name in _DATE_NAMES:
        for column in raw.columns:
            if lowered[column] == name:
                return column
    first = raw.columns[0]
    values = raw[first]
    if pd.api.types.is_datetime64_any_dtype(values):
        return first
    if not pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        sample = values.dropna()
        if len(sample) and _parses_as_date(sample.iloc[0]):
            return first
    raise DataError(
        f"{file}: no date column; name one date/datetime/timestamp/time or put the dates in the first column"
    )


def _parses_as_date(value: object) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return not pd.isna(pd.to_datetime(value))
    except (ValueError, TypeError, OverflowError):
        return False


def _parse_dates(values: pd.Series, file: Path, column: str, where: Callable[[int], str]) -> pd.DatetimeIndex:
    """Dates normalised to tz-naive midnight; any unparseable or duplicate date is an error."""
    text = values
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        # Dates such as 20200102 read as integers; as numbers they would be nanoseconds since 1970.
        try:
            text = values.astype("Int64").astype("string")
        except (TypeError, ValueError):
            text = values.astype("string")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            parsed = pd.to_datetime(text, errors="coerce")
    except (ValueError, TypeError, OverflowError) as exc:
        reason = str(exc).strip().splitlines()[0]
        raise DataError(f"{file}: cannot parse the dates in column {column!r} ({reason})") from None
    bad = np.flatnonzero(parsed.isna().to_numpy())
    if len(bad):
        i = int(bad[0])
        shown = "an empty date" if pd.isna(values.iloc[i]) else f"unparseable date {values.iloc[i]!r}"
        raise DataError(f"{file}: {shown} in column {column!r} ({where(i)})")
    try:
        dates = pd.DatetimeIndex(parsed)
        if dates.tz is not None:
            dates = dates.tz_localize(None)  # keep the local trading day, not the UTC one
        # One resolution whatever the source (pandas 3 parses text to us, Parquet dates to s).
        return dates.normalize().as_unit("ns").rename(None)
    except (ValueError, TypeError, OverflowError) as exc:
        reason = str(exc).strip().splitlines()[0]
        raise DataError(f"{file}: cannot use the dates in column {column!r} ({reason})") from None


def _wide_columns(
    raw: pd.DataFrame, file: Path, date_col: str, dates: pd.DatetimeIndex, where: Callable[[int], str]
) -> pd.DataFrame:
    tickers = [c for c in raw.columns if c != date_col]
    if not tickers:
        raise DataError(f"{file}: no price column; a wide file needs one price column per ticker after the dates")
    named = {_normalise(c) for c in tickers}
    if named & {"close", "adjclose", "adjustedclose"} and named & (_OHLCV_NAMES - {"close"}):
        raise DataError(
            f"{file}: columns {', '.join(tickers)} look like one asset's prices; a long file needs a "
            "ticker column (ticker/symbol/tic/asset), a wide file one price column per ticker"
        )
    _check_unique_dates(dates, file, where)
    frame = raw[tickers].copy()
    frame.index = dates
    return frame


def _check_unique_dates(dates: pd.DatetimeIndex, file: Path, where: Callable[[int], str]) -> None:
    duplicated = dates.duplicated(keep=False)
    if duplicated.any():
        first, second = np.flatnonzero(duplicated & (dates == dates[duplicated][0]))[:2]
        raise DataError(f"{file}: duplicate date {_iso(dates[first])} ({where(first)} and {where(second)})")


def _find_price_column(raw: pd.DataFrame, file: Path, *, exclude: tuple[str, ...]) -> str:
    candidates = [c for c in raw.columns if c not in exclude]
    for label, names in _PRICE_NAMES:
        found = [c for c in candidates if _normalise(c) in names]
        if len(found) > 1:
            raise DataError(f"{file}: more than one {label} column ({', '.join(found)}); keep one")
        if found:
            return found[0]
    raise DataError(
        f"{file}: no price column; a long file needs an adj close, close or price column "
        f"(found: {', '.join(raw.columns)})"
    )


def _parse_tickers(values: pd.Series, file: Path, column: str, where: Callable[[int], str]) -> np.ndarray:
    missing = np.flatnonzero(values.isna().to_numpy())
    if len(missing):
        raise DataError(f"{file}: empty ticker in column {column!r} ({where(int(missing[0]))})")
    tickers = values.astype(str).str.strip()
    empty = np.flatnonzero((tickers == "").to_numpy())
    if len(empty):
        raise DataError(f"{file}: empty ticker in column {column!r} ({where(int(empty[0]))})")
    return tickers.to_numpy(dtype=object)


def _select_tickers(requested: Sequence[str], available: list[str], file: Path) -> list[str]:
    if isinstance(requested, str):
        requested = [requested]
    if not requested:
        return available
    chosen = [str(t).strip() for t in requested]
    repeated = sorted({t for t in chosen if chosen.count(t) > 1})
    if repeated:
        raise DataError(f"ticker(s) requested more than once: {', '.join(repeated)}")
    unknown = [t for t in chosen if t not in available]
    if unknown:
        raise DataError(f"{file}: unknown ticker(s) {', '.join(unknown)}; available: {', '.join(available)}")
    return chosen


def _filter_dates(frame: pd.DataFrame, file: Path, start: str, end: str) -> pd.DataFrame:
    first, last = frame.index[0], frame.index[-1]
    lo = _parse_bound(start, "start") if start else first
    hi = _parse_bound(end, "end") if end else last
    kept = frame[(frame.index >= lo) & (frame.index <= hi)]
    if kept.empty:
        raise DataError(
            f"{file}: no rows between {_iso(lo)} and {_iso(hi)} (start={start!r}, end={end!r}); "
            f"the file covers {_iso(first)} to {_iso(last)}"
        )
    return kept


def _parse_bound(value: str, name: str) -> pd.Timestamp:
    try:
        stamp = pd.Timestamp(value)
    except (ValueError, TypeError):
        stamp = pd.NaT
    if pd.isna(stamp):
        raise DataError(f"{name} {value!r} is not a date (expected YYYY-MM-DD)")
    return stamp.tz_localize(None).normalize() if stamp.tz is not None else stamp.normalize()


def _check_prices(values: pd.Series, file: Path, ticker_at: Callable[[int], str]) -> pd.Series:
    """Float64 prices with NaN for missing; non-numeric, non-finite or non-positive values are errors."""
    if pd.api.types.is_bool_dtype(values):
        numbers = pd.Series(np.nan, index=values.index)
    elif pd.api.types.is_numeric_dtype(values):
        numbers = values.astype(np.float64)
    else:
        numbers = pd.to_numeric(values, errors="coerce").astype(np.float64)
    present = values.notna().to_numpy()
    array = numbers.to_numpy()
    bad = np.flatnonzero(present & np.isnan(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{file}: non-numeric price {values.iloc[i]!r} for ticker {ticker_at(i)} on {_iso(values.index[i])}"
        )
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(present & ~(np.isfinite(array) & (array > 0)))
    if len(bad):
        i = int(bad[0])
        kind = "non-positive" if np.isfinite(array[i]) else "non-finite"
        raise DataError(f"{file}: {kind} price {array[i]:g} for ticker {ticker_at(i)} on {_iso(values.index[i])}")
    return numbers


def _check_column(values: pd.Series, file: Path, column: str, ticker_at: Callable[[int], str]) -> pd.Series:
    """Float64 user values with NaN for missing; booleans read as 0/1; non-numeric or infinite values are errors."""
    array = _as_numbers(values)
    present = values.notna().to_numpy()
    bad = np.flatnonzero(present & np.isnan(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{file}: non-numeric value {values.iloc[i]!r} in column {column!r} for ticker {ticker_at(i)} "
            f"on {_iso(values.index[i])}"
        )
    bad = np.flatnonzero(np.isinf(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{file}: infinite value {array[i]:g} in column {column!r} for ticker {ticker_at(i)} "
            f"on {_iso(values.index[i])}"
        )
    return pd.Series(array, index=values.index)


def _as_numbers(values: pd.Series) -> np.ndarray:
    """Float64 values, NaN where missing or not a number; booleans are 0/1, dates and durations not numbers."""
    kind = values.dtype
    if pd.api.types.is_datetime64_any_dtype(kind) or pd.api.types.is_timedelta64_dtype(kind):
        return np.full(len(values), np.nan)
    if isinstance(kind, pd.CategoricalDtype):
        values = values.astype(object)
    elif pd.api.types.is_numeric_dtype(kind):  # bool included
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    return pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def _series_column(raw: pd.DataFrame, file: Path, date_col: str) -> str:
    """The one value column of a series file: the only column besides the dates, or the only numeric one."""
    others = [c for c in raw.columns if c != date_col]
    if len(others) == 1:
        return others[0]
    numeric = [c for c in others if pd.api.types.is_numeric_dtype(raw[c]) and not pd.api.types.is_bool_dtype(raw[c])]
    if len(numeric) == 1:
        return numeric[0]
    if numeric:
        raise DataError(f"{file}: more than one numeric column ({', '.join(numeric)}); keep the dates and one value")
    found = ", ".join(others) if others else "none"
    raise DataError(f"{file}: no numeric value column besides the dates {date_col!r} (found: {found})")


def _check_series(values: pd.Series, dates: pd.DatetimeIndex, file: Path, column: str, what: str) -> np.ndarray:
    """Float64 values of a series file's rows in use; anything but a finite, plausible number is an error."""
    array = np.full(len(values), np.nan) if pd.api.types.is_bool_dtype(values) else _as_numbers(values)
    bad = np.flatnonzero(np.isnan(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(f"{file}: non-numeric value {values.iloc[i]!r} in column {column!r} on {_iso(dates[i])}")
    label = _SERIES_VALUES[what]
    bad = np.flatnonzero(~np.isfinite(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(f"{file}: non-finite {label} {array[i]:g} in column {column!r} on {_iso(dates[i])}")
    if what == "benchmark":
        bad = np.flatnonzero(array <= 0)
        if len(bad):
            i = int(bad[0])
            raise DataError(
                f"{file}: non-positive {label} {array[i]:g} in column {column!r} on {_iso(dates[i])}; a benchmark "
                "is a total-return index level"
            )
    else:
        bad = np.flatnonzero(array > 1)
        if len(bad):
            i = int(bad[0])
            raise DataError(
                f"{file}: {label} {array[i]:g} in column {column!r} on {_iso(dates[i])} looks like a percentage; "
                "give annual rates as decimals (0.05 for 5 %): divide the column by 100"
            )
        bad = np.flatnonzero(array < -0.5)
        if len(bad):
            i = int(bad[0])
            raise DataError(
                f"{file}: {label} {array[i]:g} in column {column!r} on {_iso(dates[i])} is below -0.5; give "
                "annual rates as decimals (0.05 for 5 %)"
            )
    return array


def _close_gaps(frame: pd.DataFrame, file: Path, max_fill_days: int, notes: list[str]) -> pd.DataFrame:
    """Applies the common universe's gap policy (module docstring); the result has no NaN."""
    frame, missing = _drop_empty_rows(frame, file, notes)
    dates = frame.index
    tickers = list(frame.columns)
    first_valid, last_valid = _first_and_last(~missing, dates, tickers, file)
    lo, hi = int(first_valid.max()), int(last_valid.min())
    if lo > hi:
        late, early = tickers[int(first_valid.argmax())], tickers[int(last_valid.argmin())]
        raise DataError(
            f"{file}: tickers {late} (from {_iso(dates[lo])}) and {early} (until {_iso(dates[hi])}) "
            "have no dates in common"
        )
    if lo > 0:
        late = [t for t, f in zip(tickers, first_valid, strict=True) if f == lo]
        notes.append(
            f"{', '.join(late)} starts on {_iso(dates[lo])}: dropped {lo} earlier row(s) "
            f"({_iso(dates[0])} to {_iso(dates[lo - 1])})"
        )
    if hi < len(dates) - 1:
        early = [t for t, last in zip(tickers, last_valid, strict=True) if last == hi]
        notes.append(
            f"{', '.join(early)} ends on {_iso(dates[hi])}: dropped {len(dates) - 1 - hi} later row(s) "
            f"({_iso(dates[hi + 1])} to {_iso(dates[-1])})"
        )
    frame = frame.iloc[lo : hi + 1]
    missing = missing[lo : hi + 1]
    dates = frame.index

    for j, ticker in enumerate(tickers):
        runs = _missing_runs(missing[:, j])
        if not runs:
            continue
        begin, length = max(runs, key=lambda run: run[1])
        if length > max_fill_days:
            raise DataError(
                f"{file}: ticker {ticker} has no price on {length} consecutive rows, {_iso(dates[begin])} to "
                f"{_iso(dates[begin + length - 1])}, more than max_fill_days={max_fill_days} (data.max_fill_days)"
            )
        notes.append(
            f"{ticker}: forward-filled {sum(n for _, n in runs)} missing day(s) in {len(runs)} gap(s), "
            f"longest {length}, first on {_iso(dates[runs[0][0]])}"
        )
    # The first row has every price (trimming), so forward-filling leaves no NaN.
    return frame.ffill()


def _close_gaps_point_in_time(
    frame: pd.DataFrame, file: Path, max_fill_days: int, notes: list[str]
) -> tuple[pd.DataFrame, np.ndarray]:
    """Applies the point-in-time universe's gap policy (module docstring); NaN is left where no price is known, and
    the days a short gap carries forward (for the features) are not quoted: (frame, quoted (T, N))."""
    frame, missing = _drop_empty_rows(frame, file, notes)
    dates = frame.index
    tickers = list(frame.columns)
    first_valid, last_valid = _first_and_last(~missing, dates, tickers, file)
    _note_lives(first_valid, last_valid, dates, tickers, notes)

    fill = np.zeros_like(missing)  # (T, N)
    for j, ticker in enumerate(tickers):
        lo, hi = int(first_valid[j]), int(last_valid[j])
        runs = [(lo + begin, length) for begin, length in _missing_runs(missing[lo : hi + 1, j])]
        short = [run for run in runs if run[1] <= max_fill_days]
        long = [run for run in runs if run[1] > max_fill_days]
        for begin, length in short:
            fill[begin : begin + length, j] = True
        if short:
            notes.append(
                f"{ticker}: no price on {sum(n for _, n in short)} day(s) in {len(short)} gap(s) of at most "
                f"max_fill_days={max_fill_days} (untradable, the features carry the last price), longest "
                f"{max(n for _, n in short)}, first on {_iso(dates[short[0][0]])}"
            )
        if long:
            shown = "; ".join(
                f"{n} rows, {_iso(dates[begin])} to {_iso(dates[begin + n - 1])}" for begin, n in long[:_MAX_SHOWN]
            )
            more = f"; and {len(long) - _MAX_SHOWN} more" if len(long) > _MAX_SHOWN else ""
            notes.append(
                f"{ticker}: not tradable (NaN) on {len(long)} gap(s) longer than max_fill_days={max_fill_days}: "
                f"{shown}{more}"
            )
    prices = frame.to_numpy(dtype=np.float64, copy=True)
    # A short run starts after the ticker's first price, so the fill takes the price before the run.
    prices[fill] = frame.ffill().to_numpy(dtype=np.float64)[fill]
    return pd.DataFrame(prices, index=dates, columns=tickers), ~missing


def _drop_empty_rows(frame: pd.DataFrame, file: Path, notes: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """The frame without the rows where no selected ticker has a price, and its missing mask (T, N)."""
    missing = frame.isna().to_numpy()  # (T, N)
    empty_rows = missing.all(axis=1)
    if empty_rows.all():
        raise DataError(f"{file}: no prices in the selected rows")
    if empty_rows.any():
        notes.append(f"dropped {int(empty_rows.sum())} date(s) on which none of the selected tickers has a price")
        frame = frame[~empty_rows]
        missing = missing[~empty_rows]
    return frame, missing


def _first_and_last(
    has: np.ndarray, dates: pd.DatetimeIndex, tickers: list[str], file: Path
) -> tuple[np.ndarray, np.ndarray]:
    """Row of each ticker's first and last price, (N,) each; a ticker with no price is an error."""
    for j, ticker in enumerate(tickers):
        if not has[:, j].any():
            raise DataError(f"{file}: ticker {ticker} has no prices between {_iso(dates[0])} and {_iso(dates[-1])}")
    first_valid = has.argmax(axis=0)  # (N,)
    last_valid = len(dates) - 1 - has[::-1].argmax(axis=0)  # (N,)
    return first_valid, last_valid


def _note_lives(
    first_valid: np.ndarray, last_valid: np.ndarray, dates: pd.DatetimeIndex, tickers: list[str], notes: list[str]
) -> None:
    """A line per ticker that starts late or ends early, or one line for them all when there are many."""
    last_row = len(dates) - 1
    partial = [j for j in range(len(tickers)) if first_valid[j] > 0 or last_valid[j] < last_row]
    if len(partial) > _MAX_NOTED:
        late, early = int((first_valid > 0).sum()), int((last_valid < last_row).sum())
        shown = ", ".join(
            f"{tickers[j]} {_iso(dates[first_valid[j]])} to {_iso(dates[last_valid[j]])}" for j in partial[:_MAX_SHOWN]
        )
        notes.append(
            f"{len(partial)} of {len(tickers)} tickers trade on part of the dates only, not tradable (NaN) before "
            f"their first or after their last price: {late} start late, {early} end early (e.g. {shown})"
        )
        return
    for j in partial:
        first, last = int(first_valid[j]), int(last_valid[j])
        if first > 0 and last < last_row:
            notes.append(
                f"{tickers[j]} starts on {_iso(dates[first])} and ends on {_iso(dates[last])}: not tradable (NaN) "
                f"on the {first} earlier and {last_row - last} later row(s)"
            )
        elif first > 0:
            notes.append(
                f"{tickers[j]} starts on {_iso(dates[first])}: not tradable (NaN) on the {first} earlier row(s)"
            )
        else:
            notes.append(
                f"{tickers[j]} ends on {_iso(dates[last])}: not tradable (NaN) on the {last_row - last} later row(s)"
            )


def _lives(frame: pd.DataFrame) -> np.ndarray:
    """(T, N) bool, True from each ticker's first to its last price."""
    has = frame.notna().to_numpy()
    return (np.cumsum(has, axis=0) > 0) & (np.cumsum(has[::-1], axis=0)[::-1] > 0)


def _align_columns(
    values: dict[str, pd.DataFrame],
    life: np.ndarray,
    source_dates: pd.DatetimeIndex,
    dates: pd.DatetimeIndex,
    file: Path,
    notes: list[str],
) -> dict[str, np.ndarray]:
    """User columns on the table's dates, each forward-filled within its ticker's life and NaN outside it.

    ``life`` (S, N) is on ``source_dates``, the rows before gap closing; the table's ``dates`` are a
    subset, so a value known on a row trimmed away still carries into the table.
    """
    rows = source_dates.get_indexer(dates)  # (T,)
    aligned: dict[str, np.ndarray] = {}
    for name, frame in values.items():
        known = np.where(life, frame.to_numpy(dtype=np.float64), np.nan)  # (S, N)
        filled = pd.DataFrame(known).ffill().to_numpy(copy=True)
        filled[~life] = np.nan
        result = filled[rows]  # (T, N)
        if np.isnan(result).all():
            raise DataError(
                f"{file}: column {name!r} has no value for the selected tickers between {_iso(dates[0])} and "
                f"{_iso(dates[-1])}"
            )
        alive = life[rows]
        num_filled = int((np.isnan(known[rows]) & ~np.isnan(result)).sum())
        before = [t for t, gap in zip(frame.columns, (alive & np.isnan(result)).any(axis=0), strict=True) if gap]
        said = [f"forward-filled {num_filled} missing value(s)"] if num_filled else []
        if before:
            more = f" and {len(before) - _MAX_SHOWN} more" if len(before) > _MAX_SHOWN else ""
            said.append(f"NaN before the first value of {', '.join(before[:_MAX_SHOWN])}{more}")
        if said:
            notes.append(f"column {name!r}: {'; '.join(said)}")
        result.setflags(write=False)
        aligned[name] = result
    return aligned


def _missing_runs(missing: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True in a 1-D boolean array."""
    edges = np.diff(np.concatenate(([0], missing.astype(np.int8), [0])))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(int(a), int(b - a)) for a, b in zip(starts, stops, strict=True)]


def _bundled_benchmark(dates: pd.DatetimeIndex) -> np.ndarray:
    index, _, _ = _load_wide(BUNDLED_BENCHMARK, tickers=(_BENCHMARK_COLUMN,), start="", end="")
    levels = index[_BENCHMARK_COLUMN].reindex(dates)
    if levels.isna().any():
        missing = levels.index[levels.isna()][0]
        raise DataError(f"{BUNDLED_BENCHMARK}: no {_BENCHMARK_COLUMN} level on {_iso(missing)}")
    benchmark = levels.to_numpy(dtype=np.float64, copy=True)
    benchmark.setflags(write=False)
    return benchmark


def _iso(date: pd.Timestamp) -> str:
    return pd.Timestamp(date).strftime("%Y-%m-%d")
