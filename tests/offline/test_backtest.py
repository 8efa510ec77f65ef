"""``python main.py backtest``: folds that never see their test year, and a killed backtest that resumes to the
same table."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import main
from benchmarks.naive_selection import naive_fold
from config import override, preset
from environment.features import WARMUP_DAYS
from environment.synthetic import make_market
from offline import backtest
from offline.backtest import OUTPUTS, STRATEGIES, Fold, plan_folds, summarise, table
from training.runs import load_market
from utils.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prices(tmp_path_factory) -> Path:
    """About six years of a 5-asset random walk from 2000-01-03."""
    path = tmp_path_factory.mktemp("backtest-data") / "prices.csv"
    make_market("random_walk", num_days=1560, num_assets=5, seed=3).prices.to_csv(path, index=False)
    return path


def small_config(prices: Path):
    return override(
        preset("smoke"),
        {"data.path": str(prices), "data.tickers": (), "data.start": "", "data.validation_days": 126},
    )


def test_folds_never_let_a_training_or_validation_day_reach_the_test_year(prices):
    config = small_config(prices)
    folds = plan_folds(config, seeds=[0, 1], folds=3)
    assert [(f.year, f.seed) for f in folds] == [(y, s) for y in (2003, 2004, 2005) for s in (0, 1)]
    for fold in folds:
        market = load_market(fold.config, torch.device("cpu"))
        splits, dates = market.splits, market.dates
        first_test_day = dt.date(fold.year, 1, 1).isoformat()
        # Every day training or validation earns, and every day their observation windows show, is before it.
        assert dates[splits.validation.stop - 1] < first_test_day
        assert dates[splits.train.stop - 1] < dates[splits.validation.start]
        # The test year is the holdout, all of it and nothing else.
        test_dates = [dates[d] for d in splits.holdout]
        assert all(d.startswith(str(fold.year)) for d in test_dates)
        assert dates[splits.holdout.start - 1] < first_test_day <= test_dates[0]
        assert splits.holdout.stop == market.num_days
        # The gap: the first test decision's window (lookback days to the day before the test) holds no
        # validation day, so no feature a test decision sees was earned by selection.
        lookback = fold.config.env.lookback
        assert len(splits.gap) == lookback
        first_window = range(splits.holdout.start - lookback, splits.holdout.start)
        assert set(first_window) == set(splits.gap)
        assert splits.validation.stop <= first_window.start
        # No row after the test year was even loaded.
        assert dates[-1] <= dt.date(fold.year, 12, 31).isoformat()
    assert WARMUP_DAYS > 0


def test_plans_that_cannot_be_run_are_refused(prices):
    config = small_config(prices)
    with pytest.raises(ConfigError, match="not in the data"):
        plan_folds(config, seeds=[0], years=[1999])
    with pytest.raises(ConfigError, match="--folds"):
        plan_folds(config, seeds=[0], folds=7)
    # Three years of data: the default four test years are named as the default, not as a flag nobody typed.
    with pytest.raises(ConfigError, match=r"^the default --folds 4: the data spans 3 calendar years"):
        plan_folds(override(config, {"data.start": "2003-01-01"}), seeds=[0])


def backtest_command(prices: Path, root: Path) -> list[str]:
    return [
        "backtest",
        "--preset",
        "smoke",
        "--data",
        str(prices),
        "--set",
        "data.tickers=",
        "--set",
        "data.start=",
        "--set",
        "data.validation_days=126",
        "--folds",
        "2",
        "--seeds",
        "0",
        "--generations",
        "3",
        "--checkpoint-uri",
        str(root),
        "--no-progress",
        "--json",
    ]


def test_a_killed_backtest_resumes_to_the_same_table(prices, tmp_path, capsys):
    assert main.main(backtest_command(prices, tmp_path / "whole")) == 0
    whole = json.loads(capsys.readouterr().out)
    assert [(row["year"], row["seed"]) for row in whole["folds"]] == [(2004, 0), (2005, 0)]
    assert all({"deflated_sharpe", "pbo"} <= set(row) for row in whole["folds"])
    folder = tmp_path / "whole" / "backtest"
    assert {p.name for p in folder.iterdir()} >= {"plan.json", "summary.json", "summary.csv", "backtest.png"}

    # The same backtest, killed (SIGKILL: no cleanup) once the second fold has its first checkpoint.
    killed_root = tmp_path / "killed"
    second = killed_root / "backtest" / "fold-2005-seed-0"
    command = [sys.executable, "main.py", *backtest_command(prices, killed_root)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not (second / "gen-000001").is_dir() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert (killed_root / "backtest" / "folds" / "fold-2004-seed-0.json").is_file()
    assert not (killed_root / "backtest" / "folds" / "fold-2005-seed-0.json").exists()

    assert main.main(backtest_command(prices, killed_root)) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed == whole

    # benchmarks/naive_selection.py scores a finished fold's test year as the backtest does.
    naive = naive_fold(folder / "fold-2004-seed-0")
    first = whole["folds"][0]
    assert naive["sharpe_equal_weight"] == pytest.approx(first["sharpe"]["equal_weight"], abs=1e-9)
    assert naive["total_return_equal_weight"] == pytest.approx(first["total_return"]["equal_weight"], abs=1e-9)
    assert naive["agent"].startswith("agent") and naive["turnover_ratio"] > 0


def test_the_same_name_with_another_plan_is_refused(prices, tmp_path, capsys):
    assert main.main([*backtest_command(prices, tmp_path), "--folds", "1", "--generations", "1"]) == 0
    capsys.readouterr()
    status = main.main([*backtest_command(prices, tmp_path), "--folds", "1", "--generations", "2"])
    err = capsys.readouterr().err
    assert status == 2 and "started with other settings" in err and len(err.strip().splitlines()) == 1
    assert "runtime.generations (1 in plan.json, now 2)" in err  # what changed, by name
    status = main.main([*backtest_command(prices, tmp_path), "--folds", "1", "--generations", "1", "--seeds", "1"])
    err = capsys.readouterr().err
    assert status == 2 and "(years 2005, seeds 0 in plan.json, now years 2005, seeds 1)" in err


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_continuing_on_other_data_is_refused(prices, tmp_path, capsys):
    """Folds trained on the old prices and folds trained on the new ones never meet in one summary."""
    data = tmp_path / "prices.csv"
    shutil.copy(prices, data)
    command = [*backtest_command(data, tmp_path / "root"), "--folds", "2", "--generations", "1"]
    assert main.main(command) == 0
    whole = capsys.readouterr().out
    folder = tmp_path / "root" / "backtest"
    frame = pd.read_csv(data)
    frame.iloc[-1, 1] *= 1.01  # one price of the last day of 2005: test year 2004's market is unchanged
    frame.to_csv(data, index=False)
    before = files_under(folder)
    assert main.main(command) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"the data changed: {data} no longer gives test year 2005 the market fold-2005-seed-0 was trained on" in err
    assert f"{folder / 'folds' / 'fold-2005-seed-0.json'} records market fingerprint" in err
    assert files_under(folder) == before
    # A fold result without a fingerprint (an earlier version's) or none yet: the fold's run checkpoint tells.
    result_path = folder / "folds" / "fold-2005-seed-0.json"
    result = json.loads(result_path.read_text())
    del result["market_fingerprint"]
    result_path.write_text(json.dumps(result))
    assert main.main(command) == 2
    err = capsys.readouterr().err
    assert f"{folder / 'fold-2005-seed-0'} records market fingerprint" in err and len(err.strip().splitlines()) == 1
    shutil.copy(prices, data)  # the backtest's own data again: it continues
    assert main.main(command) == 0 and capsys.readouterr().out == whole


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
    assert main.main(command) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{path} is not a valid fold result (not JSON" in err and "delete the file to train the fold again" in err
    assert files_under(tmp_path) == before


def test_folders_where_the_backtests_files_go_are_refused_before_anything_is_written(prices, tmp_path, capsys):
    command = [*backtest_command(prices, tmp_path), "--folds", "1", "--generations", "1"]
    assert main.main(command) == 0
    capsys.readouterr()
    folder = tmp_path / "backtest"
    for name in OUTPUTS:
        (folder / name).unlink()
        (folder / name).mkdir()
        before = files_under(folder)
        assert main.main(command) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1, err
        assert f"{folder / name} is a folder" in err and "move it away" in err
        assert files_under(folder) == before
        (folder / name).rmdir()


def test_a_name_or_location_that_is_a_file_is_refused(prices, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("notes\n")
    for command, phrase in (
        ([*backtest_command(prices, tmp_path), "--name", "taken"], "use another --name"),
        (backtest_command(prices, taken), "give --checkpoint-uri a folder"),
    ):
        assert main.main(command) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.strip().splitlines()) == 1 and f"{taken} is a file" in err and phrase in err
        assert [p.name for p in tmp_path.iterdir()] == ["taken"] and taken.read_text() == "notes\n"


@pytest.mark.parametrize(
    ("args", "phrase"),
    [
        (["--seeds", "0,x"], "--seeds expects"),
        (["--seeds", "-1"], "--seeds expects"),
        (["--seeds", "0,1,0"], "--seeds names seed 0 twice"),
        (["--years", "2004,2005,2004"], "--years names year 2004 twice"),
        (["--years", ""], "--years expects"),
        (["--years", "1890"], "not in the data"),
        (["--years", "2000"], "test year 2000: the price data has 260 rows"),
        (["--years", "2001"], "test year 2001: rollout.fitness_block_every"),
        (["--folds", "0"], "--folds must be >= 1"),
        (["--name", "../up"], "--name must be a plain folder name"),
        (["--checkpoint-uri", "gs://bucket/x"], "local folder"),
        (["--set", "ddpg.gamma=2"], "ddpg.gamma"),
        pytest.param(
            ["--device", "cuda"],
            "no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
        ),
    ],
)
def test_bad_backtest_input_is_one_line_and_writes_nothing(prices, tmp_path, capsys, args, phrase):
    command = backtest_command(prices, tmp_path / "root")
    status = main.main([*command, *args])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and phrase in err, err
    assert not (tmp_path / "root").exists()


def test_folds_carry_their_runs_overfitting_diagnostics(prices, tmp_path, capsys, monkeypatch, add_validation_keys):
    """A fold's deflated Sharpe ratio and PBO come from its run's whole history (2 generations of 4 agents) and its
    champion's validation; the table and the summary show them."""
    real = backtest.diagnose

    def from_recorded_rows(history, champion_excess, *, crowned):  # whatever the trainer recorded, the same rows
        return real(add_validation_keys(history, popsize=4, seed=9), champion_excess, crowned=crowned)

    monkeypatch.setattr(backtest, "diagnose", from_recorded_rows)
    command = [arg for arg in backtest_command(prices, tmp_path) if arg != "--json"]
    assert main.main([*command, "--folds", "1", "--generations", "2"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "backtest" / "folds" / "fold-2005-seed-0.json").read_text())
    diagnostics = result["diagnostics"]
    assert diagnostics["trials"] == 8
    assert diagnostics["deflated_sharpe_of"] == ("champion" if result["champion_generation"] else "best candidate")
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


