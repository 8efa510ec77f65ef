"""Loading and validating price files: formats, column detection, every validation error, gaps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from environment.data import BUNDLED_PRICES, PriceTable, load_prices
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
