"""Does the method beat equal weight? One test over every test day of a backtest, instead of a mean of per-fold
Sharpe differences with no inference.

**The series.** For every fold (test year, seed), the champion's daily log return minus equal weight's on the test
days. Seeds that trade the same day are one observation of that day, not several: the runs of one year share the
market's days, so their excesses move together and counting them as independent days would overstate the evidence.
Each day's excess is the mean over the folds that trade it, and the test years are chained in date order into one
series of D days (``pooled_excess``).

**The test.** H0: the expected daily excess is at most 0. The mean excess ``m`` is resampled by the stationary
bootstrap (Politis and Romano, 1994: blocks of random length, mean ``b`` days, so that a dependence between days is
kept), with ``b`` chosen from the series by the Politis-White rule (``training.selection.block_length``, the
estimator the selection gate uses). From B resampled means ``m*``:

* the standard error ``se``: their standard deviation; ``t = m / se``;
* the one-sided p-value, from the re-centred resamples: ``p = (1 + #{m* - m >= m}) / (B + 1)``, the fraction of
  resamples in which a series with the same dependence but mean 0 would show at least ``m``;
* the interval: the basic bootstrap interval at level ``1 - 2 alpha`` (90% at the default alpha 0.05),
  ``[2m - q(1 - alpha), 2m - q(alpha)]`` of ``m*``; each end is a one-sided ``alpha`` bound, so its lower end is above
  0 exactly when ``p <= alpha`` (up to ties and the +1), and an upper end below ``selection.min_edge`` rules an edge
  worth having out at the same level.

Means and bounds are reported annualised, ``x 252``: log returns a year (log %/y in the table).

**The guarantee.** If the daily excess is stationary (its distribution and dependence the same on every test day)
and weakly dependent (the dependence dies out within blocks of the chosen length), the chance of ``p <= alpha`` when
the method has no edge over equal weight is ``alpha`` up to the bootstrap's approximation error, which falls as the
days grow. At a finite block length the block bootstrap's variance is biased low when the days are strongly and
positively autocorrelated, and the test is then somewhat liberal (``benchmarks/backtest_power.py`` measures the size
on random-walk backtests and on simulated series: RESULTS.md). It is a test of the method on these years: a market
whose regime changes between test years breaks stationarity, and the years tested are the years the data has. It
tests the mean log excess, net of costs, not a Sharpe ratio. A champion's test year is out of sample (selection looked
at validation days only), so the test needs no allowance for the candidates a fold compared; the deflated Sharpe ratio
below makes one anyway.

**The verdict**, one sentence: *edge proven at the 5% level* when ``p <= alpha`` (alpha is ``selection.alpha``);
*no edge* when the mean is not positive or the interval's upper end is below ``selection.min_edge``; otherwise
*cannot tell yet*, with the test years that would make the one-sided test reject at this mean and spread:
``(z(1 - alpha) * sd / m)^2 / 252``, ``sd = se * sqrt(D)`` the per-day spread the bootstrap implies (dependence
included). A backtest whose every champion is equal weight (excess exactly 0 every day) is not bootstrapped: there is
nothing to test. Fewer than ``MIN_DAYS`` days are too few for a block bootstrap.

**The deflated Sharpe ratio over every trial** (``pooled_deflated_sharpe``): the backtest tried every agent of every
generation of every fold (N = agents x generations x test years x seeds, each fold's ``diagnostics.trials``). The
pooled series' per-day Sharpe ratio (an information ratio over equal weight) is held against what the best of N
unskilled trials is expected to show on as many days (``offline.overfitting.expected_max_sharpe``): the trials'
variance of per-day Sharpe ratios is each fold's, measured on its validation days, pooled over the folds (weighted
by trials) and scaled to the pooled series' length by ``validation days / D``, since a Sharpe ratio's sampling variance
falls as one over its days (exactly so for unskilled trials, the null the ratio tests). It is stricter than the test
above: it asks whether the edge would stand out had all N candidates been tried on the test days and the best kept.

**The family** (``family_test``, ``family_verdict``): every procedure a fold traded (``offline.procedures``) has its
own series and its own test above; proving "some procedure" from several tests on the same days needs an allowance
for the several. Romano and Wolf's stepdown max-t (2005) gives it: one set of resampled days (the block length the
longest of the series' Politis-White lengths) gives every series' resampled mean; each is studentised by its
bootstrap standard error ``t_j = m_j / se_j``; in the order of decreasing ``t``, a series' adjusted p-value is the
share of resamples in which the largest centred ``(m*_k - m_k) / se_k`` over the series not yet ranked above it
reaches ``t_j``, made monotone. Those with an adjusted p at most alpha are proven; the chance of proving any
series whose expected value is at most 0 is at most alpha, under the test's conditions and up to the bootstrap's
error, whichever others have an edge. A series that is 0 every day is not tested. For one series it is the test above.

Deterministic: the resamples come from a generator seeded from ``SEED`` and the plan's (year, seed) pairs, so a
backtest continued by the same command gives the same summary, byte for byte.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np
import torch

from environment.market import TRADING_DAYS
from offline.overfitting import deflated_sharpe_from, expected_max_sharpe, read_deflated_sharpe, series_moments
from offline.procedures import TRADER_NAMES
from training.selection import block_length, stationary_bootstrap

MIN_DAYS = 20
"""Fewer test days than this are too few for a block bootstrap: the verdict asks for more."""
DRAWS = 5_000
"""Bootstrap resamples: the p-value's resolution is 1 / (DRAWS + 1), its Monte Carlo error at 0.05 about 0.003."""
SEED = 20_261_129
"""With the plan's (year, seed) pairs, seeds the resamples' generator."""
_DRAWS_AT_ONCE = 500
"""Resamples drawn at once (a chunk of ``_DRAWS_AT_ONCE x D`` day indices). The generator's stream is consumed chunk
by chunk, so this is part of what fixes the resamples: changing it changes a summary's bytes, not its meaning."""


