"""Was the champion chosen for skill or for luck? Two diagnostics a quant asks of any strategy picked by a backtest.

A run tries many candidates (every agent of every generation) on the same validation days and keeps one. The best of
many unskilled candidates always looks good on the days it was chosen on, so its validation figures overstate it:

* the **deflated Sharpe ratio** (Bailey & Lopez de Prado, 2014) is the probability that the chosen strategy's true
  Sharpe ratio exceeds the Sharpe ratio the best of N unskilled trials is expected to show, given the trials'
  spread, the number of days and the series' skewness and kurtosis;
* the **probability of backtest overfitting** (Bailey, Borwein, Lopez de Prado & Zhu, 2017) splits the validation
  days into S blocks and, for every way to call half of them in-sample (combinatorially symmetric cross-validation,
  CSCV), asks where the in-sample best candidate ranks on the other half: PBO is the share of splits in which it
  ranks at or below the median.

Both are measured on the daily excess log return over equal weight (an information ratio, not a Sharpe ratio over
cash): that is what the run selects on (``training.selection``). Sharpe ratios here are per day, not annualised.
Everything is float64 numpy or plain floats. The block means come from ``run.records``, which writes them into
every metrics row.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any, NamedTuple

import numpy as np

EULER_GAMMA = 0.5772156649015329
CSCV_MEMORY_BYTES = 128 * 2**20
"""What one chunk of CSCV splits may hold: N = 13,000 candidates stay well under 200 MB."""
_NORMAL = NormalDist()


# ---------------------------------------------------------------------------------------------- deflated Sharpe


class SeriesMoments(NamedTuple):
    """What the deflated Sharpe ratio needs of one daily series."""

    sharpe: float
    """Mean over standard deviation (ddof 1), per day."""
    skewness: float
    kurtosis: float
    """Non-excess: 3 for a normal series."""
    days: int


def series_moments(daily: Any) -> SeriesMoments:
    """Per-day Sharpe ratio (std with ddof 1, as the trainer's ``validation_sharpe``), skewness and kurtosis
    (population moments, as in Bailey & Lopez de Prado) of a (D,) series.

    Raises:
        ValueError: Fewer than two days, a non-finite value, or a constant series (its Sharpe ratio is undefined).
    """
    series = np.asarray(daily, dtype=np.float64).ravel()
    if len(series) < 2 or not np.isfinite(series).all():
        raise ValueError("the series needs at least two finite days")
    if (series == series[0]).all():  # exactly: the mean's rounding would otherwise leave a spread of 1e-19
        raise ValueError("the series is constant: its Sharpe ratio is undefined")
    deviations = series - series.mean()
    second = float(np.mean(deviations**2))
    return SeriesMoments(
        sharpe=float(series.mean() / series.std(ddof=1)),
        skewness=float(np.mean(deviations**3) / second**1.5),
        kurtosis=float(np.mean(deviations**4) / second**2),
        days=len(series),
    )


def expected_max_sharpe(trials: int, variance: float) -> float:
    """The Sharpe ratio the best of ``trials`` unskilled trials is expected to show (per day): the bar a selected
    strategy must clear. ``variance`` is the variance of the trials' per-day Sharpe ratios; one trial sets no bar.

    Raises:
        ValueError: ``trials`` < 1, or ``variance`` negative or not finite.
    """
    if trials < 1:
        raise ValueError(f"the number of trials must be >= 1, got {trials}")
    if not math.isfinite(variance) or variance < 0.0:
        raise ValueError(f"the variance of the trials' Sharpe ratios must be finite and >= 0, got {variance}")
    if trials == 1:
        return 0.0
    expected_max_of_normals = (1.0 - EULER_GAMMA) * _NORMAL.inv_cdf(1.0 - 1.0 / trials) + EULER_GAMMA * _NORMAL.inv_cdf(
        1.0 - 1.0 / (trials * math.e)
    )
    return math.sqrt(variance) * expected_max_of_normals


def probabilistic_sharpe(
    sharpe: float, benchmark: float, *, days: int, skewness: float = 0.0, kurtosis: float = 3.0
) -> float:
    """The probability that the true per-day Sharpe ratio exceeds ``benchmark``, given ``sharpe`` measured over
    ``days`` days of a series with this skewness and (non-excess) kurtosis: fat tails and negative skew widen the
    estimate's error and lower the probability.

    Raises:
        ValueError: ``days`` < 2, a non-finite input, or moments that leave the estimate's variance non-positive.
    """
    if days < 2:
        raise ValueError(f"a Sharpe ratio needs at least two days, got {days}")
    if not all(math.isfinite(x) for x in (sharpe, benchmark, skewness, kurtosis)):
        raise ValueError("the Sharpe ratio, its benchmark and the moments must be finite")
    spread = 1.0 - skewness * sharpe + (kurtosis - 1.0) / 4.0 * sharpe**2
    if spread <= 0.0:
        raise ValueError(
            f"skewness {skewness:.3g} and kurtosis {kurtosis:.3g} with Sharpe {sharpe:.3g} leave the estimate "
            "no variance: the moments are inconsistent"
        )
    return _NORMAL.cdf((sharpe - benchmark) * math.sqrt(days - 1) / math.sqrt(spread))


def deflated_sharpe(
    sharpe: float,
    *,
    days: int,
    trials: int,
    variance: float,
    skewness: float = 0.0,
    kurtosis: float = 3.0,
) -> float:
    """The probabilistic Sharpe ratio against the expected best of ``trials`` unskilled trials (whose per-day
    Sharpe ratios have this ``variance``): the probability that the selected strategy's edge is not the luck of the
    draw. With one trial it is the probabilistic Sharpe ratio against 0.

    Raises:
        ValueError: As ``expected_max_sharpe`` and ``probabilistic_sharpe``.
    """
    bar = expected_max_sharpe(trials, variance)
    return probabilistic_sharpe(sharpe, bar, days=days, skewness=skewness, kurtosis=kurtosis)


# ---------------------------------------------------------------------------------------------- CSCV


class Cscv(NamedTuple):
    """The probability of backtest overfitting and what it is the fraction of."""

    pbo: float
    """Share of splits whose in-sample best ranks at or below the out-of-sample median (logit <= 0)."""
    logits: np.ndarray
    """(C,) logit of the in-sample best's relative out-of-sample rank, one per split, in split order."""

    @property
    def median_logit(self) -> float:
        return float(np.median(self.logits))


def half_splits(blocks: int) -> np.ndarray:
    """(C(blocks, blocks / 2), blocks) float64 0/1 rows: every choice of half the blocks as in-sample, in
    ``itertools.combinations`` order (each split's complement is a split too: the test is symmetric)."""
    chosen = list(itertools.combinations(range(blocks), blocks // 2))
    splits = np.zeros((len(chosen), blocks))
    splits[np.repeat(np.arange(len(chosen)), blocks // 2), np.asarray(chosen).ravel()] = 1.0
    return splits


def cscv(blocks_per_candidate: Any, *, chunk: int | None = None) -> Cscv:
    """Probability of backtest overfitting by combinatorially symmetric cross-validation.

    For every split of the S blocks into two halves, the candidate with the best in-sample mean (the first one on a
    tie) is ranked by its out-of-sample mean among all N (1 = worst; tied candidates share their mid-rank), and
    ``w = rank / (N + 1)`` gives the logit ``log(w / (1 - w))``. Both halves hold S / 2 blocks, so sums rank as
    means do. The splits go through in chunks of ``chunk`` (default: what ``CSCV_MEMORY_BYTES`` holds); the result
    does not depend on it.

    Args:
        blocks_per_candidate: (N, S) block means (``run.records.block_means``), N >= 2 candidates, S even.
        chunk: Splits per chunk.

    Raises:
        ValueError: Fewer than two candidates, an odd or zero number of blocks, or a non-finite block mean.
    """
    blocks = np.asarray(blocks_per_candidate, dtype=np.float64)
    if blocks.ndim != 2:
        raise ValueError(f"CSCV needs a (candidates, blocks) matrix, got shape {blocks.shape}")
    candidates, count = blocks.shape
    if candidates < 2:
        raise ValueError("CSCV needs at least two candidates to rank")
    if count < 2 or count % 2:
        raise ValueError(f"CSCV needs an even number of blocks, got {count}")
    if not np.isfinite(blocks).all():
        raise ValueError("the block means hold NaN or infinite values")
    splits = half_splits(count)  # (C, S)
    if chunk is None:  # two float64 score matrices and their comparisons, with room to spare
        chunk = max(1, CSCV_MEMORY_BYTES // (4 * 8 * candidates))
    logits = np.empty(len(splits))
    for start in range(0, len(splits), chunk):
        in_sample = splits[start : start + chunk]  # (c, S)
        in_sample_scores = in_sample @ blocks.T  # (c, N)
        out_of_sample_scores = (1.0 - in_sample) @ blocks.T  # (c, N)
        best = in_sample_scores.argmax(axis=1)  # (c,)
        best_score = out_of_sample_scores[np.arange(len(best)), best][:, None]  # (c, 1)
        below = (out_of_sample_scores < best_score).sum(axis=1)
        level = (out_of_sample_scores == best_score).sum(axis=1)  # the best itself included
        relative = (below + (level + 1) / 2) / (candidates + 1)  # (c,) in (0, 1)
        logits[start : start + len(best)] = np.log(relative / (1.0 - relative))
    return Cscv(float(np.mean(logits <= 0.0)), logits)


# ---------------------------------------------------------------------------------------------- readings


def read_deflated_sharpe(value: float, *, trials: int, edge: str, as_many_days: bool = False) -> str:
    """One line for a person: the figure and what it says about ``edge`` (what was measured: "the champion's
    validation edge over equal weight"), against the best of ``trials`` unskilled trials (``as_many_days``: on as
    many days as the edge was measured on, when they are not the validation days)."""
    bar = f"what the best of {trials} unskilled trials is expected to show" + (
        " on as many days" if as_many_days else ""
    )
    if value >= 0.95:
        meaning = f"stands out against {bar}: unlikely to be the best of {trials} lucky tries"
    elif value >= 0.5:
        meaning = f"is above {bar}, but not by enough to rule out luck"
    else:
        meaning = f"is below {bar}: no evidence of skill"
    return f"deflated Sharpe {value:.2f}: {edge} {meaning}"


def read_pbo(value: float) -> str:
    """One line for a person: the figure and how much of choosing by validation return it calls luck."""
    if value > 0.5:
        verdict = "choosing by validation return here is mostly luck"
    elif value > 0.2:
        verdict = "choosing by validation return here is partly luck"
    else:
        verdict = "the best on one half mostly stays ahead on the other"
    return (
        f"PBO {value:.2f}: in {value:.0%} of the splits of the validation days, the candidate best on one half "
        f"ranks at or below the median on the other: {verdict}"
    )


# ---------------------------------------------------------------------------------------------- from a run's history


def unavailable(reason: str) -> dict[str, Any]:
    """The diagnostics of a target that cannot have them (an export has no run history)."""
    return {**_no_deflated_sharpe(reason), **_no_pbo(reason)}


def _no_deflated_sharpe(reason: str) -> dict[str, Any]:
    return {
        "deflated_sharpe": None,
        "deflated_sharpe_of": None,
        "trials": None,
        "deflated_sharpe_reading": f"deflated Sharpe n/a ({reason})",
    }


def _no_pbo(reason: str) -> dict[str, Any]:
    return {"pbo": None, "pbo_reading": f"PBO n/a ({reason})"}


def _stacked(rows: Sequence[Mapping[str, Any]], key: str, ndim: int) -> np.ndarray:
    """Every row's ``key`` stacked along the candidates; ValueError with a reason a person can read."""
    missing = sum(key not in row for row in rows)
    if missing:
        raise ValueError(f"{missing} of {len(rows)} generations were recorded without {key}, by an earlier version")
    try:
        parts = [np.asarray(row[key], dtype=np.float64) for row in rows]
        if any(part.ndim != ndim for part in parts):
            raise ValueError
        stacked = np.concatenate(parts)  # (N,) or (N, S)
    except (TypeError, ValueError):
        raise ValueError(f"the history's {key} is malformed") from None
    if len(stacked) == 0 or not np.isfinite(stacked).all():
        raise ValueError(f"the history's {key} is empty or not finite")
    return stacked


def deflated_sharpe_from(moments: SeriesMoments, *, trials: int, variance: float) -> float:
    """``deflated_sharpe`` of a series summarised by ``series_moments`` (its Sharpe ratio, days and shape)."""
    return deflated_sharpe(
        moments.sharpe,
        days=moments.days,
        trials=trials,
        variance=variance,
        skewness=moments.skewness,
        kurtosis=moments.kurtosis,
    )


def _deflated_sharpe_of_run(
    history: Sequence[Mapping[str, Any]], champion_excess: Any, *, crowned: bool
) -> dict[str, Any]:
    try:
        sharpes = _stacked(history, "validation_sharpe", 1)
        trials = len(sharpes)
        variance = float(np.var(sharpes, ddof=1)) if trials > 1 else 0.0
        if crowned:
            moments, of = series_moments(champion_excess), "champion"
        else:
            days = len(np.asarray(champion_excess).ravel())
            moments, of = SeriesMoments(float(sharpes.max()), 0.0, 3.0, days), "best candidate"
        value = deflated_sharpe_from(moments, trials=trials, variance=variance)
    except ValueError as reason:
        return _no_deflated_sharpe(str(reason))
    reading = read_deflated_sharpe(value, trials=trials, edge=f"the {of}'s validation edge over equal weight")
    return {
        "deflated_sharpe": value,
        "deflated_sharpe_of": of,
        "trials": trials,
        "deflated_sharpe_reading": reading if crowned else f"{reading} (no agent was crowned: not the champion's)",
        "sharpe": moments.sharpe,
        # Without a crowned champion there is no series to measure: its shape is assumed normal, not shown as measured
        "skewness": moments.skewness if crowned else None,
        "kurtosis": moments.kurtosis if crowned else None,
        "moments": "measured" if crowned else "assumed normal (skewness 0, kurtosis 3): no champion's series",
        "days": moments.days,
        "expected_max_sharpe": expected_max_sharpe(trials, variance),
        "trial_sharpe_variance": variance,
    }


def _pbo_of_run(history: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    try:
        result = cscv(_stacked(history, "validation_blocks", 2))
    except ValueError as reason:
        return _no_pbo(str(reason))
    return {
        "pbo": result.pbo,
        "pbo_reading": read_pbo(result.pbo),
        "pbo_median_logit": result.median_logit,
        "pbo_splits": len(result.logits),
    }


def diagnose(history: Sequence[Mapping[str, Any]] | None, champion_excess: Any, *, crowned: bool) -> dict[str, Any]:
    """Both diagnostics of a run, JSON-ready; a figure that cannot be had is None, with the reason in its reading.

    The trials are every agent of every history row (N = P x generations; an elite scored again counts again,
    which errs toward a higher bar). The deflated Sharpe ratio is the champion's, from its own validation excess;
    when no agent was crowned (the champion is equal weight: no excess at all) it is the best candidate's by
    ``validation_sharpe``, with normal moments.

    Args:
        history: The run's metrics rows, each with ``validation_sharpe`` (P floats) and ``validation_blocks``
            (P lists of block means); None when the run has none.
        champion_excess: (D,) the champion's daily validation log return minus equal weight's.
        crowned: Whether an agent was crowned (``champion_generation`` > 0).
    """
    if not history:
        return unavailable("the run has no history")
    return {**_deflated_sharpe_of_run(history, champion_excess, crowned=crowned), **_pbo_of_run(history)}
