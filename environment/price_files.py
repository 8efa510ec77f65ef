"""Reading a price or series file: its format, its date, ticker and price columns, and the rows asked for."""

import re
import warnings
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from utils.errors import DataError

DATE_NAMES = ("date", "datetime", "timestamp", "time")
PRICE_NAMES = (
    ("adjusted close", ("adjclose", "adjustedclose", "adjcloseprice", "adjustedcloseprice")),
    ("close", ("close", "closeprice", "closingprice")),
    ("price", ("price",)),
)
OHLCV_NAMES = {"open", "high", "low", "volume", "close", "adjclose", "adjustedclose"}
READ_ERRORS = (ValueError, TypeError, OSError, EOFError, UnicodeDecodeError, zlib.error, pd.errors.ParserError)


def pivot(frame: pd.DataFrame, key: str, selected: list[str]) -> pd.DataFrame:
    wide = frame.pivot(columns="ticker", values=key)
    wide = wide.reindex(columns=selected)
    wide.columns.name = None
    wide.index.name = None
    return wide.astype(np.float64)


def requested_columns(columns: Sequence[str]) -> tuple[str, ...]:
    if isinstance(columns, str):
        columns = [columns]
    names = tuple(str(name).strip() for name in columns)
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(f"column(s) requested more than once: {', '.join(repeated)}")
    return names


def match_columns(requested: Sequence[str], raw: pd.DataFrame, file: Path, *, exclude: tuple[str, str]) -> list[str]:
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


def read_file(file: Path, label: str = "price file") -> tuple[pd.DataFrame, Callable[[int], str]]:
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
    except READ_ERRORS as exc:
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


def normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def find_date_column(raw: pd.DataFrame, file: Path) -> str:
    lowered = {c: c.lower() for c in raw.columns}
    for name in DATE_NAMES:
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


def parse_dates(values: pd.Series, file: Path, column: str, where: Callable[[int], str]) -> pd.DatetimeIndex:
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


def wide_columns(
    raw: pd.DataFrame, file: Path, date_col: str, dates: pd.DatetimeIndex, where: Callable[[int], str]
) -> pd.DataFrame:
    tickers = [c for c in raw.columns if c != date_col]
    if not tickers:
        raise DataError(f"{file}: no price column; a wide file needs one price column per ticker after the dates")
    named = {normalise(c) for c in tickers}
    if named & {"close", "adjclose", "adjustedclose"} and named & (OHLCV_NAMES - {"close"}):
        raise DataError(
            f"{file}: columns {', '.join(tickers)} look like one asset's prices; a long file needs a "
            "ticker column (ticker/symbol/tic/asset), a wide file one price column per ticker"
        )
    check_unique_dates(dates, file, where)
    frame = raw[tickers].copy()
    frame.index = dates
    return frame


def check_unique_dates(dates: pd.DatetimeIndex, file: Path, where: Callable[[int], str]) -> None:
    duplicated = dates.duplicated(keep=False)
    if duplicated.any():
        first, second = np.flatnonzero(duplicated & (dates == dates[duplicated][0]))[:2]
        raise DataError(f"{file}: duplicate date {iso(dates[first])} ({where(first)} and {where(second)})")


def find_price_column(raw: pd.DataFrame, file: Path, *, exclude: tuple[str, ...]) -> str:
    candidates = [c for c in raw.columns if c not in exclude]
    for label, names in PRICE_NAMES:
        found = [c for c in candidates if normalise(c) in names]
        if len(found) > 1:
            raise DataError(f"{file}: more than one {label} column ({', '.join(found)}); keep one")
        if found:
            return found[0]
    raise DataError(
        f"{file}: no price column; a long file needs an adj close, close or price column "
        f"(found: {', '.join(raw.columns)})"
    )


def parse_tickers(values: pd.Series, file: Path, column: str, where: Callable[[int], str]) -> np.ndarray:
    missing = np.flatnonzero(values.isna().to_numpy())
    if len(missing):
        raise DataError(f"{file}: empty ticker in column {column!r} ({where(int(missing[0]))})")
    tickers = values.astype(str).str.strip()
    empty = np.flatnonzero((tickers == "").to_numpy())
    if len(empty):
        raise DataError(f"{file}: empty ticker in column {column!r} ({where(int(empty[0]))})")
    return tickers.to_numpy(dtype=object)


def select_tickers(requested: Sequence[str], available: list[str], file: Path) -> list[str]:
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


def filter_dates(frame: pd.DataFrame, file: Path, start: str, end: str) -> pd.DataFrame:
    first, last = frame.index[0], frame.index[-1]
    lo = _parse_bound(start, "start") if start else first
    hi = _parse_bound(end, "end") if end else last
    kept = frame[(frame.index >= lo) & (frame.index <= hi)]
    if kept.empty:
        raise DataError(
            f"{file}: no rows between {iso(lo)} and {iso(hi)} (start={start!r}, end={end!r}); "
            f"the file covers {iso(first)} to {iso(last)}"
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


def iso(date: pd.Timestamp) -> str:
    return pd.Timestamp(date).strftime("%Y-%m-%d")
