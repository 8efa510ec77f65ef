"""``report.html``: the tear sheet of a champion against every baseline, one self-contained page.

``evaluation.json`` and the CSVs hold every figure and the PNGs show three of them; a practitioner reads a strategy
from a tear sheet (pyfolio's and quantstats', as users of FinRL and qlib do): equity against the alternatives, the
worst drawdowns and how long they lasted, rolling risk-adjusted return, calendar returns, what the strategy held and
traded, its exposure to the benchmark, and whether choosing it was skill or luck. This page puts those in one place,
for ``evaluate`` (the holdout, out of sample, and the validation range that chose the champion) and for ``backtest``
(the test years chained per seed, with the summary's figures).

The page is one file that opens offline with nothing else: every figure is a PNG drawn on a matplotlib ``Figure``
with the Agg canvas (``offline.plots``, never pyplot) and inlined as base64, the style sheet is inline, and nothing
is fetched (no script, font, image or style sheet from anywhere; the fonts are the reader's own).

Figures are ``offline.risk``'s (the summary table is ``risk_metrics``, the same numbers as ``evaluation.json``) and
``offline.performance``'s. A figure annualised from fewer than a year of days says so, and Calmar is not shown for
such samples (``offline.performance.annualised``, ``CALMAR_MIN_DAYS``).
"""

from __future__ import annotations

import base64
import dataclasses
import html
import io
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from config import describe_conventions
from offline.holdout import INDEX, RANGES, RangeResult
from offline.performance import (
    CALMAR_MIN_DAYS,
    annualised,
    calendar_returns,
    concentration,
    distribution,
    drawdown_periods,
    relative_figures,
    rolling_beta,
    rolling_sharpe,
    rolling_volatility,
)
from offline.plots import (
    SeriesPanel,
    WeightsPanel,
    plot_drawdowns,
    plot_equity,
    plot_lines,
    plot_month_grid,
    plot_weights,
    plot_year_bars,
)
from offline.procedures import TRADERS
from offline.risk import METRICS, TRADING_DAYS, drawdown_curve, equity_curve, risk_metrics
from persistence import checkpoint

PAGE = "report.html"
"""The tear sheet's file name, beside the other files of a report."""
SECTIONS = (
    "Summary figures",
    "Equity curves",
    "Drawdowns",
    "Rolling Sharpe ratio",
    "Monthly and yearly returns",
    "Return distribution",
    "Weights, turnover and costs",
    "Against the benchmark",
)
"""The headings of each part's sections, in page order."""
DEFINITIONS = "Definitions"
ROLLING_WINDOWS = (63, 252)
"""Rolling Sharpe windows in days: a quarter and a year."""
FIGURE_SIZE_PX = (1000, 380)
WEIGHTS_SIZE_PX = (1000, 460)
ROLLING_SHOWN = ("champion", "equal_weight", INDEX)
"""The strategies of the rolling-Sharpe figure: more lines would hide the champion's."""
TRADES_SHOWN = ("champion", "untrained", "equal_weight")
"""The strategies of the turnover and costs figures (buy and hold trades once, cash never)."""
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
PARTIAL_MARK = "†"


@dataclass(frozen=True)
class Table:
    """A table of the page: formatted cells, the first column a label."""

    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    caption: str = ""


@dataclass(frozen=True)
class Verdict:
    """The page's first section: what selection concluded (``evaluate``) or the backtest's summary."""

    heading: str
    sentences: Sequence[str]
    tables: Sequence[Table] = ()


@dataclass(frozen=True)
class Part:
    """One stretch of days the page reads: every strategy's daily log returns over the same dates."""

    title: str
    note: str
    """A sentence on what these days are (out of sample, in sample, chained test years)."""
    dates: Sequence[str]
    """(D,) the day each return is earned, ISO."""
    start: str
    """The close before the first return: the equity curves' first point."""
    after: str | None
    """The market's trading day after the last date (None when the data ends there): is the last month complete?"""
    log_returns: Mapping[str, np.ndarray]
    """Strategy -> (D,) daily log returns net of costs; ``champion`` first, then the baselines present."""
    cash_returns: np.ndarray | None
    """(D,) cash's daily log return, which Sharpe ratios and alpha are measured over; None for a zero rate."""
    turnover: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Strategy -> (D,) daily turnover, where it was kept."""
    costs: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Strategy -> (D,) daily costs as a fraction of the portfolio, where they were kept."""
    weights: np.ndarray | None = None
    """(D, N + 1) the champion's target weights each day, cash first; None where they were not kept."""
    asset_labels: Sequence[str] = ()
    """``cash`` and the tickers: one per column of ``weights``."""
    trading_note: str = ""
    """What the trading section says when daily weights or trades were not kept."""
    trading_table: Table | None = None
    """Per-period turnover and costs, where no daily ones were kept."""


@dataclass(frozen=True)
class Sheet:
    """Everything the page shows."""

    title: str
    lines: Sequence[str]
    """Sentences under the title: where the champion comes from, how it trades."""
    labels: Mapping[str, str]
    """Strategy -> its name on the page (the benchmark by what it is: ``Market.benchmark_label``)."""
    verdict: Verdict
    parts: Sequence[Part]


