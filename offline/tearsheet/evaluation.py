"""``evaluate``'s page: the holdout and the validation range, with the run's diagnostics."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from offline.holdout import RANGES, RangeResult
from offline.tearsheet.sheet import Part, Sheet, Table, Verdict, scalar_rows

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
    figures = scalar_rows(overfitting, skip=("deflated_sharpe_reading", "pbo_reading"), names=DIAGNOSTIC_NAMES)
    verdict = Verdict(
        "Selection and overfitting",
        [selection, overfitting.get("deflated_sharpe_reading", ""), overfitting.get("pbo_reading", "")],
        [Table(["figure", "value"], figures, "The diagnostics of the run's choice (evaluation.json: diagnostics)")],
    )
    return Sheet(title, lines, labels, verdict, parts)
