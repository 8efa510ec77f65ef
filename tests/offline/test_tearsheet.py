"""The tear sheet (``offline.tearsheet``) and its figures (``offline.performance``): each figure on a series whose
answer is known, against a direct computation, against the project's own ``offline.risk`` and against
empyrical-reloaded (the figures of pyfolio and quantstats; a test dependency only); then the page itself."""

from __future__ import annotations

import html
import math
import re
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from offline import tearsheet
from offline.backtest.report import summarise
from offline.holdout import INDEX
from offline.performance import (
    annualised,
    calendar_returns,
    concentration,
    distribution,
    drawdown_periods,
    relative_figures,
    rolling_sharpe,
)
from offline.risk import TRADING_DAYS, risk_metrics
from tests.offline.tearsheet_builders import (
    POOLED,
    WITH_INDEX,
    backtest_inputs,
    backtest_sheet,
    evaluation_sheet,
)

empyrical = pytest.importorskip("empyrical", reason="empyrical-reloaded is a test dependency: requirements-dev.txt")

TIGHT = {"rel": 1e-9, "abs": 1e-12}
"""The tolerance between two float64 computations of the same formula (different order of operations)."""


def returns(days: int, seed: int, mean: float = 4e-4, spread: float = 0.012) -> np.ndarray:
    return np.random.default_rng(seed).normal(mean, spread, days)


def business_days(first: str, days: int) -> list[str]:
    return [d.date().isoformat() for d in pd.bdate_range(first, periods=days)]


# ---------------------------------------------------------------------------------------------- drawdowns


def test_the_worst_five_drawdowns_of_a_constructed_series():
    """Six falls of known depth, two days under each, the last never recovered: the five deepest, deepest first."""
    equity = [1.0]
    falls = (0.10, 0.04, 0.25, 0.06, 0.02)
    for fall in falls:
        equity.append(equity[-1] * 1.1)  # a new peak
        peak = equity[-1]
        equity += [peak * math.sqrt(1 - fall), peak * (1 - fall)]  # two days down to the trough
        equity.append(peak * 1.01)  # back above the peak
    equity.append(equity[-1] * 1.1)
    last_peak = len(equity) - 1
    equity += [equity[-1] * 0.7, equity[-1] * 0.735]  # 30%, then 26.5% below: not recovered
    log_returns = np.diff(np.log(equity))
    days = business_days("2021-03-01", len(equity))
    start, dates = days[0], days[1:]

    periods = drawdown_periods(log_returns, dates, start=start)

    assert len(periods) == 5
    assert [round(p.depth, 9) for p in periods] == [0.30, 0.25, 0.10, 0.06, 0.04]  # 2% is the sixth: left out
    worst = periods[0]
    assert (worst.peak, worst.trough, worst.recovery, worst.days) == (
        days[last_peak],
        days[last_peak + 1],
        None,
        2,
    )
    third = periods[1]  # the 25% fall is the third: its peak is point 1 + 4 * 2
    assert (third.peak, third.trough, third.recovery, third.days) == (days[9], days[11], days[12], 2)
    # The project's own figures and the library's, on the same series.
    metrics = risk_metrics(log_returns)
    assert worst.depth == pytest.approx(metrics.max_drawdown, **TIGHT)
    assert max(p.days for p in periods) == metrics.max_drawdown_days
    assert -worst.depth == pytest.approx(empyrical.max_drawdown(np.expm1(log_returns)), **TIGHT)


def test_a_series_that_never_falls_has_no_drawdown():
    days = business_days("2021-03-01", 11)
    assert drawdown_periods(np.full(10, 0.001), days[1:], start=days[0]) == []