# ---------------------------------------------------------------------------------------------- formatting


def _percent(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:+.{digits}f}%"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:+.2f}"


def _fixed(value: float | None, digits: int = 2) -> str:
    """A figure that is not a ratio to equal weight or a share (a spread, a probability, a multiple), to ``digits``."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "n/a" if value is None else ("yes" if value else "no")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.4g}"
    return str(value)


def _cell(text: str) -> str:
    negative = text.startswith("-") and text[1:2].isdigit()
    return f'<td class="neg">{html.escape(text)}</td>' if negative else f"<td>{html.escape(text)}</td>"


def _table(table: Table) -> str:
    caption = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
    body = "".join(
        "<tr>" + f"<th>{html.escape(row[0])}</th>" + "".join(_cell(c) for c in row[1:]) + "</tr>" for row in table.rows
    )
    return f'<div class="scroll"><table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _paragraph(text: str, kind: str = "") -> str:
    return f'<p class="{kind}">{html.escape(text)}</p>' if kind else f"<p>{html.escape(text)}</p>"


def _figure(draw: Callable[[BinaryIO], None], *, alt: str, size: tuple[int, int], caption: str) -> str:
    """A PNG drawn by ``draw`` into memory, inlined as base64: the page fetches nothing."""
    buffer = io.BytesIO()
    draw(buffer)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    width, height = size
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" width="{width}" '
        f'height="{height}"><figcaption>{html.escape(caption)}</figcaption></figure>'
    )


# ---------------------------------------------------------------------------------------------- the tables


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
            _percent(-p.depth),
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
                _ratio(r.beta),
                _percent(r.annualised_alpha),
                _percent(r.alpha, 3),
                _ratio(r.correlation),
                _percent(r.tracking_error),
                _ratio(r.information_ratio),
                _percent(r.active_return),
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
        rows.append([name, span, str(year.days), *(_percent(per_strategy[s][i].total_return) for s in per_strategy)])
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
        text = _percent(month.total_return)
        cells[month.period[:4]][int(month.period[5:]) - 1] = f"{text}{PARTIAL_MARK}" if month.partial else text
    rows = []
    for year, row in cells.items():
        total = _percent(years[year].total_return)
        rows.append([year, *row, f"{total}{PARTIAL_MARK}" if years[year].partial else total])
    return Table(["year", *MONTHS, "the year"], rows)


# ---------------------------------------------------------------------------------------------- the sections


def _strategies_named(part: Part, labels: Mapping[str, str], transform: Callable[[np.ndarray], Any]) -> SeriesPanel:
    series = {labels[s]: list(transform(r)) for s, r in part.log_returns.items()}
    return SeriesPanel(part.title, [part.start, *part.dates], series)


def _summary_section(part: Part, labels: Mapping[str, str]) -> str:
    days = len(part.dates)
    notes = [
        f"{days} trading days, {part.dates[0]} to {part.dates[-1]}, every strategy from cash on the same days with "
        "the same costs; returns are net of costs."
    ]
    if days < TRADING_DAYS:
        notes.append(
            f"Fewer than {TRADING_DAYS} days: the yearly figures are annualised from {days} days (a rate extrapolated "
            f"from part of a year), and Calmar is not shown: it needs at least {CALMAR_MIN_DAYS} days."
        )
    return "".join(_paragraph(n, "note") for n in notes) + _table(summary_table(part, labels))


def identical_to_champion(part: Part) -> list[str]:
    """The baselines whose daily returns are the champion's, day for day (equal weight, when no agent was crowned):
    their lines would lie under the champion's, where no one can see them; the page names them instead."""
    champion = np.asarray(part.log_returns["champion"])
    return [s for s, r in part.log_returns.items() if s != "champion" and np.array_equal(np.asarray(r), champion)]


def _equity_section(part: Part, labels: Mapping[str, str]) -> str:
    hidden = identical_to_champion(part)
    shown = dataclasses.replace(part, log_returns={s: r for s, r in part.log_returns.items() if s not in hidden})
    same = f" {', '.join(labels[s] for s in hidden)}: identical to the champion, not drawn." if hidden else ""
    return _figure(
        lambda out: plot_equity(
            out,
            [_strategies_named(shown, labels, equity_curve)],
            title="Growth of 1, net of costs",
            highlight=labels["champion"],
            size_px=FIGURE_SIZE_PX,
        ),
        alt=f"equity curves: {part.title}",
        size=FIGURE_SIZE_PX,
        caption="The value of 1 invested at the close before the first day (log scale), champion in black." + same,
    )


def _drawdown_section(part: Part, labels: Mapping[str, str]) -> str:
    figure = _figure(
        lambda out: plot_drawdowns(
            out,
            [_strategies_named(part, labels, lambda r: drawdown_curve(equity_curve(r)))],
            title="Underwater: the fall from the running peak",
            highlight=labels["champion"],
            size_px=FIGURE_SIZE_PX,
        ),
        alt=f"drawdowns: {part.title}",
        size=FIGURE_SIZE_PX,
        caption="Drawdown 1 - value / running peak, champion shaded.",
    )
    table = drawdown_table(part)
    if not table.rows:
        return figure + _paragraph("The champion never closed below an earlier peak on these days.", "note")
    return (
        figure
        + _paragraph(
            "The champion's worst five drawdowns: from the peak (the last close at the high) to the trough, and the "
            "first close back at the peak (recovery), or 'not recovered' by the last day; days underwater counts the "
            "days that closed below the peak.",
            "note",
        )
        + _table(table)
    )


