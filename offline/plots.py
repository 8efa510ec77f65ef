"""Figures as PNG files, drawn on a ``matplotlib.figure.Figure`` with the Agg canvas.

Never ``pyplot``: its global figure registry keeps every figure alive until it is closed. A ``Figure`` made here
is garbage once the function returns.
Inputs are plain lists (``None`` for a missing value, drawn as a gap), so this module knows nothing of the trainer.
Every input is checked before a figure is made: a ValueError leaves no file behind. Every function replaces the PNG
at ``path``, whose folder must exist, or writes it into a binary file object (the tear sheet keeps its figures in
memory and inlines them).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.dates import AutoDateLocator, ConciseDateFormatter, DateFormatter
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter, MaxNLocator, NullLocator, PercentFormatter

HISTORY_SIZE_PX: tuple[int, int] = (1000, 700)
"""(width, height) in pixels of ``plot_history``'s PNG."""
REPORT_SIZE_PX: tuple[int, int] = (1200, 800)
"""(width, height) in pixels of the PNGs of ``plot_equity``, ``plot_drawdowns`` and ``plot_weights`` unless their
``size_px`` says otherwise."""
_DPI = 100
Target = Path | str | BinaryIO
"""Where a PNG goes: a file's path, or a binary file object."""


def _values(values: Sequence[float | None]) -> list[float]:
    return [math.nan if v is None else float(v) for v in values]


def _figure(size_px: tuple[int, int], title: str, rows: int, **subplots) -> tuple[Figure, list[Axes]]:
    width, height = size_px
    figure = Figure(figsize=(width / _DPI, height / _DPI), dpi=_DPI, layout="constrained")
    FigureCanvasAgg(figure)
    figure.suptitle(title)
    return figure, list(figure.subplots(rows, 1, squeeze=False, **subplots)[:, 0])