def test_drawdowns_of_random_days_agree_with_risk_and_empyrical():
    r = returns(700, seed=4)
    days = business_days("2019-01-01", 701)
    periods = drawdown_periods(r, days[1:], start=days[0], top=1000)
    metrics = risk_metrics(r)
    assert periods[0].depth == pytest.approx(metrics.max_drawdown, **TIGHT)
    assert max(p.days for p in periods) == metrics.max_drawdown_days
    assert -periods[0].depth == pytest.approx(empyrical.max_drawdown(np.expm1(r)), **TIGHT)
    # empyrical's underwater curve, day by day, reaches each period's depth at its trough.
    underwater = -empyrical.stats.drawdown_series(pd.Series(np.expm1(r), index=pd.to_datetime(days[1:])))
    for p in periods[:5]:
        assert underwater[pd.Timestamp(p.trough)] == pytest.approx(p.depth, **TIGHT)


# ---------------------------------------------------------------------------------------------- calendar periods


def test_monthly_and_yearly_returns_mark_partial_periods():
    """From 5 March 2020 (the close before is in March: March is partial) to 10 February 2021, with no next day in
    the data (weekdays of February are still to come: partial)."""
    days = business_days("2020-03-04", 246)
    start, dates = days[0], days[1:]
    assert dates[-1] == "2021-02-10"
    r = returns(len(dates), seed=5)

    months = calendar_returns(r, dates, start=start, after=None, period="month")
    years = calendar_returns(r, dates, start=start, after=None, period="year")

    assert [m.period for m in months] == [f"2020-{m:02d}" for m in range(3, 13)] + ["2021-01", "2021-02"]
    assert [m.partial for m in months] == [True] + [False] * 10 + [True]
    assert (months[0].first_day, months[0].days) == ("2020-03-05", 19)
    assert [(y.period, y.partial) for y in years] == [("2020", True), ("2021", True)]
    assert sum(m.days for m in months) == sum(y.days for y in years) == len(dates)

    # Against the library: the same compounded returns by calendar month and year.
    simple = pd.Series(np.expm1(r), index=pd.to_datetime(dates))
    monthly = empyrical.aggregate_returns(simple, "monthly")
    yearly = empyrical.aggregate_returns(simple, "yearly")
    assert [m.total_return for m in months] == pytest.approx(list(monthly), **TIGHT)
    assert [y.total_return for y in years] == pytest.approx(list(yearly), **TIGHT)


def test_whole_periods_are_not_partial():
    """The close before is in February and the next trading day in March: every month is whole; the year is not
    (the days start in March)."""
    days = business_days("2020-02-28", 253)  # 2020-02-28 .. 2021-02-26
    start, dates = days[0], days[1:]
    r = returns(len(dates), seed=6)
    months = calendar_returns(r, dates, start=start, after="2021-03-01", period="month")
    assert not any(m.partial for m in months) and months[-1].period == "2021-02"
    years = calendar_returns(r, dates, start=start, after="2021-03-01", period="year")
    assert [(y.period, y.partial) for y in years] == [("2020", True), ("2021", True)]
    # The next trading day inside the last month: the month is partial even on its last weekday's eve.
    assert calendar_returns(r, dates, start=start, after="2021-02-27", period="month")[-1].partial
    with pytest.raises(ValueError, match="period must be one of month, year"):
        calendar_returns(r, dates, start=start, after=None, period="week")


# ---------------------------------------------------------------------------------------------- rolling Sharpe


@pytest.mark.parametrize("window", [63, 252])
def test_rolling_sharpe_against_a_direct_computation(window):
    r, cash = returns(400, seed=7), np.full(400, 1.5e-4)
    rolling = rolling_sharpe(r, window, risk_free=cash)
    assert rolling.shape == (400,) and np.isnan(rolling[: window - 1]).all()
    for end in (window, 250, 399):
        if end < window - 1:
            continue
        days = slice(end - window + 1, end + 1)
        excess = np.expm1(r[days]) - np.expm1(cash[days])
        direct = excess.mean() / excess.std(ddof=1) * math.sqrt(TRADING_DAYS)
        assert rolling[end] == pytest.approx(direct, **TIGHT)
        assert rolling[end] == pytest.approx(risk_metrics(r[days], risk_free=cash[days]).sharpe, **TIGHT)
    # The library's rolling Sharpe ratio of the excess returns: one value per full window.
    library = empyrical.roll_sharpe_ratio(np.expm1(r) - np.expm1(cash), window)
    assert rolling[window - 1 :] == pytest.approx(np.asarray(library), rel=1e-9)