def _rolling_section(part: Part, labels: Mapping[str, str]) -> str:
    days = len(part.dates)
    shown = [w for w in ROLLING_WINDOWS if days >= w]
    notes = [
        f"{w}-day rolling Sharpe: not shown; the series has {days} days, fewer than the {w}-day window."
        for w in ROLLING_WINDOWS
        if w not in shown
    ]
    text = "".join(_paragraph(n, "note") for n in notes)
    if not shown:
        return text
    strategies = [s for s in ROLLING_SHOWN if s in part.log_returns]
    panels = []
    for window in shown:
        series = {}
        for s in strategies:
            values = rolling_sharpe(part.log_returns[s], window, risk_free=part.cash_returns)
            series[labels[s]] = [None if math.isnan(v) else float(v) for v in values]
        panels.append(SeriesPanel(f"{window}-day window", list(part.dates), series))
    size = (FIGURE_SIZE_PX[0], FIGURE_SIZE_PX[1] * len(panels))
    return (
        text
        + _figure(
            lambda out: plot_lines(
                out,
                panels,
                title="Rolling Sharpe ratio over cash",
                ylabel="Sharpe ratio",
                highlight=labels["champion"],
                size_px=size,
            ),
            alt=f"rolling Sharpe: {part.title}",
            size=size,
            caption="Each point: the Sharpe ratio of the window of days ending that day, annualised by sqrt(252) (a "
            f"{shown[0]}-day window extrapolates {shown[0]} days to a year); gaps where a window's days are all equal.",
        )
        + _rolling_risk(part, labels, shown[0], strategies)
    )


def _rolling_risk(part: Part, labels: Mapping[str, str], window: int, strategies: Sequence[str]) -> str:
    """The rolling volatility of every strategy shown, and the champion's rolling beta to the index where there is
    one, over the shortest window."""

    def gaps(values: np.ndarray) -> list[float | None]:
        return [None if math.isnan(v) else float(v) for v in values]

    panels = [
        SeriesPanel(
            f"{window}-day volatility",
            list(part.dates),
            {labels[s]: gaps(rolling_volatility(part.log_returns[s], window)) for s in strategies},
        )
    ]
    if INDEX in part.log_returns:
        beta = rolling_beta(part.log_returns["champion"], part.log_returns[INDEX], window, risk_free=part.cash_returns)
        panels.append(
            SeriesPanel(f"{window}-day beta to {labels[INDEX]}", list(part.dates), {labels["champion"]: gaps(beta)})
        )
    size = (FIGURE_SIZE_PX[0], FIGURE_SIZE_PX[1] * len(panels))
    return _figure(
        lambda out: plot_lines(
            out, panels, title="Rolling volatility and beta", ylabel="", highlight=labels["champion"], size_px=size
        ),
        alt=f"rolling volatility and beta: {part.title}",
        size=size,
        caption=f"Each point: over the {window} days ending that day, the annualised volatility of the daily simple "
        "returns (sqrt(252) x their standard deviation) and, against the index, the champion's beta (the slope of its "
        "excess returns over cash on the index's).",
    )


def month_grid(part: Part, strategy: str = "champion") -> tuple[list[str], list[list[float | None]]]:
    """The strategy's monthly returns as (years, a row of 12 months per year, None where a month has no days)."""
    months = calendar_returns(
        part.log_returns[strategy], part.dates, start=part.start, after=part.after, period="month"
    )
    years = sorted({p.period[:4] for p in months})
    grid: list[list[float | None]] = [[None] * 12 for _ in years]
    for p in months:
        grid[years.index(p.period[:4])][int(p.period[5:]) - 1] = p.total_return
    return years, grid


def _calendar_section(part: Part, labels: Mapping[str, str]) -> str:
    years, grid = month_grid(part)
    height = max(240, 60 + 36 * len(years))
    out = _paragraph(
        f"The champion's return in each calendar month and year; {PARTIAL_MARK} marks a partial period, one the "
        "days start or end inside, whose return covers only its traded days.",
        "note",
    )
    out += _figure(
        lambda buffer: plot_month_grid(
            buffer, years, grid, title="The champion's monthly returns", size_px=(FIGURE_SIZE_PX[0], height)
        ),
        alt=f"monthly returns: {part.title}",
        size=(FIGURE_SIZE_PX[0], height),
        caption="Each cell a calendar month's return in percent, red a loss and green a gain on a scale symmetric "
        "about 0; the first and last months may be partial (the table below marks them).",
    )
    out += _table(monthly_table(part))
    if INDEX in part.log_returns:
        periods = {
            labels[s]: calendar_returns(
                part.log_returns[s], part.dates, start=part.start, after=part.after, period="year"
            )
            for s in ("champion", INDEX)
        }
        yearly = {name: [p.total_return for p in rows] for name, rows in periods.items()}
        names = [p.period for p in periods[labels["champion"]]]
        out += _figure(
            lambda buffer: plot_year_bars(
                buffer, names, yearly, title=f"Yearly returns against {labels[INDEX]}", size_px=FIGURE_SIZE_PX
            ),
            alt=f"yearly returns against the index: {part.title}",
            size=FIGURE_SIZE_PX,
            caption="Each calendar year's return of the champion beside the index's (a partial year covers only its "
            "traded days).",
        )
    return (
        out + _paragraph("Every strategy's return in each calendar year:", "note") + _table(yearly_table(part, labels))
    )