def fold_result(year: int, *, crowned: int = 0, **diagnostics: float) -> dict:
    """A fold's result as ``run_fold`` writes it, two test days; without diagnostics, as earlier versions wrote it."""
    figures = {"total_return": 0.1, "sharpe": 1.0, "max_drawdown": 0.1, "turnover": 4.0, "costs": 0.002}
    metrics = {s: dict(figures) for s in STRATEGIES}
    days = [f"{year}-01-03", f"{year}-01-04"]
    spans = {"train": ["2000-01-03", "2001-01-02"], "validation": ["2001-01-03", "2001-12-28"], "test": days}
    return {
        "year": year,
        "seed": 0,
        "champion_generation": crowned,
        "metrics": metrics,
        "dates": {**spans, "gap": None},
        "daily": {s: [0.01, -0.02] for s in STRATEGIES},
        "test_dates": days,
        **diagnostics,
    }


def test_two_results_of_one_fold_are_never_both_counted():
    with pytest.raises(ValueError, match="test year 2021 seed 0 is given twice"):
        summarise([fold_result(2021), fold_result(2022), fold_result(2021)])


def damaged(result: dict, path: str, value) -> dict:
    """``result`` with the key at dotted ``path`` set to ``value`` (``...``: removed)."""
    result = json.loads(json.dumps(result))
    *parents, key = path.split(".")
    place = result
    for parent in parents:
        place = place[parent]
    if value is ...:
        del place[key]
    else:
        place[key] = value
    return result


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
        ("dates.gap", ["2020-12-30"], "dates.gap"),
        ("dates", ..., "dates must give"),
    ],
)
def test_fold_results_are_checked_key_by_key_before_use(prices, path, value, problem):
    fold = Fold(2021, 0, small_config(prices), "fingerprint")
    assert backtest._result_problem(fold_result(2021, pbo=0.4), fold) is None
    assert problem in backtest._result_problem(damaged(fold_result(2021, pbo=0.4), path, value), fold)
    assert backtest._result_problem(["not", "an", "object"], fold) == "a JSON array, not an object"


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
