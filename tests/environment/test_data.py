"""Loading and validating price files (formats, every validation error, gaps, universes, user columns) and series."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from environment.prices import BUNDLED_PRICES, PriceTable, load_prices, load_series
from utils.errors import DataError

TICKERS = ("AAA", "BBB", "CCC")


def make_prices(num_days: int = 40, tickers: tuple[str, ...] = TICKERS, seed: int = 0) -> pd.DataFrame:
    """A wide frame of positive prices on business days, indexed by date."""
    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2020-01-01", periods=num_days)
    levels = 100.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, size=(num_days, len(tickers))), axis=0))
    return pd.DataFrame(levels.round(4), index=dates, columns=list(tickers))


def write_wide_csv(path: Path, frame: pd.DataFrame, date_header: str = "Date") -> Path:
    frame.rename_axis(date_header).reset_index().to_csv(path, index=False, date_format="%Y-%m-%d")
    return path


def to_long(frame: pd.DataFrame) -> pd.DataFrame:
    """Long rows (date, ticker, OHLCV) where the adjusted close is the wide price and the close is not."""
    long = frame.rename_axis("date").reset_index().melt(id_vars="date", var_name="ticker", value_name="adj")
    return pd.DataFrame(
        {
            "date": long["date"].dt.strftime("%Y-%m-%d"),
            "ticker": long["ticker"],
            "open": long["adj"] * 2.0,
            "high": long["adj"] * 3.0,
            "low": long["adj"] * 0.5,
            "close": long["adj"] * 1.5,
            "adj close": long["adj"],
            "volume": 1_000_000.0,
        }
    )


def write_text(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def assert_valid(table: PriceTable) -> None:
    assert table.dates.is_monotonic_increasing and table.dates.is_unique
    assert table.dates.tz is None
    assert (table.dates == table.dates.normalize()).all()
    assert table.prices.dtype == np.float64
    assert table.prices.shape == (len(table.dates), len(table.tickers))
    assert np.isfinite(table.prices).all() and (table.prices > 0).all()


# ---------------------------------------------------------------------------------------------- formats


def test_wide_csv(tmp_path: Path) -> None:
    frame = make_prices()
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame))
    assert_valid(table)
    assert table.tickers == TICKERS
    assert table.dates.equals(pd.DatetimeIndex(frame.index))
    np.testing.assert_array_equal(table.prices, frame.to_numpy())
    assert table.benchmark is None
    assert table.notes == ()


@pytest.mark.parametrize("header", ["date", "DATE", "Datetime", "timestamp", "Time", "", "Unnamed"])
def test_wide_csv_date_column_by_name_or_first_column(tmp_path: Path, header: str) -> None:
    frame = make_prices(num_days=10)
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame, date_header=header))
    assert table.tickers == TICKERS
    assert table.dates.equals(pd.DatetimeIndex(frame.index))


def test_wide_csv_gz_and_pandas_index_column(tmp_path: Path) -> None:
    frame = make_prices(num_days=10)
    path = tmp_path / "prices.csv.gz"
    frame.to_csv(path)  # the index is written as an unnamed first column
    table = load_prices(path)
    assert table.tickers == TICKERS
    np.testing.assert_array_equal(table.prices, frame.to_numpy())


def test_unsorted_dates_are_sorted_with_a_note(tmp_path: Path) -> None:
    frame = make_prices(num_days=10)
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame.iloc[::-1]))
    assert table.dates.equals(pd.DatetimeIndex(frame.index))
    np.testing.assert_array_equal(table.prices, frame.to_numpy())
    assert any("sorted" in note for note in table.notes)


def test_timezones_and_times_are_dropped_keeping_the_local_day(tmp_path: Path) -> None:
    text = "timestamp,AAA\n2020-01-02 16:00:00+09:00,1.0\n2020-01-03 16:00:00+09:00,2.0\n"
    table = load_prices(write_text(tmp_path / "prices.csv", text))
    assert table.dates.tz is None
    assert list(table.dates.strftime("%Y-%m-%d")) == ["2020-01-02", "2020-01-03"]


def test_integer_dates_and_a_tz_aware_parquet_index(tmp_path: Path) -> None:
    table = load_prices(write_text(tmp_path / "prices.csv", "date,AAA\n20200102,1.0\n20200103,2.0\n"))
    assert list(table.dates.strftime("%Y-%m-%d")) == ["2020-01-02", "2020-01-03"]
    frame = make_prices(num_days=5)
    frame.index = (frame.index + pd.Timedelta(hours=16)).tz_localize("Asia/Tokyo")
    frame.to_parquet(tmp_path / "prices.parquet")
    table = load_prices(tmp_path / "prices.parquet")
    assert table.dates.tz is None
    assert table.dates.equals(pd.DatetimeIndex(frame.index.tz_localize(None).normalize()))


@pytest.mark.parametrize("adjusted", ["Adj Close", "adj_close", "adjclose", "Adjusted Close", "ADJ_CLOSE"])
def test_long_csv_prefers_adjusted_close(tmp_path: Path, adjusted: str) -> None:
    frame = make_prices()
    long = to_long(frame).rename(
        columns={"date": "Date", "ticker": "Symbol", "open": "OPEN", "close": "Close", "adj close": adjusted}
    )
    long.to_csv(tmp_path / "long.csv", index=False)
    table = load_prices(tmp_path / "long.csv")
    assert_valid(table)
    assert table.tickers == TICKERS
    np.testing.assert_allclose(table.prices, frame.to_numpy())


def test_long_csv_uses_close_then_price_never_volume(tmp_path: Path) -> None:
    frame = make_prices()
    long = to_long(frame).drop(columns="adj close")
    long.to_csv(tmp_path / "close.csv", index=False)
    np.testing.assert_allclose(load_prices(tmp_path / "close.csv").prices, 1.5 * frame.to_numpy())

    priced = long[["date", "ticker", "volume", "close"]].rename(columns={"close": "Price", "ticker": "Asset"})
    priced.to_csv(tmp_path / "price.csv", index=False)
    np.testing.assert_allclose(load_prices(tmp_path / "price.csv").prices, 1.5 * frame.to_numpy())


def test_long_csv_keeps_first_appearance_order_and_unsorted_rows(tmp_path: Path) -> None:
    frame = make_prices(tickers=("ZZZ", "AAA", "MMM"))
    long = to_long(frame).sample(frac=1.0, random_state=0)
    long.to_csv(tmp_path / "long.csv", index=False)
    table = load_prices(tmp_path / "long.csv")
    expected = tuple(pd.unique(long["ticker"]))
    assert table.tickers == expected
    np.testing.assert_allclose(table.prices, frame[list(expected)].to_numpy())


def test_parquet_wide_with_datetime_index(tmp_path: Path) -> None:
    frame = make_prices()
    frame.to_parquet(tmp_path / "prices.parquet")
    table = load_prices(tmp_path / "prices.parquet")
    assert table.tickers == TICKERS
    assert table.dates.equals(pd.DatetimeIndex(frame.index))
    np.testing.assert_array_equal(table.prices, frame.to_numpy())


def test_parquet_long(tmp_path: Path) -> None:
    frame = make_prices()
    long = to_long(frame)
    long["date"] = pd.to_datetime(long["date"])
    long.to_parquet(tmp_path / "prices.pq", index=False)
    table = load_prices(tmp_path / "prices.pq")
    assert table.tickers == TICKERS
    np.testing.assert_allclose(table.prices, frame.to_numpy())


def test_bundled_data_set() -> None:
    assert BUNDLED_PRICES.is_file()
    table = load_prices()
    assert_valid(table)
    assert len(table.tickers) == 20 and len(table.dates) == 8313
    assert table.benchmark is not None and table.benchmark.shape == (8313,)
    assert np.isfinite(table.benchmark).all() and (table.benchmark > 0).all()
    assert load_prices("").prices.shape == (8313, 20)


def test_bundled_data_set_with_selection() -> None:
    table = load_prices(tickers=["MSFT", "AAPL"], start="2000-01-01", end="2000-12-31")
    assert table.tickers == ("MSFT", "AAPL")
    assert table.dates[0] >= pd.Timestamp("2000-01-01") and table.dates[-1] <= pd.Timestamp("2000-12-31")
    assert table.benchmark is not None and table.benchmark.shape == (len(table.dates),)


# ---------------------------------------------------------------------------------------------- selection


def test_ticker_selection_and_order(tmp_path: Path) -> None:
    frame = make_prices()
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame), tickers=["CCC", "AAA"])
    assert table.tickers == ("CCC", "AAA")
    np.testing.assert_array_equal(table.prices, frame[["CCC", "AAA"]].to_numpy())


def test_max_assets_keeps_the_first_tickers_unless_tickers_are_named(tmp_path: Path) -> None:
    path = write_wide_csv(tmp_path / "prices.csv", make_prices())
    assert load_prices(path, max_assets=2).tickers == ("AAA", "BBB")
    assert load_prices(path, max_assets=9).tickers == TICKERS
    assert load_prices(path, tickers=["CCC", "BBB", "AAA"], max_assets=2).tickers == ("CCC", "BBB", "AAA")


def test_ticker_selection_in_a_long_file(tmp_path: Path) -> None:
    frame = make_prices()
    to_long(frame).to_csv(tmp_path / "long.csv", index=False)
    table = load_prices(tmp_path / "long.csv", tickers=("BBB",))
    assert table.tickers == ("BBB",)
    np.testing.assert_allclose(table.prices, frame[["BBB"]].to_numpy())


def test_start_and_end_are_inclusive(tmp_path: Path) -> None:
    frame = make_prices()
    path = write_wide_csv(tmp_path / "prices.csv", frame)
    first, last = frame.index[5], frame.index[20]
    table = load_prices(path, start=first.strftime("%Y-%m-%d"), end=last.strftime("%Y-%m-%d"))
    assert table.dates[0] == first and table.dates[-1] == last
    assert len(table.dates) == 16
    np.testing.assert_array_equal(table.prices, frame.iloc[5:21].to_numpy())


def test_bad_values_outside_the_selection_are_ignored(tmp_path: Path) -> None:
    frame = make_prices().astype(object)
    frame.iloc[0, 0] = "oops"
    frame.iloc[3, 1] = -1.0
    path = write_wide_csv(tmp_path / "prices.csv", frame)
    assert load_prices(path, tickers=["CCC"]).num_days == 40
    assert load_prices(path, start=frame.index[4].strftime("%Y-%m-%d")).num_days == 36


# ---------------------------------------------------------------------------------------------- gaps


def test_short_gaps_are_forward_filled_with_a_note(tmp_path: Path) -> None:
    frame = make_prices()
    gappy = frame.copy()
    gappy.iloc[10:13, 1] = np.nan
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", gappy), max_fill_days=3)
    assert_valid(table)
    assert table.num_days == 40
    np.testing.assert_array_equal(table.prices[10:13, 1], np.full(3, frame.iloc[9, 1]))
    np.testing.assert_array_equal(table.prices[:, [0, 2]], frame.iloc[:, [0, 2]].to_numpy())
    assert any("BBB" in note and "forward-filled 3" in note for note in table.notes)


def test_long_gap_is_an_error_naming_ticker_and_dates(tmp_path: Path) -> None:
    frame = make_prices()
    frame.iloc[10:14, 2] = np.nan
    path = write_wide_csv(tmp_path / "prices.csv", frame)
    with pytest.raises(DataError, match=r"CCC has no price on 4 consecutive rows, 2020-01-15 to 2020-01-20"):
        load_prices(path, max_fill_days=3)
    assert load_prices(path, max_fill_days=4).num_days == 40


def test_no_fill_allowed_with_max_fill_days_zero(tmp_path: Path) -> None:
    frame = make_prices()
    frame.iloc[10, 0] = np.nan
    with pytest.raises(DataError, match="max_fill_days=0"):
        load_prices(write_wide_csv(tmp_path / "prices.csv", frame), max_fill_days=0)


def test_late_start_and_early_end_trim_with_notes(tmp_path: Path) -> None:
    frame = make_prices()
    frame.iloc[:7, 1] = np.nan  # BBB starts late
    frame.iloc[-3:, 2] = np.nan  # CCC ends early
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame), max_fill_days=0)
    assert_valid(table)
    assert table.dates[0] == frame.index[7] and table.dates[-1] == frame.index[-4]
    np.testing.assert_array_equal(table.prices, frame.iloc[7:-3].to_numpy())
    assert any(note.startswith("BBB starts on") and "dropped 7" in note for note in table.notes)
    assert any(note.startswith("CCC ends on") and "dropped 3" in note for note in table.notes)


def test_late_start_in_a_long_file(tmp_path: Path) -> None:
    frame = make_prices()
    long = to_long(frame)
    late = (long["ticker"] == "AAA") & (long["date"] < frame.index[5].strftime("%Y-%m-%d"))
    long[~late].to_csv(tmp_path / "long.csv", index=False)
    table = load_prices(tmp_path / "long.csv")
    assert table.num_days == 35
    assert any("AAA starts on" in note and "dropped 5" in note for note in table.notes)


def test_rows_without_any_price_are_dropped(tmp_path: Path) -> None:
    frame = make_prices()
    frame.iloc[10] = np.nan
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame), max_fill_days=0)
    assert table.num_days == 39
    assert frame.index[10] not in table.dates
    assert any("none of the selected tickers" in note for note in table.notes)


def test_tickers_without_common_dates(tmp_path: Path) -> None:
    frame = make_prices(tickers=("AAA", "BBB"))
    frame.iloc[:20, 0] = np.nan
    frame.iloc[20:, 1] = np.nan
    with pytest.raises(DataError, match="no dates in common"):
        load_prices(write_wide_csv(tmp_path / "prices.csv", frame))


# ---------------------------------------------------------------------------------------------- errors


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"not found: .*nope\.csv"):
        load_prices(tmp_path / "nope.csv")


def test_unknown_extension(tmp_path: Path) -> None:
    path = write_text(tmp_path / "prices.xlsx", "Date,A\n2020-01-02,1\n")
    with pytest.raises(DataError, match=r"prices\.xlsx: unknown file type"):
        load_prices(path)


@pytest.mark.parametrize(
    ("name", "content"),
    [("bad.parquet", b"this is not parquet"), ("bad.csv.gz", b"not gzip at all"), ("bad.csv", b'a,"b\n1,2\n')],
)
def test_unreadable_file(tmp_path: Path, name: str, content: bytes) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError, match=rf"{name}: cannot read it as"):
        load_prices(path)


@pytest.mark.parametrize("content", ["", "Date,AAA,BBB\n"])
def test_empty_file(tmp_path: Path, content: str) -> None:
    with pytest.raises(DataError, match="empty file"):
        load_prices(write_text(tmp_path / "prices.csv", content))


def test_unparseable_date_shows_value_and_line(tmp_path: Path) -> None:
    text = "Date,AAA\n2020-01-02,1.0\n2020-01-03,1.1\nnot-a-date,1.2\n"
    with pytest.raises(DataError, match=r"unparseable date 'not-a-date' in column 'Date' \(line 4\)"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_empty_date(tmp_path: Path) -> None:
    text = "Date,AAA\n2020-01-02,1.0\n,1.1\n"
    with pytest.raises(DataError, match=r"empty date in column 'Date' \(line 3\)"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_no_date_column(tmp_path: Path) -> None:
    text = "AAA,BBB\n1.0,2.0\n1.1,2.1\n"
    with pytest.raises(DataError, match="no date column"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_duplicate_date(tmp_path: Path) -> None:
    text = "Date,AAA\n2020-01-02,1.0\n2020-01-03,1.1\n2020-01-03,1.2\n"
    with pytest.raises(DataError, match=r"duplicate date 2020-01-03 \(line 3 and line 4\)"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_duplicate_date_and_ticker_in_long_file(tmp_path: Path) -> None:
    text = "date,ticker,close\n2020-01-02,AAA,1.0\n2020-01-02,BBB,2.0\n2020-01-02,AAA,1.5\n"
    with pytest.raises(DataError, match="more than one row for ticker AAA on 2020-01-02"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_non_numeric_price(tmp_path: Path) -> None:
    text = "Date,AAA,BBB\n2020-01-02,1.0,2.0\n2020-01-03,1.1,n/a!\n2020-01-06,1.2,2.2\n"
    with pytest.raises(DataError, match=r"non-numeric price 'n/a!' for ticker BBB on 2020-01-03"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_non_numeric_price_in_long_file(tmp_path: Path) -> None:
    text = "date,symbol,close\n2020-01-02,AAA,1.0\n2020-01-02,BBB,abc\n"
    with pytest.raises(DataError, match=r"non-numeric price 'abc' for ticker BBB on 2020-01-02"):
        load_prices(write_text(tmp_path / "prices.csv", text))


@pytest.mark.parametrize(("value", "kind"), [("0", "non-positive"), ("-3.5", "non-positive"), ("inf", "non-finite")])
def test_invalid_price_values(tmp_path: Path, value: str, kind: str) -> None:
    text = f"Date,AAA,BBB\n2020-01-02,1.0,2.0\n2020-01-03,{value},2.1\n"
    with pytest.raises(DataError, match=rf"{kind} price .* for ticker AAA on 2020-01-03"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_no_price_column_wide(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no price column"):
        load_prices(write_text(tmp_path / "prices.csv", "Date\n2020-01-02\n2020-01-03\n"))


def test_no_price_column_long(tmp_path: Path) -> None:
    text = "date,ticker,open,volume\n2020-01-02,AAA,1.0,100\n"
    with pytest.raises(DataError, match=r"no price column.*found: date, ticker, open, volume"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_ohlcv_file_without_ticker_column(tmp_path: Path) -> None:
    text = "Date,Open,High,Low,Close,Volume\n2020-01-02,1,2,0.5,1.5,100\n"
    with pytest.raises(DataError, match="needs a ticker column"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_unknown_tickers_list_the_available_ones(tmp_path: Path) -> None:
    path = write_wide_csv(tmp_path / "prices.csv", make_prices())
    with pytest.raises(DataError, match=r"unknown ticker\(s\) XXX, YYY; available: AAA, BBB, CCC"):
        load_prices(path, tickers=["AAA", "XXX", "YYY"])


def test_start_end_leaving_no_rows(tmp_path: Path) -> None:
    path = write_wide_csv(tmp_path / "prices.csv", make_prices())
    with pytest.raises(DataError, match=r"no rows between 2021-01-01 and .*the file covers 2020-01-01 to 2020-02-25"):
        load_prices(path, start="2021-01-01")
    with pytest.raises(DataError, match="no rows between"):
        load_prices(path, start="2020-02-01", end="2020-01-01")


def test_bad_start_date(tmp_path: Path) -> None:
    path = write_wide_csv(tmp_path / "prices.csv", make_prices())
    with pytest.raises(DataError, match="start 'soon' is not a date"):
        load_prices(path, start="soon")


def test_ticker_with_no_prices(tmp_path: Path) -> None:
    frame = make_prices()
    frame["CCC"] = np.nan
    with pytest.raises(DataError, match="ticker CCC has no prices"):
        load_prices(write_wide_csv(tmp_path / "prices.csv", frame))


def test_error_messages_are_one_line(tmp_path: Path) -> None:
    path = write_text(tmp_path / "bad.parquet", "garbage\nmore garbage\n")
    with pytest.raises(DataError) as info:
        load_prices(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("delimiter", "name"), [(";", "semicolons"), ("\t", "tabs"), ("|", "pipes"), (" ", "spaces")])
def test_another_delimiter_says_to_save_as_comma_separated(tmp_path: Path, delimiter: str, name: str) -> None:
    frame = make_prices()
    frame.rename_axis("Date").reset_index().to_csv(tmp_path / "prices.csv", sep=delimiter, index=False)
    with pytest.raises(DataError, match=rf"separated by {name}, not commas; save it as comma-separated CSV"):
        load_prices(tmp_path / "prices.csv")


@pytest.mark.parametrize("header", ["Date,AAA,AAA,BBB", "Date,AAA, AAA ,BBB"])
def test_two_price_columns_for_one_ticker(tmp_path: Path, header: str) -> None:
    text = f"{header}\n2020-01-02,1,2,3\n2020-01-03,1,2,3\n"
    with pytest.raises(DataError, match=r"more than one column named 'AAA'; keep one price column per ticker"):
        load_prices(write_text(tmp_path / "prices.csv", text))


def test_two_price_columns_for_one_ticker_in_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns = [pa.array(["2020-01-02", "2020-01-03"]), pa.array([1.0, 1.1]), pa.array([2.0, 2.1])]
    pq.write_table(pa.table(columns, names=["date", "AAA", "AAA"]), tmp_path / "prices.parquet")
    with pytest.raises(DataError, match=r"more than one column named 'AAA'"):
        load_prices(tmp_path / "prices.parquet")


@pytest.mark.parametrize("name", ["prices.csv", "prices.csv.gz", "prices.parquet"])
def test_a_folder_named_like_a_price_file(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(DataError, match=r"is a folder, not a price file; pass the CSV or Parquet file itself"):
        load_prices(tmp_path / name)


# ---------------------------------------------------------------------------------------------- point-in-time universe

FORMATS = ["long.csv", "long.csv.gz", "long.parquet"]


def listing_prices(num_days: int = 40) -> pd.DataFrame:
    """AAA trades throughout, BBB lists on row 7, CCC delists after row 33, DDD lives on rows 5 to 30."""
    frame = make_prices(num_days=num_days, tickers=("AAA", "BBB", "CCC", "DDD"))
    frame.iloc[:7, 1] = np.nan
    frame.iloc[34:, 2] = np.nan
    frame.iloc[:5, 3] = np.nan
    frame.iloc[31:, 3] = np.nan
    return frame


def write_long(path: Path, long: pd.DataFrame) -> Path:
    """Writes long rows in the format the name says; Parquet gets real dates."""
    if path.name.endswith(".parquet"):
        long = long.assign(date=pd.to_datetime(long["date"]))
        long.to_parquet(path, index=False)
    else:
        long.to_csv(path, index=False)
    return path


def long_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """``to_long`` without the rows of a ticker that has no price that day (not listed yet, delisted, gap)."""
    long = to_long(frame)
    return long[long["adj close"].notna()].reset_index(drop=True)


def life_mask(frame: pd.DataFrame) -> np.ndarray:
    has = frame.notna().to_numpy()
    return (np.cumsum(has, axis=0) > 0) & (np.cumsum(has[::-1], axis=0)[::-1] > 0)


@pytest.mark.parametrize("name", FORMATS)
def test_point_in_time_keeps_every_date_with_nan_outside_each_life(tmp_path: Path, name: str) -> None:
    frame = listing_prices()
    table = load_prices(write_long(tmp_path / name, long_rows(frame)), universe="point_in_time")
    assert table.universe == "point_in_time"
    assert table.tickers == ("AAA", "BBB", "CCC", "DDD")
    assert table.dates.equals(pd.DatetimeIndex(frame.index))
    expected = frame.to_numpy()
    np.testing.assert_array_equal(np.isnan(table.prices), np.isnan(expected))
    np.testing.assert_allclose(table.prices, expected)  # NaN where expected is NaN
    assert table.tradable.dtype == bool
    np.testing.assert_array_equal(table.tradable, life_mask(frame))
    assert not table.prices.flags.writeable
    assert (table.prices[table.tradable] > 0).all()
    day = [d.strftime("%Y-%m-%d") for d in frame.index]
    assert f"BBB starts on {day[7]}: not tradable (NaN) on the 7 earlier row(s)" in table.notes
    assert f"CCC ends on {day[33]}: not tradable (NaN) on the 6 later row(s)" in table.notes
    assert f"DDD starts on {day[5]} and ends on {day[30]}: not tradable (NaN) on the 5 earlier and 9 later row(s)" in (
        table.notes
    )
    assert not any(note.startswith("AAA") for note in table.notes)


@pytest.mark.parametrize("name", FORMATS)
def test_common_universe_trims_the_listing_file_as_before(tmp_path: Path, name: str) -> None:
    frame = listing_prices()
    table = load_prices(write_long(tmp_path / name, long_rows(frame)))
    assert_valid(table)
    assert table.universe == "common"
    assert table.dates.equals(pd.DatetimeIndex(frame.index[7:31]))
    np.testing.assert_allclose(table.prices, frame.iloc[7:31].to_numpy())
    assert table.tradable.all()
    assert dict(table.columns) == {}
    assert any(note.startswith("BBB starts on") and "dropped 7 earlier" in note for note in table.notes)
    assert any(note.startswith("DDD ends on") and "dropped 9 later" in note for note in table.notes)


def test_every_gap_is_untradable_under_point_in_time_and_a_long_one_an_error_under_common(tmp_path: Path) -> None:
    frame = make_prices()
    frame.iloc[10:14, 0] = np.nan  # 4 rows: longer than max_fill_days=3
    frame.iloc[20:22, 1] = np.nan  # 2 rows: filled
    frame.iloc[25:29, 1] = np.nan
    frame.iloc[31:35, 1] = np.nan
    path = write_wide_csv(tmp_path / "prices.csv", frame)
    with pytest.raises(DataError, match=r"AAA has no price on 4 consecutive rows, 2020-01-15 to 2020-01-20"):
        load_prices(path, max_fill_days=3)

    table = load_prices(path, max_fill_days=3, universe="point_in_time")
    assert table.num_days == 40
    expected = frame.to_numpy().copy()
    expected[20:22, 1] = frame.iloc[19, 1]
    np.testing.assert_array_equal(table.prices, expected)
    assert not table.tradable[10:14, 0].any() and table.tradable[[9, 14], 0].all()
    # A short gap carries the last price for the features, but nobody quoted it: untradable from its first day too.
    assert not table.tradable[20:22, 1].any() and table.tradable[[19, 22], 1].all()
    assert table.tradable.sum() == 40 * 3 - 14
    assert "AAA: not tradable (NaN) on 1 gap(s) longer than max_fill_days=3: 4 rows, 2020-01-15 to 2020-01-20" in (
        table.notes
    )
    assert (
        "BBB: not tradable (NaN) on 2 gap(s) longer than max_fill_days=3: 4 rows, 2020-02-05 to 2020-02-10; "
        "4 rows, 2020-02-13 to 2020-02-18"
    ) in table.notes
    assert (
        "BBB: no price on 2 day(s) in 1 gap(s) of at most max_fill_days=3 (untradable, the features carry the last "
        "price), longest 2, first on 2020-01-29"
    ) in table.notes


def test_point_in_time_without_any_fill(tmp_path: Path) -> None:
    frame = make_prices()
    frame.iloc[10, 2] = np.nan
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame), max_fill_days=0, universe="point_in_time")
    assert np.isnan(table.prices[10, 2]) and table.tradable.sum() == 40 * 3 - 1
    assert any(note.startswith("CCC: not tradable (NaN) on 1 gap(s)") for note in table.notes)


def test_point_in_time_drops_rows_without_any_price(tmp_path: Path) -> None:
    frame = listing_prices()
    frame.iloc[12] = np.nan
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame), universe="point_in_time")
    assert table.num_days == 39 and frame.index[12] not in table.dates
    assert any("none of the selected tickers" in note for note in table.notes)
    assert table.tradable.all(axis=0).tolist() == [True, False, False, False]


def test_point_in_time_ticker_with_no_prices_is_an_error(tmp_path: Path) -> None:
    frame = listing_prices()
    path = write_wide_csv(tmp_path / "prices.csv", frame)
    with pytest.raises(DataError, match=r"ticker BBB has no prices between 2020-01-01 and 2020-01-09"):
        load_prices(path, end=frame.index[6].strftime("%Y-%m-%d"), universe="point_in_time")


def test_point_in_time_with_many_partial_tickers_sums_them_up_in_one_note(tmp_path: Path) -> None:
    tickers = tuple(f"T{i:02d}" for i in range(13))
    frame = make_prices(tickers=tickers)
    for i in range(1, 13):
        frame.iloc[:i, i] = np.nan  # T01..T12 start late
    frame.iloc[-2:, 5] = np.nan  # T05 also ends early
    table = load_prices(write_wide_csv(tmp_path / "prices.csv", frame), universe="point_in_time")
    assert table.num_days == 40
    lives = [note for note in table.notes if "trade on part of the dates" in note]
    assert len(lives) == 1
    assert lives[0].startswith("12 of 13 tickers trade on part of the dates only")
    assert "12 start late, 1 end early (e.g. T01 2020-01-02 to 2020-02-25," in lives[0]
    assert not any(" starts on " in note for note in table.notes)


def test_unknown_universe(tmp_path: Path) -> None:
    path = write_wide_csv(tmp_path / "prices.csv", make_prices())
    with pytest.raises(DataError, match=r"universe must be one of common, point_in_time, got 'survivors'"):
        load_prices(path, universe="survivors")


def test_price_table_checks_nan_by_universe() -> None:
    dates = pd.bdate_range("2020-01-01", periods=3)
    prices = np.array([[1.0, np.nan], [1.1, 2.0], [1.2, 2.1]])
    with pytest.raises(ValueError, match="finite and positive"):
        PriceTable(dates=dates, tickers=("A", "B"), prices=prices)
    table = PriceTable(dates=dates, tickers=("A", "B"), prices=prices, universe="point_in_time")
    np.testing.assert_array_equal(table.tradable, ~np.isnan(prices))
    for bad in (np.inf, 0.0, -1.0):
        broken = prices.copy()
        broken[1, 1] = bad
        with pytest.raises(ValueError, match="finite and positive where present"):
            PriceTable(dates=dates, tickers=("A", "B"), prices=broken, universe="point_in_time")
    with pytest.raises(ValueError, match="universe must be one of"):
        PriceTable(dates=dates, tickers=("A", "B"), prices=prices, universe="all")
    full = PriceTable(dates=dates, tickers=("A", "B"), prices=np.ones((3, 2)))
    assert full.universe == "common" and full.tradable.all() and len(full.columns) == 0


def test_price_table_checks_user_columns() -> None:
    dates = pd.bdate_range("2020-01-01", periods=3)
    ones = np.ones((3, 2))
    PriceTable(dates=dates, tickers=("A", "B"), prices=ones, columns={"v": np.full((3, 2), np.nan)})
    for bad in (np.ones((2, 2)), np.ones((3, 2), dtype=np.float32), np.full((3, 2), np.inf)):
        with pytest.raises(ValueError, match="column 'v'"):
            PriceTable(dates=dates, tickers=("A", "B"), prices=ones, columns={"v": bad})


# ---------------------------------------------------------------------------------------------- user columns


def with_user_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Long rows with a volume that names its row and a signal missing on some rows."""
    long = long_rows(frame)
    row = pd.DatetimeIndex(pd.to_datetime(long["date"])).map(frame.index.get_loc).to_numpy()
    asset = long["ticker"].map({t: j for j, t in enumerate(frame.columns)}).to_numpy()
    long["volume"] = 1000.0 * row + asset
    signal = -0.5 + 0.01 * row + 0.1 * asset
    signal[row % 4 == 1] = np.nan
    signal[(asset == 1) & (row < 12)] = np.nan  # BBB's signal starts 5 rows after its listing
    long["My Signal"] = signal
    return long


