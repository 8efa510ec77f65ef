"""Risk figures of one daily series of portfolio log returns (numpy only, float64).

The trainer's rewards are daily log returns ``r_t = log(V_t / V_{t-1})``, net of costs. Figures about growth use them
directly (log returns add over days); figures about day-to-day risk use the simple returns ``exp(r_t) - 1``, the
convention of the usual Sharpe and Sortino ratios, measured over what cash earned on the same days (``risk_free``;
0 when cash earns nothing).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

TRADING_DAYS = 252
"""Trading days in a year: the default ``periods_per_year``."""
A_YEAR_AT_LEAST = 250
"""The fewest trading days a sample holds to count as a year (a calendar year of an exchange holds 250 to 253).
A shorter sample's annualised figures are labelled with the days they come from, and ratios that need a year's
drawdown (Calmar) are not given."""


@dataclass(frozen=True)
class RiskMetrics:
    """Risk figures of D daily log returns ``r``; ``simple = exp(r) - 1``; ``N = periods_per_year``.

    NaN marks a ratio whose denominator is zero (or a spread of a single day); ``to_dict`` writes it as None.
    """

    days: int
    """D, the number of daily returns."""
    total_return: float
    """``exp(sum r) - 1``: the growth of 1 over the whole series, minus 1."""
    annualised_return: float
    """``exp(mean(r) * N) - 1``: the geometric yearly growth (CAGR), since log returns add over days."""
    annualised_volatility: float
    """``std(simple, ddof=1) * sqrt(N)``; NaN for a single day."""
    sharpe: float
    """``mean(excess) / std(excess, ddof=1) * sqrt(N)`` with ``excess = simple - cash's simple return`` (``simple`` at
    a zero rate); NaN if all days are equal (zero spread) or D < 2."""
    sortino: float
    """``mean(excess) / sqrt(mean(min(excess, 0) ** 2)) * sqrt(N)``, the mean over all days; NaN if no day lost."""
    max_drawdown: float
    """The largest fall of the equity curve from its running peak, ``max(1 - equity / running_max)``, in [0, 1)."""
    max_drawdown_days: int
    """The longest run of consecutive days that end below an earlier peak (underwater); 0 if never."""
    calmar: float
    """``annualised_return / max_drawdown``; NaN if the curve never fell, or the sample is under a year (a year's worst
    fall is what it is measured against)."""
    turnover: float
    """``mean(turnover) * N``: the yearly turnover; 0.0 when none was given."""
    costs: float
    """``sum_t costs_t * equity_{t-1}``: costs paid per unit of starting capital; 0.0 when none were given."""
    under_a_year: bool = False
    """Fewer than ``A_YEAR_AT_LEAST`` days (scaled to ``periods_per_year``): the annualised figures are a short
    sample's, scaled up, and say so where they are shown; ``calmar`` is NaN."""

    def to_dict(self) -> dict[str, float | int | None]:
        """The figures by field name, NaN as None (JSON has no NaN)."""
        return {
            name: None if isinstance(value, float) and math.isnan(value) else value
            for name, value in dataclasses.asdict(self).items()
        }


@dataclass(frozen=True)
class Metric:
    """One figure of ``RiskMetrics`` as every report shows it: the evaluate table, ``evaluation.json`` and ``.csv``, the
    backtest's fold results and the tear sheet read ``METRICS`` and nothing else, so a new figure is a field of
    ``RiskMetrics``, its computation in ``risk_metrics`` and one entry here."""

    name: str
    """The ``RiskMetrics`` field (the JSON and CSV key)."""
    label: str
    """The tear sheet's column head."""
    short: str
    """The evaluate table's column head (11 characters at most)."""
    style: str
    """How a value reads: ``percent`` (+1.2%), ``ratio`` (+0.45), ``drawdown`` (a fall, shown negative), ``days``,
    ``times`` (4.2x) or ``costs`` (0.12%, of starting capital)."""
    annualised: bool = False
    """Scaled to a year: a sample under a year says so where the figure is shown."""
    needs_a_year: bool = False
    """Not given for a sample under a year (Calmar)."""
    traded: bool = False
    """Known only for a strategy whose trades were recorded (turnover, costs): n/a for the index."""

    def format(self, value: float | int | None) -> str:
        """``value`` as reports print it; n/a for None, NaN or an infinite ratio."""
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return "n/a"
        if self.style == "percent":
            return f"{100 * value:+.1f}%"
        if self.style == "ratio":
            return f"{value:+.2f}"
        if self.style == "drawdown":
            return f"{-100 * value:+.1f}%" if value > 0 else "0.0%"
        if self.style == "days":
            return str(int(value))
        if self.style == "times":
            return f"{value:.1f}x"
        return f"{100 * value:.2f}%"  # costs


METRICS = (
    Metric("total_return", "total return", "total", "percent"),
    Metric("annualised_return", "annual return", "annual", "percent", annualised=True),
    Metric("annualised_volatility", "volatility", "vol", "percent", annualised=True),
    Metric("sharpe", "Sharpe", "Sharpe", "ratio", annualised=True),
    Metric("sortino", "Sortino", "Sortino", "ratio", annualised=True),
    Metric("max_drawdown", "max drawdown", "max DD", "drawdown"),
    Metric("max_drawdown_days", "longest underwater (days)", "underwater", "days"),
    Metric("calmar", "Calmar", "Calmar", "ratio", needs_a_year=True),
    Metric("turnover", "turnover per year", "turnover/y", "times", annualised=True, traded=True),
    Metric("costs", "costs", "costs", "costs", traded=True),
)
"""Every figure a report shows of a series, in the order reports show them (``RiskMetrics`` holds them, with
``days`` and ``under_a_year``)."""
METRIC = {metric.name: metric for metric in METRICS}