class PooledExcess(NamedTuple):
    """The champion's daily excess over equal weight over every test day, seeds averaged per day."""

    dates: list[str]
    """(D,) the test days in date order."""
    excess: np.ndarray
    """(D,) per day the mean over the folds that trade it of the champion's log return minus equal weight's."""
    test_years: int
    seeds: int
    folds: int


def pooled_excess(results: Sequence[dict[str, Any]], trader: str = "champion") -> PooledExcess:
    """Chain every fold's daily excess (``trader`` minus equal weight) in date order; folds that trade the same day
    (seeds of one test year) give that day the mean of their excesses, so a day counts once however many seeds."""
    by_day: dict[str, list[float]] = {}
    for result in results:
        champion, equal = result["daily"][trader], result["daily"]["equal_weight"]
        for day, ours, theirs in zip(result["test_dates"], champion, equal, strict=True):
            by_day.setdefault(day, []).append(ours - theirs)
    dates = sorted(by_day)  # ISO dates: text order is date order
    excess = np.array([math.fsum(by_day[d]) / len(by_day[d]) for d in dates], dtype=np.float64)  # (D,)
    return PooledExcess(
        dates,
        excess,
        test_years=len({r["year"] for r in results}),
        seeds=len({r["seed"] for r in results}),
        folds=len(results),
    )


class MeanTest(NamedTuple):
    """The stationary bootstrap's verdict on a series' mean (per day)."""

    mean: float
    standard_error: float
    """Standard deviation of the resampled means (ddof 1)."""
    interval: tuple[float, float]
    """Basic bootstrap interval at level ``1 - 2 alpha``: each end a one-sided ``alpha`` bound."""
    p_value: float
    """One-sided, H0: the expected value is at most 0; ``(1 + #{m* - m >= m}) / (B + 1)``."""
    block_length: float
    draws: int

    @property
    def t(self) -> float | None:
        return self.mean / self.standard_error if self.standard_error > 0 else None