def test_rolling_sharpe_of_a_flat_window_is_a_gap_and_a_short_series_has_none():
    cash = np.full(100, 1e-4)
    assert np.isnan(rolling_sharpe(cash, 63, risk_free=cash)).all()  # no excess: no ratio, not +-inf
    assert np.isnan(rolling_sharpe(returns(50, seed=8), 63)).all()


# ---------------------------------------------------------------------------------------------- against a benchmark


def test_alpha_beta_information_ratio_and_tracking_error():
    days = 500
    benchmark, noise, cash = returns(days, seed=9), returns(days, seed=10, mean=1e-4, spread=0.004), np.full(days, 1e-4)
    champion = 0.8 * benchmark + noise  # a beta near 0.8 and some alpha
    figures = relative_figures(champion, benchmark, risk_free=cash)

    # A least-squares regression in numpy: excess simple returns over cash, an intercept and a slope.
    y = np.expm1(champion) - np.expm1(cash)
    x = np.expm1(benchmark) - np.expm1(cash)
    (alpha, beta), *_ = np.linalg.lstsq(np.column_stack([np.ones(days), x]), y, rcond=None)
    assert figures.beta == pytest.approx(beta, **TIGHT) and 0.7 < figures.beta < 0.9
    assert figures.alpha == pytest.approx(alpha, **TIGHT)
    assert figures.annualised_alpha == pytest.approx((1 + alpha) ** TRADING_DAYS - 1, **TIGHT)
    assert figures.correlation == pytest.approx(np.corrcoef(x, y)[0, 1], **TIGHT)

    # empyrical-reloaded, on the simple returns with cash as the risk-free return of each day.
    simple, simple_benchmark, simple_cash = np.expm1(champion), np.expm1(benchmark), np.expm1(cash)
    library_alpha, library_beta = empyrical.alpha_beta(simple, simple_benchmark, risk_free=simple_cash)
    assert figures.beta == pytest.approx(library_beta, **TIGHT)
    assert figures.annualised_alpha == pytest.approx(library_alpha, **TIGHT)
    active = simple - simple_benchmark
    assert figures.tracking_error == pytest.approx(empyrical.annual_volatility(active), **TIGHT)
    library_ir = empyrical.excess_sharpe(simple, simple_benchmark) * math.sqrt(TRADING_DAYS)
    assert figures.information_ratio == pytest.approx(library_ir, **TIGHT)
    assert figures.active_return == pytest.approx(active.mean() * TRADING_DAYS, **TIGHT)


def test_a_copy_of_the_benchmark_has_no_active_risk():
    r = returns(200, seed=11)
    figures = relative_figures(r, r)
    assert figures.beta == pytest.approx(1.0) and figures.alpha == pytest.approx(0.0, abs=1e-15)
    assert figures.tracking_error == 0.0 and math.isnan(figures.information_ratio)


def test_the_projects_risk_figures_agree_with_empyrical():
    """``offline.risk`` (evaluation.json's figures and the page's summary table) against the library, a year and a
    half of days with cash earning a rate."""
    r, cash = returns(380, seed=12), np.full(380, 1.2e-4)
    m = risk_metrics(r, risk_free=cash)
    simple, simple_cash = np.expm1(r), np.expm1(cash)
    assert m.sharpe == pytest.approx(empyrical.sharpe_ratio(simple, risk_free=simple_cash), **TIGHT)
    assert m.sortino == pytest.approx(empyrical.sortino_ratio(simple - simple_cash), **TIGHT)
    assert m.annualised_volatility == pytest.approx(empyrical.annual_volatility(simple), **TIGHT)
    assert m.annualised_return == pytest.approx(empyrical.annual_return(simple), **TIGHT)
    assert m.max_drawdown == pytest.approx(-empyrical.max_drawdown(simple), **TIGHT)
    assert m.calmar == pytest.approx(empyrical.calmar_ratio(simple), **TIGHT)
    assert m.total_return == pytest.approx(empyrical.cum_returns_final(simple), **TIGHT)


# ---------------------------------------------------------------------------------------------- the page


