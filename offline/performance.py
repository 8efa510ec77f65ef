"""The tear sheet's figures of daily log-return series: the worst drawdowns, calendar-period returns, rolling Sharpe
ratios, and one series against a benchmark (alpha, beta, tracking error, information ratio).

The conventions are ``offline.risk``'s, so a figure here and one in ``evaluation.json`` never disagree: growth adds
log returns; day-to-day risk uses the simple returns ``exp(r) - 1``, measured over what cash earned on the same days
(``risk_free``, daily log returns; 0 when None); standard deviations have ``ddof=1``; a year is ``TRADING_DAYS``
(252) days. They are the conventions of empyrical (the figures of pyfolio and quantstats), and the tests check them
against empyrical-reloaded; the product computes them itself, with numpy alone, and depends on nothing more.

Annualising a figure measured over fewer than a year of days extrapolates it; ``annualised`` names such a figure
for what it is; a ratio that needs a year of days (Calmar: a yearly return over the worst fall) is not shown for
fewer than ``CALMAR_MIN_DAYS``.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from offline.risk import A_YEAR_AT_LEAST, TRADING_DAYS

CALMAR_MIN_DAYS = A_YEAR_AT_LEAST
"""The fewest days a Calmar ratio is shown for: a year's return over the year's worst fall needs a year
(``offline.risk.A_YEAR_AT_LEAST``, as ``RiskMetrics.under_a_year``)."""
PERIOD_KEYS = {"month": 7, "year": 4}
"""Calendar periods by the length of their prefix of an ISO date: ``2020-03`` and ``2020``."""


def annualised(days: int, periods_per_year: int = TRADING_DAYS) -> str:
    """How to label a figure annualised from ``days`` days: 'annualised', or 'annualised from N days' when the
    sample is shorter than a year (the yearly figure then extrapolates a part of one)."""
    year = A_YEAR_AT_LEAST * periods_per_year / TRADING_DAYS
    return "annualised" if days >= year else f"annualised from {days} days"


def _series(values: ArrayLike, name: str, days: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or array.shape[0] == 0 or not np.isfinite(array).all():
        raise ValueError(f"{name} must be a non-empty 1-D series of finite values")
    if days is not None and array.shape[0] != days:
        raise ValueError(f"{name} needs one value per day: {array.shape[0]} values for {days} days")
    return array


def _excess(log_returns: ArrayLike, risk_free: ArrayLike | None) -> np.ndarray:
    """(D,) simple returns over what cash earned the same day (as ``offline.risk``'s Sharpe ratio)."""
    simple = np.expm1(_series(log_returns, "log_returns"))
    if risk_free is None:
        return simple
    return simple - np.expm1(_series(risk_free, "risk_free", simple.shape[0]))


# ---------------------------------------------------------------------------------------------- drawdowns


@dataclass(frozen=True)
class DrawdownPeriod:
    """One fall of the equity curve from a peak and, if it came, its recovery."""

    peak: str
    """The close the fall starts from (the last close at the running peak)."""
    trough: str
    """The lowest close before the recovery (or before the last day)."""
    recovery: str | None
    """The first close back at the peak; None when the series ends below it (not recovered)."""
    depth: float
    """``1 - trough / peak``, in (0, 1)."""
    days: int
    """The days that closed below the peak: to the recovery, or to the last day when not recovered (as
    ``RiskMetrics.max_drawdown_days`` counts them)."""


def drawdown_periods(log_returns: ArrayLike, dates: Sequence[str], *, start: str, top: int = 5) -> list[DrawdownPeriod]:
    """The ``top`` deepest drawdowns of a series, deepest first (ties: the earlier first).

    Args:
        log_returns: (D,) daily log returns.
        dates: (D,) the day each return is earned.
        start: The close before the first return: the equity curve's first point (worth 1).

    Raises:
        ValueError: the series is empty or not finite, or ``dates`` does not have one date per return.
    """
    r = _series(log_returns, "log_returns", len(dates))
    points = [start, *dates]  # (D + 1,) closes
    log_equity = np.concatenate(([0.0], np.cumsum(r)))  # (D + 1,)
    # offline.risk's drawdown, in log space; a point is underwater when it closed below the running peak.
    drawdown = -np.expm1(log_equity - np.maximum.accumulate(log_equity))  # (D + 1,)
    underwater = drawdown > 0
    periods = []
    day = 1
    while day < len(points):
        if not underwater[day]:
            day += 1
            continue
        end = day
        while end < len(points) and underwater[end]:
            end += 1
        trough = day + int(np.argmax(drawdown[day:end]))
        periods.append(
            DrawdownPeriod(
                peak=points[day - 1],
                trough=points[trough],
                recovery=points[end] if end < len(points) else None,
                depth=float(drawdown[trough]),
                days=end - day,
            )
        )
        day = end
    return sorted(periods, key=lambda p: -p.depth)[:top]  # sorted() is stable: equal depths keep their order


# ---------------------------------------------------------------------------------------------- calendar periods


@dataclass(frozen=True)
class PeriodReturn:
    """A series' return over one calendar month or year."""

    period: str
    """``YYYY-MM`` or ``YYYY``."""
    first_day: str
    last_day: str
    days: int
    total_return: float
    """``exp(sum r) - 1`` over the period's days: the growth of 1 held through them, minus 1."""
    partial: bool
    """The series starts or ends inside the period, so it misses some of the period's days."""


def _weekdays_left(day: str, key: int) -> bool:
    """Whether a weekday follows ``day`` in its calendar period (prefix length ``key``)."""
    date = datetime.date.fromisoformat(day)
    following = date + datetime.timedelta(days=1)
    while following.isoformat()[:key] == day[:key]:
        if following.weekday() < 5:
            return True
        following += datetime.timedelta(days=1)
    return False


def calendar_returns(
    log_returns: ArrayLike, dates: Sequence[str], *, start: str, after: str | None, period: str
) -> list[PeriodReturn]:
    """The series' return in each calendar month or year it touches, in date order.

    The first period is partial when ``start`` (the close before the first return) lies in it: the series misses
    the days before. The last is partial when ``after`` (the market's next trading day) lies in it, or, when the
    data has no next day, while a weekday of the period is still to come.

    Args:
        log_returns: (D,) daily log returns, earned on ``dates`` (ISO, ascending, without gaps in the market's days).
        start: The close before the first return.
        after: The market's trading day after the last date; None when the data ends there.
        period: ``month`` or ``year``.

    Raises:
        ValueError: an unknown period, a series that is empty or not finite, or one date per return missing.
    """
    if period not in PERIOD_KEYS:
        raise ValueError(f"period must be one of {', '.join(PERIOD_KEYS)}, got {period!r}")
    key = PERIOD_KEYS[period]
    r = _series(log_returns, "log_returns", len(dates))
    groups: dict[str, list[int]] = {}
    for day, date in enumerate(dates):
        groups.setdefault(date[:key], []).append(day)
    names = list(groups)
    last_partial = _weekdays_left(dates[-1], key) if after is None else after[:key] == dates[-1][:key]
    rows = []
    for name, days in groups.items():
        rows.append(
            PeriodReturn(
                period=name,
                first_day=dates[days[0]],
                last_day=dates[days[-1]],
                days=len(days),
                total_return=float(np.expm1(r[days].sum())),
                partial=(name == names[0] and start[:key] == name) or (name == names[-1] and last_partial),
            )
        )
    return rows


# ---------------------------------------------------------------------------------------------- rolling Sharpe


def rolling_sharpe(
    log_returns: ArrayLike,
    window: int,
    *,
    risk_free: ArrayLike | None = None,
    periods_per_year: int = TRADING_DAYS,
) -> np.ndarray:
    """(D,) the Sharpe ratio of the ``window`` days ending on each day, ``offline.risk``'s definition (mean over
    standard deviation of the excess simple returns, ``ddof=1``, times ``sqrt(periods_per_year)``); NaN before a
    full window and where a window's excess returns are all equal.

    Raises:
        ValueError: ``window`` < 2, or a series that is empty, not finite or of another length.
    """
    if window < 2:
        raise ValueError(f"window must be >= 2 days, got {window}")
    excess = _excess(log_returns, risk_free)  # (D,)
    out = np.full(excess.shape[0], math.nan)
    if excess.shape[0] < window:
        return out
    windows = np.lib.stride_tricks.sliding_window_view(excess, window)  # (D - window + 1, window), a view
    std = windows.std(axis=1, ddof=1)
    flat = np.ptp(windows, axis=1) == 0.0  # exactly equal days: no spread, whatever rounding leaves in std
    with np.errstate(divide="ignore", invalid="ignore"):
        out[window - 1 :] = np.where(flat, math.nan, windows.mean(axis=1) / std * math.sqrt(periods_per_year))
    return out


def rolling_volatility(log_returns: ArrayLike, window: int, *, periods_per_year: int = TRADING_DAYS) -> np.ndarray:
    """(D,) the annualised volatility of the ``window`` days ending on each day: the standard deviation (``ddof=1``)
    of the simple returns times ``sqrt(periods_per_year)``, ``offline.risk``'s; NaN before a full window."""
    if window < 2:
        raise ValueError(f"window must be >= 2 days, got {window}")
    simple = np.expm1(_series(log_returns, "log_returns"))
    out = np.full(simple.shape[0], math.nan)
    if simple.shape[0] >= window:
        windows = np.lib.stride_tricks.sliding_window_view(simple, window)
        out[window - 1 :] = windows.std(axis=1, ddof=1) * math.sqrt(periods_per_year)
    return out


def rolling_beta(
    log_returns: ArrayLike, benchmark: ArrayLike, window: int, *, risk_free: ArrayLike | None = None
) -> np.ndarray:
    """(D,) the beta of the ``window`` days ending on each day: the slope of the series' excess simple returns on the
    benchmark's (``relative_figures``' beta, window by window); NaN before a full window and where the benchmark's
    window has no spread."""
    if window < 2:
        raise ValueError(f"window must be >= 2 days, got {window}")
    y = _excess(log_returns, risk_free)
    x = _excess(benchmark, risk_free)
    if x.shape != y.shape:
        raise ValueError(f"benchmark needs one value per day: {x.shape[0]} values for {y.shape[0]} days")
    out = np.full(y.shape[0], math.nan)
    if y.shape[0] < window:
        return out
    xs = np.lib.stride_tricks.sliding_window_view(x, window)
    ys = np.lib.stride_tricks.sliding_window_view(y, window)
    xc = xs - xs.mean(axis=1, keepdims=True)
    yc = ys - ys.mean(axis=1, keepdims=True)
    variance = (xc**2).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        out[window - 1 :] = np.where(variance > 0, (xc * yc).sum(axis=1) / variance, math.nan)
    return out


# ---------------------------------------------------------------------------------------------- against a benchmark


@dataclass(frozen=True)
class Relative:
    """A series against a benchmark over the same D days, from daily simple returns.

    ``y = simple - cash`` and ``x = benchmark's simple - cash`` are the excess returns over what cash earned; the
    daily regression ``y = alpha + beta * x + e`` is ordinary least squares. ``active = simple - benchmark's simple``
    is the daily return of holding the series and shorting the benchmark. NaN marks a ratio whose denominator is 0.
    """

    days: int
    beta: float
    """``cov(x, y) / var(x)``: the daily exposure to the benchmark; NaN if the benchmark's excess is constant."""
    alpha: float
    """``mean(y) - beta * mean(x)``: the regression's daily intercept."""
    annualised_alpha: float
    """``(1 + alpha) ** N - 1``: the daily alpha compounded over a year (empyrical's and pyfolio's convention)."""
    correlation: float
    """Pearson correlation of ``x`` and ``y``; NaN if either is constant."""
    tracking_error: float
    """``std(active, ddof=1) * sqrt(N)``: the yearly spread of the active return; 0 for a copy of the benchmark."""
    information_ratio: float
    """``mean(active) / std(active, ddof=1) * sqrt(N)``: the active return per unit of tracking error, yearly."""
    active_return: float
    """``mean(active) * N``: the mean daily active return times a year's days."""


def relative_figures(
    log_returns: ArrayLike,
    benchmark: ArrayLike,
    *,
    risk_free: ArrayLike | None = None,
    periods_per_year: int = TRADING_DAYS,
) -> Relative:
    """``log_returns`` against ``benchmark`` (both daily log returns of the same days; see ``Relative``).

    Raises:
        ValueError: fewer than two days, a series that is not finite, or series of different lengths.
    """
    y = _excess(log_returns, risk_free)  # (D,)
    days = y.shape[0]
    if days < 2:
        raise ValueError(f"relative figures need at least two days, got {days}")
    x = _excess(_series(benchmark, "benchmark", days), risk_free)  # (D,)
    active = y - x  # cash cancels: the series' simple return minus the benchmark's
    year = float(periods_per_year)
    dx, dy = x - x.mean(), y - y.mean()
    spread_x, spread_y = float(np.dot(dx, dx)), float(np.dot(dy, dy))
    flat_x, flat_y = np.ptp(x) == 0.0, np.ptp(y) == 0.0
    beta = math.nan if flat_x else float(np.dot(dx, dy)) / spread_x
    alpha = math.nan if flat_x else float(y.mean() - beta * x.mean())
    tracking = 0.0 if np.ptp(active) == 0.0 else float(active.std(ddof=1))
    return Relative(
        days=days,
        beta=beta,
        alpha=alpha,
        annualised_alpha=math.nan if flat_x else float((1.0 + alpha) ** year - 1.0),
        correlation=math.nan if flat_x or flat_y else float(np.dot(dx, dy)) / math.sqrt(spread_x * spread_y),
        tracking_error=tracking * math.sqrt(year),
        information_ratio=math.nan if tracking == 0.0 else float(active.mean()) / tracking * math.sqrt(year),
        active_return=float(active.mean()) * year,
    )


# ---------------------------------------------------------------------------------------------- the distribution

TAIL = 0.05
"""The tail the value at risk, the conditional value at risk and the tail ratio look at: the worst (and best) 5% of
days."""


@dataclass(frozen=True)
class Distribution:
    """What a quantstats reader looks up of a series' daily simple returns ``exp(r) - 1`` (empyrical's and
    quantstats' definitions): its tails, its moments, its best and worst days and months, how often and how much it
    wins. A moment of a series without spread is None: not measured (never an assumed 0 or 3)."""

    value_at_risk: float
    """The 5th percentile of the daily returns (numpy's linear interpolation): a loss exceeded on 5% of days."""
    conditional_value_at_risk: float
    """The mean of the daily returns at or below the value at risk: the average day of the worst 5%."""
    skew: float | None
    """``m3 / m2 ** 1.5`` of the daily returns (central moments, the biased estimator: scipy's default)."""
    excess_kurtosis: float | None
    """``m4 / m2 ** 2 - 3``: 0 for a normal distribution (scipy's default, Fisher's)."""
    best_day: float
    worst_day: float
    best_month: float | None
    worst_month: float | None
    """Calendar months' returns (``calendar_returns``), partial months included; None without dates."""
    win_rate: float | None
    """The fraction of days with a gain among the days with a gain or a loss (days of no change are neither)."""
    average_win: float | None
    average_loss: float | None
    """The mean return of the winning days, of the losing days (negative)."""
    profit_factor: float | None
    """The winning days' returns summed over the losing days' losses summed; None without a losing day."""
    tail_ratio: float | None
    """``|95th percentile| / |5th percentile|``: how large the best days are against the worst; None if the 5th is 0."""


def distribution(log_returns: ArrayLike, dates: Sequence[str] | None = None, *, start: str = "") -> Distribution:
    """The ``Distribution`` of daily log returns (``dates`` and ``start``, the close before the first, for the
    months)."""
    simple = np.expm1(_series(log_returns, "log_returns", None if dates is None else len(dates)))
    var = float(np.percentile(simple, 100 * TAIL))
    centred = simple - simple.mean()
    m2 = float(np.mean(centred**2))
    spread = m2 > 1e-30
    wins, losses = simple[simple > 0], simple[simple < 0]
    months = None
    if dates is not None:
        months = [p.total_return for p in calendar_returns(log_returns, dates, start=start, after=None, period="month")]
    low = float(np.percentile(simple, 100 * TAIL))
    return Distribution(
        value_at_risk=var,
        conditional_value_at_risk=float(simple[simple <= var].mean()),
        skew=float(np.mean(centred**3) / m2**1.5) if spread else None,
        excess_kurtosis=float(np.mean(centred**4) / m2**2 - 3.0) if spread else None,
        best_day=float(simple.max()),
        worst_day=float(simple.min()),
        best_month=None if months is None else max(months),
        worst_month=None if months is None else min(months),
        win_rate=float(len(wins) / (len(wins) + len(losses))) if len(wins) + len(losses) else None,
        average_win=float(wins.mean()) if len(wins) else None,
        average_loss=float(losses.mean()) if len(losses) else None,
        profit_factor=float(wins.sum() / -losses.sum()) if len(losses) else None,
        tail_ratio=float(abs(np.percentile(simple, 100 * (1 - TAIL))) / abs(low)) if low != 0 else None,
    )


def concentration(weights: ArrayLike, labels: Sequence[str], *, top: int = 5) -> tuple[float, list[tuple[str, float]]]:
    """How concentrated daily weights (D, N + 1), cash first, are: the effective number of assets, the mean over days
    of ``1 / sum_i (w_i / sum_j |w_j|) ** 2`` over the assets (N for equal weight, 1 for one asset; a day all in cash
    counts as none), and the ``top`` assets by mean |weight| with it."""
    assets = np.abs(np.asarray(weights, dtype=np.float64)[:, 1:])
    gross = assets.sum(axis=1)
    invested = gross > 1e-12
    shares = assets[invested] / gross[invested, None]
    effective = float(np.mean(1.0 / (shares**2).sum(axis=1))) if invested.any() else 0.0
    mean = assets.mean(axis=0)
    order = np.argsort(-mean, kind="stable")[:top]
    return effective, [(labels[1 + i], float(mean[i])) for i in order]
