"""``python main.py trade``: the champion's next orders from a data file that ends on the last close, with no
look-ahead: for a holdout day t, the file cut after t gives exactly the order ``evaluate`` recorded for t
(``weights.csv``), which saw the whole file; and what it refuses, in one line, writing nothing."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest

import main
from environment.prices import load_prices

pytestmark = pytest.mark.slow


def _long_frame() -> pd.DataFrame:
    """The bundled data's first six tickers from 2012, as a long file."""
    table = load_prices(None, max_assets=6, start="2012-01-03")
    dates = table.dates.strftime("%Y-%m-%d")
    n = len(table.tickers)
    return pd.DataFrame(
        {
            "date": np.repeat(dates, n),
            "ticker": np.tile(table.tickers, len(dates)),
            "close": table.prices.reshape(-1),
        }
    )


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A smoke run crowned on a long file (an agent, not equal weight), its evaluation, and the file."""
    root = tmp_path_factory.mktemp("trade")
    frame = _long_frame()
    data = root / "prices.csv"
    frame.to_csv(data, index=False)
    argv = ["--preset", "smoke", "--data", str(data), "--checkpoint-uri", str(root), "--run-name", "r", "--no-progress"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("training.loop.choose_champion", lambda edges, *_, **__: int(edges.argmax()))
        assert main.main([*argv, "--device", "cpu", "--generations", "2"]) == 0
    assert main.main(["evaluate", str(root / "r"), "--out", str(root / "report")]) == 0
    document = json.loads((root / "report" / "evaluation.json").read_text())
    with (root / "report" / "weights.csv").open() as f:
        weights = {row["date"]: row for row in csv.DictReader(f)}
    return root, frame, document, weights


def _trade(capsys, root, data, *args):
    capsys.readouterr()
    status = main.main(["trade", str(root / "r"), "--data", str(data), *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("day", [0, 9, 60, -1])
def test_the_file_cut_after_a_holdout_day_gives_evaluates_order_for_it(evaluated, capsys, tmp_path, day):
    root, frame, document, weights = evaluated
    holdout = document["ranges"]["holdout"]
    start = holdout["episode_starts"][0]  # evaluate's first holdout decision, from cash
    decisions = sorted(date for date in weights if date >= start)
    t = decisions[day]
    cut = tmp_path / "cut.csv"
    frame[frame["date"] <= t].to_csv(cut, index=False)
    status, out, err = _trade(capsys, root, cut, "--since", start, "--json", "--out", str(tmp_path / "orders"))
    assert status == 0, err
    orders = json.loads(out.strip().splitlines()[-1])
    assert orders["decided"] == t and orders["rebalances"]  # a daily book decides every day
    target = {row["ticker"]: row["target_weight"] for row in orders["orders"]}
    expected = weights[t]
    assert {name: float(expected[name]) for name in target} == target  # exactly: the same arithmetic on the same days
    written = list(csv.DictReader((tmp_path / "orders" / "orders.csv").open()))
    assert [row["ticker"] for row in written] == list(target)
    for row in written:
        assert float(row["trade"]) == pytest.approx(float(row["target_weight"]) - float(row["current_weight"]))


def test_holdings_replace_the_replay_and_a_bad_sum_is_refused(evaluated, capsys, tmp_path):
    root, frame, _, _ = evaluated
    tickers = list(dict.fromkeys(frame["ticker"]))
    held = pd.DataFrame({"ticker": ["cash", *tickers], "weight": [0.4, *([0.1] * 6)]})
    held.to_csv(tmp_path / "held.csv", index=False)
    data = tmp_path / "all.csv"
    frame.to_csv(data, index=False)
    status, out, err = _trade(
        capsys, root, data, "--holdings", str(tmp_path / "held.csv"), "--json", "--out", str(tmp_path)
    )
    assert status == 0, err
    seen = {row["ticker"]: row["current_weight"] for row in json.loads(out.strip().splitlines()[-1])["orders"]}
    assert seen == pytest.approx({"cash": 0.4, **dict.fromkeys(tickers, 0.1)})
    held.assign(weight=[0.41, *([0.1] * 6)]).to_csv(tmp_path / "bad.csv", index=False)
    out_dir = tmp_path / "refused"
    status, _, err = _trade(capsys, root, data, "--holdings", str(tmp_path / "bad.csv"), "--out", str(out_dir))
    assert status == 2 and "sum to 1.01" in err and len(err.strip().splitlines()) == 1
    assert not out_dir.exists()


def test_a_file_whose_history_differs_or_ends_too_early_is_refused(evaluated, capsys, tmp_path):
    root, frame, document, _ = evaluated
    out_dir = tmp_path / "refused"
    restated = frame.copy()
    restated.loc[6 * 300, "close"] *= 1.01  # a day the run traded
    restated.to_csv(tmp_path / "restated.csv", index=False)
    status, _, err = _trade(capsys, root, tmp_path / "restated.csv", "--out", str(out_dir))
    assert status == 2 and "differs from the run's data" in err and len(err.strip().splitlines()) == 1
    restated = frame.copy()
    restated.loc[6 * 20, "close"] *= 1.01  # a day of the features' warm-up: no return the run kept, its features
    restated.to_csv(tmp_path / "restated.csv", index=False)
    status, _, err = _trade(capsys, root, tmp_path / "restated.csv", "--out", str(out_dir))
    assert status == 2 and "differs from the run's data" in err and len(err.strip().splitlines()) == 1
    gone = frame[frame["ticker"] != frame["ticker"].iloc[0]]
    gone.to_csv(tmp_path / "gone.csv", index=False)
    status, _, err = _trade(capsys, root, tmp_path / "gone.csv", "--out", str(out_dir))
    assert status == 2 and "tickers" in err
    first_out = document["ranges"]["holdout"]["episode_starts"][0]
    frame[frame["date"] < first_out].to_csv(tmp_path / "early.csv", index=False)
    status, _, err = _trade(capsys, root, tmp_path / "early.csv", "--out", str(out_dir))
    assert status == 2 and "the first decision out of sample" in err
    assert not out_dir.exists()


def test_at_a_cadence_the_orders_say_whether_today_is_a_decision_day(evaluated, capsys, tmp_path):
    """A run rebalancing every 5 trading days: from --since, the 5th close after is a decision day, the 4th is not."""
    _, frame, document, _ = evaluated
    data = tmp_path / "prices.csv"
    frame.to_csv(data, index=False)
    argv = ["--preset", "smoke", "--data", str(data), "--checkpoint-uri", str(tmp_path), "--run-name", "k5"]
    assert (
        main.main([*argv, "--no-progress", "--device", "cpu", "--generations", "1", "--set", "env.rebalance_every=5"])
        == 0
    )
    dates = sorted(set(frame["date"]))
    start = document["ranges"]["holdout"]["episode_starts"][0]
    first = dates.index(start)
    for ahead, decides in ((4, False), (5, True)):
        cut = tmp_path / f"cut{ahead}.csv"
        frame[frame["date"] <= dates[first + ahead]].to_csv(cut, index=False)
        capsys.readouterr()
        status = main.main(
            ["trade", str(tmp_path / "k5"), "--data", str(cut), "--since", start, "--json", "--out", str(tmp_path)]
        )
        out, err = capsys.readouterr()
        assert status == 0, err
        assert json.loads(out.strip().splitlines()[-1])["rebalances"] is decides


def test_since_with_holdings_and_a_since_off_the_calendar_are_refused(evaluated, capsys, tmp_path):
    root, frame, _, _ = evaluated
    data = tmp_path / "all.csv"
    frame.to_csv(data, index=False)
    out_dir = tmp_path / "refused"
    status, _, err = _trade(capsys, root, data, "--since", "2022-01-03", "--holdings", "h.csv", "--out", str(out_dir))
    assert status == 2 and "not both" in err
    status, _, err = _trade(capsys, root, data, "--since", "2022-01-01", "--out", str(out_dir))
    assert status == 2 and "is not a trading day of the file" in err and len(err.strip().splitlines()) == 1
    assert not out_dir.exists()
