"""What a tear sheet is made of: its parts, tables and verdicts, the page's constants, and how a figure reads."""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import numpy as np

from offline.holdout import INDEX

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


def percent(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{100 * value:+.{digits}f}%"


def ratio(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:+.2f}"


def fixed(value: float | None, digits: int = 2) -> str:
    """A figure that is not a ratio to equal weight or a share (a spread, a probability, a multiple), to ``digits``."""
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def number(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "n/a" if value is None else ("yes" if value else "no")
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "n/a" if not math.isfinite(value) else f"{value:.4g}"
    return str(value)


def cell_html(text: str) -> str:
    negative = text.startswith("-") and text[1:2].isdigit()
    return f'<td class="neg">{html.escape(text)}</td>' if negative else f"<td>{html.escape(text)}</td>"


def table_html(table: Table) -> str:
    caption = f"<caption>{html.escape(table.caption)}</caption>" if table.caption else ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in table.header)
    body = "".join(
        "<tr>" + f"<th>{html.escape(row[0])}</th>" + "".join(cell_html(c) for c in row[1:]) + "</tr>"
        for row in table.rows
    )
    return f'<div class="scroll"><table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def paragraph(text: str, kind: str = "") -> str:
    return f'<p class="{kind}">{html.escape(text)}</p>' if kind else f"<p>{html.escape(text)}</p>"


def figure_html(draw: Callable[[BinaryIO], None], *, alt: str, size: tuple[int, int], caption: str) -> str:
    """A PNG drawn by ``draw`` into memory, inlined as base64: the page fetches nothing."""
    buffer = io.BytesIO()
    draw(buffer)
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    width, height = size
    return (
        f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(alt)}" width="{width}" '
        f'height="{height}"><figcaption>{html.escape(caption)}</figcaption></figure>'
    )


def scalar_rows(
    document: Mapping[str, Any], skip: Sequence[str] = (), names: Mapping[str, str] | None = None
) -> list[list[str]]:
    """The number, text and yes/no fields of a JSON object as rows, each named by ``names`` or by its key (nested
    objects and lists left out)."""
    names = names or {}
    return [
        [names.get(key, key.replace("_", " ")), number(value)]
        for key, value in document.items()
        if key not in skip and (value is None or isinstance(value, (bool, int, float, str)))
    ]