def expected_user_column(frame: pd.DataFrame, long: pd.DataFrame, column: str) -> np.ndarray:
    """The column forward-filled within each ticker's life, written out by hand."""
    values = long.assign(date=pd.to_datetime(long["date"])).pivot(index="date", columns="ticker", values=column)
    values = values.reindex(index=frame.index, columns=frame.columns).to_numpy()
    life = life_mask(frame)
    out = np.full(values.shape, np.nan)
    for j in range(values.shape[1]):
        last = np.nan
        for t in range(values.shape[0]):
            if not life[t, j]:
                continue
            last = values[t, j] if not np.isnan(values[t, j]) else last
            out[t, j] = last
    return out


@pytest.mark.parametrize("name", FORMATS)
def test_user_columns_are_aligned_and_forward_filled_within_each_life(tmp_path: Path, name: str) -> None:
    frame = listing_prices()
    long = with_user_columns(frame)
    path = write_long(tmp_path / name, long)
    table = load_prices(path, universe="point_in_time", columns=("volume", "My Signal"))
    assert list(table.columns) == ["volume", "My Signal"]
    volume, signal = table.columns["volume"], table.columns["My Signal"]
    for values in (volume, signal):
        assert values.dtype == np.float64 and values.shape == (40, 4)
        assert not values.flags.writeable
    np.testing.assert_array_equal(volume, expected_user_column(frame, long, "volume"))
    np.testing.assert_array_equal(np.isnan(volume), ~life_mask(frame))
    expected = expected_user_column(frame, long, "My Signal")
    np.testing.assert_allclose(signal, expected)
    assert np.isnan(signal[5, 0]) == np.isnan(expected[5, 0]) and signal[5, 0] == signal[4, 0]  # row 5 filled
    assert np.isnan(signal[:12, 1]).all() and not np.isnan(signal[12:, 1]).any()
    assert np.isnan(signal[34:, 2]).all()  # CCC delisted: nothing carried past its life
    assert any(
        note.startswith("column 'My Signal': forward-filled") and "NaN before the first value of BBB" in note
        for note in table.notes
    )
    with pytest.raises(TypeError):
        table.columns["extra"] = volume  # type: ignore[index]