def mean_test(
    series: Any, *, alpha: float, generator: torch.Generator, draws: int = DRAWS, mean_block: float | None = None
) -> MeanTest:
    """Stationary-bootstrap test of ``series`` (D,)'s mean against 0 (see the module docstring).

    Args:
        series: (D,) the daily values.
        alpha: the one-sided level; the interval's level is ``1 - 2 alpha``.
        generator: draws the resamples.
        draws: resamples B.
        mean_block: the mean block length in days; None: Politis-White on the series.

    Raises:
        ValueError: fewer than two days, a non-finite value, or alpha outside (0, 0.5).
    """
    x = np.asarray(series, dtype=np.float64).ravel()
    if len(x) < 2 or not np.isfinite(x).all():
        raise ValueError("the series needs at least two finite days")
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    block = block_length(x) if mean_block is None else float(mean_block)
    values = torch.from_numpy(x)
    means = torch.empty(draws, dtype=torch.float64)  # (B,)
    for first in range(0, draws, _DRAWS_AT_ONCE):
        count = min(_DRAWS_AT_ONCE, draws - first)
        days = stationary_bootstrap(len(x), draws=count, mean_block=block, generator=generator)  # (c, D)
        means[first : first + count] = values[days].mean(dim=1)
    resampled = means.numpy()
    m = float(x.mean())
    low, high = np.quantile(resampled, [alpha, 1.0 - alpha])
    exceed = int(np.count_nonzero(resampled - m >= m))
    return MeanTest(
        mean=m,
        standard_error=float(resampled.std(ddof=1)),
        interval=(2.0 * m - float(high), 2.0 * m - float(low)),
        p_value=(1 + exceed) / (draws + 1),
        block_length=block,
        draws=draws,
    )


def years_to_prove(mean: float, standard_error: float, *, days: int, alpha: float) -> float | None:
    """Test years at which the one-sided test would reject if the daily excess kept this ``mean`` and the spread
    ``standard_error * sqrt(days)``: ``(z(1 - alpha) * sd / mean)^2 / 252``; None for a mean that is not positive
    (no number of years proves it)."""
    if not mean > 0.0:
        return None
    spread = standard_error * math.sqrt(days)
    return (NormalDist().inv_cdf(1.0 - alpha) * spread / mean) ** 2 / TRADING_DAYS


def pooled_deflated_sharpe(
    series: np.ndarray, results: Sequence[dict[str, Any]], *, procedures: int = 1
) -> dict[str, Any]:
    """The deflated Sharpe ratio of the pooled series against the best of every trial of the backtest (module
    docstring), JSON-ready: ``deflated_sharpe`` (None with the reason in the reading when it cannot be had), ``trials``,
    ``sharpe`` (per day), ``expected_max_sharpe`` (the bar, per day, at the series' length) and a reading.
    ``procedures``: how many procedures the backtest judged on the same trials; each counts them again."""
    days = len(series)
    recorded = [r.get("diagnostics") or {} for r in results]
    figures: dict[str, Any] = {"deflated_sharpe": None, "trials": None, "sharpe": None, "expected_max_sharpe": None}
    unrecorded = sum(any(d.get(k) is None for k in ("trials", "trial_sharpe_variance", "days")) for d in recorded)
    if days < 2:
        return {**figures, "deflated_sharpe_reading": "deflated Sharpe n/a (fewer than two test days)"}
    if unrecorded:
        reason = f"{unrecorded} of {len(results)} folds record no trials: finished by an earlier version, or no history"
        return {**figures, "deflated_sharpe_reading": f"deflated Sharpe n/a ({reason})"}
    trials = sum(d["trials"] for d in recorded) * procedures
    figures["trials"] = trials
    # Each fold's variance of per-day validation Sharpe ratios, at the pooled series' length (variance ~ 1 / days).
    variance = (
        math.fsum(d["trials"] * d["trial_sharpe_variance"] * d["days"] / days for d in recorded) * procedures / trials
    )
    try:
        moments = series_moments(series)
        value = deflated_sharpe_from(moments, trials=trials, variance=variance)
    except ValueError as reason:
        why = "the excess is 0 on every test day" if not series.any() else str(reason)
        return {**figures, "deflated_sharpe_reading": f"deflated Sharpe n/a ({why}; {trials} trials)"}
    return {
        **figures,
        "deflated_sharpe": value,
        "sharpe": moments.sharpe,
        "expected_max_sharpe": expected_max_sharpe(trials, variance),
        "deflated_sharpe_reading": read_deflated_sharpe(
            value, trials=trials, edge="the edge over every test day", as_many_days=True
        ),
    }


