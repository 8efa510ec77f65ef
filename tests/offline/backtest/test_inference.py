"""The backtest's one test over every test day (``offline.backtest.inference``): the pooled series, the stationary
bootstrap's figures against independent references (scipy's normal distribution, a plain numpy bootstrap), the
verdict on series with a known answer, the deflated Sharpe ratio over every trial, and determinism."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from offline.backtest import inference
from offline.backtest.inference import mean_test, pooled_deflated_sharpe, pooled_excess, pooled_test, years_to_prove


def fold(year: int, excess, *, seed: int = 0, equal_weight=None, diagnostics: dict | None = None) -> dict:
    """A fold result with what the pooled test reads: the champion's daily log return is equal weight's plus
    ``excess`` (equal weight's 0 unless given), on the first business days of ``year``."""
    excess = np.asarray(excess, dtype=np.float64)
    equal = np.zeros(len(excess)) if equal_weight is None else np.asarray(equal_weight, dtype=np.float64)
    days = pd.bdate_range(f"{year}-01-01", periods=len(excess)).strftime("%Y-%m-%d").tolist()
    assert all(day.startswith(str(year)) for day in days)
    result = {
        "year": year,
        "seed": seed,
        "champion_generation": 0 if not excess.any() else 5,
        "daily": {"champion": (equal + excess).tolist(), "equal_weight": equal.tolist()},
        "test_dates": days,
    }
    return result if diagnostics is None else {**result, "diagnostics": diagnostics}


def series(days: int, *, mean: float, sd: float, seed: int = 0, ar: float = 0.0) -> np.ndarray:
    """(days,) an AR(1) series with exactly this sample mean and standard deviation (ddof 1)."""
    rng = np.random.default_rng(seed)
    shocks = rng.normal(size=days)
    x = np.empty(days)
    x[0] = shocks[0]
    for t in range(1, days):
        x[t] = ar * x[t - 1] + shocks[t]
    return mean + sd * (x - x.mean()) / x.std(ddof=1)


def split_years(x: np.ndarray, first_year: int = 2010, **kwargs) -> list[dict]:
    """``x`` as folds of 250 days, one per year from ``first_year``."""
    return [fold(first_year + i, x[start : start + 250], **kwargs) for i, start in enumerate(range(0, len(x), 250))]


def stationary_means(x: np.ndarray, *, mean_block: float, draws: int, rng: np.random.Generator) -> np.ndarray:
    """A plain numpy stationary bootstrap (Politis and Romano, 1994), written from the definition: each resample
    starts on a uniform day and each next day either continues the block (wrapping around) or, with probability
    ``1 / mean_block``, jumps to a new uniform day. (draws,) the resampled means."""
    days = len(x)
    jumps = rng.random((draws, days)) < 1.0 / mean_block
    starts = rng.integers(days, size=(draws, days))
    index = np.empty((draws, days), dtype=np.int64)
    index[:, 0] = starts[:, 0]
    for t in range(1, days):
        index[:, t] = np.where(jumps[:, t], starts[:, t], (index[:, t - 1] + 1) % days)
    return x[index].mean(axis=1)


# ---------------------------------------------------------------------------------------------- the series


def test_seeds_of_the_same_days_are_averaged_per_day_not_stacked():
    one = fold(2021, [0.25, -0.5, 1.0], seed=0)
    other = fold(2021, [0.75, 0.5, 0.0], seed=1)
    earlier = fold(2020, [0.125, 0.25], seed=0)
    pooled = pooled_excess([one, other, earlier])  # any order: chained by date
    assert pooled.dates == earlier["test_dates"] + one["test_dates"]
    assert pooled.excess.tolist() == [0.125, 0.25, 0.5, 0.0, 0.5]
    assert (pooled.test_years, pooled.seeds, pooled.folds) == (2, 2, 3)


def test_the_excess_is_the_champion_minus_equal_weight():
    equal = [0.01, -0.02, 0.03]
    result = fold(2021, [0.0, 0.0, 0.0], equal_weight=equal)
    result["daily"]["champion"] = [0.015, -0.02, 0.01]
    assert pooled_excess([result]).excess == pytest.approx([0.005, 0.0, -0.02], abs=1e-15)


def test_two_seeds_count_their_days_once_in_the_test():
    """Two seeds with the same excess: the test of one seed, not of twice the days."""
    x = series(1000, mean=0.0002, sd=0.004, seed=4)
    single = pooled_test(split_years(x), draws=2000)
    doubled = pooled_test(split_years(x) + split_years(x, seed=1), draws=2000)
    assert doubled["days"] == single["days"] == 1000 and doubled["seeds"] == 2
    assert doubled["mean_excess"] == single["mean_excess"]
    assert doubled["block_length"] == single["block_length"]
    assert doubled["t"] == pytest.approx(single["t"], rel=0.05)  # the same series: other resamples only


# ---------------------------------------------------------------------------------------------- the statistics


def test_the_interval_and_p_value_match_a_plain_numpy_stationary_bootstrap():
    x = series(400, mean=0.0004, sd=0.01, seed=1, ar=0.4)  # dependent days, t about 0.8 / sqrt(1 - 0.4)...
    ours = mean_test(x, alpha=0.05, generator=torch.Generator().manual_seed(0), draws=5000, mean_block=6.0)
    reference = stationary_means(x, mean_block=6.0, draws=8000, rng=np.random.default_rng(1))
    m = x.mean()
    se = reference.std(ddof=1)
    assert ours.standard_error == pytest.approx(se, rel=0.05)
    low, high = 2 * m - np.quantile(reference, 0.95), 2 * m - np.quantile(reference, 0.05)  # basic interval
    assert ours.interval[0] == pytest.approx(low, abs=0.15 * se)
    assert ours.interval[1] == pytest.approx(high, abs=0.15 * se)
    p = (1 + np.count_nonzero(reference - m >= m)) / (len(reference) + 1)
    assert ours.p_value == pytest.approx(p, abs=0.02)
    assert ours.t == pytest.approx(m / ours.standard_error)
    assert ours.block_length == 6.0 and ours.draws == 5000


def test_on_independent_days_the_bootstrap_agrees_with_the_normal_test():
    """Days with no dependence: Politis-White chooses blocks of one day, and the bootstrap's standard error, p-value
    and interval are the normal test's (scipy) up to the resampling's error."""
    x = series(2000, mean=0.0003, sd=0.01, seed=2)
    test = mean_test(x, alpha=0.05, generator=torch.Generator().manual_seed(3), draws=5000)
    assert test.block_length == 1.0
    se = x.std(ddof=0) / math.sqrt(len(x))  # resampling days: the plug-in standard error
    assert test.standard_error == pytest.approx(se, rel=0.04)
    assert test.p_value == pytest.approx(stats.norm.sf(x.mean() / se), abs=0.015)
    z = stats.norm.ppf(0.95)
    assert test.interval[0] == pytest.approx(x.mean() - z * se, abs=0.12 * se)
    assert test.interval[1] == pytest.approx(x.mean() + z * se, abs=0.12 * se)


def test_the_years_to_prove_are_the_normal_tests():
    mean, se, days = 0.0002, 0.00015, 1500
    sd = se * math.sqrt(days)
    expected = (stats.norm.ppf(0.95) * sd / mean) ** 2 / 252
    assert years_to_prove(mean, se, days=days, alpha=0.05) == pytest.approx(expected, rel=1e-12)
    assert years_to_prove(mean, se, days=days, alpha=0.01) == pytest.approx(
        (stats.norm.ppf(0.99) * sd / mean) ** 2 / 252, rel=1e-12
    )
    assert years_to_prove(0.0, se, days=days, alpha=0.05) is None
    assert years_to_prove(-mean, se, days=days, alpha=0.05) is None


def test_the_test_refuses_what_it_cannot_test():
    generator = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="at least two finite days"):
        mean_test([1.0], alpha=0.05, generator=generator)
    with pytest.raises(ValueError, match="at least two finite days"):
        mean_test([1.0, float("nan")], alpha=0.05, generator=generator)
    with pytest.raises(ValueError, match="alpha"):
        mean_test([1.0, 2.0], alpha=0.5, generator=generator)