@pytest.fixture(scope="module")
def evaluation_page() -> tuple[tearsheet.Sheet, str]:
    """A 126-day holdout and a 300-day validation range, with the bundled index: the sheet and its page."""
    sheet = evaluation_sheet(holdout=126, validation=300)
    return sheet, tearsheet.render(sheet)


@pytest.fixture(scope="module")
def backtest_page() -> tuple[tearsheet.Sheet, str]:
    """Two seeds over the test years 2019 and 2020, with a pooled test in the summary."""
    sheet = backtest_sheet()
    return sheet, tearsheet.render(sheet)


def test_annualisation_is_labelled_for_a_126_day_sample(evaluation_page):
    assert annualised(126) == "annualised from 126 days" and annualised(252) == annualised(600) == "annualised"
    sheet, page = evaluation_page
    holdout, validation = sheet.parts
    assert len(holdout.dates) == 126 and len(validation.dates) == 300

    short = tearsheet.summary_table(holdout, sheet.labels).header
    assert "annual return (annualised from 126 days)" in short and "Sharpe (annualised from 126 days)" in short
    assert not any("Calmar" in h for h in short)  # a ratio that needs a year is not shown for half of one
    relative = tearsheet.relative_table(holdout, sheet.labels).header
    assert "alpha (annualised from 126 days)" in relative
    assert "information ratio (annualised from 126 days)" in relative
    assert "tracking error (annualised from 126 days)" in relative

    long = tearsheet.summary_table(validation, sheet.labels).header
    assert "Calmar" in long and "annual return (annualised)" in long and not any("from 300" in h for h in long)

    assert "252-day rolling Sharpe: not shown; the series has 126 days" in page
    assert "Calmar is not shown: it needs at least 250 days" in page
    assert page.count("annualised from 126 days") >= 8


def test_the_page_lists_every_baseline_present(evaluation_page):
    sheet, page = evaluation_page
    assert WITH_INDEX[INDEX] == "S&P 500 price index (no dividends)"
    for part in sheet.parts:
        assert list(part.log_returns) == ["champion", "untrained", "equal_weight", "buy_and_hold", "cash", INDEX]
    for strategy in sheet.parts[0].log_returns:
        assert page.count(f"<th>{html.escape(WITH_INDEX[strategy])}</th>") >= 2  # a row of each part's summary table
    without = evaluation_sheet(index=False, holdout=30, validation=30)
    assert INDEX not in without.parts[0].log_returns
    assert [row[0] for row in tearsheet.relative_table(without.parts[0], without.labels).rows] == [
        "equal weight, daily"
    ]


def test_the_summary_table_holds_the_figures_of_evaluation_json(evaluation_page):
    sheet, _ = evaluation_page
    part = sheet.parts[0]
    table = tearsheet.summary_table(part, sheet.labels)
    champion = next(row for row in table.rows if row[0] == "champion")
    m = risk_metrics(
        part.log_returns["champion"],
        turnover=part.turnover["champion"],
        costs=part.costs["champion"],
        risk_free=part.cash_returns,
    )
    assert champion[1] == f"{100 * m.total_return:+.1f}%" and champion[4] == f"{m.sharpe:+.2f}"


