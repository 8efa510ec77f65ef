"""Loading and validating daily price files into one aligned, gap-free ``PriceTable``.

Formats, chosen by extension: ``.csv``, ``.csv.gz``, ``.parquet`` / ``.pq``.

* **Wide**: a date column (named date, datetime, timestamp or time, in any case; for Parquet also
  the index; otherwise a first column whose values parse as dates), then one price column per ticker.
* **Long**: a date column, a ticker column (ticker, symbol, tic or asset) and price columns such as
  open, high, low, close, adj close and volume, in any capitalisation and with or without spaces or
  underscores. The price is the adjusted close if there is one, else the close, else a ``price``
  column; open, high, low and volume are never used. The table is pivoted to wide.

Order of work: parse and check dates (unparseable or duplicate dates are errors; unsorted dates are
sorted), select ``tickers``, keep the rows between ``start`` and ``end`` (inclusive), check prices
(non-numeric, non-finite or non-positive values are errors), then close the gaps.

Gap policy:

* Rows where none of the selected tickers has a price (a holiday row, or a day only an unselected
  ticker traded) are dropped, with a note.
* The table is trimmed to the dates where every ticker has data: a ticker that starts late moves
  the first date, one that ends early moves the last date, and a note names it and the rows dropped.
* Inside that range, a run of at most ``max_fill_days`` consecutive missing rows of one ticker is
  forward-filled (the asset earns a zero return on those days), with a note per ticker; a longer run
  is a ``DataError`` naming the ticker and the dates.

No NaN leaves this module: every price in a ``PriceTable`` is finite and positive.
"""

from __future__ import annotations

import re
import warnings
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from utils.errors import DataError

DATA_DIR = Path(__file__).resolve().parent / "data"
BUNDLED_PRICES = DATA_DIR / "sp500_20_daily_close.csv.gz"
"""Daily closes of 20 S&P 500 stocks, 1990-01-02 to 2022-12-28 (8313 rows)."""
BUNDLED_BENCHMARK = DATA_DIR / "sp500_index_daily.csv.gz"
"""The S&P 500 index on the same dates (column ``SP500``), the bundled data set's benchmark."""
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
_READ_ERRORS = (ValueError, TypeError, OSError, EOFError, UnicodeDecodeError, zlib.error, pd.errors.ParserError)


@dataclass(frozen=True, eq=False)
class PriceTable:
    """Daily prices of N assets on T dates, aligned and gap-free."""

    dates: pd.DatetimeIndex
    """Strictly increasing, unique, tz-naive dates normalised to midnight."""
    tickers: tuple[str, ...]
    """Asset names, in column order."""
    prices: np.ndarray
    """(T, N) float64, every value finite and positive."""
    benchmark: np.ndarray | None = None
    """(T,) float64 benchmark index levels on the same dates, or None."""
    notes: tuple[str, ...] = ()
    """Human-readable lines on what loading did (rows trimmed, days filled, dates sorted)."""

    def __post_init__(self) -> None:
        num_days, num_assets = len(self.dates), len(self.tickers)
        if self.prices.shape != (num_days, num_assets):
            raise ValueError(f"prices have shape {self.prices.shape}, expected ({num_days}, {num_assets})")
        if not self.dates.is_monotonic_increasing or not self.dates.is_unique:
            raise ValueError("dates must be strictly increasing")
        if not (np.isfinite(self.prices).all() and (self.prices > 0).all()):
            raise ValueError("prices must be finite and positive")
        if self.benchmark is not None:
            if self.benchmark.shape != (num_days,):
                raise ValueError(f"benchmark has shape {self.benchmark.shape}, expected ({num_days},)")
            if not (np.isfinite(self.benchmark).all() and (self.benchmark > 0).all()):
                raise ValueError("benchmark levels must be finite and positive")

    @property
    def num_days(self) -> int:
        return len(self.dates)

    @property
    def num_assets(self) -> int:
        return len(self.tickers)


def load_prices(
    path: str | Path | None = None,
    *,
    tickers: Sequence[str] = (),
    start: str = "",
    end: str = "",
    max_fill_days: int = 5,
    max_assets: int = 0,
) -> PriceTable:
    """Reads, validates and aligns a price file (see the module docstring for formats and gap policy).

    Args:
        path: CSV, gzipped CSV or Parquet file; None or "" loads the bundled 20-stock data set with
            the S&P 500 index as its benchmark. A user's file has no benchmark.
        tickers: tickers to keep, in this order; empty keeps every ticker in file order.
        start: first date to keep (YYYY-MM-DD, inclusive); empty keeps from the first date.
        end: last date to keep (YYYY-MM-DD, inclusive); empty keeps to the last date.
        max_fill_days: longest run of missing rows of one ticker that is forward-filled.
        max_assets: with no ``tickers``, keep only the first this many tickers in file order; 0 keeps all.

    Raises:
        DataError: the file is missing, unreadable or fails validation; the one-line message says
            what and where.
    """
    if max_fill_days < 0:
        raise DataError(f"max_fill_days must be >= 0, got {max_fill_days}")
    bundled = path is None or str(path) == ""
    file = BUNDLED_PRICES if bundled else Path(path).expanduser()
    frame, notes = _load_wide(file, tickers=tickers, start=start, end=end, max_assets=max_assets)
    frame = _close_gaps(frame, file, max_fill_days, notes)

    prices = frame.to_numpy(dtype=np.float64, copy=True)
    benchmark = _bundled_benchmark(frame.index) if bundled else None
    prices.setflags(write=False)
    return PriceTable(
        dates=frame.index,
        tickers=tuple(frame.columns),
        prices=prices,
        benchmark=benchmark,
        notes=tuple(notes),
    )