def exposure_series(weights: np.ndarray) -> dict[str, list[float]]:
    """The long leg, the short leg (negative), the gross and the net of daily weights (D, N + 1), cash first."""
    assets = np.asarray(weights)[:, 1:]
    longs, shorts = np.clip(assets, 0.0, None).sum(axis=1), np.clip(assets, None, 0.0).sum(axis=1)
    return {
        "long": longs.tolist(),
        "short": shorts.tolist(),
        "gross": (longs - shorts).tolist(),
        "net": (longs + shorts).tolist(),
    }


def distribution_table(part: Part, labels: Mapping[str, str]) -> Table:
    """Every strategy's daily-return distribution (``offline.performance.distribution``)."""
    header = [
        "strategy",
        "VaR 5%",
        "CVaR 5%",
        "skew",
        "excess kurtosis",
        "best day",
        "worst day",
        "best month",
        "worst month",
        "win rate",
        "average win",
        "average loss",
        "profit factor",
        "tail ratio",
    ]
    rows = []
    for strategy, returns in part.log_returns.items():
        d = distribution(returns, part.dates, start=part.start)
        rows.append(
            [
                labels[strategy],
                _percent(d.value_at_risk, 2),
                _percent(d.conditional_value_at_risk, 2),
                _ratio(d.skew),
                _ratio(d.excess_kurtosis),
                _percent(d.best_day, 2),
                _percent(d.worst_day, 2),
                _percent(d.best_month),
                _percent(d.worst_month),
                "n/a" if d.win_rate is None else f"{100 * d.win_rate:.1f}%",
                _percent(d.average_win, 2),
                _percent(d.average_loss, 2),
                "n/a" if d.profit_factor is None else f"{d.profit_factor:.2f}",
                "n/a" if d.tail_ratio is None else f"{d.tail_ratio:.2f}",
            ]
        )
    return Table(header, rows)


def _distribution_section(part: Part, labels: Mapping[str, str]) -> str:
    out = _paragraph(
        "Of the daily simple returns: the value at risk and its conditional mean over the worst 5% of days, the "
        "moments (n/a for a series without spread: not measured), the extremes, and how often and how much a day "
        "wins (a day of no change neither wins nor loses).",
        "note",
    )
    out += _table(distribution_table(part, labels))
    if part.weights is not None:
        effective, top = concentration(part.weights, part.asset_labels)
        held = ", ".join(f"{name} {100 * weight:.1f}%" for name, weight in top)
        out += _paragraph(
            f"The champion's concentration: {effective:.1f} effective assets on average (1 / the sum of squared "
            f"shares of its gross; {len(part.asset_labels) - 1} for equal weight), its largest mean holdings {held}."
        )
    return out


def _trading_section(part: Part, labels: Mapping[str, str]) -> str:
    out = ""
    if part.weights is not None and (np.asarray(part.weights)[:, 1:] < 0).any():  # a long-short book
        panel = SeriesPanel(part.title, list(part.dates), exposure_series(part.weights))
        out += _figure(
            lambda buffer: plot_lines(
                buffer,
                [panel],
                title="The champion's long and short exposure each day",
                ylabel="of the book's value",
                highlight="net",
                percent=True,
                size_px=FIGURE_SIZE_PX,
            ),
            alt=f"exposure: {part.title}",
            size=FIGURE_SIZE_PX,
            caption="The long leg (sum of positive weights), the short leg (negative weights), the gross (sum of "
            "|weights|) and the net (sum of weights) held each day; the rest, short proceeds included, is cash, "
            "the line the equity curves measure a long-short book against.",
        )
    elif part.weights is not None:
        out += _figure(
            lambda buffer: plot_weights(
                buffer,
                [WeightsPanel(part.title, list(part.dates), list(part.asset_labels), part.weights.tolist())],
                title="The champion's target weights each day",
                size_px=WEIGHTS_SIZE_PX,
            ),
            alt=f"weights: {part.title}",
            size=WEIGHTS_SIZE_PX,
            caption="Target weights held each day, stacked, cash first.",
        )
    traded = [s for s in TRADES_SHOWN if s in part.turnover]
    if traded and len(part.dates) > 1:
        paid = {}
        for s in traded:  # costs per unit of starting capital, as RiskMetrics.costs adds them up
            equity = equity_curve(part.log_returns[s])[:-1]  # (D,) the value before each day's trade
            paid[labels[s]] = list(np.cumsum(np.asarray(part.costs[s]) * equity))
        for name, ylabel, series, caption in (
            (
                "Turnover each day",
                "traded fraction",
                {labels[s]: [math.nan, *list(part.turnover[s])[1:]] for s in traded},
                "The fraction of the portfolio traded each day, sum |target - held|, from the second day: the first "
                "day's buy from cash ("
                + ", ".join(f"{labels[s]} {100 * float(part.turnover[s][0]):.0f}%" for s in traded)
                + ") would set the scale.",
            ),
            (
                "Costs paid so far",
                "of starting capital",
                paid,
                "Costs paid so far per unit of starting capital: cost rate x turnover x the value traded.",
            ),
        ):
            panel = SeriesPanel(part.title, list(part.dates), series)
            out += _figure(
                lambda buffer, name=name, ylabel=ylabel, panel=panel: plot_lines(
                    buffer,
                    [panel],
                    title=name,
                    ylabel=ylabel,
                    highlight=labels["champion"],
                    percent=True,
                    size_px=FIGURE_SIZE_PX,
                ),
                alt=f"{name.lower()}: {part.title}",
                size=FIGURE_SIZE_PX,
                caption=caption,
            )
    if part.trading_note:
        out += _paragraph(part.trading_note, "note")
    if part.trading_table is not None:
        out += _table(part.trading_table)
    return out


