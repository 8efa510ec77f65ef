"""A backtest's report (``offline.backtest.report``): no fold counted twice, results of earlier versions shown
as n/a, and the pooled test over every test day in the summary and under the table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from offline.backtest.inference import pooled_test
from offline.backtest.report import summarise, table
from tests.offline.backtest.builders import fold_result


def test_two_results_of_one_fold_are_never_both_counted():
    with pytest.raises(ValueError, match="test year 2021 seed 0 is given twice"):
        summarise([fold_result(2021), fold_result(2022), fold_result(2021)])


def test_fold_results_of_earlier_versions_show_n_a():
    older, newer = fold_result(2021), fold_result(2022, crowned=3, deflated_sharpe=0.7, pbo=0.4)
    summary = summarise([older, newer])
    assert summary["crowned_folds"] == 1
    assert summary["deflated_sharpe_mean"] == 0.7 and summary["deflated_sharpe_folds"] == 1
    lines = table(summary).splitlines()
    assert lines[1].split()[-2:] == ["n/a", "n/a"] and lines[2].split()[-2:] == ["0.70", "0.40"]
    assert lines[-4] == (
        "overfitting: an agent was crowned in 1 of 2 folds; mean deflated Sharpe 0.70 (over 1 of 2 folds) "
        "(the champion's where crowned, else the best candidate's), mean PBO 0.40 (over 1 of 2 folds)"
    )
    only_older = table(summarise([older]))
    assert "mean deflated Sharpe n/a (no fold recorded it)" in only_older and "mean PBO n/a" in only_older


def _with_days(result: dict, excess: list[float]) -> dict:
    """``result`` trading the first ``len(excess)`` business days of its year, the champion ``excess`` above equal
    weight's 0."""
    days = pd.bdate_range(f"{result['year']}-01-01", periods=len(excess)).strftime("%Y-%m-%d").tolist()
    daily = {s: [0.0] * len(days) for s in result["daily"]}
    return {**result, "test_dates": days, "daily": {**daily, "champion": list(excess)}}


def test_the_summary_tests_the_method_over_every_test_day():
    rng = np.random.default_rng(0)
    recorded = {"trials": 80, "trial_sharpe_variance": 0.003, "days": 252}
    results = [
        _with_days(fold_result(year, crowned=4, diagnostics=recorded), list(rng.normal(0.002, 0.004, 250)))
        for year in (2020, 2021)
    ]
    summary = summarise(results, alpha=0.05, min_edge=0.005)
    pooled = summary["pooled"]
    assert pooled == pooled_test(results, alpha=0.05, min_edge=0.005)
    assert pooled["outcome"] == "proven" and pooled["days"] == 500 and pooled["trials"] == 160
    lines = table(summary).splitlines()
    assert lines[-3].startswith(
        f"pooled test over every test day (500 days, 2.0 years, 1 seed averaged per day): mean excess over equal "
        f"weight {pooled['mean_excess'] * 100:+.2f} log %/y, 90% interval {pooled['interval'][0] * 100:+.2f} to "
    )
    assert lines[-3].endswith(f"(stationary bootstrap, mean block {pooled['block_length']:.1f} days, 5000 draws)")
    assert lines[-2] == pooled["deflated_sharpe_reading"] and "the best of 160 unskilled trials" in lines[-2]
    assert lines[-1] == f"verdict: {pooled['verdict']}" and lines[-1].startswith("verdict: edge proven at the 5% level")
    # The plan's selection settings are the test's: a level of 1% and a margin no edge here reaches.
    strict = summarise(results, alpha=0.01, min_edge=2.0)["pooled"]
    assert strict["alpha"] == 0.01 and strict["interval_level"] == 0.98 and strict["min_edge"] == 2.0


def test_a_backtest_of_equal_weight_champions_has_nothing_to_test():
    summary = summarise([_with_days(fold_result(year), [0.0] * 250) for year in (2021, 2022)])
    lines = table(summary).splitlines()
    assert summary["pooled"]["outcome"] == "equal_weight"
    assert lines[-3] == (
        "pooled test over every test day (500 days, 2.0 years, 1 seed averaged per day): mean excess over equal "
        "weight +0.00 log %/y"
    )
    assert (
        lines[-2]
        == "deflated Sharpe n/a (2 of 2 folds record no trials: finished by an earlier version, or no history)"
    )
    assert lines[-1].startswith("verdict: no edge: every fold's champion is equal weight")


def test_summaries_of_earlier_versions_still_make_a_table():
    summary = summarise([fold_result(2021), fold_result(2022, crowned=3, deflated_sharpe=0.7, pbo=0.4)])
    earlier = {k: v for k, v in json.loads(json.dumps(summary)).items() if k != "pooled"}  # written before the test
    assert table(earlier) == "\n".join(table(summary).splitlines()[:-3])
    assert table(earlier).splitlines()[-1].startswith("overfitting: ")