def test_user_columns_under_the_common_universe_carry_values_known_before_the_trim(tmp_path: Path) -> None:
    frame = listing_prices()
    long = with_user_columns(frame)
    long.loc[(long["ticker"] == "AAA") & (long["date"] > frame.index[2].strftime("%Y-%m-%d")), "My Signal"] = np.nan
    table = load_prices(write_long(tmp_path / "long.csv", long), columns=["My Signal", "volume"])
    assert table.dates.equals(pd.DatetimeIndex(frame.index[7:31]))
    signal = table.columns["My Signal"]
    np.testing.assert_allclose(signal, expected_user_column(frame, long, "My Signal")[7:31])
    np.testing.assert_allclose(signal[:, 0], -0.5 + 0.01 * 2)  # AAA's value of row 2, known ever since
    assert np.isnan(signal[:5, 1]).all() and not np.isnan(signal[5:, 1]).any()
    np.testing.assert_array_equal(table.columns["volume"], expected_user_column(frame, long, "volume")[7:31])


def test_user_column_names_match_exactly_then_in_any_case(tmp_path: Path) -> None:
    frame = make_prices()
    long = to_long(frame).assign(signal=1.0, Signal=2.0)
    path = write_long(tmp_path / "long.csv", long)
    table = load_prices(path, columns=[" VOLUME ", "adj close", "Open", "signal", "Signal"])
    assert list(table.columns) == ["VOLUME", "adj close", "Open", "signal", "Signal"]
    assert (table.columns["VOLUME"] == 1_000_000.0).all()
    np.testing.assert_array_equal(table.columns["adj close"], table.prices)
    np.testing.assert_allclose(table.columns["Open"], 2.0 * frame.to_numpy())
    assert (table.columns["signal"] == 1.0).all() and (table.columns["Signal"] == 2.0).all()
    with pytest.raises(DataError, match=r"long\.csv: no column 'SIGNAL', and it matches signal, Signal but for case"):
        load_prices(path, columns=["SIGNAL"])


