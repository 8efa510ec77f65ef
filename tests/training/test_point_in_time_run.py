"""A user's long file whose tickers list, pause and delist mid-sample, with columns of its own: a run trains on all of
its days, sees only what it could have traded, and every command says how it traded."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

import main
from environment.features import TRADABLE, WARMUP_DAYS
from persistence import checkpoint

DAYS = 1300
LISTS, DELISTS, PAUSE = 300, 1000, range(600, 620)  # D lists late, E delists, B pauses for 20 days


@pytest.fixture(scope="module")
def long_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    dates = pd.bdate_range("2001-01-01", periods=DAYS)
    rows = []
    for i, ticker in enumerate("ABCDE"):
        price = 30.0 * np.exp(np.cumsum(rng.normal(0.0003, 0.012, DAYS)))
        alive = np.ones(DAYS, dtype=bool)
        alive[:LISTS] &= ticker != "D"
        alive[DELISTS:] &= ticker != "E"
        if ticker == "B":
            alive[PAUSE.start : PAUSE.stop] = False
        for day in np.flatnonzero(alive):
            rows.append((dates[day].strftime("%Y-%m-%d"), ticker, price[day], 1e6 * (1 + i), rng.normal()))
    frame = pd.DataFrame(rows, columns=["date", "ticker", "close", "volume", "signal"])
    path = tmp_path_factory.mktemp("data") / "universe.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def run(long_file, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    argv = ["--preset", "smoke", "--data", str(long_file), "--checkpoint-uri", str(root), "--run-name", "r"]
    argv += ["--no-progress", "--device", "cpu", "--generations", "2", "--set", "data.features=builtin,signal"]
    argv += ["--set", "data.max_fill_days=5", "--set", "env.cash_rate=0.02"]
    return root / "r", argv


def test_a_run_trains_on_every_day_of_the_file_and_says_what_it_trades(run, capsys):
    run_dir, argv = run
    assert main.main(argv) == 0
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert f"5 assets x {DAYS - WARMUP_DAYS} days" in first  # not cut to the dates every ticker has
    tradable = 1 - (LISTS + (DAYS - DELISTS) + len(PAUSE)) / (5 * DAYS)  # of the rows the market keeps, about
    share = float(first.split("days, ")[1].split("%")[0]) / 100
    assert share == pytest.approx(tradable, abs=0.02) and share < 1
    assert "fills 1 trading day after the decision | universe point_in_time | features builtin,signal" in out
    assert "cash earns 2%/y" in out
    # The first lines say what the panel became: its dates after the warm-up, and the tickers whose lives are short.
    dates = pd.bdate_range("2001-01-01", periods=DAYS).strftime("%Y-%m-%d")
    assert f"{dates[WARMUP_DAYS]} to {dates[-1]} after {WARMUP_DAYS} warm-up days" in first
    universe = next(line for line in out.splitlines() if line.startswith("universe:"))
    assert (
        f"listing late 1 (D on {dates[LISTS]})" in universe
        and f"delisting 1 (E after {dates[DELISTS - 1]})" in universe
    )
    assert "halting 1 (B: 1 gap, 20 days)" in universe
    state = checkpoint.read_document(checkpoint.open_generation(run_dir), "state")
    assert state["config"]["env"]["execution_delay"] == 1


@pytest.mark.slow
def test_evaluate_inspect_and_export_state_the_conventions_and_features(run, capsys, tmp_path):
    run_dir, argv = run
    if not run_dir.exists():  # trained by the test above; alone (``-m slow``) this one trains it
        assert main.main(argv) == 0
    capsys.readouterr()
    assert main.main(["inspect", str(run_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["conventions"]["execution_delay"] == 1 and report["conventions"]["universe"] == "point_in_time"
    assert main.main(["evaluate", str(run_dir), "--json", "--out", str(tmp_path / "evaluation")]) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["conventions"]["features"] == ["builtin", "signal"]
    holdout = evaluation["ranges"]["holdout"]["metrics"]
    assert all(m["total_return"] is not None and np.isfinite(m["total_return"]) for m in holdout.values())
    assert "index" not in holdout  # a user's file has no benchmark unless one is given
    assert main.main(["export", str(run_dir), str(tmp_path / "export")]) == 0
    spec = json.loads((tmp_path / "export" / "actor.json").read_text())
    assert spec["feature_names"][-2:] == ["signal", TRADABLE] and spec["execution_delay"] == 1
    assert "column 'signal'" in spec["feature_definitions"]["signal"] and spec["tradable"] is True
    assert "t + 1" in spec["action"]["meaning"]


def test_the_champion_never_holds_an_asset_on_a_day_it_cannot_trade(run, tmp_path):
    from offline.evaluate import load_champion
    from offline.holdout import score_champion

    run_dir, _ = run
    champion = load_champion(str(run_dir), tmp_path)
    market = champion.market
    assert market.tradable is not None
    results = score_champion(market, champion.config, champion.actor)
    for name, result in results.items():
        days = getattr(market.splits, name)
        decided = torch.arange(days.start, days.stop) - 1 - champion.config.env.execution_delay
        untradable = ~market.tradable[decided].numpy()  # at each decision
        for strategy in ("champion", "untrained", "equal_weight"):
            held = result.traces[strategy].weights[:, 1:]
            assert (held[untradable] == 0).all(), (name, strategy)


@pytest.mark.slow
def test_a_benchmark_file_is_the_index_and_named_for_what_it_is(run, capsys, tmp_path, long_file):
    run_dir, _ = run
    dates = pd.bdate_range("2001-01-01", periods=DAYS)
    levels = pd.DataFrame({"date": dates.strftime("%Y-%m-%d"), "level": 100 * np.exp(np.arange(DAYS) * 1e-4)})
    benchmark = tmp_path / "total_return.csv"
    levels.to_csv(benchmark, index=False)
    args = ["evaluate", str(run_dir), "--json", "--out", str(tmp_path / "e"), "--benchmark", str(benchmark)]
    assert main.main(args) == 0
    evaluation = json.loads(capsys.readouterr().out)
    assert evaluation["strategies"]["index"] == "total_return.csv (total return)"
    index = evaluation["ranges"]["holdout"]["metrics"]["index"]
    days = index["days"]
    assert index["total_return"] == pytest.approx(np.expm1(days * 1e-4), rel=1e-3)  # float32 relatives


def test_resuming_with_another_delay_is_refused_and_writes_nothing(run, capsys):
    run_dir, _ = run
    before = sorted(path.relative_to(run_dir) for path in run_dir.rglob("*"))
    resume = ["--resume", "--checkpoint-uri", str(run_dir.parent), "--run-name", "r", "--no-progress"]
    assert main.main([*resume, "--set", "env.execution_delay=0"]) == 2
    assert "env.execution_delay is 1 in r, not 0" in capsys.readouterr().err
    assert sorted(path.relative_to(run_dir) for path in run_dir.rglob("*")) == before


def test_a_size_limit_says_which_tickers_it_left_out(long_file, tmp_path, capsys):
    """The smoke preset keeps a file's first data.max_assets tickers (6): a file of 5 keeps all and says nothing, one
    of 8 names the 2 it leaves out."""
    rows = pd.read_csv(long_file)
    wide = pd.concat([rows, rows.assign(ticker=rows["ticker"].map(lambda t: t + "2"))])
    path = tmp_path / "eight.csv"
    wide[wide["ticker"].isin(["A", "B", "C", "D", "E", "A2", "B2", "C2"])].to_csv(path, index=False)
    for name, data, said in (("five", long_file, None), ("eight", path, "left out: B2, C2")):
        argv = ["--preset", "smoke", "--data", str(data), "--checkpoint-uri", str(tmp_path / "runs"), "--no-progress"]
        argv += ["--run-name", name]  # two runs in one second would share a timestamp's name
        assert main.main([*argv, "--device", "cpu", "--generations", "1"]) == 0
        notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("data: data.max_assets")]
        assert (notes == []) if said is None else (len(notes) == 1 and said in notes[0] and "6 of 8" in notes[0])
