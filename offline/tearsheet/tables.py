"""The tear sheet's tables of one part: the summary figures, drawdowns, calendar returns and the relative figures."""

from __future__ import annotations

from collections.abc import Mapping

from offline.holdout import INDEX
from offline.performance import (
    CALMAR_MIN_DAYS,
    annualised,
    calendar_returns,
    drawdown_periods,
    relative_figures,
)
from offline.risk import METRICS, risk_metrics
from offline.tearsheet.sheet import MONTHS, PARTIAL_MARK, Part, Table, percent, ratio


def summary_table(part: Part, labels: Mapping[str, str]) -> Table:
    """Every strategy's ``offline.risk`` figures (``METRICS``) on the part's days; annualised ones labelled with the
    days they come from when fewer than a year, Calmar left out then."""
    days = len(part.dates)
    yearly = annualised(days)
    shown = [metric for metric in METRICS if days >= CALMAR_MIN_DAYS or not metric.needs_a_year]
    header = ["strategy", *(f"{m.label} ({yearly})" if m.annualised else m.label for m in shown)]
    rows = []
    for strategy, returns in part.log_returns.items():
        figures = risk_metrics(
            returns,
            turnover=part.turnover.get(strategy),
            costs=part.costs.get(strategy),
            risk_free=part.cash_returns,
        )
        known = strategy in part.turnover
        rows.append(
            [
                labels[strategy],
                *(
                    "n/a" if metric.traded and not known else metric.format(getattr(figures, metric.name))
                    for metric in shown
                ),
            ]
        )
    return Table(header, rows)


def drawdown_table(part: Part, strategy: str = "champion") -> Table:
    """The worst five drawdowns of ``strategy``: peak, trough, recovery or 'not recovered', depth, days."""
    periods = drawdown_periods(part.log_returns[strategy], part.dates, start=part.start)
    rows = [
        [
            str(rank),
            p.peak,
            p.trough,
            p.recovery or "not recovered",
            percent(-p.depth),
            str(p.days),
        ]
        for rank, p in enumerate(periods, start=1)
    ]
    return Table(["", "peak (start)", "trough", "recovery (end)", "depth", "days underwater"], rows)


def relative_table(part: Part, labels: Mapping[str, str]) -> Table | None:
    """The champion against the benchmark and against equal weight (those present); None if neither is."""
    yearly = annualised(len(part.dates))
    header = [
        "champion against",
        "beta",
        f"alpha ({yearly})",
        "alpha per day",
        "correlation",
        f"tracking error ({yearly})",
        f"information ratio ({yearly})",
        f"active return ({yearly})",
    ]
    rows = []
    for strategy in (INDEX, "equal_weight"):
        if strategy not in part.log_returns or len(part.dates) < 2:
            continue
        r = relative_figures(part.log_returns["champion"], part.log_returns[strategy], risk_free=part.cash_returns)
        rows.append(
            [
                labels[strategy],
                ratio(r.beta),
                percent(r.annualised_alpha),
                percent(r.alpha, 3),
                ratio(r.correlation),
                percent(r.tracking_error),
                ratio(r.information_ratio),
                percent(r.active_return),
            ]
        )
    return Table(header, rows) if rows else None


def yearly_table(part: Part, labels: Mapping[str, str]) -> Table:
    """Every strategy's return in each calendar year; a partial year marked, with its days."""
    per_strategy = {
        s: calendar_returns(r, part.dates, start=part.start, after=part.after, period="year")
        for s, r in part.log_returns.items()
    }
    champion = per_strategy["champion"]
    rows = []
    for i, year in enumerate(champion):
        name = f"{year.period} {PARTIAL_MARK} partial" if year.partial else year.period
        span = f"{year.first_day} to {year.last_day}"
        rows.append([name, span, str(year.days), *(percent(per_strategy[s][i].total_return) for s in per_strategy)])
    return Table(["year", "days traded", "days", *(labels[s] for s in per_strategy)], rows)


def monthly_table(part: Part, strategy: str = "champion") -> Table:
    """``strategy``'s return in each calendar month (a row per year, and the year's): partial ones marked."""
    returns = part.log_returns[strategy]
    months = calendar_returns(returns, part.dates, start=part.start, after=part.after, period="month")
    years = {
        y.period: y for y in calendar_returns(returns, part.dates, start=part.start, after=part.after, period="year")
    }
    cells: dict[str, list[str]] = {year: [""] * 12 for year in years}
    for month in months:
        text = percent(month.total_return)
        cells[month.period[:4]][int(month.period[5:]) - 1] = f"{text}{PARTIAL_MARK}" if month.partial else text
    rows = []
    for year, row in cells.items():
        total = percent(years[year].total_return)
        rows.append([year, *row, f"{total}{PARTIAL_MARK}" if years[year].partial else total])
    return Table(["year", *MONTHS, "the year"], rows)