class _Page(HTMLParser):
    """Every tag, attribute and the text of style and script elements of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str]] = []
        self.code: list[str] = []
        self._open: str | None = None

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attributes += [(name, value or "") for name, value in attrs]
        self._open = tag

    def handle_endtag(self, tag):
        self._open = None

    def handle_data(self, data):
        if self._open in ("style", "script"):
            self.code.append(data)


@pytest.mark.parametrize("which", ["evaluation_page", "backtest_page"])
def test_the_page_fetches_nothing(which, request):
    """No script, no external style sheet, font or frame; every image inline PNG data, every link to the page
    itself, and no address in any attribute or in the style sheet (plain text may name one)."""
    _, page = request.getfixturevalue(which)
    parser = _Page()
    parser.feed(page)
    assert not {"script", "link", "iframe", "object", "embed", "base", "svg"} & set(parser.tags)
    images = [value for name, value in parser.attributes if name == "src"]
    assert images and all(re.fullmatch(r"data:image/png;base64,[A-Za-z0-9+/]+=*", v) for v in images)
    assert all(value.startswith("#") for name, value in parser.attributes if name == "href")
    others = [v for name, v in parser.attributes if name not in ("src", "href")]
    assert not [v for v in others if re.search(r"https?:|//", v)]
    assert not [c for c in parser.code if "url(" in c or "@import" in c or "http" in c]
    without_images = re.sub(r"data:image/png;base64,[A-Za-z0-9+/]+=*", "", page)
    assert not re.search(r"https?://", without_images)


def test_the_backtest_page_chains_the_test_years_per_seed_and_shows_the_pooled_test(backtest_page):
    sheet, page = backtest_page
    assert [p.title for p in sheet.parts] == [
        "Seed 0: test years 2019, 2020 chained",
        "Seed 1: test years 2019, 2020 chained",
    ]
    part = sheet.parts[0]
    assert part.dates[0] == "2019-01-01" and part.dates[-1] == "2020-12-31" and part.start == "2018-12-31"
    assert list(part.log_returns) == [
        "champion",
        "best_on_validation",
        "ensemble",
        "untrained",
        "equal_weight",
        "buy_and_hold",
        "cash",
        INDEX,
    ]
    assert part.cash_returns is part.log_returns["cash"]
    years = tearsheet.yearly_table(part, sheet.labels).rows
    assert [row[0] for row in years] == ["2019", "2020"]  # whole years: neither is partial
    assert f"pooled test: {POOLED['verdict']}" in page
    for name, value in (("edge", "-0.012"), ("t", "-0.4"), ("proven", "no"), ("days", "1,004")):
        cell = f'<td class="neg">{value}</td>' if value.startswith("-") else f"<td>{value}</td>"
        assert f"<tr><th>{name}</th>{cell}</tr>" in page
    assert "<th>blocks</th>" not in page  # a list: not a scalar figure
    summary, _ = backtest_inputs(pooled=None)
    verdict = tearsheet.backtest_verdict(summary, WITH_INDEX)
    assert not any("pooled" in sentence for sentence in verdict.sentences) and len(verdict.tables) == 2


def test_seeds_that_traded_every_day_the_same_way_are_shown_once():
    summary, results = backtest_inputs()
    twins = [{**r, "seed": 1} for r in results if r["seed"] == 0]  # seed 1 a copy of seed 0, a third seed apart
    third = [{**r, "seed": 2} for r in results if r["seed"] == 1]
    sheet = tearsheet.backtest_sheet(
        summary, [r for r in results if r["seed"] == 0] + twins + third, labels=WITH_INDEX, title="b"
    )
    assert [p.title for p in sheet.parts] == [
        "Seeds 0, 1: test years 2019, 2020 chained",
        "Seed 2: test years 2019, 2020 chained",
    ]
    assert sheet.parts[0].note.endswith("Seed 1 traded every test day exactly the same way: shown once.")


def test_the_backtest_page_renders_the_pooled_test_the_summary_computes():
    summary, results = backtest_inputs()
    summary = summarise(results, trading=summary["conventions"])  # the report's own pooled test, not a stand-in
    verdict = tearsheet.backtest_verdict(summary, WITH_INDEX)
    for trader, pooled in summary["traders"].items():
        assert f"{WITH_INDEX[trader]}: {pooled['verdict']}" in verdict.sentences
    family = summary["family"]
    assert verdict.sentences[-1] == f"which to deploy ({family['method']}): {family['verdict']}"
    procedures = verdict.tables[-1]
    assert [row[0] for row in procedures.rows] == [
        "champion",
        "best agent on validation",
        "ensemble of the best on validation",
    ]
    for row, (trader, pooled) in zip(procedures.rows, summary["traders"].items(), strict=True):
        assert row[4] == f"{pooled['p_value']:.4f}" and row[5] == f"{family['adjusted_p'][trader]:.4f}"
        assert float(row[1]) == pytest.approx(pooled["mean_excess"] * 100, abs=0.005)
    # the backtest page shows every procedure's days beside the baselines'
    page = tearsheet.backtest_sheet(summary, results, labels=WITH_INDEX, title="b")
    assert list(page.parts[0].log_returns)[:3] == ["champion", "best_on_validation", "ensemble"]


def test_a_long_short_champion_shows_its_long_and_short_exposure():
    """A champion with negative weights gets the exposure figure (long leg, short leg, gross, net) in place of the
    stacked weights, whose stack a short would fold; a long-only one keeps the stacked weights."""
    import dataclasses

    sheet = evaluation_sheet(holdout=126, validation=300)
    part = sheet.parts[0]
    days = len(part.dates)
    rng = np.random.default_rng(0)
    assets = rng.uniform(-0.3, 0.5, size=(days, 4))
    weights = np.concatenate([1.0 - assets.sum(axis=1, keepdims=True), assets], axis=1)
    series = tearsheet.exposure_series(weights)
    np.testing.assert_allclose(np.array(series["gross"]), np.abs(assets).sum(axis=1))
    np.testing.assert_allclose(np.array(series["net"]), assets.sum(axis=1))
    np.testing.assert_allclose(np.array(series["long"]) + np.array(series["short"]), assets.sum(axis=1))
    labels = ["cash", *(f"A{i}" for i in range(4))]
    short = dataclasses.replace(part, weights=weights, asset_labels=labels)
    page = tearsheet.render(dataclasses.replace(sheet, parts=[short, *sheet.parts[1:]]))
    assert "The long leg (sum of positive weights)" in page
    long_only = dataclasses.replace(part, weights=np.abs(weights) / np.abs(weights).sum(axis=1, keepdims=True))
    page = tearsheet.render(dataclasses.replace(sheet, parts=[dataclasses.replace(long_only, asset_labels=labels)]))
    assert "The long leg" not in page and "Target weights held each day" in page


def test_the_distribution_agrees_with_empyrical_and_scipy():
    """VaR, CVaR and the tail ratio against empyrical-reloaded; skew and excess kurtosis against scipy's defaults; the
    win figures against a direct count; the best and worst month against the calendar returns."""
    from scipy import stats

    r = returns(500, seed=3)
    r[::17] = 0.0  # days of no change: neither wins nor losses
    dates = business_days("2019-01-02", 500)
    simple = np.expm1(r)
    d = distribution(r, dates, start="2018-12-31")
    assert d.value_at_risk == pytest.approx(empyrical.value_at_risk(simple), **TIGHT)
    assert d.conditional_value_at_risk == pytest.approx(empyrical.conditional_value_at_risk(simple), **TIGHT)
    assert d.tail_ratio == pytest.approx(empyrical.tail_ratio(simple), **TIGHT)
    assert d.skew == pytest.approx(stats.skew(simple), **TIGHT)
    assert d.excess_kurtosis == pytest.approx(stats.kurtosis(simple), **TIGHT)
    wins, losses = simple[simple > 0], simple[simple < 0]
    assert d.win_rate == pytest.approx(len(wins) / (len(wins) + len(losses)))
    assert (d.average_win, d.average_loss) == pytest.approx((wins.mean(), losses.mean()))
    assert d.profit_factor == pytest.approx(wins.sum() / -losses.sum())
    assert (d.best_day, d.worst_day) == (simple.max(), simple.min())
    months = [p.total_return for p in calendar_returns(r, dates, start="2018-12-31", after=None, period="month")]
    assert (d.best_month, d.worst_month) == (max(months), min(months))
    flat = distribution(np.zeros(300))  # no spread: no moment is assumed
    assert flat.skew is None and flat.excess_kurtosis is None and flat.win_rate is None and flat.tail_ratio is None


def test_concentration_counts_effective_assets_and_names_the_largest_holdings():
    labels = ["cash", "A", "B", "C", "D"]
    equal = np.tile([0.0, 0.25, 0.25, 0.25, 0.25], (10, 1))
    assert concentration(equal, labels)[0] == pytest.approx(4.0)
    one = np.tile([0.0, 0.0, 1.0, 0.0, 0.0], (10, 1))
    effective, top = concentration(one, labels, top=2)
    assert effective == pytest.approx(1.0) and top[0] == ("B", 1.0)
    long_short = np.tile([1.0, 0.5, -0.5, 0.0, 0.0], (10, 1))  # two assets, equal in size, either sign
    assert concentration(long_short, labels)[0] == pytest.approx(2.0)
    page = tearsheet.render(evaluation_sheet(holdout=126, validation=300))
    assert "Return distribution" in page and "effective assets" in page and "CVaR 5%" in page


def test_the_growth_axis_labels_the_range_a_curve_spans():
    """A curve from 0.9 to 1.2 gets evenly spaced plain labels across it (a log axis alone labels 1 and 0.9 there); a
    curve over decades keeps the log axis's labels."""
    from matplotlib.figure import Figure

    from offline.plots import growth_axis

    ax = Figure().add_subplot()
    ax.plot([0, 1, 2], [0.9, 1.05, 1.2])
    growth_axis(ax, [0.9, 1.05, 1.2])
    ax.set_ylim(0.9, 1.2)
    ticks = [t for t in ax.get_yticks() if 0.9 <= t <= 1.2]
    assert len(ticks) >= 3 and max(ticks) >= 1.1
    assert ax.yaxis.get_major_formatter()(1.1, 0) == "1.1"
    wide = Figure().add_subplot()
    wide.plot([0, 1], [1.0, 50.0])
    growth_axis(wide, [1.0, 50.0])
    assert wide.get_yscale() == "log"