def plot_history(
    path: Target,
    *,
    generations: Sequence[int],
    best_fitness: Sequence[float | None],
    mean_fitness: Sequence[float | None],
    worst_fitness: Sequence[float | None],
    validation_best: Sequence[float | None],
    champion_score: Sequence[float | None],
    title: str,
) -> None:
    """Write a PNG of a run's history per generation: the population's fitness band above, the best agent's and
    the champion's validation scores below. ValueError if the sequences differ in length."""
    series = [best_fitness, mean_fitness, worst_fitness, validation_best, champion_score]
    if any(len(s) != len(generations) for s in series):
        raise ValueError("every series needs one value per generation")
    x = [int(g) for g in generations]
    best, mean, worst, validation, champion = (_values(s) for s in series)

    figure, (fitness_ax, validation_ax) = _figure(HISTORY_SIZE_PX, title, 2, sharex=True)
    fitness_ax.fill_between(x, worst, best, alpha=0.25, color="tab:blue", label="worst to best")
    fitness_ax.plot(x, best, color="tab:blue", marker=".", label="best")
    fitness_ax.plot(x, mean, color="tab:blue", linestyle="--", label="mean")
    fitness_ax.plot(x, worst, color="tab:blue", linestyle=":", label="worst")
    fitness_ax.set_title("Fitness of the population (training episodes)")
    fitness_ax.set_ylabel("fitness")

    validation_ax.plot(x, validation, color="tab:orange", marker=".", label="best agent")
    validation_ax.step(x, champion, where="post", color="tab:green", label="champion")
    validation_ax.set_title("Validation score (total log return over the validation episode)")
    validation_ax.set_ylabel("validation score")
    validation_ax.set_xlabel("generation")
    validation_ax.xaxis.set_major_locator(MaxNLocator(integer=True))

    for ax in (fitness_ax, validation_ax):
        ax.grid(alpha=0.3)
        if x:
            ax.legend(loc="best", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no history", transform=ax.transAxes, ha="center", va="center")
    figure.savefig(path, format="png")


@dataclass(frozen=True)
class SeriesPanel:
    """One subplot of daily series over the same dates (e.g. the champion and its baselines on the test range)."""

    title: str
    dates: Sequence[str]
    """ISO dates ``YYYY-MM-DD``, one per point."""
    series: Mapping[str, Sequence[float]]
    """Name -> one value per date (``None`` for a gap); the insertion order is the legend's order."""


@dataclass(frozen=True)
class WeightsPanel:
    """One subplot of portfolio weights per day: a stacked area of the columns."""

    title: str
    dates: Sequence[str]
    """ISO dates ``YYYY-MM-DD``, one per row of ``weights``."""
    labels: Sequence[str]
    """One per column, e.g. ``['cash', 'AAPL', ...]``."""
    weights: Sequence[Sequence[float]]
    """One row per date, one weight per label; rows sum to about 1."""


def _dates(dates: Sequence[str], panel: str) -> list[datetime.date]:
    try:
        return [datetime.date.fromisoformat(d) for d in dates]
    except (TypeError, ValueError) as error:
        raise ValueError(f"panel {panel!r}: dates must be ISO strings YYYY-MM-DD ({error})") from None


def _series_panels(
    panels: Sequence[SeriesPanel], invalid: Callable[[float], bool], rule: str
) -> list[tuple[list[datetime.date], dict[str, list[float]]]]:
    """Each panel's dates and series, checked: one value per date, none ``invalid`` (gaps are NaN, never invalid)."""
    if not panels:
        raise ValueError("no panels to plot")
    checked = []
    for panel in panels:
        dates = _dates(panel.dates, panel.title)
        series = {name: _values(values) for name, values in panel.series.items()}
        for name, values in series.items():
            if len(values) != len(dates):
                raise ValueError(
                    f"panel {panel.title!r}: series {name!r} has {len(values)} values for {len(dates)} dates"
                )
            if any(invalid(v) for v in values):
                raise ValueError(f"panel {panel.title!r}: series {name!r} must be {rule}")
        checked.append((dates, series))
    return checked


def _date_axis(ax: Axes, title: str, dates: list[datetime.date], *, legend: bool = False) -> None:
    ax.set_title(title)
    ax.set_xlabel("date")
    ax.grid(alpha=0.3)
    if len(dates) == 1:
        ax.set_xticks(dates)
        ax.xaxis.set_major_formatter(DateFormatter("%Y-%m-%d"))
    elif dates:
        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
    else:
        ax.tick_params(which="both", left=False, bottom=False, labelleft=False, labelbottom=False)
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center")
    if legend and dates:
        ax.legend(loc="best", fontsize="small")


def _style(name: str, highlight: str, days: int) -> dict:
    # The highlighted series is drawn thick, in black and above the others; legend order stays insertion order.
    style = {"label": name, "marker": "." if days == 1 else None}
    if name == highlight:
        return {**style, "color": "black", "linewidth": 2.2, "zorder": 3}
    return {**style, "linewidth": 1.1, "alpha": 0.85, "zorder": 2}


class _PlainLogFormatter(LogFormatter):
    """``LogFormatter``'s choice of the ticks to label, written as plain numbers (0.97, 1.5, 20), not 1e+00:
    growth of 1 usually spans less than a decade, so most labelled ticks are minor ones."""

    def __call__(self, x: float, pos: int | None = None) -> str:
        return f"{x:.4g}" if super().__call__(x, pos) else ""


def growth_axis(ax: Axes, values: Sequence[float]) -> None:
    """A log y axis for growth-of-1 curves whose labels span the curves: within less than a decade of range (the
    usual case), about six evenly spaced plain ticks (0.9, 1, 1.1, 1.2), since a log axis labels only 1 and the
    minor ticks 0.9 and 2 .. 9 there; over a decade or more, the log axis's own labels."""
    ax.set_yscale("log")
    low, high = (min(values), max(values)) if values else (1.0, 1.0)
    if high < 10 * low:
        ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:.4g}"))
        ax.yaxis.set_minor_locator(NullLocator())
        return
    ax.yaxis.set_major_formatter(_PlainLogFormatter())
    ax.yaxis.set_minor_formatter(_PlainLogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))