def _load_wide(
    file: Path, *, tickers: Sequence[str], start: str, end: str, max_assets: int = 0
) -> tuple[pd.DataFrame, list[str]]:
    """A float64 wide frame indexed by sorted dates, restricted to tickers and [start, end]; may hold NaN."""
    raw, where = _read_file(file)
    if raw.empty:
        raise DataError(f"{file}: empty file (no rows)")
    notes: list[str] = []
    columns = list(raw.columns)
    date_col = _find_date_column(raw, file)
    dates = _parse_dates(raw[date_col], file, date_col, where)

    normalised = {c: _normalise(c) for c in columns}
    ticker_col = next((c for name in _TICKER_NAMES for c in columns if normalised[c] == name), None)
    if ticker_col is None:
        frame = _wide_columns(raw, file, date_col, dates, where)
        available = list(frame.columns)
    else:
        price_col = _find_price_column(raw, file, exclude=(date_col, ticker_col))
        frame = pd.DataFrame(
            {"ticker": _parse_tickers(raw[ticker_col], file, ticker_col, where), "price": raw[price_col]}
        )
        frame.index = dates
        available = list(pd.unique(frame["ticker"]))

    if not frame.index.is_monotonic_increasing:
        frame = frame.iloc[np.argsort(frame.index.to_numpy(), kind="stable")]
        notes.append("dates were not in ascending order: sorted them")

    selected = _select_tickers(tickers, available, file)
    if max_assets and not tickers:
        selected = selected[:max_assets]
    frame = _filter_dates(frame, file, start, end)
    if ticker_col is None:
        checked = {t: _check_prices(frame[t], file, lambda _i, t=t: t) for t in selected}
        return pd.DataFrame(checked, index=frame.index, columns=selected), notes

    frame = frame[frame["ticker"].isin(selected)]
    ticker_at = frame["ticker"].to_numpy()
    frame = frame.assign(price=_check_prices(frame["price"], file, lambda i: ticker_at[i]))
    pairs = pd.MultiIndex.from_arrays([frame.index, frame["ticker"]])
    if pairs.has_duplicates:
        date, ticker = pairs[pairs.duplicated()][0]
        raise DataError(f"{file}: more than one row for ticker {ticker} on {_iso(date)}")
    wide = frame.pivot(columns="ticker", values="price")
    wide = wide.reindex(columns=selected)
    wide.columns.name = None
    wide.index.name = None
    return wide.astype(np.float64), notes


def _read_file(file: Path) -> tuple[pd.DataFrame, Callable[[int], str]]:
    """The file as pandas reads it, with string column names, and a function naming a row's position."""
    name = file.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        kind = "csv"
    elif name.endswith((".parquet", ".pq")):
        kind = "parquet"
    else:
        raise DataError(f"{file}: unknown file type; expected .csv, .csv.gz, .parquet or .pq")
    if file.is_dir():
        raise DataError(f"{file} is a folder, not a price file; pass the CSV or Parquet file itself")
    if not file.is_file():
        raise DataError(f"price file not found: {file}")
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
    duplicated = dates.duplicated(keep=False)
    if duplicated.any():
        first, second = np.flatnonzero(duplicated & (dates == dates[duplicated][0]))[:2]
        raise DataError(f"{file}: duplicate date {_iso(dates[first])} ({where(first)} and {where(second)})")
    frame = raw[tickers].copy()
    frame.index = dates
    return frame


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


def _close_gaps(frame: pd.DataFrame, file: Path, max_fill_days: int, notes: list[str]) -> pd.DataFrame:
    """Applies the gap policy of the module docstring; the result has no NaN."""
    missing = frame.isna().to_numpy()  # (T, N)
    empty_rows = missing.all(axis=1)
    if empty_rows.all():
        raise DataError(f"{file}: no prices in the selected rows")
    if empty_rows.any():
        notes.append(f"dropped {int(empty_rows.sum())} date(s) on which none of the selected tickers has a price")
        frame = frame[~empty_rows]
        missing = missing[~empty_rows]

    dates = frame.index
    tickers = list(frame.columns)
    has = ~missing
    for j, ticker in enumerate(tickers):
        if not has[:, j].any():
            raise DataError(f"{file}: ticker {ticker} has no prices between {_iso(dates[0])} and {_iso(dates[-1])}")
    first_valid = has.argmax(axis=0)  # (N,)
    last_valid = len(dates) - 1 - has[::-1].argmax(axis=0)  # (N,)
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


def _missing_runs(missing: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True in a 1-D boolean array."""
    edges = np.diff(np.concatenate(([0], missing.astype(np.int8), [0])))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(int(a), int(b - a)) for a, b in zip(starts, stops, strict=True)]


def _bundled_benchmark(dates: pd.DatetimeIndex) -> np.ndarray:
    index, _ = _load_wide(BUNDLED_BENCHMARK, tickers=(_BENCHMARK_COLUMN,), start="", end="")
    levels = index[_BENCHMARK_COLUMN].reindex(dates)
    if levels.isna().any():
        missing = levels.index[levels.isna()][0]
        raise DataError(f"{BUNDLED_BENCHMARK}: no {_BENCHMARK_COLUMN} level on {_iso(missing)}")
    benchmark = levels.to_numpy(dtype=np.float64, copy=True)
    benchmark.setflags(write=False)
    return benchmark


def _iso(date: pd.Timestamp) -> str:
    return pd.Timestamp(date).strftime("%Y-%m-%d")