def test_boolean_user_columns_read_as_zero_and_one(tmp_path: Path) -> None:
    text = (
        "date,ticker,close,earnings\n"
        "2020-01-02,AAA,1.0,True\n2020-01-02,BBB,2.0,False\n"
        "2020-01-03,AAA,1.1,\n2020-01-03,BBB,2.1,True\n"
    )
    table = load_prices(write_text(tmp_path / "long.csv", text), columns=["earnings"])
    np.testing.assert_array_equal(table.columns["earnings"], [[1.0, 0.0], [1.0, 1.0]])


def test_bad_user_values_outside_the_selection_are_ignored(tmp_path: Path) -> None:
    text = (
        "date,ticker,close,signal\n"
        "2020-01-02,AAA,1.0,abc\n2020-01-02,BBB,2.0,inf\n"
        "2020-01-03,AAA,1.1,0.5\n2020-01-03,BBB,2.1,abc\n"
    )
    path = write_text(tmp_path / "long.csv", text)
    assert load_prices(path, tickers=["AAA"], start="2020-01-03", columns=["signal"]).columns["signal"][0, 0] == 0.5


USER_COLUMN_ERRORS = [
    (
        "date,ticker,close,volume,note\n2020-01-02,AAA,1.0,5,x\n",
        ["volum"],
        r"long\.csv: no column 'volum'; numeric columns: close, volume$",
    ),
    (
        "date,ticker,close,signal\n2020-01-02,AAA,1.0,0.1\n2020-01-03,BBB,2.0,abc\n",
        ["signal"],
        r"long\.csv: non-numeric value 'abc' in column 'signal' for ticker BBB on 2020-01-03$",
    ),
    (
        "date,ticker,close,signal\n2020-01-02,AAA,1.0,0.1\n2020-01-03,AAA,1.1,-inf\n",
        ["signal"],
        r"long\.csv: infinite value -inf in column 'signal' for ticker AAA on 2020-01-03$",
    ),
    (
        "date,ticker,close,signal\n2020-01-02,AAA,1.0,\n2020-01-03,AAA,1.1,\n2020-01-03,BBB,2.0,1\n",
        ["signal"],
        None,  # tickers=["AAA"]: the only value is another ticker's
    ),
    (
        "date,ticker,close,signal\n2020-01-02,AAA,1.0,5\n",
        ["signal", "signal "],
        r"^column\(s\) requested more than once: signal$",
    ),
    (
        "date,ticker,close,volume\n2020-01-02,AAA,1.0,5\n",
        ["volume", "VOLUME"],
        r"long\.csv: columns 'volume' and 'VOLUME' both name column 'volume'; ask for it once$",
    ),
    (
        "Date,Symbol,close\n2020-01-02,AAA,1.0\n",
        ["symbol"],
        r"long\.csv: column 'Symbol' holds the dates or the tickers, not values to load$",
    ),
]


