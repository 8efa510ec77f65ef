"""Fold results (``offline.backtest.results``): checked key by key before use, recomputed from their run when
damaged, and carrying their runs' overfitting diagnostics."""

from __future__ import annotations

import json
import shutil

import pytest

import main
from offline.backtest import results
from offline.backtest.plan import Fold
from persistence import checkpoint
from tests.offline.backtest.builders import backtest_command, damaged, files_under, fold_result, refusal, small_config


@pytest.mark.slow
def test_damaged_fold_results_are_recomputed_from_their_run_or_refused(prices, tmp_path, capsys):
    command = [*backtest_command(prices, tmp_path), "--folds", "1", "--generations", "1"]
    assert main.main(command) == 0
    whole = capsys.readouterr().out
    path = tmp_path / "backtest" / "folds" / "fold-2005-seed-0.json"
    good = json.loads(path.read_text())
    figures = good["metrics"]["champion"]
    damages = [
        "{",
        "[]",
        json.dumps({**good, "year": 2004}),
        json.dumps({**good, "metrics": {**good["metrics"], "champion": {**figures, "sharpe": "1.2"}}}),
        json.dumps({**good, "daily": {"champion": [0.0]}}),
    ]
    for damage in damages:
        path.write_text(damage)
        assert main.main(command) == 0
        out, err = capsys.readouterr()
        assert f"{path} is not a valid fold result (" in err and "recomputing it from the fold's run" in err
        assert out == whole and json.loads(path.read_text()) == good

    # With no run left to recompute it from: one line that names the file and what to do, nothing written.
    shutil.rmtree(tmp_path / "backtest" / "fold-2005-seed-0")
    path.write_text("{")
    before = files_under(tmp_path)
    err = refusal(command, capsys)
    assert f"{path} is not a valid fold result (not JSON" in err and "delete the file to train the fold again" in err
    assert files_under(tmp_path) == before


def test_folds_carry_their_runs_overfitting_diagnostics(prices, tmp_path, capsys, monkeypatch, add_validation_keys):
    """A fold's deflated Sharpe ratio and PBO come from its run's whole history (2 generations of 4 agents) and its
    champion's validation; the table and the summary show them."""
    real = results.diagnose

    def from_recorded_rows(history, champion_excess, *, crowned):  # whatever the trainer recorded, the same rows
        return real(add_validation_keys(history, popsize=4, seed=9), champion_excess, crowned=crowned)

    monkeypatch.setattr(results, "diagnose", from_recorded_rows)
    command = [arg for arg in backtest_command(prices, tmp_path) if arg != "--json"]
    assert main.main([*command, "--folds", "1", "--generations", "2"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "backtest" / "folds" / "fold-2005-seed-0.json").read_text())
    diagnostics = result["diagnostics"]
    state = checkpoint.read_document(checkpoint.open_generation(tmp_path / "backtest" / "fold-2005-seed-0"), "state")
    assert "champion_edge" not in result and result["champion_bound"] == state["champion_bound"]  # a bound, named so
    assert diagnostics["trials"] == 8
    assert diagnostics["deflated_sharpe_of"] == ("champion" if result["champion_generation"] else "best candidate")
    if not result["champion_generation"]:  # no champion's series: its shape is assumed, and never shown as measured
        assert diagnostics["skewness"] is None and diagnostics["kurtosis"] is None
        assert diagnostics["moments"].startswith("assumed normal")
    else:
        assert diagnostics["moments"] == "measured" and diagnostics["kurtosis"] is not None
    assert result["deflated_sharpe"] == diagnostics["deflated_sharpe"] and 0.0 <= result["deflated_sharpe"] <= 1.0
    assert result["pbo"] == diagnostics["pbo"] and 0.0 <= result["pbo"] <= 1.0
    summary = json.loads((tmp_path / "backtest" / "summary.json").read_text())
    assert summary["deflated_sharpe_mean"] == result["deflated_sharpe"] and summary["pbo_mean"] == result["pbo"]
    assert summary["crowned_folds"] == (1 if result["champion_generation"] else 0)
    header = next(line for line in printed.splitlines() if line.startswith("test year"))
    row = next(line for line in printed.splitlines() if line.startswith("2005"))
    assert header.split()[-2:] == ["DSR", "PBO"]
    assert row.split()[-2:] == [f"{result['deflated_sharpe']:.2f}", f"{result['pbo']:.2f}"]
    assert f"mean deflated Sharpe {result['deflated_sharpe']:.2f} " in printed
    assert f"mean PBO {result['pbo']:.2f}" in printed


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("seed", 1, "seed is 1, not 0"),
        ("year", "2021", "year is '2021', not 2021"),
        ("champion_generation", True, "champion_generation is True"),
        ("pbo", "0.4", "pbo is '0.4', not a number"),
        ("market_fingerprint", 7, "market_fingerprint"),
        ("metrics.untrained", ..., "metrics must hold"),
        ("metrics.cash.turnover", [4.0], "metrics.cash must hold"),
        ("metrics.champion.sharpe", float("nan"), "metrics.champion must hold"),
        ("test_dates", ["2021-01-03", "2020-01-04"], "test_dates must list the days of 2021"),
        ("daily.champion", [0.01], "daily.champion must hold one log return per test day"),
        ("daily.equal_weight", ..., "daily must hold the champion's and equal weight's log returns"),
        ("diagnostics", [80], "diagnostics is not an object"),
        ("diagnostics", {"trials": 0}, "diagnostics.trials is 0, not a count >= 1"),
        ("diagnostics", {"trials": 80.0}, "diagnostics.trials is 80.0, not a count >= 1"),
        ("diagnostics", {"days": 1}, "diagnostics.days is 1, not a count >= 2"),
        ("diagnostics", {"trial_sharpe_variance": -0.1}, "diagnostics.trial_sharpe_variance is -0.1"),
        ("dates.gap", ["2020-12-30"], "dates.gap"),
        ("dates", ..., "dates must give"),
    ],
)
def test_fold_results_are_checked_key_by_key_before_use(prices, path, value, problem):
    fold = Fold(2021, 0, small_config(prices), "fingerprint")
    assert results.result_problem(fold_result(2021, pbo=0.4), fold) is None
    recorded = {"trials": 80, "trial_sharpe_variance": 0.003, "days": 252}
    assert results.result_problem(fold_result(2021, diagnostics=recorded), fold) is None
    assert results.result_problem(fold_result(2021, diagnostics=dict.fromkeys(recorded)), fold) is None  # no history
    assert problem in results.result_problem(damaged(fold_result(2021, pbo=0.4), path, value), fold)
    assert results.result_problem(["not", "an", "object"], fold) == "a JSON array, not an object"