def test_a_baseline_identical_to_the_champion_is_named_not_drawn_under_it():
    import dataclasses

    sheet = evaluation_sheet(holdout=126, validation=300)
    part = sheet.parts[0]
    same = dataclasses.replace(part, log_returns={**part.log_returns, "equal_weight": part.log_returns["champion"]})
    assert tearsheet.identical_to_champion(same) == ["equal_weight"]
    page = tearsheet.render(dataclasses.replace(sheet, parts=[same]))
    assert f"{sheet.labels['equal_weight']}: identical to the champion, not drawn." in page
    assert "identical to the champion" not in tearsheet.render(sheet)
    assert "the first day&#x27;s buy from cash" in page or "the first day's buy from cash" in page


def test_rolling_volatility_and_beta_against_a_direct_computation_and_empyrical():
    from offline.performance import rolling_beta, rolling_volatility

    r, b = returns(300, seed=5), returns(300, seed=6)
    window = 63
    vol = rolling_volatility(r, window)
    assert np.isnan(vol[: window - 1]).all()
    simple = np.expm1(r)
    assert vol[-1] == pytest.approx(np.std(simple[-window:], ddof=1) * math.sqrt(TRADING_DAYS), **TIGHT)
    assert vol[-1] == pytest.approx(empyrical.annual_volatility(simple[-window:]), **TIGHT)
    beta = rolling_beta(r, b, window)
    assert beta[-1] == pytest.approx(empyrical.beta(simple[-window:], np.expm1(b)[-window:]), rel=1e-9)
    assert beta[-1] == pytest.approx(relative_figures(r[-window:], b[-window:]).beta, rel=1e-9)
    flat = rolling_beta(r, np.zeros(300), window)
    assert np.isnan(flat).all()  # a benchmark without spread has no beta


def test_the_month_grid_holds_each_months_return_and_the_page_draws_it_and_the_years_against_the_index():
    sheet = evaluation_sheet(holdout=126, validation=300)
    part = sheet.parts[0]
    years, grid = tearsheet.month_grid(part)
    months = calendar_returns(
        part.log_returns["champion"], part.dates, start=part.start, after=part.after, period="month"
    )
    assert sum(v is not None for row in grid for v in row) == len(months)
    for p in months:
        assert grid[years.index(p.period[:4])][int(p.period[5:]) - 1] == p.total_return
    page = tearsheet.render(sheet)
    assert "monthly returns:" in page  # the grid's alt text
    assert ("yearly returns against the index" in page) == (INDEX in part.log_returns)
