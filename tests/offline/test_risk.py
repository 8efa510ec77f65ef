"""Risk metrics: every figure against a case worked out by hand in the comments."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from offline.risk import METRIC, METRICS, TRADING_DAYS, RiskMetrics, drawdown_curve, equity_curve, risk_metrics

# Five days of simple returns +10%, -20%, +5%, +25%, -10%:
#   equity    1 -> 1.1 -> 0.88 -> 0.924 -> 1.155 -> 1.0395
#   peak      1    1.1    1.1     1.1      1.155    1.155
#   drawdown  0    0      0.2     0.16     0        0.1
#   (0.88 / 1.1 = 0.8; 0.924 / 1.1 = 0.84; 1.0395 / 1.155 = 0.9)
# Underwater stretches: days 2-3 (2 days), then day 5 (1 day, still under at the end) -> longest 2.
# mean(simple) = 0.10 / 5 = 0.02; deviations .08 -.22 .03 .23 -.12, squares sum to 0.123, ddof=1 variance 0.03075.
# Downside: min(simple, 0) = 0 -.2 0 0 -.1, squares sum 0.05, mean over all 5 days 0.01, root 0.1.
SIMPLE = [0.10, -0.20, 0.05, 0.25, -0.10]
TURNOVER = [1.0, 0.5, 0.0, 0.25, 0.25]  # mean 0.4
COSTS = [0.001, 0.002, 0.0, 0.001, 0.0005]
ROOT_YEAR = math.sqrt(252)


def worked() -> RiskMetrics:
    return risk_metrics(np.log1p(SIMPLE), turnover=TURNOVER, costs=COSTS)


def test_equity_and_drawdown_curves_of_the_worked_case():
    equity = equity_curve(np.log1p(SIMPLE))
    assert equity == pytest.approx([1.0, 1.1, 0.88, 0.924, 1.155, 1.0395], rel=1e-12)
    assert drawdown_curve(equity) == pytest.approx([0.0, 0.0, 0.2, 0.16, 0.0, 0.1], abs=1e-12)
    assert equity_curve([]).tolist() == [1.0]


def test_growth_figures_of_the_worked_case():
    m = worked()
    assert m.days == 5
    assert m.total_return == pytest.approx(0.0395, rel=1e-12)  # 1.0395 - 1
    # exp(mean(r) * 252) = exp(log(1.0395) / 5 * 252) = 1.0395 ** 50.4 ≈ 7.0462
    assert m.annualised_return == pytest.approx(6.046192127, rel=1e-9)
    assert m.annualised_return == pytest.approx(1.0395 ** (252 / 5) - 1, rel=1e-12)


def test_risk_figures_of_the_worked_case():
    m = worked()
    # sqrt(0.03075) ≈ 0.1753568; * sqrt(252) ≈ 2.7837026
    assert m.annualised_volatility == pytest.approx(math.sqrt(0.03075 * 252), rel=1e-12)
    assert m.annualised_volatility == pytest.approx(2.78370257, rel=1e-8)
    # 0.02 / 0.1753568 * 15.8745079 ≈ 1.8105383
    assert m.sharpe == pytest.approx(0.02 / math.sqrt(0.03075) * ROOT_YEAR, rel=1e-12)
    assert m.sharpe == pytest.approx(1.81053826, rel=1e-8)
    # 0.02 / 0.1 * 15.8745079 ≈ 3.1749016
    assert m.sortino == pytest.approx(0.2 * ROOT_YEAR, rel=1e-12)
    assert m.max_drawdown == pytest.approx(0.2, rel=1e-12)
    assert m.max_drawdown_days == 2
    # Five days are not a year: no Calmar, and the annualised figures say so where they are shown.
    assert m.under_a_year and math.isnan(m.calmar)
    # Counted as a year (periods_per_year 5): the growth over it, 3.95%, over the 20% fall.
    year = risk_metrics(np.log1p(SIMPLE), periods_per_year=5)
    assert not year.under_a_year and year.calmar == pytest.approx(0.0395 / 0.2, rel=1e-12)


def test_turnover_and_costs_of_the_worked_case():
    m = worked()
    assert m.turnover == pytest.approx(0.4 * 252, rel=1e-12)  # 100.8 a year
    # Costs on the equity before each day's trade: .001 * 1 + .002 * 1.1 + 0 * .88 + .001 * .924 + .0005 * 1.155
    #   = .001 + .0022 + 0 + .000924 + .0005775 = .0047015
    assert m.costs == pytest.approx(0.0047015, rel=1e-12)
    bare = risk_metrics(np.log1p(SIMPLE))
    assert bare.turnover == 0.0 and bare.costs == 0.0


def test_cash_has_no_ratios_and_no_drawdown():
    m = risk_metrics(np.zeros(5), turnover=np.zeros(5), costs=np.zeros(5))
    assert (m.total_return, m.annualised_return, m.annualised_volatility) == (0.0, 0.0, 0.0)
    assert math.isnan(m.sharpe) and math.isnan(m.sortino) and math.isnan(m.calmar)
    assert (m.max_drawdown, m.max_drawdown_days, m.turnover, m.costs) == (0.0, 0, 0.0, 0.0)
    values = m.to_dict()
    assert values["sharpe"] is None and values["sortino"] is None and values["calmar"] is None
    assert values["days"] == 5 and values["max_drawdown"] == 0.0
    assert list(values) == [field for field in RiskMetrics.__dataclass_fields__]
    json.dumps(values, allow_nan=False)  # valid JSON: no NaN left


def test_a_constant_gain_has_no_spread_and_no_drawdown():
    # +1% every day: equal days, so zero spread exactly (no 1e-18 std turned into a huge Sharpe).
    m = risk_metrics(np.full(4, math.log(1.01)))
    assert m.total_return == pytest.approx(1.01**4 - 1, rel=1e-12)
    assert m.annualised_return == pytest.approx(1.01**252 - 1, rel=1e-12)
    assert m.annualised_volatility == 0.0
    assert math.isnan(m.sharpe) and math.isnan(m.sortino) and math.isnan(m.calmar)


def test_a_rising_series_has_no_drawdown():
    # +1%, +2%, +0.5%: equity 1, 1.01, 1.0302, 1.035351, always at its peak.
    m = risk_metrics(np.log1p([0.01, 0.02, 0.005]))
    assert m.max_drawdown == 0.0 and m.max_drawdown_days == 0
    assert math.isnan(m.calmar) and math.isnan(m.sortino)
    # mean 0.035 / 3; deviations -.001667 .008333 -.006667, squares sum 1.16667e-4, variance 5.8333e-5
    assert m.sharpe == pytest.approx((0.035 / 3) / math.sqrt(0.000175 / 3) * ROOT_YEAR, rel=1e-9)
    assert m.total_return == pytest.approx(0.035351, rel=1e-12)


def test_a_single_day_and_a_loss_that_is_never_recovered():
    # One day of -5%: no spread from one day; downside deviation 0.05, so Sortino = -0.05 / 0.05 * sqrt(252).
    m = risk_metrics([math.log(0.95)])
    assert m.days == 1 and math.isnan(m.annualised_volatility) and math.isnan(m.sharpe)
    assert m.sortino == pytest.approx(-ROOT_YEAR, rel=1e-12)
    assert m.max_drawdown == pytest.approx(0.05, rel=1e-12) and m.max_drawdown_days == 1
    assert m.under_a_year and math.isnan(m.calmar)  # one day is not a year
    # Down 3 days then up but still below the first peak: underwater to the end, 4 days.
    assert risk_metrics(np.log1p([0.1, -0.1, -0.1, -0.1, 0.2])).max_drawdown_days == 4


def test_periods_per_year_scales_the_annual_figures():
    weekly = risk_metrics(np.log1p(SIMPLE), turnover=TURNOVER, periods_per_year=52)
    assert weekly.annualised_return == pytest.approx(1.0395 ** (52 / 5) - 1, rel=1e-12)
    assert weekly.sharpe == pytest.approx(0.02 / math.sqrt(0.03075) * math.sqrt(52), rel=1e-12)
    assert weekly.turnover == pytest.approx(0.4 * 52, rel=1e-12)
    assert TRADING_DAYS == 252


@pytest.mark.parametrize(
    ("log_returns", "options", "message"),
    [
        ([], {}, "at least 1"),
        ([[0.1, 0.2]], {}, "1-D"),
        ([0.1, math.nan], {}, "finite"),
        ([0.1, math.inf], {}, "finite"),
        ([0.1, 0.2], {"turnover": [0.1]}, "turnover needs one value per day"),
        ([0.1, 0.2], {"costs": [0.1, 0.1, 0.1]}, "costs needs one value per day"),
        ([0.1, 0.2], {"costs": [[0.1, 0.1]]}, "costs must be 1-D"),
        ([0.1, 0.2], {"turnover": [0.1, math.nan]}, "turnover must be finite"),
        ([0.1, 0.2], {"costs": [0.1, -0.1]}, "costs must not be negative"),
        ([0.1, 0.2], {"periods_per_year": 0}, "periods_per_year"),
    ],
)
def test_bad_input_is_refused(log_returns, options, message):
    with pytest.raises(ValueError, match=message):
        risk_metrics(log_returns, **options)


def test_bad_curves_are_refused():
    with pytest.raises(ValueError, match="1-D"):
        equity_curve(np.zeros((2, 2)))
    with pytest.raises(ValueError, match="positive"):
        drawdown_curve([1.0, 0.0])
    with pytest.raises(ValueError, match="at least 1"):
        drawdown_curve([])


def test_a_year_is_at_least_250_trading_days():
    """A calendar year of an exchange holds 250 to 253 trading days: from 250 a sample is a year and has a Calmar
    ratio; under it, its annualised figures are a short sample's scaled up (``under_a_year``) and Calmar is not
    given."""
    days = np.random.default_rng(0).normal(0.0005, 0.01, 300)
    assert not risk_metrics(days[:250]).under_a_year and math.isfinite(risk_metrics(days[:250]).calmar)
    short = risk_metrics(days[:249])
    assert short.under_a_year and math.isnan(short.calmar) and short.to_dict()["calmar"] is None
    assert math.isfinite(short.annualised_return) and math.isfinite(short.sharpe)  # given, with the label


def test_sharpe_and_sortino_are_measured_over_what_cash_earned():
    rng = np.random.default_rng(1)
    r = rng.normal(0.0004, 0.01, 300)
    cash = np.full(300, math.log(1.05) / 252)  # 5% a year
    plain, over_cash = risk_metrics(r), risk_metrics(r, risk_free=cash)
    excess = np.expm1(r) - np.expm1(cash)
    assert over_cash.sharpe == pytest.approx(excess.mean() / excess.std(ddof=1) * ROOT_YEAR, rel=1e-12)
    downside = math.sqrt(np.mean(np.minimum(excess, 0.0) ** 2))
    assert over_cash.sortino == pytest.approx(excess.mean() / downside * ROOT_YEAR, rel=1e-12)
    assert over_cash.sharpe < plain.sharpe
    # Growth, volatility and drawdowns are the portfolio's own, whatever cash earned.
    assert over_cash.annualised_volatility == plain.annualised_volatility
    assert over_cash.total_return == plain.total_return and over_cash.max_drawdown == plain.max_drawdown
    assert risk_metrics(r, risk_free=np.zeros(300)).sharpe == plain.sharpe  # a zero rate is the old figure


def test_one_list_of_metrics_covers_every_figure_and_every_report_reads_it():
    """``METRICS`` is the one list: every figure of ``RiskMetrics`` but the sample's length is in it, and the evaluate
    table, ``evaluation.csv``, the tear sheet and the backtest's fold results take their columns from it."""
    import dataclasses

    from offline import evaluate, tearsheet
    from offline.backtest import results
    from tests.offline.tearsheet_builders import evaluation_sheet

    fields = {f.name for f in dataclasses.fields(RiskMetrics)} - {"days", "under_a_year"}
    assert [m.name for m in METRICS] == [f.name for f in dataclasses.fields(RiskMetrics) if f.name in fields]
    assert all(len(m.short) <= 10 for m in METRICS)  # an 11-wide column with a space before it
    assert ("days", *(m.name for m in METRICS), "under_a_year") == evaluate.METRIC_COLUMNS
    sheet = evaluation_sheet(holdout=300, validation=300)
    header = tearsheet.summary_table(sheet.parts[0], sheet.labels).header
    assert header[1:] == [f"{m.label} (annualised)" if m.annualised else m.label for m in METRICS]
    assert set(results.REQUIRED) <= {m.name for m in METRICS}
    figures = risk_metrics([0.01, -0.02, 0.005], turnover=[0.1, 0.0, 0.2], costs=[0.001, 0.0, 0.002])
    cells = {m.name: m.format(getattr(figures, m.name)) for m in METRICS}
    assert cells["max_drawdown"].startswith("-") and cells["turnover"].endswith("x") and cells["calmar"] == "n/a"
    assert METRIC["sharpe"].format(float("inf")) == "n/a" and METRIC["max_drawdown"].format(0.0) == "0.0%"