def plan_seed(results: Sequence[dict[str, Any]]) -> int:
    """The resamples' seed: ``SEED`` and the plan's (year, seed) pairs, in any order."""
    pairs = sorted((int(r["year"]), int(r["seed"])) for r in results)
    return SEED ^ zlib.crc32(json.dumps(pairs).encode())


def pooled_test(
    results: Sequence[dict[str, Any]],
    *,
    alpha: float = 0.05,
    min_edge: float = 0.005,
    draws: int = DRAWS,
    trader: str = "champion",
    procedures: int = 1,
) -> dict[str, Any]:
    """The test of the module docstring on a backtest's fold results, JSON-ready: every figure (means and bounds
    annualised, log return a year), the outcome (``proven``, ``no_edge``, ``cannot_tell``, ``equal_weight``,
    ``too_few_days``) and the verdict sentence.

    Args:
        results: fold results as ``offline.backtest.results`` checks them (``daily`` holding ``champion`` and
            ``equal_weight``, ``test_dates``; ``diagnostics`` where recorded).
        alpha: the one-sided level (``selection.alpha``).
        min_edge: the edge worth having, log return a year (``selection.min_edge``).
        draws: bootstrap resamples.
        trader: the procedure tested (``offline.procedures.TRADERS``); its name starts the verdict.
        procedures: how many procedures the backtest judged, which the deflated Sharpe ratio counts.
    """
    pooled = pooled_excess(results, trader)
    who = TRADER_NAMES.get(trader, trader)
    days = len(pooled.excess)
    figures: dict[str, Any] = {
        "days": days,
        "years": days / TRADING_DAYS,
        "first_day": pooled.dates[0] if days else None,
        "last_day": pooled.dates[-1] if days else None,
        "test_years": pooled.test_years,
        "seeds": pooled.seeds,
        "folds": pooled.folds,
        "mean_excess": float(pooled.excess.mean()) * TRADING_DAYS if days else None,
        "interval": None,
        "interval_level": 1.0 - 2.0 * alpha,
        "t": None,
        "p_value": None,
        "alpha": alpha,
        "min_edge": min_edge,
        "block_length": None,
        "draws": None,
        "years_to_prove": None,
    }
    dsr = pooled_deflated_sharpe(pooled.excess, results, procedures=procedures)
    if days and not pooled.excess.any():
        verdict = (
            "no edge: every fold's champion is equal weight (no agent proved an edge on its validation days), so the "
            "excess is exactly 0 on every test day and there is nothing to test"
            if trader == "champion"
            else f"no edge: the {who} traded exactly as equal weight on every test day; there is nothing to test"
        )
        return {**figures, **dsr, "outcome": "equal_weight", "verdict": verdict}
    if days < MIN_DAYS:
        verdict = f"cannot tell yet: the test needs more days ({days} test days; at least {MIN_DAYS})"
        return {**figures, **dsr, "outcome": "too_few_days", "verdict": verdict}

    generator = torch.Generator().manual_seed(plan_seed(results))
    test = mean_test(pooled.excess, alpha=alpha, generator=generator, draws=draws)
    figures.update(
        interval=[bound * TRADING_DAYS for bound in test.interval],
        t=test.t,
        p_value=test.p_value,
        block_length=test.block_length,
        draws=test.draws,
    )
    outcome, verdict, figures["years_to_prove"] = _judge(test, days=days, alpha=alpha, min_edge=min_edge, who=who)
    rho = lag_one_autocorrelation(pooled.excess)
    figures["autocorrelation"] = rho
    figures["size_at_autocorrelation"] = measured_size(rho) if alpha == MEASURED_AT else None
    if outcome == "proven":
        verdict += size_caveat(rho, test.p_value, alpha)
    return {**figures, **dsr, "outcome": outcome, "verdict": verdict}


