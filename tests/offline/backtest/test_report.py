"""A backtest's report (``offline.backtest.report``): no fold counted twice, and results of earlier versions shown
as n/a."""

from __future__ import annotations

import pytest

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
    assert lines[-1] == (
        "overfitting: an agent was crowned in 1 of 2 folds; mean deflated Sharpe 0.70 (over 1 of 2 folds) "
        "(the champion's where crowned, else the best candidate's), mean PBO 0.40 (over 1 of 2 folds)"
    )
    only_older = table(summarise([older]))
    assert "mean deflated Sharpe n/a (no fold recorded it)" in only_older and "mean PBO n/a" in only_older