def plot_equity(
    path: Target,
    panels: Sequence[SeriesPanel],
    *,
    title: str,
    highlight: str = "champion",
    size_px: tuple[int, int] = REPORT_SIZE_PX,
) -> None:
    """Write a PNG of growth-of-1 curves (positive values), one subplot per panel, on a log y axis so that equal
    percentage moves are equal heights. ``highlight`` is drawn thicker and on top.

    Raises:
        ValueError: No panels, a date that is not ISO, a series whose length is not its panel's number of dates, or
            a value that is not positive.
    """
    checked = _series_panels(panels, lambda v: v <= 0, "positive on a log axis")  # NaN compares False
    figure, axes = _figure(size_px, title, len(panels))
    for ax, panel, (dates, series) in zip(axes, panels, checked):
        for name, values in series.items():
            ax.plot(dates, values, **_style(name, highlight, len(dates)))
        growth_axis(ax, [v for values in series.values() for v in values if not math.isnan(v)])
        ax.set_ylabel("growth of 1 (log scale)")
        _date_axis(ax, panel.title, dates, legend=bool(series))
    figure.savefig(path, format="png")


def plot_drawdowns(
    path: Target,
    panels: Sequence[SeriesPanel],
    *,
    title: str,
    highlight: str = "champion",
    size_px: tuple[int, int] = REPORT_SIZE_PX,
) -> None:
    """Write a PNG of drawdown fractions ``1 - equity / running_max`` (>= 0), drawn in percent downwards from 0, one
    subplot per panel. ``highlight`` is drawn as a filled area.

    Raises:
        ValueError: No panels, a date that is not ISO, a series whose length is not its panel's number of dates, or
            a negative drawdown.
    """
    checked = _series_panels(panels, lambda v: v < 0, "drawdown fractions >= 0")
    figure, axes = _figure(size_px, title, len(panels))
    for ax, panel, (dates, series) in zip(axes, panels, checked):
        deepest = 0.0
        for name, values in series.items():
            below = [-100.0 * v for v in values]  # percent, 0 at the top
            deepest = min([deepest, *(v for v in below if not math.isnan(v))])
            if name == highlight:
                ax.fill_between(dates, below, 0.0, color="black", alpha=0.2, linewidth=0, zorder=2.5)
            ax.plot(dates, below, **_style(name, highlight, len(dates)))
        # 0 at the top; a floor of -1% keeps an all-zero panel from collapsing to a line.
        ax.set_ylim(min(deepest * 1.05, -1.0), 0.0)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=100))
        ax.set_ylabel("drawdown from peak")
        _date_axis(ax, panel.title, dates, legend=bool(series))
    figure.savefig(path, format="png")


def plot_weights(
    path: Target, panels: Sequence[WeightsPanel], *, title: str, size_px: tuple[int, int] = REPORT_SIZE_PX
) -> None:
    """Write a PNG of portfolio weights per day as stacked areas (0 to 100%), one subplot per panel.

    The legend sits right of each subplot, top to bottom in the stack's order; past 12 labels its font shrinks and
    it splits into two columns, so about 21 labels (cash and 20 assets) stay readable.

    Raises:
        ValueError: No panels, a date that is not ISO, a number of rows that is not the number of dates, or a row
            whose length is not the number of labels.
    """
    if not panels:
        raise ValueError("no panels to plot")
    checked = []
    for panel in panels:
        dates = _dates(panel.dates, panel.title)
        if len(panel.weights) != len(dates):
            raise ValueError(f"panel {panel.title!r}: {len(panel.weights)} rows of weights for {len(dates)} dates")
        rows = [[float(w) for w in row] for row in panel.weights]  # (T, N)
        if any(len(row) != len(panel.labels) for row in rows):
            raise ValueError(f"panel {panel.title!r}: every row of weights needs one value per label")
        checked.append((dates, rows))

    # 40 distinct qualitative colours; more labels than that repeat them.
    palette = [*matplotlib.colormaps["tab20"].colors, *matplotlib.colormaps["tab20b"].colors]
    figure, axes = _figure(size_px, title, len(panels))
    for ax, panel, (dates, rows) in zip(axes, panels, checked):
        labels = list(panel.labels)
        if dates and labels:
            x: list = list(dates)
            columns = [list(column) for column in zip(*rows)]  # (N, T)
            if len(dates) == 1:  # a single day as a block one day wide around its tick, else the area has no width
                start = datetime.datetime.combine(dates[0], datetime.time()) - datetime.timedelta(hours=12)
                x = [start, start + datetime.timedelta(days=1)]
                columns = [column * 2 for column in columns]
            colors = [palette[i % len(palette)] for i in range(len(labels))]
            ax.stackplot(x, columns, labels=labels, colors=colors, linewidth=0)
            handles, names = ax.get_legend_handles_labels()
            many = len(labels) > 12
            ax.legend(
                handles[::-1],  # the top of the stack first
                names[::-1],
                loc="upper left",
                bbox_to_anchor=(1.01, 1.0),
                fontsize="x-small" if many else "small",
                ncols=2 if many else 1,
                borderaxespad=0.0,
            )
        ax.set_ylim(0.0, 1.0)
        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set_ylabel("portfolio weight")
        _date_axis(ax, panel.title, dates)
        if dates and not labels:
            ax.text(0.5, 0.5, "no labels", transform=ax.transAxes, ha="center", va="center")
    figure.savefig(path, format="png")


