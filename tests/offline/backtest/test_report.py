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
    assert next(line for line in lines if line.startswith("overfitting:")) == (
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
    judged = {"alpha": 0.05, "min_edge": 0.005, "procedures": 3}  # the champion, best on validation, the ensemble
    assert {k: pooled[k] for k in pooled_test(results, **judged)} == pooled_test(results, **judged)
    assert pooled["outcome"] == "proven" and pooled["days"] == 500 and pooled["trials"] == 3 * 160
    lines = table(summary).splitlines()
    at = _champions_test(lines)
    assert lines[at].startswith(
        f"pooled test over every test day (500 days, 2.0 years, 1 seed averaged per day): mean excess over equal "
        f"weight {pooled['mean_excess'] * 100:+.2f} log %/y, 90% interval {pooled['interval'][0] * 100:+.2f} to "
    )
    assert lines[at].endswith(f"(stationary bootstrap, mean block {pooled['block_length']:.1f} days, 5000 draws)")
    assert lines[at + 1] == pooled["deflated_sharpe_reading"] and "the best of 480 unskilled trials" in lines[at + 1]
    assert lines[at + 2] == f"verdict: {pooled['verdict']}"
    assert lines[at + 2].startswith("verdict: edge proven at the 5% level")
    # The plan's selection settings are the test's: a level of 1% and a margin no edge here reaches.
    strict = summarise(results, alpha=0.01, min_edge=2.0)["pooled"]
    assert strict["alpha"] == 0.01 and strict["interval_level"] == 0.98 and strict["min_edge"] == 2.0


def test_a_backtest_of_equal_weight_champions_has_nothing_to_test():
    summary = summarise([_with_days(fold_result(year), [0.0] * 250) for year in (2021, 2022)])
    lines = table(summary).splitlines()
    assert summary["pooled"]["outcome"] == "equal_weight"
    at = _champions_test(lines)
    assert lines[at] == (
        "pooled test over every test day (500 days, 2.0 years, 1 seed averaged per day): mean excess over equal "
        "weight +0.00 log %/y"
    )
    assert (
        lines[at + 1]
        == "deflated Sharpe n/a (2 of 2 folds record no trials: finished by an earlier version, or no history)"
    )
    assert lines[at + 2].startswith("verdict: no edge: every fold's champion is equal weight")


def _champions_test(lines: list[str]) -> int:
    """The line where the champion's pooled test starts in the table."""
    return lines.index(next(line for line in lines if line.startswith("champion ("))) + 1


def test_summaries_of_earlier_versions_still_make_a_table():
    summary = summarise([fold_result(2021), fold_result(2022, crowned=3, deflated_sharpe=0.7, pbo=0.4)])
    now = table(summary).splitlines()
    overfitting = now.index(next(line for line in now if line.startswith("overfitting: ")))
    before_traders = {k: v for k, v in json.loads(json.dumps(summary)).items() if k not in ("traders", "family")}
    champions = table(before_traders).splitlines()  # the champion's test alone, under the summary lines
    assert champions[: overfitting + 1] == now[: overfitting + 1] and champions[-1].startswith("verdict: ")
    earlier = {k: v for k, v in before_traders.items() if k != "pooled"}  # written before the test
    assert table(earlier) == "\n".join(now[: overfitting + 1])