def _relative_section(part: Part, labels: Mapping[str, str]) -> str:
    table = relative_table(part, labels)
    notes = []
    if INDEX not in part.log_returns:
        notes.append("This data has no benchmark index: the champion is measured against equal weight only.")
    notes.append(
        "A daily regression of the champion's simple returns in excess of cash on the benchmark's: beta is the slope, "
        "alpha the intercept per day, compounded over 252 days (1 + alpha)^252 - 1. Active return is the champion's "
        "daily return minus the benchmark's; tracking error is its standard deviation times sqrt(252), the "
        "information ratio its mean over its standard deviation times sqrt(252), and the active return its mean "
        "times 252."
    )
    days = len(part.dates)
    if days < TRADING_DAYS:
        notes.append(f"With fewer than {TRADING_DAYS} days here, these yearly figures are annualised from {days} days.")
    return "".join(_paragraph(n, "note") for n in notes) + (_table(table) if table is not None else "")


SECTION_WRITERS = (
    _summary_section,
    _equity_section,
    _drawdown_section,
    _rolling_section,
    _calendar_section,
    _distribution_section,
    _trading_section,
    _relative_section,
)


# ---------------------------------------------------------------------------------------------- the page


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;max-width:1200px;
margin:0 auto;padding:1rem 1.5rem 3rem;color:#1d1d1f;line-height:1.45;background:#fff}
h1{font-size:1.6rem;margin-bottom:.3rem}h2{margin-top:2.5rem;border-bottom:2px solid #1d1d1f;padding-bottom:.2rem}
h3{margin-top:1.8rem}.note{color:#555;font-size:.92rem}.lead{margin:.2rem 0}
table{border-collapse:collapse;margin:.6rem 0 1.2rem;font-size:.86rem;font-variant-numeric:tabular-nums}
caption{text-align:left;font-weight:600;padding:.3rem 0}
th,td{padding:.2rem .45rem;border-bottom:1px solid #ddd;text-align:right;white-space:nowrap}
thead th{border-bottom:2px solid #999;vertical-align:bottom;white-space:normal}
tbody th,thead th:first-child{text-align:left;font-weight:600;white-space:normal}
.scroll{overflow-x:auto}td.neg{color:#b3261e}
figure{margin:1rem 0}img{display:block;max-width:100%;height:auto;border:1px solid #eee}
figcaption{color:#555;font-size:.88rem;margin-top:.3rem}nav ul{columns:2;font-size:.92rem}
dt{font-weight:600;margin-top:.5rem}dd{margin-left:1.2rem}
"""

_DEFINITIONS = (
    ("Returns", "Daily log returns net of costs; total return is exp(sum) - 1, the growth of 1 over the days."),
    (
        "Annualised",
        "With 252 trading days a year: annual return exp(mean log return x 252) - 1, volatility and ratios times "
        "sqrt(252). A figure from fewer than 252 days says 'annualised from N days': a rate extrapolated from part "
        "of a year.",
    ),
    (
        "Sharpe ratio",
        "Mean over standard deviation (ddof 1) of the daily simple returns in excess of what cash earned the same "
        "day, times sqrt(252). Sortino: the same mean over the root mean square of the days below cash.",
    ),
    (
        "Drawdown",
        "1 - value / running peak. Days underwater: the days that closed below the last peak. Calmar: annual return "
        "over the maximum drawdown, shown for 252 days or more.",
    ),
    (
        "Turnover and costs",
        "Turnover: sum |target - held| each day, per year the mean times 252; costs are paid as "
        "cost rate x turnover, added up per unit of starting capital.",
    ),
    (
        "Alpha and beta",
        "Ordinary least squares of the champion's daily simple excess returns over cash on the benchmark's: beta the "
        "slope, alpha the intercept per day, annualised as (1 + alpha)^252 - 1 (pyfolio's convention).",
    ),
    (
        "Tracking error and information ratio",
        "Of the daily active return, the champion's simple return minus the benchmark's: tracking error its standard "
        "deviation (ddof 1) times sqrt(252), information ratio its mean over that deviation times sqrt(252).",
    ),
    (
        "Deflated Sharpe ratio and PBO",
        "How much of the champion's validation edge over equal weight the number of candidates tried explains "
        "(offline/overfitting.py; docs/backtest.md, section Skill or luck?).",
    ),
)


def _anchor(index: int, section: int | None = None) -> str:
    return f"part-{index}" if section is None else f"part-{index}-{section}"


def render(sheet: Sheet) -> str:
    """The page's HTML: the verdict, then each part's sections (``SECTIONS``), then the definitions."""
    labels = sheet.labels
    body = [f"<h1>{html.escape(sheet.title)}</h1>", *(_paragraph(line, "lead") for line in sheet.lines)]
    links = [f'<li><a href="#verdict">{html.escape(sheet.verdict.heading)}</a></li>']
    links += [f'<li><a href="#{_anchor(i)}">{html.escape(part.title)}</a></li>' for i, part in enumerate(sheet.parts)]
    links.append(f'<li><a href="#definitions">{DEFINITIONS}</a></li>')
    body.append(f"<nav><ul>{''.join(links)}</ul></nav>")
    verdict = sheet.verdict
    body.append(f'<h2 id="verdict">{html.escape(verdict.heading)}</h2>')
    body += [_paragraph(s) for s in verdict.sentences]
    body += [_table(t) for t in verdict.tables]
    for i, part in enumerate(sheet.parts):
        body.append(f'<h2 id="{_anchor(i)}">{html.escape(part.title)}</h2>')
        body.append(_paragraph(part.note))
        for k, (heading, write) in enumerate(zip(SECTIONS, SECTION_WRITERS)):
            body.append(f'<section><h3 id="{_anchor(i, k)}">{html.escape(heading)}</h3>{write(part, labels)}</section>')
    body.append(f'<h2 id="definitions">{DEFINITIONS}</h2><dl>')
    body += [f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in _DEFINITIONS]
    body.append("</dl>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(sheet.title)}</title><style>{STYLE}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def write_page(path: Path, sheet: Sheet) -> str:
    """Write ``render(sheet)`` to ``path`` (replaced atomically); returns the file's name."""
    checkpoint.write_file_atomically(path, render(sheet).encode("utf-8"))
    return path.name


# ---------------------------------------------------------------------------------------------- evaluate's page


DIAGNOSTIC_NAMES = {
    "deflated_sharpe": "deflated Sharpe ratio",
    "deflated_sharpe_of": "deflated Sharpe ratio of",
    "trials": "trials (candidates compared)",
    "sharpe": "Sharpe ratio per day of the validation excess over equal weight",
    "skewness": "skewness of the daily excess",
    "kurtosis": "kurtosis of the daily excess (3: normal)",
    "moments": "skewness and kurtosis",
    "days": "validation days",
    "expected_max_sharpe": "Sharpe ratio per day the best of the trials shows by luck (expected)",
    "trial_sharpe_variance": "variance of the trials' Sharpe ratios",
    "pbo": "probability of backtest overfitting (PBO)",
    "pbo_median_logit": "PBO: median logit of the in-sample best's rank out of sample",
    "pbo_splits": "PBO: splits of the validation blocks",
}
"""How the page names ``offline.overfitting``'s figures; any other field is named by its key."""


def _scalars(
    document: Mapping[str, Any], skip: Sequence[str] = (), names: Mapping[str, str] | None = None
) -> list[list[str]]:
    """The number, text and yes/no fields of a JSON object as rows, each named by ``names`` or by its key (nested
    objects and lists left out)."""
    names = names or {}
    return [
        [names.get(key, key.replace("_", " ")), _number(value)]
        for key, value in document.items()
        if key not in skip and (value is None or isinstance(value, (bool, int, float, str)))
    ]


def evaluation_sheet(
    results: Mapping[str, RangeResult],
    *,
    labels: Mapping[str, str],
    tickers: Sequence[str],
    calendar: Sequence[str],
    title: str,
    lines: Sequence[str],
    overfitting: Mapping[str, Any],
    selection: str,
) -> Sheet:
    """``evaluate``'s page: the holdout (out of sample) and the validation range (which chose the champion).

    Args:
        results: ``offline.holdout.score_champion``'s ranges.
        labels: Strategy -> name (``offline.evaluate.strategy_labels``).
        tickers: The market's assets, the weights' columns after cash.
        calendar: The market's trading days (``Market.dates``): the close before each range and the day after it.
        title: The page's title; ``lines``: sentences under it.
        overfitting: ``offline.evaluate.diagnostics``' answer; ``selection``: ``selection_reading``'s line.
    """
    position = {day: i for i, day in enumerate(calendar)}
    notes = {
        "holdout": "Out of sample: no day of it trained, selected or tuned anything.",
        "validation": "In sample: these days chose the champion, so its figures here overstate what it would earn.",
    }
    parts = []
    for name in ("holdout", *(r for r in RANGES if r != "holdout")):
        result = results[name]
        first, last = position[result.dates[0]], position[result.dates[-1]]
        traces = result.traces
        parts.append(
            Part(
                title=f"{name.capitalize()}: {result.dates[0]} to {result.dates[-1]}",
                note=notes.get(name, ""),
                dates=result.dates,
                start=calendar[first - 1],
                after=calendar[last + 1] if last + 1 < len(calendar) else None,
                log_returns={s: t.log_returns for s, t in traces.items()},
                cash_returns=result.cash_returns,
                turnover={s: t.turnover for s, t in traces.items() if t.weights is not None},
                costs={s: t.costs for s, t in traces.items() if t.weights is not None},
                weights=traces["champion"].weights,
                asset_labels=["cash", *tickers],
            )
        )
    figures = _scalars(overfitting, skip=("deflated_sharpe_reading", "pbo_reading"), names=DIAGNOSTIC_NAMES)
    verdict = Verdict(
        "Selection and overfitting",
        [selection, overfitting.get("deflated_sharpe_reading", ""), overfitting.get("pbo_reading", "")],
        [Table(["figure", "value"], figures, "The diagnostics of the run's choice (evaluation.json: diagnostics)")],
    )
    return Sheet(title, lines, labels, verdict, parts)


# ---------------------------------------------------------------------------------------------- backtest's page


def _fold_rows(summary: Mapping[str, Any], labels: Mapping[str, str]) -> Table:
    strategies = [s for s in ("champion", "equal_weight", "untrained", INDEX) if s in labels]
    header = ["test year", "seed", "crowned", *(f"Sharpe: {labels[s]}" for s in strategies), "difference", "DSR", "PBO"]
    rows = []
    for fold in summary.get("folds", []):
        sharpe = fold.get("sharpe", {})
        rows.append(
            [
                str(fold.get("year")),
                str(fold.get("seed")),
                f"generation {fold['crowned']}" if fold.get("crowned") else "no",
                *(_ratio(sharpe.get(s)) for s in strategies),
                _ratio(fold.get("sharpe_difference")),
                _fixed(fold.get("deflated_sharpe")),
                _fixed(fold.get("pbo")),
            ]
        )
    return Table(header, rows, "Each test year and seed (summary.json: folds)")


def backtest_verdict(summary: Mapping[str, Any], labels: Mapping[str, str]) -> Verdict:
    """The summary's figures (``offline.backtest.report.summarise``), read with ``.get`` so that a summary of another
    version still renders; its ``pooled`` object, where present, as its verdict sentence and its scalar fields."""
    sentences = []
    mean = summary.get("mean_sharpe", {})
    sentences.append(
        "mean Sharpe: " + ", ".join(f"{labels.get(s, s)} {_ratio(v)}" for s, v in mean.items() if v is not None)
    )
    figures = [
        ["Sharpe difference to equal weight, mean", _ratio(summary.get("sharpe_difference_mean"))],
        ["Sharpe difference, spread (stdev)", _fixed(summary.get("sharpe_difference_std"))],
        ["Sharpe difference, worst fold", _ratio(summary.get("sharpe_difference_min"))],
        ["folds won", _percent(summary.get("won"), 0).lstrip("+")],
        ["folds tied", _percent(summary.get("tied"), 0).lstrip("+")],
        ["folds where an agent was crowned", _percent(summary.get("crowned"), 0).lstrip("+")],
        ["mean deflated Sharpe ratio", _fixed(summary.get("deflated_sharpe_mean"))],
        ["mean PBO", _fixed(summary.get("pbo_mean"))],
        ["turnover over equal weight's", _fixed(summary.get("turnover_ratio"))],
    ]
    tables = [
        Table(["figure", "value"], figures, "Over every fold and seed (summary.json)"),
        _fold_rows(summary, labels),
    ]
    traders = summary.get("traders")
    family = summary.get("family")
    if isinstance(traders, Mapping) and traders:
        for trader, pooled in traders.items():
            if isinstance(pooled, Mapping) and pooled.get("verdict"):
                sentences.append(f"{labels.get(trader, trader)}: {pooled['verdict']}")
        if isinstance(family, Mapping) and family.get("verdict"):
            sentences.append(f"which to deploy ({family.get('method', 'family')}): {family['verdict']}")
        tables.append(_procedure_rows(traders, family if isinstance(family, Mapping) else {}, labels))
        return Verdict("Backtest summary", sentences, tables)
    pooled = summary.get("pooled")  # a summary of an earlier version: the champion's test alone
    if isinstance(pooled, Mapping):
        if pooled.get("verdict"):
            sentences.append(f"pooled test: {pooled['verdict']}")
        known = {k: v for k, v in pooled.items() if v is not None}  # a figure not computed is left out, not n/a
        tables.append(
            Table(["figure", "value"], _scalars(known, skip=("verdict",)), "The pooled test (summary.json: pooled)")
        )
    return Verdict("Backtest summary", sentences, tables)


def _procedure_rows(traders: Mapping[str, Any], family: Mapping[str, Any], labels: Mapping[str, str]) -> Table:
    """One row per procedure: its pooled test over every test day, the family's adjusted p-value, what it traded."""
    adjusted = family.get("adjusted_p") or {}
    header = [
        "procedure",
        "mean excess, log %/y",
        "90% interval",
        "t",
        "one-sided p",
        "family-adjusted p",
        "turnover a year",
        "costs a year",
        "deflated Sharpe",
    ]
    rows = []
    for trader, pooled in traders.items():
        interval = pooled.get("interval")
        rows.append(
            [
                labels.get(trader, trader),
                _percent_points(pooled.get("mean_excess")),
                "not tested" if not interval else f"{interval[0] * 100:+.2f} to {interval[1] * 100:+.2f}",
                "not tested" if pooled.get("t") is None else f"{pooled['t']:+.2f}",
                "not tested" if pooled.get("p_value") is None else f"{pooled['p_value']:.4f}",
                "not tested" if adjusted.get(trader) is None else f"{adjusted[trader]:.4f}",
                "n/a" if pooled.get("mean_turnover") is None else f"{pooled['mean_turnover']:.1f}x",
                "n/a" if pooled.get("mean_costs") is None else f"{100 * pooled['mean_costs']:.2f}%",
                "n/a" if pooled.get("deflated_sharpe") is None else f"{pooled['deflated_sharpe']:.2f}",
            ]
        )
    return Table(header, rows, "Each procedure over every test day (summary.json: traders, family)")


def _percent_points(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.2f}"


TRADED = ("turnover per year", "costs")


def _yearly(figures: Mapping[str, Any]) -> tuple[str, str]:
    """A fold's turnover per year and costs (of starting capital) of one strategy, from its metrics."""
    turnover, costs = figures.get("turnover"), figures.get("costs")
    return (
        "n/a" if turnover is None else f"{turnover:.1f}x",
        "n/a" if costs is None else f"{100 * costs:.2f}%",
    )


def backtest_sheet(
    summary: Mapping[str, Any], results: Sequence[Mapping[str, Any]], *, labels: Mapping[str, str], title: str
) -> Sheet:
    """``backtest``'s page: the summary's figures, then per seed its test years chained (every test day traded by
    the champion of a run trained before that year, against the baselines on the same days).

    Args:
        summary: ``offline.backtest.report.summarise``'s answer (its ``pooled`` object rendered where present).
        results: The fold results (``offline.backtest.results.run_fold``), as they read back from their files.
        labels: Strategy -> name, the index by what it is.
    """
    order = (*TRADERS, "untrained", "equal_weight", "buy_and_hold", "cash", INDEX)
    parts = []
    shown: dict[bytes, int] = {}  # seeds whose chains trade the very same days the very same way show once
    for seed in sorted({r["seed"] for r in results}):
        chain = sorted((r for r in results if r["seed"] == seed), key=lambda r: r["year"])
        strategies = [s for s in order if all(s in r["daily"] for r in chain)]
        traders = [s for s in TRADERS if s in strategies]
        dates = [d for r in chain for d in r["test_dates"]]
        spans = chain[0]["dates"]
        years = [r["year"] for r in chain]
        consecutive = years == list(range(years[0], years[-1] + 1))
        note = (
            f"Seed {seed}: each test year traded from cash by the champion of a run trained on the years before it"
            + ("" if consecutive else "; the years are not consecutive: the days between them are not traded")
            + "."
        )
        log_returns = {
            s: np.concatenate([np.asarray(r["daily"][s], dtype=np.float64) for r in chain]) for s in strategies
        }
        turnover_rows = [
            [str(r["year"]), *(_yearly(r["metrics"].get(s, {})) for s in (*traders, "equal_weight"))] for r in chain
        ]
        same = json.dumps([dates, {s: v.tolist() for s, v in log_returns.items()}, turnover_rows]).encode()
        if same in shown:
            earlier = parts[shown[same]]
            named, rest = earlier.title.split(":", 1)
            parts[shown[same]] = dataclasses.replace(
                earlier,
                title=f"Seeds {named.removeprefix('Seeds ').removeprefix('Seed ')}, {seed}:{rest}",
                note=f"{earlier.note} Seed {seed} traded every test day exactly the same way: shown once.",
            )
            continue
        shown[same] = len(parts)
        part = Part(
            title=f"Seed {seed}: test years {', '.join(map(str, years))} chained",
            note=note,
            dates=dates,
            start=(spans.get("gap") or spans["validation"])[1],
            after=None,
            log_returns=log_returns,
            cash_returns=log_returns.get("cash"),
            trading_note="The fold results keep each strategy's daily log returns, not its daily weights or "
            "trades; each test year's turnover and costs:",
            trading_table=Table(
                ["test year", *(f"{what}: {labels[s]}" for s in (*traders, "equal_weight") for what in TRADED)],
                [[row[0], *(cell for pair in row[1:] for cell in pair)] for row in turnover_rows],
            ),
        )
        parts.append(part)
    years = sorted({r["year"] for r in results})
    seeds = sorted({r["seed"] for r in results})
    lines = [
        f"{len(results)} folds: test years {', '.join(map(str, years))}, seeds {', '.join(map(str, seeds))}; each "
        "fold a run trained on the years before its test year, its champion chosen on its own validation range."
    ]
    if summary.get("conventions"):
        lines.append(f"trading: {describe_conventions(summary['conventions'])}")
    return Sheet(title, lines, labels, backtest_verdict(summary, labels), parts)
