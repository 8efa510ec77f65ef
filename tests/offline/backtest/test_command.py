"""``python main.py backtest`` (``offline.backtest.command``): a killed backtest resumes to the same table; another
plan, other data, and folders or files in the way are refused in one line, writing nothing."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import pandas as pd
import pytest
import torch

import main
from benchmarks.naive_selection import naive_fold
from offline import tearsheet
from offline.backtest.report import OUTPUTS
from persistence import checkpoint
from tests import hold_points
from tests.offline.backtest.builders import ROOT, backtest_command, files_under, refusal
from tests.run_checks import wait_for


@pytest.mark.slow
def test_a_killed_backtest_resumes_to_the_same_table(prices, tmp_path, capsys):
    assert main.main(backtest_command(prices, tmp_path / "whole")) == 0
    whole = json.loads(capsys.readouterr().out)
    assert [(row["year"], row["seed"]) for row in whole["folds"]] == [(2004, 0), (2005, 0)]
    assert all({"deflated_sharpe", "pbo"} <= set(row) for row in whole["folds"])
    folder = tmp_path / "whole" / "backtest"
    assert {p.name for p in folder.iterdir()} >= {"plan.json", "summary.json", "summary.csv", "backtest.png"}
    # The tear sheet: the test years chained for the seed, champion against the baselines, and the summary's figures.
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert "Seed 0: test years 2004, 2005 chained" in page and "Backtest summary" in page
    assert page.count("<h3") == len(tearsheet.SECTIONS) and "data:image/png;base64," in page

    # The same backtest, killed (SIGKILL: no cleanup) once the second fold has its first checkpoint, held at the
    # start of its second generation (tests/hold_points.py; the first fold, released ahead, goes on).
    killed_root, marks = tmp_path / "killed", tmp_path / "marks"
    finished, killed = "fold-2004-seed-0", "fold-2005-seed-0"
    command = [sys.executable, hold_points.SCRIPT, *backtest_command(prices, killed_root)]
    env = {**os.environ, **hold_points.environment(marks, "start@2")}
    hold_points.release(marks, [finished])
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        hold_points.wait_until_held(process, marks, [killed])
        wait_for(lambda: checkpoint.latest_generation(killed_root / "backtest" / killed) == 1)
    finally:
        process.kill()  # SIGKILL
        process.wait()
    assert process.returncode == -signal.SIGKILL
    assert (killed_root / "backtest" / "folds" / f"{finished}.json").is_file()
    assert not (killed_root / "backtest" / "folds" / f"{killed}.json").exists()

    assert main.main(backtest_command(prices, killed_root)) == 0
    resumed = json.loads(capsys.readouterr().out)
    assert resumed == whole
    # The pooled test's resamples are seeded from the plan: the continued backtest's summary is the same, byte for byte.
    assert (killed_root / "backtest" / "summary.json").read_bytes() == (folder / "summary.json").read_bytes()
    pooled = whole["pooled"]
    assert pooled["days"] == len({day for name in ("2004", "2005") for day in _test_days(folder, name)})
    # the smoke preset: 4 agents x 3 generations x 2 years, counted once for each of the 3 procedures judged
    assert pooled["verdict"] and pooled["trials"] == 4 * 3 * 2 * 3

    # Every procedure traded each test year; each has its pooled test, and the family names what to deploy.
    traders = whole["traders"]
    assert list(traders) == ["champion", "best_on_validation", "ensemble"] and traders["champion"] == pooled
    assert all(t["days"] == pooled["days"] and t["verdict"] for t in traders.values())
    family = whole["family"]
    assert family["traders"] == list(traders) and set(family["adjusted_p"]) == set(traders)
    assert family["verdict"].startswith("deploy") and (family["deploy"] is None) == (not family["proven"])
    for year in ("2004", "2005"):
        result = json.loads((folder / "folds" / f"fold-{year}-seed-0.json").read_text())
        assert len(result["members"]["best_on_validation"]) == 1 and len(result["members"]["ensemble"]) == 3
        assert result["members"]["ensemble"][0] == result["members"]["best_on_validation"][0]
        assert {"best_on_validation", "ensemble"} <= result["daily"].keys() <= set(result["metrics"])

    # A fold result of an earlier version (the champion's procedure only) is scored again from its run, to the same
    # summary: a resumed backtest gains the new fields.
    result_path = killed_root / "backtest" / "folds" / f"{finished}.json"
    result = json.loads(result_path.read_text())
    for key in ("metrics", "daily"):
        for trader in ("best_on_validation", "ensemble"):
            del result[key][trader]
    del result["members"]
    result_path.write_text(json.dumps(result))
    assert main.main(backtest_command(prices, killed_root)) == 0
    assert json.loads(capsys.readouterr().out) == whole

    # benchmarks/naive_selection.py scores a finished fold's test year as the backtest does.
    naive = naive_fold(folder / "fold-2004-seed-0")
    first = whole["folds"][0]
    assert naive["sharpe_equal_weight"] == pytest.approx(first["sharpe"]["equal_weight"], abs=1e-9)
    assert naive["total_return_equal_weight"] == pytest.approx(first["total_return"]["equal_weight"], abs=1e-9)
    assert naive["agent"].startswith("agent") and naive["turnover_ratio"] > 0


def _test_days(folder, year: str) -> list[str]:
    return json.loads((folder / "folds" / f"fold-{year}-seed-0.json").read_text())["test_dates"]


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


@pytest.mark.slow
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
    err = refusal(command, capsys)
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


def test_folders_where_the_backtests_files_go_are_refused_before_anything_is_written(prices, tmp_path, capsys):
    command = [*backtest_command(prices, tmp_path), "--folds", "1", "--generations", "1"]
    assert main.main(command) == 0
    capsys.readouterr()
    folder = tmp_path / "backtest"
    for name in (*OUTPUTS, "report.html"):
        (folder / name).unlink()
        (folder / name).mkdir()
        before = files_under(folder)
        err = refusal(command, capsys)
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
        err = refusal(command, capsys)
        assert f"{taken} is a file" in err and phrase in err
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
        (
            ["--years", "2001", "--set", "env.execution_delay=0", "--set", "data.gap_before_validation=false"],
            "test year 2001: rollout.fitness_block_every",
        ),
        (["--folds", "0"], "--folds must be >= 1"),
        (["--jobs", "0"], "--jobs must be >= 1, got 0"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--name", "../up"], "--name must be a plain folder name"),
        (["--checkpoint-uri", "gs://bucket/x"], "local folder"),
        (["--set", "learner.gamma=2"], "learner.gamma"),
        pytest.param(
            ["--device", "cuda"],
            "no CUDA device",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA"),
        ),
    ],
)
def test_bad_backtest_input_is_one_line_and_writes_nothing(prices, tmp_path, capsys, args, phrase):
    err = refusal([*backtest_command(prices, tmp_path / "root"), *args], capsys)
    assert phrase in err, err
    assert not (tmp_path / "root").exists()
