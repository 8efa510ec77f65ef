"""The family of procedures (``offline.backtest.inference.family_test``): Romano and Wolf's stepdown max-t over the
traders' pooled excess, held against ``arch``'s ``StepM`` on the same series, its family-wise size measured on null
series and its power on planted ones; and the verdict that names what to deploy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from arch.bootstrap import StepM, optimal_block_length

from offline.backtest.inference import family_test, family_verdict, mean_test
from tests.offline.backtest.builders import fold_result
from training.selection import block_length

DAYS = 1500


def _series(rng: np.random.Generator, means: list[float]) -> dict[str, np.ndarray]:
    """Correlated daily excesses (a shared part, as procedures drawn from one population have), one per mean."""
    shared = rng.normal(0.0, 0.003, DAYS)
    return {f"trader{j}": shared + rng.normal(0.0, 0.003, DAYS) + mu for j, mu in enumerate(means)}


def test_the_family_finds_what_arch_stepm_finds_on_the_same_series():
    rng = np.random.default_rng(7)
    compared = 0
    for rep in range(12):
        series = _series(rng, [0.0, 0.0005 * (rep % 3), 0.0003 * (rep % 2), -0.0002])
        ours = family_test(series, generator=torch.Generator().manual_seed(rep), draws=1000)
        step = StepM(
            np.zeros(DAYS),  # losses: the benchmark's 0, each trader's minus its excess
            -np.column_stack(list(series.values())),
            size=0.05,
            block_size=max(1, round(ours.block_length)),
            reps=1000,
            bootstrap="stationary",
            seed=rep,
        )
        step.compute()
        theirs = {ours.names[int(j)] for j in step.superior_models}
        found = {name for name, p in zip(ours.names, ours.adjusted_p, strict=True) if p is not None and p <= 0.05}
        if all(p is None or abs(p - 0.05) > 0.03 for p in ours.adjusted_p):  # far from the level: no coin flip
            assert found == theirs, (rep, ours.adjusted_p)
            compared += 1
    assert compared >= 8


def test_one_trader_alone_is_the_pooled_test():
    """On one series and the same resamples, the stepdown max-t p-value is the pooled test's."""
    x = np.random.default_rng(3).normal(0.0004, 0.004, DAYS)
    single = mean_test(x, alpha=0.05, generator=torch.Generator().manual_seed(5), draws=2000)
    family = family_test({"champion": x}, generator=torch.Generator().manual_seed(5), draws=2000)
    assert family.adjusted_p[0] == pytest.approx(single.p_value, abs=1.5 / 2001)
    assert family.block_length == single.block_length


def test_its_family_wise_size_is_held_on_null_series_and_it_finds_planted_edges():
    rng = np.random.default_rng(11)
    reps, rejected, found = 200, 0, 0
    for rep in range(reps):
        null = family_test(_series(rng, [0.0, 0.0, 0.0]), generator=torch.Generator().manual_seed(rep), draws=400)
        rejected += any(p <= 0.05 for p in null.adjusted_p)
        planted = family_test(_series(rng, [0.0, 0.0003, 0.0]), generator=torch.Generator().manual_seed(rep), draws=400)
        found += planted.adjusted_p[1] <= 0.05
    # 5% of 200 is 10; a true rate of 5% rejects more than 18 times with probability 0.006
    assert rejected <= 18, rejected
    assert found >= 0.6 * reps, found  # t about 2.7 at 1500 days: found in about three backtests of four


def test_a_series_of_zeros_is_not_tested_and_cannot_be_deployed():
    rng = np.random.default_rng(0)
    series = {"champion": np.zeros(DAYS), "ensemble": rng.normal(0.001, 0.004, DAYS)}
    test = family_test(series, generator=torch.Generator().manual_seed(0), draws=500)
    assert test.adjusted_p[0] is None and test.t[0] is None and test.adjusted_p[1] <= 0.05


def _results(excess: dict[str, list[float]]) -> list[dict]:
    """Two fold results whose procedures beat equal weight's 0 by ``excess`` (the first half in the first year)."""
    results = []
    for k, year in enumerate((2020, 2021)):
        result = fold_result(year)
        half = len(next(iter(excess.values()))) // 2
        days = pd.bdate_range(f"{year}-01-01", periods=half).strftime("%Y-%m-%d").tolist()
        daily = {s: [0.0] * half for s in result["daily"]}
        for trader, values in excess.items():
            daily[trader] = values[k * half : (k + 1) * half]
        results.append({**result, "test_dates": days, "daily": daily})
    return results


def test_the_verdict_deploys_the_proven_trader_with_the_strongest_evidence():
    rng = np.random.default_rng(1)
    strong, weaker, none = (list(rng.normal(mu, 0.004, 500)) for mu in (0.002, 0.0008, 0.0))
    verdict = family_verdict(
        _results({"champion": none, "best_on_validation": weaker, "ensemble": strong}),
        ["champion", "best_on_validation", "ensemble"],
    )
    assert verdict["deploy"] == "ensemble" and "ensemble" in verdict["proven"] and "champion" not in verdict["proven"]
    assert verdict["verdict"].startswith("deploy the ensemble (selection.deploy=ensemble)")
    nothing = family_verdict(_results({"champion": [0.0] * 500}), ["champion"])
    assert nothing["deploy"] is None and nothing["verdict"] == (
        "deploy none, keep equal weight: every trader traded as equal weight on every test day: there is nothing to "
        "test"
    )
    unproven = family_verdict(_results({"champion": none, "ensemble": none}), ["champion", "ensemble"])
    assert unproven["deploy"] is None and unproven["verdict"].startswith("deploy none, keep equal weight: no trader")


@pytest.mark.parametrize("phi", [0.3, 0.5, 0.7, 0.9])
def test_the_block_length_is_the_one_arch_chooses_up_to_its_window(phi):
    """Politis and White's rule as arch implements it: arch finds the window one lag later (its flat-top width is
    2(m + 1) where the paper's is 2m) and normalises its autocorrelations by partial sums, so the two agree within a
    quarter on autocorrelated series and both give short blocks on independent days."""
    rng = np.random.default_rng(int(phi * 10))
    shocks = rng.normal(size=3000)
    x = np.empty(3000)
    x[0] = shocks[0]
    for t in range(1, 3000):
        x[t] = phi * x[t - 1] + shocks[t]
    theirs = float(optimal_block_length(x)["stationary"].iloc[0])
    assert block_length(x) == pytest.approx(theirs, rel=0.25)
    independent = rng.normal(size=3000)
    assert block_length(independent) <= 2.0 and float(optimal_block_length(independent)["stationary"].iloc[0]) <= 2.0