def _judge(test: MeanTest, *, days: int, alpha: float, min_edge: float, who: str) -> tuple[str, str, float | None]:
    """The outcome of ``test`` on ``days`` pooled test days (``proven``, ``no_edge`` or ``cannot_tell``), its verdict
    sentence about ``who``, and the test years that would prove its mean (``cannot_tell`` only, else None)."""
    low, high = (bound * TRADING_DAYS for bound in test.interval)
    mean, level, years = test.mean * TRADING_DAYS, f"{alpha * 100:g}%", None
    span = f"over {days} test days ({days / TRADING_DAYS:.1f} years)"
    interval = f"{1.0 - 2.0 * alpha:.0%} interval {_pct(low)} to {_pct(high)}"
    if test.p_value <= alpha:
        outcome = "proven"
        verdict = (
            f"edge proven at the {level} level: the {who} beat equal weight by {_pct(mean)} log %/y {span}, "
            f"one-sided p {test.p_value:.4f} ({interval})"
        )
        if high < min_edge:
            verdict += (
                f", though below selection.min_edge ({_pct(min_edge)} log %/y): real, but smaller than worth having"
            )
    elif mean <= 0.0:
        outcome = "no_edge"
        verdict = f"no edge: the {who}'s mean excess over equal weight is {_pct(mean)} log %/y {span}, not above 0"
    elif high < min_edge:
        outcome = "no_edge"
        verdict = (
            f"no edge: the {interval} log %/y ends below selection.min_edge ({_pct(min_edge)}): an edge worth having "
            f"is ruled out {span}"
        )
    else:
        outcome = "cannot_tell"
        years = years_to_prove(test.mean, test.standard_error, days=days, alpha=alpha)
        verdict = (
            f"cannot tell yet: {_pct(mean)} log %/y {span} is not significant at the {level} level "
            f"(one-sided p {test.p_value:.4f}); at this mean and spread about {_years(years)} test years would make "
            "the one-sided test reject"
        )
        if years is not None and years <= days / TRADING_DAYS:
            # the normal quantile rejects already; the bootstrap's distribution of the mean has a heavier tail here
            verdict += " by the normal approximation (the bootstrap, which allows for the series' tails, does not yet)"
    return outcome, verdict, years


def size_caveat(autocorrelation: float, p_value: float, alpha: float) -> str:
    """What a proof at ``p_value`` is worth where the test's measured size at this autocorrelation exceeds its level:
    a caveat when the p-value is above the level that would hold the measured size at ``alpha`` (to first order,
    ``alpha * alpha / size``), or when the size was not measured this far; else nothing."""
    if alpha != MEASURED_AT:
        return ""
    size = measured_size(autocorrelation)
    if size is None:
        return (
            f" (the daily excess's lag-one autocorrelation is {autocorrelation:.2f}, beyond the "
            f"{MEASURED_SIZE[-1][0]} up to which the test's size was measured: it may reject more often than its level)"
        )
    if size > alpha and p_value > alpha * alpha / size:
        return (
            f" (the daily excess's lag-one autocorrelation is {autocorrelation:.2f}: on AR(1) series with no edge and "
            f"that autocorrelation the test rejected at {alpha * 100:g}% in {size:.1%} of series, not {alpha:.0%}; "
            f"p {p_value:.4f} is above the {alpha * alpha / size:.4f} that would hold {alpha:.0%})"
        )
    return ""