# ---------------------------------------------------------------------------------------------- the verdict


def test_a_strong_positive_excess_is_proven():
    x = series(1000, mean=0.001, sd=0.005, seed=5, ar=0.2)  # t about 6
    pooled = pooled_test(split_years(x))
    assert pooled["outcome"] == "proven" and pooled["p_value"] <= 1 / 5000 * 2
    assert pooled["verdict"].startswith("edge proven at the 5% level: the champion beat equal weight by +25.20 log %/y")
    assert "over 1000 test days (4.0 years)" in pooled["verdict"]
    assert pooled["mean_excess"] == pytest.approx(0.252)
    low, high = pooled["interval"]
    assert 0.0 < low < 0.252 < high
    assert pooled["t"] > 4 and pooled["years_to_prove"] is None


def test_a_proven_edge_below_the_margin_says_so():
    x = series(2500, mean=0.00001, sd=0.00004, seed=6)  # 0.25%/y, t about 12; the margin 0.5%/y
    pooled = pooled_test(split_years(x))
    assert pooled["outcome"] == "proven"
    assert pooled["verdict"].endswith(
        "though below selection.min_edge (+0.50 log %/y): real, but smaller than worth having"
    )


def test_a_negative_mean_is_no_edge():
    x = series(1000, mean=-0.0002, sd=0.004, seed=7)
    pooled = pooled_test(split_years(x))
    assert pooled["outcome"] == "no_edge" and pooled["p_value"] > 0.5
    assert pooled["verdict"] == (
        "no edge: the champion's mean excess over equal weight is -5.04 log %/y over 1000 test days (4.0 years), "
        "not above 0"
    )