@pytest.mark.parametrize(("text", "columns", "message"), USER_COLUMN_ERRORS)
def test_user_column_errors(tmp_path: Path, text: str, columns: list[str], message: str | None) -> None:
    path = write_text(tmp_path / "long.csv", text)
    tickers = ["AAA"] if message is None else []
    message = message or r"long\.csv: column 'signal' has no value for the selected tickers between 2020-01-02 and "
    with pytest.raises(DataError, match=message) as info:
        load_prices(path, tickers=tickers, columns=columns)
    assert "\n" not in str(info.value)


def test_user_columns_need_a_long_file(tmp_path: Path) -> None:
    path = write_wide_csv(tmp_path / "prices.csv", make_prices())
    with pytest.raises(DataError, match=r"prices\.csv: column 'volume' needs a long file .* a wide file holds only"):
        load_prices(path, columns=["volume"])
    with pytest.raises(DataError, match="needs a long file"):
        load_prices(columns=["volume"])  # the bundled data set is wide


def test_a_user_column_missing_before_its_ticker_lives_is_no_value(tmp_path: Path) -> None:
    text = "date,ticker,close,signal\n2020-01-02,AAA,1.0,\n2020-01-02,BBB,,3\n2020-01-03,AAA,1.1,\n2020-01-03,BBB,2,\n"
    with pytest.raises(DataError, match=r"column 'signal' has no value for the selected tickers"):
        load_prices(write_text(tmp_path / "long.csv", text), columns=["signal"], universe="point_in_time")