MEASURED_AT = 0.05
"""The level at which the test's size was measured."""
MEASURED_SIZE = ((0.05, 0.047), (0.5, 0.065))
"""(largest lag-one autocorrelation, the test's measured rejection rate at 5% up to it): on 2000 simulated null series
of 12 x 252 days each (mean 0, 1000 resamples; ``benchmarks/backtest_power.py --parts null``, RESULTS.md),
independent days gave 0.047; AR(1) days at 0.1, 0.2, 0.3 and 0.5 gave 0.062, 0.049, 0.065 and 0.059, whose largest
stands for them all (the four are within each other's Monte Carlo error)."""


def lag_one_autocorrelation(series: np.ndarray) -> float:
    """The series' sample autocorrelation at lag one; 0 for a series with no spread."""
    x = np.asarray(series, dtype=np.float64) - float(np.mean(series))
    denominator = float(x @ x)
    return float(x[1:] @ x[:-1]) / denominator if denominator > 0.0 and len(x) > 1 else 0.0


def measured_size(autocorrelation: float) -> float | None:
    """The size measured on series as autocorrelated as this (``MEASURED_SIZE``; a negative autocorrelation reads as
    independent days, where the test holds its level); None beyond the largest measured."""
    for largest, size in MEASURED_SIZE:
        if autocorrelation <= largest:
            return size
    return None


class FamilyTest(NamedTuple):
    """The stepdown max-t test over several series' means, on one set of resampled days."""

    names: list[str]
    mean: list[float]
    """Per day, each series' mean."""
    t: list[float | None]
    """``mean / se``, ``se`` the standard deviation of the series' resampled means; None where the series is 0."""
    adjusted_p: list[float | None]
    """Family-wise adjusted one-sided p-values; None for a series that is 0 on every day (nothing to test)."""
    block_length: float | None
    draws: int


def family_test(
    series: dict[str, np.ndarray], *, generator: torch.Generator, draws: int = DRAWS, mean_block: float | None = None
) -> FamilyTest:
    """Romano and Wolf's stepdown max-t test of H0_j "series j's expected value is at most 0" for every series at
    once (module docstring, "The family"). The series share their days (D,); ``mean_block``: None, the longest
    Politis-White length of the series tested."""
    names = list(series)
    x = np.stack([np.asarray(series[name], dtype=np.float64).ravel() for name in names])  # (T, D)
    if x.shape[1] < 2 or not np.isfinite(x).all():
        raise ValueError("the series need at least two finite days each")
    tested = [j for j in range(len(names)) if x[j].any()]
    nothing = FamilyTest(names, x.mean(axis=1).tolist(), [None] * len(names), [None] * len(names), None, draws)
    if not tested:
        return nothing
    block = max(block_length(x[j]) for j in tested) if mean_block is None else float(mean_block)
    values = torch.from_numpy(x[tested])  # (T', D)
    means = torch.empty(len(tested), draws, dtype=torch.float64)  # (T', B)
    for first in range(0, draws, _DRAWS_AT_ONCE):
        count = min(_DRAWS_AT_ONCE, draws - first)
        days = stationary_bootstrap(x.shape[1], draws=count, mean_block=block, generator=generator)  # (c, D)
        means[:, first : first + count] = values[:, days].mean(dim=2)
    resampled = means.numpy()
    m = x[tested].mean(axis=1)  # (T',)
    se = resampled.std(axis=1, ddof=1)
    se = np.where(se > 0.0, se, np.inf)  # a series constant under resampling has no evidence to give
    t = m / se
    centred = (resampled - m[:, None]) / se[:, None]  # (T', B): each series' null distribution, studentised
    order = sorted(range(len(tested)), key=lambda k: (-t[k], k))
    adjusted: list[float | None] = [None] * len(names)
    running = 0.0
    for step, k in enumerate(order):
        largest = centred[order[step:]].max(axis=0)  # the max over the hypotheses not yet rejected
        running = max(running, (1 + int(np.count_nonzero(largest >= t[k]))) / (draws + 1))
        adjusted[tested[k]] = running
    ts: list[float | None] = [None] * len(names)
    for k, j in enumerate(tested):
        ts[j] = float(t[k]) if math.isfinite(se[k]) else None
    return FamilyTest(names, x.mean(axis=1).tolist(), ts, adjusted, block, draws)