def plot_lines(
    path: Target,
    panels: Sequence[SeriesPanel],
    *,
    title: str,
    ylabel: str,
    highlight: str = "champion",
    percent: bool = False,
    size_px: tuple[int, int] = REPORT_SIZE_PX,
) -> None:
    """Write a PNG of daily series on a linear y axis with a line at 0, one subplot per panel (rolling ratios,
    turnover, costs); ``percent`` labels fractions as percentages. ``highlight`` is drawn thicker and on top.

    Raises:
        ValueError: No panels, a date that is not ISO, a series whose length is not its panel's number of dates, or
            an infinite value.
    """
    checked = _series_panels(panels, math.isinf, "finite (None for a gap)")
    figure, axes = _figure(size_px, title, len(panels))
    for ax, panel, (dates, series) in zip(axes, panels, checked):
        ax.axhline(0.0, color="grey", linewidth=0.8, zorder=1)
        for name, values in series.items():
            ax.plot(dates, values, **_style(name, highlight, len(dates)))
        if percent:
            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set_ylabel(ylabel)
        _date_axis(ax, panel.title, dates, legend=bool(series))
    figure.savefig(path, format="png")


def plot_month_grid(
    path: Target, years: Sequence[str], grid: Sequence[Sequence[float | None]], *, title: str, size_px: tuple[int, int]
) -> None:
    """Write a PNG of monthly returns as a coloured grid, a row per year and a column per month, each cell labelled
    in percent: red for a loss, green for a gain, white at 0, the colour scale symmetric about 0 so equal moves
    look equal; an empty cell is a month without days.

    Raises:
        ValueError: a row that is not twelve months long, or no rows.
    """
    if not grid or any(len(row) != 12 for row in grid) or len(grid) != len(years):
        raise ValueError("the grid needs one row of 12 months per year")
    values = np.array([[math.nan if v is None else float(v) for v in row] for row in grid])
    figure, (ax,) = _figure(size_px, title, 1)
    reach = float(np.nanmax(np.abs(values))) if np.isfinite(values).any() else 0.01
    image = ax.imshow(values * 100, cmap="RdYlGn", vmin=-reach * 100, vmax=reach * 100, aspect="auto")
    ax.set_xticks(range(12), ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"])
    ax.set_yticks(range(len(years)), list(years))
    for (row, column), value in np.ndenumerate(values):
        if math.isfinite(value):
            ax.text(column, row, f"{100 * value:+.1f}", ha="center", va="center", fontsize=8)
    figure.colorbar(image, ax=ax, format=PercentFormatter(xmax=100), label="monthly return")
    figure.savefig(path, format="png")


def plot_year_bars(
    path: Target, years: Sequence[str], series: Mapping[str, Sequence[float]], *, title: str, size_px: tuple[int, int]
) -> None:
    """Write a PNG of yearly returns as grouped bars, a group per year and a bar per named series (the champion
    beside the index), in percent, with a line at 0.

    Raises:
        ValueError: a series whose length is not the number of years, or no series.
    """
    if not series or any(len(values) != len(years) for values in series.values()):
        raise ValueError("every series needs one value per year")
    figure, (ax,) = _figure(size_px, title, 1)
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        offsets = [i - 0.4 + width * (k + 0.5) for i in range(len(years))]
        ax.bar(offsets, [100 * v for v in values], width=width, label=name)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xticks(range(len(years)), list(years))
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=100))
    ax.set_ylabel("yearly return")
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    figure.savefig(path, format="png")