# ---------------------------------------------------------------------------------------------- series files


PANEL = pd.bdate_range("2020-01-06", periods=15)  # 2020-01-06 to 2020-01-24


def write_series(path: Path, dates: pd.DatetimeIndex, values: object, name: str = "level", **more: object) -> Path:
    frame = pd.DataFrame({"date": dates, name: values, **more})
    if path.name.endswith(".parquet"):
        frame.set_index("date").to_parquet(path)
    else:
        frame.to_csv(path, index=False, date_format="%Y-%m-%d")
    return path


@pytest.mark.parametrize("name", ["bench.csv", "bench.csv.gz", "bench.parquet"])
def test_benchmark_series_on_the_panel_dates(tmp_path: Path, name: str) -> None:
    days = pd.date_range("2019-12-20", "2020-02-10")  # calendar days: more dates than the panel
    levels = 100.0 + np.arange(len(days))
    series = load_series(write_series(tmp_path / name, days[::-1], levels[::-1]), PANEL, what="benchmark")
    assert series.dtype == np.float64 and series.shape == (15,)
    assert not series.flags.writeable
    np.testing.assert_array_equal(series, levels[days.get_indexer(PANEL)])


def test_series_fills_short_runs_of_missing_dates_and_rejects_long_ones(tmp_path: Path) -> None:
    levels = pd.Series(100.0 + np.arange(15), index=PANEL)
    gappy = levels.drop(PANEL[[3, 4]])
    gappy[PANEL[8]] = np.nan  # an empty value is a missing date
    path = write_series(tmp_path / "bench.csv", gappy.index, gappy.to_numpy())
    expected = levels.to_numpy().copy()
    expected[[3, 4]] = expected[2]
    expected[8] = expected[7]
    np.testing.assert_array_equal(load_series(path, PANEL, what="benchmark", max_fill_days=2), expected)
    with pytest.raises(
        DataError,
        match=r"bench\.csv: no benchmark level on 2 consecutive price dates, 2020-01-09 to 2020-01-10, more than "
        r"max_fill_days=1$",
    ):
        load_series(path, PANEL, what="benchmark", max_fill_days=1)