def test_an_interval_below_the_margin_rules_an_edge_worth_having_out():
    x = series(1000, mean=0.000004, sd=0.00013, seed=8)  # +0.10%/y, t about 1; the interval's top about +0.27%/y
    pooled = pooled_test(split_years(x))
    assert pooled["outcome"] == "no_edge" and pooled["p_value"] > 0.05
    assert pooled["interval"][1] < 0.005
    assert pooled["verdict"].startswith("no edge: the 90% interval ")
    assert pooled["verdict"].endswith(
        "log %/y ends below selection.min_edge (+0.50): an edge worth having is ruled out over 1000 test days "
        "(4.0 years)"
    )


def test_an_edge_that_is_not_yet_significant_gives_the_years_that_would_prove_it():
    x = series(1000, mean=0.0002, sd=0.006, seed=9)  # t about 1
    pooled = pooled_test(split_years(x))
    assert pooled["outcome"] == "cannot_tell" and pooled["p_value"] > 0.05
    sd = pooled["mean_excess"] / 252 / pooled["t"] * math.sqrt(1000)  # the bootstrap's standard error x sqrt(D)
    years = (stats.norm.ppf(0.95) * sd / (pooled["mean_excess"] / 252)) ** 2 / 252
    assert pooled["years_to_prove"] == pytest.approx(years, rel=1e-9)
    assert years > 4.0
    assert pooled["verdict"] == (
        f"cannot tell yet: +5.04 log %/y over 1000 test days (4.0 years) is not significant at the 5% level "
        f"(one-sided p {pooled['p_value']:.4f}); at this mean and spread about {years:.1f} test years would make the "
        "one-sided test reject"
    )


def test_the_level_is_the_plans_alpha():
    x = series(1000, mean=0.0002, sd=0.006, seed=9)
    pooled = pooled_test(split_years(x), alpha=0.25)
    assert pooled["alpha"] == 0.25 and pooled["interval_level"] == 0.5
    assert pooled["outcome"] == "proven" and pooled["verdict"].startswith("edge proven at the 25% level")


def test_every_champion_equal_weight_is_not_bootstrapped(monkeypatch):
    def no_bootstrap(*args, **kwargs):
        raise AssertionError("a series of zeros was bootstrapped")

    monkeypatch.setattr(inference, "mean_test", no_bootstrap)
    recorded = {"trials": 80, "trial_sharpe_variance": 0.004, "days": 252}
    pooled = pooled_test(
        [fold(2020, np.zeros(250), diagnostics=recorded), fold(2021, np.zeros(250), diagnostics=recorded)]
    )
    assert pooled["outcome"] == "equal_weight" and pooled["mean_excess"] == 0.0
    assert pooled["verdict"] == (
        "no edge: every fold's champion is equal weight (no agent proved an edge on its validation days), so the "
        "excess is exactly 0 on every test day and there is nothing to test"
    )
    assert pooled["p_value"] is None and pooled["interval"] is None and pooled["t"] is None
    assert pooled["deflated_sharpe"] is None and pooled["trials"] == 160
    assert pooled["deflated_sharpe_reading"] == "deflated Sharpe n/a (the excess is 0 on every test day; 160 trials)"


def test_too_few_days_ask_for_more():
    pooled = pooled_test([fold(2021, [0.01, -0.005] * 5)])
    assert pooled["outcome"] == "too_few_days" and pooled["p_value"] is None
    assert pooled["verdict"] == "cannot tell yet: the test needs more days (10 test days; at least 20)"


# ---------------------------------------------------------------------------------------------- deflated Sharpe