def _series(values: ArrayLike, name: str, *, min_length: int) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per day), got shape {array.shape}")
    if array.shape[0] < min_length:
        raise ValueError(f"{name} needs at least {min_length} value(s), got {array.shape[0]}")
    if not np.isfinite(array).all():
        raise ValueError(f"{name} must be finite (no NaN or inf)")
    return array


def equity_curve(log_returns: ArrayLike) -> np.ndarray:
    """(D,) daily log returns -> (D + 1,) value of 1 invested: ``[1, exp(r1), exp(r1 + r2), ...]``.

    Raises:
        ValueError: ``log_returns`` is not 1-D or not finite.
    """
    r = _series(log_returns, "log_returns", min_length=0)
    return np.exp(np.concatenate(([0.0], np.cumsum(r))))


def drawdown_curve(equity: ArrayLike) -> np.ndarray:
    """(T,) equity curve -> (T,) drawdown ``1 - equity / running_max(equity)``: 0 at a peak, else the fall from it.

    Raises:
        ValueError: ``equity`` is empty, not 1-D, not finite or not positive.
    """
    values = _series(equity, "equity", min_length=1)
    if (values <= 0).any():
        raise ValueError("equity must be positive")
    # At a peak equity / running_max is x / x, exactly 1, so the drawdown there is exactly 0.
    return 1.0 - values / np.maximum.accumulate(values)


def _spread(values: np.ndarray) -> float:
    """The sample standard deviation; NaN for one value, and 0 exactly when all are equal (tested as such, not as
    std == 0: the float std of equal values can be 1e-18)."""
    if values.shape[0] < 2:
        return math.nan
    return 0.0 if float(np.ptp(values)) == 0.0 else float(values.std(ddof=1))


def _longest_underwater(drawdown: np.ndarray) -> int:
    longest = current = 0
    for underwater in drawdown > 0:
        current = current + 1 if underwater else 0
        longest = max(longest, current)
    return longest


def risk_metrics(
    log_returns: ArrayLike,
    *,
    turnover: ArrayLike | None = None,
    costs: ArrayLike | None = None,
    risk_free: ArrayLike | None = None,
    periods_per_year: int = TRADING_DAYS,
) -> RiskMetrics:
    """The risk figures of one series of daily log returns (see ``RiskMetrics`` for each definition).

    Args:
        log_returns: (D,) daily log returns of the portfolio, net of costs.
        turnover: (D,) daily turnover (``sum_i |target_i - weights_i|``), or None.
        costs: (D,) daily costs as a fraction of the portfolio's value before that day's trade, or None.
        risk_free: (D,) daily log returns of cash, which Sharpe and Sortino are measured over; None for a zero rate.
        periods_per_year: Days in a year, for the annualised figures.

    Raises:
        ValueError: A series is empty, not 1-D or not finite; the lengths differ; turnover or costs are negative;
            ``periods_per_year`` is not positive.
    """
    r = _series(log_returns, "log_returns", min_length=1)
    days = r.shape[0]
    if periods_per_year <= 0:
        raise ValueError(f"periods_per_year must be positive, got {periods_per_year}")
    extra: dict[str, np.ndarray] = {}
    for name, values in (("turnover", turnover), ("costs", costs), ("risk_free", risk_free)):
        if values is None:
            continue
        array = _series(values, name, min_length=1)
        if array.shape[0] != days:
            raise ValueError(f"{name} needs one value per day: {array.shape[0]} values for {days} log returns")
        if name != "risk_free" and (array < 0).any():
            raise ValueError(f"{name} must not be negative")
        extra[name] = array
    year = float(periods_per_year)
    short = days < A_YEAR_AT_LEAST * periods_per_year / TRADING_DAYS

    simple = np.expm1(r)  # (D,)
    excess = simple - np.expm1(extra["risk_free"]) if "risk_free" in extra else simple  # over what cash earned
    volatility = _spread(simple)
    mean, std = float(excess.mean()), _spread(excess)
    downside = math.sqrt(float(np.mean(np.minimum(excess, 0.0) ** 2)))

    log_equity = np.concatenate(([0.0], np.cumsum(r)))  # (D + 1,)
    # drawdown_curve's figure, in log space so that an equity that underflows to 0 still has a drawdown.
    drawdown = 0.0 - np.expm1(log_equity - np.maximum.accumulate(log_equity))  # (D + 1,)
    max_drawdown = float(drawdown.max())
    with np.errstate(over="ignore"):  # an absurd daily mean annualises to inf rather than raising
        annualised_return = float(np.expm1(r.mean() * year))
        total_return = float(np.expm1(log_equity[-1]))
        equity = np.exp(log_equity)

    return RiskMetrics(
        days=days,
        total_return=total_return,
        annualised_return=annualised_return,
        annualised_volatility=volatility * math.sqrt(year),
        sharpe=mean / std * math.sqrt(year) if std > 0.0 else math.nan,
        sortino=math.nan if downside == 0.0 else mean / downside * math.sqrt(year),
        max_drawdown=max_drawdown,
        max_drawdown_days=_longest_underwater(drawdown),
        calmar=math.nan if max_drawdown == 0.0 or short else annualised_return / max_drawdown,
        turnover=float(extra["turnover"].mean()) * year if "turnover" in extra else 0.0,
        costs=float(np.dot(extra["costs"], equity[:-1])) if "costs" in extra else 0.0,
        under_a_year=short,
    )