def family_verdict(
    results: Sequence[dict[str, Any]], traders: Sequence[str], *, alpha: float = 0.05, draws: int = DRAWS
) -> dict[str, Any]:
    """The family of ``traders`` on a backtest's fold results, JSON-ready: each trader's adjusted p-value, the proven
    ones (adjusted p at most ``alpha``), and which to deploy: the proven trader with the smallest adjusted p (then
    the largest t, then the order of ``traders``), or none."""
    pooled = {trader: pooled_excess(results, trader) for trader in traders}
    days = len(next(iter(pooled.values())).excess) if pooled else 0
    figures: dict[str, Any] = {
        "method": "stepdown max-t (Romano-Wolf) over the traders' pooled excess, one stationary bootstrap",
        "traders": list(traders),
        "alpha": alpha,
        "days": days,
        "adjusted_p": dict.fromkeys(traders),
        "t": dict.fromkeys(traders),
        "block_length": None,
        "draws": None,
        "proven": [],
        "deploy": None,
    }
    if days < MIN_DAYS:
        reason = f"too few test days to test ({days}; at least {MIN_DAYS})"
        return {**figures, "verdict": f"deploy none: {reason}"}
    generator = torch.Generator().manual_seed(plan_seed(results) ^ zlib.crc32(b"family"))
    test = family_test({t: p.excess for t, p in pooled.items()}, generator=generator, draws=draws)
    figures.update(
        adjusted_p=dict(zip(traders, test.adjusted_p, strict=True)),
        t=dict(zip(traders, test.t, strict=True)),
        block_length=test.block_length,
        draws=test.draws if test.block_length is not None else None,
    )
    proven = [t for t, p in figures["adjusted_p"].items() if p is not None and p <= alpha]
    figures["proven"] = proven
    if not proven:
        tested = [t for t, p in figures["adjusted_p"].items() if p is not None]
        if not tested:
            why = "every trader traded as equal weight on every test day: there is nothing to test"
        else:
            best = min(tested, key=lambda t: figures["adjusted_p"][t])
            why = (
                f"no trader beat equal weight at the {alpha * 100:g}% family-wise level (the closest, the "
                f"{TRADER_NAMES.get(best, best)}, has adjusted p {figures['adjusted_p'][best]:.4f})"
            )
        return {**figures, "verdict": f"deploy none, keep equal weight: {why}"}
    rank = {t: i for i, t in enumerate(traders)}
    deploy = min(proven, key=lambda t: (figures["adjusted_p"][t], -(figures["t"][t] or 0.0), rank[t]))
    figures["deploy"] = deploy
    named = ", ".join(f"{TRADER_NAMES.get(t, t)} (adjusted p {figures['adjusted_p'][t]:.4f})" for t in proven)
    verdict = (
        f"deploy the {TRADER_NAMES.get(deploy, deploy)} (selection.deploy={deploy}): proven at the {alpha * 100:g}% "
        f"family-wise level over {len(traders)} traders: {named}; it has the strongest adjusted evidence"
    )
    verdict += size_caveat(lag_one_autocorrelation(pooled[deploy].excess), figures["adjusted_p"][deploy], alpha)
    return {**figures, "verdict": verdict}


def _pct(value: float) -> str:
    """A log return a year as signed percent: ``+3.10``."""
    return f"{value * 100:+.2f}"


def _years(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}" if value < 100 else f"{value:,.0f}"