def test_the_deflated_sharpe_counts_every_trial_of_every_fold():
    x = series(750, mean=0.0008, sd=0.005, seed=10)
    recorded = [
        {"trials": 80, "trial_sharpe_variance": 0.004, "days": 252},
        {"trials": 80, "trial_sharpe_variance": 0.002, "days": 252},
        {"trials": 120, "trial_sharpe_variance": 0.001, "days": 504},
    ]
    results = [fold(2010 + i, x[250 * i : 250 * (i + 1)], diagnostics=d) for i, d in enumerate(recorded)]
    figures = pooled_deflated_sharpe(pooled_excess(results).excess, results)
    # Bailey and Lopez de Prado (2014), from scipy: the expected best of N unskilled trials, and the PSR against it.
    trials = 280
    variance = (80 * 0.004 * 252 + 80 * 0.002 * 252 + 120 * 0.001 * 504) / 750 / trials
    gamma = 0.5772156649015329
    bar = math.sqrt(variance) * (
        (1 - gamma) * stats.norm.ppf(1 - 1 / trials) + gamma * stats.norm.ppf(1 - 1 / (trials * math.e))
    )
    sharpe = x.mean() / x.std(ddof=1)
    skew, kurt = stats.skew(x), stats.kurtosis(x, fisher=False)
    psr = stats.norm.cdf((sharpe - bar) * math.sqrt(749) / math.sqrt(1 - skew * sharpe + (kurt - 1) / 4 * sharpe**2))
    assert figures["trials"] == trials
    assert figures["expected_max_sharpe"] == pytest.approx(bar, rel=1e-9)
    assert figures["sharpe"] == pytest.approx(sharpe, rel=1e-9)
    assert figures["deflated_sharpe"] == pytest.approx(psr, rel=1e-9)
    assert figures["deflated_sharpe_reading"].startswith(f"deflated Sharpe {psr:.2f}: the edge over every test day")


def test_the_deflated_sharpe_is_n_a_for_folds_of_earlier_versions():
    x = series(500, mean=0.0008, sd=0.005, seed=11)
    results = [fold(2010, x[:250], diagnostics={"trials": 80, "trial_sharpe_variance": 0.004, "days": 252})]
    results.append(fold(2011, x[250:]))  # no diagnostics: finished by an earlier version
    pooled = pooled_test(results)
    assert pooled["deflated_sharpe"] is None and pooled["trials"] is None
    assert pooled["deflated_sharpe_reading"] == (
        "deflated Sharpe n/a (1 of 2 folds record no trials: finished by an earlier version, or no history)"
    )
    assert pooled["outcome"] == "proven"  # the test itself needs only the daily returns


# ---------------------------------------------------------------------------------------------- files


def test_the_figures_round_trip_through_json():
    x = series(1000, mean=0.0002, sd=0.006, seed=9)
    recorded = {"trials": 80, "trial_sharpe_variance": 0.004, "days": 252}
    for results in (split_years(x, diagnostics=recorded), [fold(2020, np.zeros(30))], [fold(2020, [0.1] * 3)]):
        pooled = pooled_test(results, draws=1000)
        assert json.loads(json.dumps(pooled, allow_nan=False)) == pooled


def test_the_same_plan_gives_the_same_bytes_in_any_order():
    x = series(1000, mean=0.0002, sd=0.006, seed=9)
    results = split_years(x)
    first = json.dumps(pooled_test(results, draws=1000))
    assert json.dumps(pooled_test(json.loads(json.dumps(results)), draws=1000)) == first
    assert json.dumps(pooled_test(results[::-1], draws=1000)) == first
    other_plan = [{**r, "seed": 1} for r in results]  # the same days under another seed: other resamples
    assert pooled_test(other_plan, draws=1000)["p_value"] != json.loads(first)["p_value"]


def test_an_autocorrelated_excess_states_the_size_measured_at_its_autocorrelation():
    """Where the daily excess is autocorrelated the bootstrap rejects a true null more often than its level (measured
    on AR(1) series: RESULTS.md); the verdict says so, with the series' own autocorrelation."""
    x = series(12 * 252, mean=0.0006, sd=0.004, seed=3, ar=0.3)
    assert inference.lag_one_autocorrelation(x) == pytest.approx(np.corrcoef(x[1:], x[:-1])[0, 1], abs=0.01)
    pooled = pooled_test(split_years(x), alpha=0.05)
    rho = pooled["autocorrelation"]
    assert 0.2 < rho < 0.4 and pooled["size_at_autocorrelation"] == 0.065
    assert pooled["outcome"] == "proven" and pooled["p_value"] < 0.01
    assert "autocorrelation" not in pooled["verdict"]  # far below the level: the measured size changes nothing
    # A proof near the level is qualified where the series is autocorrelated, not where its days are independent.
    caveat = inference.size_caveat(0.3, 0.045, 0.05)
    assert "lag-one autocorrelation is 0.30" in caveat and "not 5%" in caveat and "0.0385 that would hold 5%" in caveat
    assert inference.size_caveat(0.3, 0.03, 0.05) == "" and inference.size_caveat(0.0, 0.045, 0.05) == ""
    assert "beyond the 0.5" in inference.size_caveat(0.7, 0.001, 0.05)
    assert pooled_test(split_years(x), alpha=0.01)["size_at_autocorrelation"] is None  # measured at 5% only
    assert inference.measured_size(-0.2) == 0.047 and inference.measured_size(0.3) == 0.065
    assert inference.measured_size(0.9) is None
