"""Checking the values of a price file and closing its gaps: the numbers, the days without a price, and each ticker's
life (the universe rules of ``environment.prices``)."""

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from environment.price_files import iso
from utils.errors import DataError

_MAX_NOTED = 10
"""More tickers than this that start late or end early are summed up in one note."""
MAX_SHOWN = 3
SERIES_VALUES = {"benchmark": "benchmark level", "risk_free": "risk-free rate"}


def check_prices(values: pd.Series, file: Path, ticker_at: Callable[[int], str]) -> pd.Series:
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
            f"{file}: non-numeric price {values.iloc[i]!r} for ticker {ticker_at(i)} on {iso(values.index[i])}"
        )
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(present & ~(np.isfinite(array) & (array > 0)))
    if len(bad):
        i = int(bad[0])
        kind = "non-positive" if np.isfinite(array[i]) else "non-finite"
        raise DataError(f"{file}: {kind} price {array[i]:g} for ticker {ticker_at(i)} on {iso(values.index[i])}")
    return numbers


def check_column(values: pd.Series, file: Path, column: str, ticker_at: Callable[[int], str]) -> pd.Series:
    """Float64 user values with NaN for missing; booleans read as 0/1; non-numeric or infinite values are errors."""
    array = _as_numbers(values)
    present = values.notna().to_numpy()
    bad = np.flatnonzero(present & np.isnan(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{file}: non-numeric value {values.iloc[i]!r} in column {column!r} for ticker {ticker_at(i)} "
            f"on {iso(values.index[i])}"
        )
    bad = np.flatnonzero(np.isinf(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(
            f"{file}: infinite value {array[i]:g} in column {column!r} for ticker {ticker_at(i)} "
            f"on {iso(values.index[i])}"
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


def series_column(raw: pd.DataFrame, file: Path, date_col: str) -> str:
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


def check_series(values: pd.Series, dates: pd.DatetimeIndex, file: Path, column: str, what: str) -> np.ndarray:
    """Float64 values of a series file's rows in use; anything but a finite, plausible number is an error."""
    array = np.full(len(values), np.nan) if pd.api.types.is_bool_dtype(values) else _as_numbers(values)
    bad = np.flatnonzero(np.isnan(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(f"{file}: non-numeric value {values.iloc[i]!r} in column {column!r} on {iso(dates[i])}")
    label = SERIES_VALUES[what]
    bad = np.flatnonzero(~np.isfinite(array))
    if len(bad):
        i = int(bad[0])
        raise DataError(f"{file}: non-finite {label} {array[i]:g} in column {column!r} on {iso(dates[i])}")
    if what == "benchmark":
        bad = np.flatnonzero(array <= 0)
        if len(bad):
            i = int(bad[0])
            raise DataError(
                f"{file}: non-positive {label} {array[i]:g} in column {column!r} on {iso(dates[i])}; a benchmark "
                "is a total-return index level"
            )
    else:
        bad = np.flatnonzero(array > 1)
        if len(bad):
            i = int(bad[0])
            raise DataError(
                f"{file}: {label} {array[i]:g} in column {column!r} on {iso(dates[i])} looks like a percentage; "
                "give annual rates as decimals (0.05 for 5 %): divide the column by 100"
            )
        bad = np.flatnonzero(array < -0.5)
        if len(bad):
            i = int(bad[0])
            raise DataError(
                f"{file}: {label} {array[i]:g} in column {column!r} on {iso(dates[i])} is below -0.5; give "
                "annual rates as decimals (0.05 for 5 %)"
            )
    return array


def close_gaps(frame: pd.DataFrame, file: Path, max_fill_days: int, notes: list[str]) -> pd.DataFrame:
    """Applies the common universe's gap policy (module docstring); the result has no NaN."""
    frame, missing = _drop_empty_rows(frame, file, notes)
    dates = frame.index
    tickers = list(frame.columns)
    first_valid, last_valid = _first_and_last(~missing, dates, tickers, file)
    lo, hi = int(first_valid.max()), int(last_valid.min())
    if lo > hi:
        late, early = tickers[int(first_valid.argmax())], tickers[int(last_valid.argmin())]
        raise DataError(
            f"{file}: tickers {late} (from {iso(dates[lo])}) and {early} (until {iso(dates[hi])}) "
            "have no dates in common"
        )
    if lo > 0:
        late = [t for t, f in zip(tickers, first_valid, strict=True) if f == lo]
        notes.append(
            f"{', '.join(late)} starts on {iso(dates[lo])}: dropped {lo} earlier row(s) "
            f"({iso(dates[0])} to {iso(dates[lo - 1])})"
        )
    if hi < len(dates) - 1:
        early = [t for t, last in zip(tickers, last_valid, strict=True) if last == hi]
        notes.append(
            f"{', '.join(early)} ends on {iso(dates[hi])}: dropped {len(dates) - 1 - hi} later row(s) "
            f"({iso(dates[hi + 1])} to {iso(dates[-1])})"
        )
    frame = frame.iloc[lo : hi + 1]
    missing = missing[lo : hi + 1]
    dates = frame.index

    for j, ticker in enumerate(tickers):
        runs = missing_runs(missing[:, j])
        if not runs:
            continue
        begin, length = max(runs, key=lambda run: run[1])
        if length > max_fill_days:
            raise DataError(
                f"{file}: ticker {ticker} has no price on {length} consecutive rows, {iso(dates[begin])} to "
                f"{iso(dates[begin + length - 1])}, more than max_fill_days={max_fill_days} (data.max_fill_days)"
            )
        notes.append(
            f"{ticker}: forward-filled {sum(n for _, n in runs)} missing day(s) in {len(runs)} gap(s), "
            f"longest {length}, first on {iso(dates[runs[0][0]])}"
        )
    # The first row has every price (trimming), so forward-filling leaves no NaN.
    return frame.ffill()


def close_gaps_point_in_time(
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
        runs = [(lo + begin, length) for begin, length in missing_runs(missing[lo : hi + 1, j])]
        short = [run for run in runs if run[1] <= max_fill_days]
        long = [run for run in runs if run[1] > max_fill_days]
        for begin, length in short:
            fill[begin : begin + length, j] = True
        if short:
            notes.append(
                f"{ticker}: no price on {sum(n for _, n in short)} day(s) in {len(short)} gap(s) of at most "
                f"max_fill_days={max_fill_days} (untradable, the features carry the last price), longest "
                f"{max(n for _, n in short)}, first on {iso(dates[short[0][0]])}"
            )
        if long:
            shown = "; ".join(
                f"{n} rows, {iso(dates[begin])} to {iso(dates[begin + n - 1])}" for begin, n in long[:MAX_SHOWN]
            )
            more = f"; and {len(long) - MAX_SHOWN} more" if len(long) > MAX_SHOWN else ""
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
            raise DataError(f"{file}: ticker {ticker} has no prices between {iso(dates[0])} and {iso(dates[-1])}")
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
            f"{tickers[j]} {iso(dates[first_valid[j]])} to {iso(dates[last_valid[j]])}" for j in partial[:MAX_SHOWN]
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
                f"{tickers[j]} starts on {iso(dates[first])} and ends on {iso(dates[last])}: not tradable (NaN) "
                f"on the {first} earlier and {last_row - last} later row(s)"
            )
        elif first > 0:
            notes.append(
                f"{tickers[j]} starts on {iso(dates[first])}: not tradable (NaN) on the {first} earlier row(s)"
            )
        else:
            notes.append(
                f"{tickers[j]} ends on {iso(dates[last])}: not tradable (NaN) on the {last_row - last} later row(s)"
            )


def lives(frame: pd.DataFrame) -> np.ndarray:
    """(T, N) bool, True from each ticker's first to its last price."""
    has = frame.notna().to_numpy()
    return (np.cumsum(has, axis=0) > 0) & (np.cumsum(has[::-1], axis=0)[::-1] > 0)


def align_columns(
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
                f"{file}: column {name!r} has no value for the selected tickers between {iso(dates[0])} and "
                f"{iso(dates[-1])}"
            )
        alive = life[rows]
        num_filled = int((np.isnan(known[rows]) & ~np.isnan(result)).sum())
        before = [t for t, gap in zip(frame.columns, (alive & np.isnan(result)).any(axis=0), strict=True) if gap]
        said = [f"forward-filled {num_filled} missing value(s)"] if num_filled else []
        if before:
            more = f" and {len(before) - MAX_SHOWN} more" if len(before) > MAX_SHOWN else ""
            said.append(f"NaN before the first value of {', '.join(before[:MAX_SHOWN])}{more}")
        if said:
            notes.append(f"column {name!r}: {'; '.join(said)}")
        result.setflags(write=False)
        aligned[name] = result
    return aligned


def missing_runs(missing: np.ndarray) -> list[tuple[int, int]]:
    """(start, length) of each run of True in a 1-D boolean array."""
    edges = np.diff(np.concatenate(([0], missing.astype(np.int8), [0])))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    return [(int(a), int(b - a)) for a, b in zip(starts, stops, strict=True)]
