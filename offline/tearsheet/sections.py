"""The sections of each part of a tear sheet, in page order (``SECTIONS``): each a heading's HTML with its tables and
figures."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from offline.holdout import INDEX
from offline.performance import (
    CALMAR_MIN_DAYS,
    calendar_returns,
    concentration,
    distribution,
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
from offline.risk import TRADING_DAYS, drawdown_curve, equity_curve
from offline.tearsheet.sheet import (
    FIGURE_SIZE_PX,
    PARTIAL_MARK,
    ROLLING_SHOWN,
    ROLLING_WINDOWS,
    TRADES_SHOWN,
    WEIGHTS_SIZE_PX,
    Part,
    Table,
    figure_html,
    paragraph,
    percent,
    ratio,
    table_html,
)
from offline.tearsheet.tables import drawdown_table, monthly_table, relative_table, summary_table, yearly_table


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
    return "".join(paragraph(n, "note") for n in notes) + table_html(summary_table(part, labels))


def identical_to_champion(part: Part) -> list[str]:
    """The baselines whose daily returns are the champion's, day for day (equal weight, when no agent was crowned):
    their lines would lie under the champion's, where no one can see them; the page names them instead."""
    champion = np.asarray(part.log_returns["champion"])
    return [s for s, r in part.log_returns.items() if s != "champion" and np.array_equal(np.asarray(r), champion)]


def _equity_section(part: Part, labels: Mapping[str, str]) -> str:
    hidden = identical_to_champion(part)
    shown = dataclasses.replace(part, log_returns={s: r for s, r in part.log_returns.items() if s not in hidden})
    same = f" {', '.join(labels[s] for s in hidden)}: identical to the champion, not drawn." if hidden else ""
    return figure_html(
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
    figure = figure_html(
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
        return figure + paragraph("The champion never closed below an earlier peak on these days.", "note")
    return (
        figure
        + paragraph(
            "The champion's worst five drawdowns: from the peak (the last close at the high) to the trough, and the "
            "first close back at the peak (recovery), or 'not recovered' by the last day; days underwater counts the "
            "days that closed below the peak.",
            "note",
        )
        + table_html(table)
    )


def _rolling_section(part: Part, labels: Mapping[str, str]) -> str:
    days = len(part.dates)
    shown = [w for w in ROLLING_WINDOWS if days >= w]
    notes = [
        f"{w}-day rolling Sharpe: not shown; the series has {days} days, fewer than the {w}-day window."
        for w in ROLLING_WINDOWS
        if w not in shown
    ]
    text = "".join(paragraph(n, "note") for n in notes)
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
        + figure_html(
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
    return figure_html(
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
    out = paragraph(
        f"The champion's return in each calendar month and year; {PARTIAL_MARK} marks a partial period, one the "
        "days start or end inside, whose return covers only its traded days.",
        "note",
    )
    out += figure_html(
        lambda buffer: plot_month_grid(
            buffer, years, grid, title="The champion's monthly returns", size_px=(FIGURE_SIZE_PX[0], height)
        ),
        alt=f"monthly returns: {part.title}",
        size=(FIGURE_SIZE_PX[0], height),
        caption="Each cell a calendar month's return in percent, red a loss and green a gain on a scale symmetric "
        "about 0; the first and last months may be partial (the table below marks them).",
    )
    out += table_html(monthly_table(part))
    if INDEX in part.log_returns:
        periods = {
            labels[s]: calendar_returns(
                part.log_returns[s], part.dates, start=part.start, after=part.after, period="year"
            )
            for s in ("champion", INDEX)
        }
        yearly = {name: [p.total_return for p in rows] for name, rows in periods.items()}
        names = [p.period for p in periods[labels["champion"]]]
        out += figure_html(
            lambda buffer: plot_year_bars(
                buffer, names, yearly, title=f"Yearly returns against {labels[INDEX]}", size_px=FIGURE_SIZE_PX
            ),
            alt=f"yearly returns against the index: {part.title}",
            size=FIGURE_SIZE_PX,
            caption="Each calendar year's return of the champion beside the index's (a partial year covers only its "
            "traded days).",
        )
    return (
        out
        + paragraph("Every strategy's return in each calendar year:", "note")
        + table_html(yearly_table(part, labels))
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
                percent(d.value_at_risk, 2),
                percent(d.conditional_value_at_risk, 2),
                ratio(d.skew),
                ratio(d.excess_kurtosis),
                percent(d.best_day, 2),
                percent(d.worst_day, 2),
                percent(d.best_month),
                percent(d.worst_month),
                "n/a" if d.win_rate is None else f"{100 * d.win_rate:.1f}%",
                percent(d.average_win, 2),
                percent(d.average_loss, 2),
                "n/a" if d.profit_factor is None else f"{d.profit_factor:.2f}",
                "n/a" if d.tail_ratio is None else f"{d.tail_ratio:.2f}",
            ]
        )
    return Table(header, rows)


def _distribution_section(part: Part, labels: Mapping[str, str]) -> str:
    out = paragraph(
        "Of the daily simple returns: the value at risk and its conditional mean over the worst 5% of days, the "
        "moments (n/a for a series without spread: not measured), the extremes, and how often and how much a day "
        "wins (a day of no change neither wins nor loses).",
        "note",
    )
    out += table_html(distribution_table(part, labels))
    if part.weights is not None:
        effective, top = concentration(part.weights, part.asset_labels)
        held = ", ".join(f"{name} {100 * weight:.1f}%" for name, weight in top)
        out += paragraph(
            f"The champion's concentration: {effective:.1f} effective assets on average (1 / the sum of squared "
            f"shares of its gross; {len(part.asset_labels) - 1} for equal weight), its largest mean holdings {held}."
        )
    return out


def _trading_section(part: Part, labels: Mapping[str, str]) -> str:
    out = ""
    if part.weights is not None and (np.asarray(part.weights)[:, 1:] < 0).any():  # a long-short book
        panel = SeriesPanel(part.title, list(part.dates), exposure_series(part.weights))
        out += figure_html(
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
        out += figure_html(
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
            out += figure_html(
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
        out += paragraph(part.trading_note, "note")
    if part.trading_table is not None:
        out += table_html(part.trading_table)
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
    return "".join(paragraph(n, "note") for n in notes) + (table_html(table) if table is not None else "")


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