@pytest.mark.parametrize(
    ("days", "uncovered"),
    [
        (pd.bdate_range("2020-01-08", "2020-02-28"), "2020-01-06"),
        (pd.bdate_range("2019-12-02", "2020-01-21"), "2020-01-22"),
    ],
)
def test_series_must_cover_every_panel_date(tmp_path: Path, days: pd.DatetimeIndex, uncovered: str) -> None:
    path = write_series(tmp_path / "rf.csv", days, np.full(len(days), 0.01))
    first, last = days[0].strftime("%Y-%m-%d"), days[-1].strftime("%Y-%m-%d")
    with pytest.raises(
        DataError,
        match=rf"rf\.csv: no risk-free rate on {uncovered}; the file has values from {first} to {last}, the prices "
        r"run from 2020-01-06 to 2020-01-24$",
    ):
        load_series(path, PANEL, what="risk_free")


def test_series_value_column(tmp_path: Path) -> None:
    days = pd.bdate_range("2020-01-01", "2020-01-31")
    rates = np.linspace(0.01, 0.02, len(days))
    path = write_series(tmp_path / "rf.csv", days, rates, name="DGS3MO", source="FRED")
    np.testing.assert_allclose(load_series(path, PANEL, what="risk_free"), rates[days.get_indexer(PANEL)])
    path = write_series(tmp_path / "two.csv", days, rates, name="a", b=rates)
    with pytest.raises(DataError, match=r"two\.csv: more than one numeric column \(a, b\); keep the dates and one"):
        load_series(path, PANEL, what="risk_free")
    path = write_series(tmp_path / "none.csv", days, "x", name="a", b="y")
    with pytest.raises(DataError, match=r"none\.csv: no numeric value column besides the dates 'date' \(found: a, b"):
        load_series(path, PANEL, what="risk_free")


SERIES_ERRORS = [
    ("benchmark", "abc", r"non-numeric value 'abc' in column 'level' on 2020-01-10$"),
    ("benchmark", "inf", r"non-finite benchmark level inf in column 'level' on 2020-01-10$"),
    (
        "benchmark",
        "0",
        r"non-positive benchmark level 0 in column 'level' on 2020-01-10; a benchmark is a total-return",
    ),
    ("risk_free", "5.25", r"risk-free rate 5.25 in column 'level' on 2020-01-10 looks like a percentage; .* divide"),
    ("risk_free", "-0.6", r"risk-free rate -0.6 in column 'level' on 2020-01-10 is below -0.5"),
]


@pytest.mark.parametrize(("what", "value", "message"), SERIES_ERRORS)
def test_series_value_errors(tmp_path: Path, what: str, value: str, message: str) -> None:
    days = pd.bdate_range("2020-01-01", "2020-01-31")
    values = np.full(len(days), "0.01", dtype=object)
    values[days.get_loc(pd.Timestamp("2020-01-10"))] = value
    path = write_series(tmp_path / "series.csv", days, values)
    with pytest.raises(DataError, match=rf"series\.csv: {message}") as info:
        load_series(path, PANEL, what=what)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)
    values[days.get_loc(pd.Timestamp("2020-01-10"))] = "0.02"
    values[0] = value  # outside the panel's dates: not read
    assert load_series(write_series(path, days, values), PANEL, what=what).shape == (15,)  # type: ignore[arg-type]


def test_risk_free_rates_may_be_negative(tmp_path: Path) -> None:
    path = write_series(tmp_path / "rf.parquet", PANEL, np.full(15, -0.0075))
    np.testing.assert_array_equal(load_series(path, PANEL, what="risk_free"), np.full(15, -0.0075))


def test_series_file_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"risk-free file not found: .*nope\.csv"):
        load_series(tmp_path / "nope.csv", PANEL, what="risk_free")
    text = "date,level\n2020-01-06,1\n2020-01-07,1\n2020-01-07,2\n"
    with pytest.raises(DataError, match=r"duplicate date 2020-01-07 \(line 3 and line 4\)"):
        load_series(write_text(tmp_path / "dup.csv", text), PANEL, what="benchmark")
    with pytest.raises(DataError, match=r"empty\.csv: column 'level' has no values"):
        load_series(write_text(tmp_path / "empty.csv", "date,level\n2020-01-06,\n"), PANEL, what="benchmark")
    with pytest.raises(DataError, match="max_fill_days must be >= 0"):
        load_series(
            write_text(tmp_path / "ok.csv", "date,level\n2020-01-06,1\n"), PANEL, what="benchmark", max_fill_days=-1
        )
    with pytest.raises(ValueError, match="what must be one of benchmark, risk_free"):
        load_series(tmp_path / "ok.csv", PANEL, what="rates")  # type: ignore[arg-type]


def test_a_date_valued_user_column_is_not_numeric(tmp_path: Path) -> None:
    long = to_long(make_prices(num_days=3)).assign(date=lambda f: pd.to_datetime(f["date"]))
    long["reported"] = long["date"]
    long.to_parquet(tmp_path / "long.parquet", index=False)
    with pytest.raises(DataError, match=r"long\.parquet: non-numeric value .*2020-01-01.* in column 'reported' for"):
        load_prices(tmp_path / "long.parquet", columns=["reported"])


@pytest.mark.parametrize("column", ["delisting_return", "DLRET"])
def test_a_long_file_says_what_a_delisting_paid_on_the_tickers_last_row(tmp_path: Path, column: str) -> None:
    frame = listing_prices()
    long = long_rows(frame)
    long[column] = np.nan
    last = long.groupby("ticker").tail(1).index  # each ticker's last row
    long.loc[last, column] = [0.0, 0.1, -0.35, np.nan]  # AAA trades to the end; DDD's file says nothing
    table = load_prices(write_long(tmp_path / "long.csv", long), universe="point_in_time")
    np.testing.assert_array_equal(table.delisting_returns, [0.0, 0.1, -0.35, np.nan])
    assert column not in table.columns  # not a feature column
    long.loc[last[2], column] = -1.5
    with pytest.raises(DataError, match=r"delisting return -1\.5 for ticker CCC is below -1"):
        load_prices(write_long(tmp_path / "bad.csv", long), universe="point_in_time")
    assert (
        load_prices(write_long(tmp_path / "none.csv", long_rows(frame)), universe="point_in_time").delisting_returns
        is None
    )
