"""The book through the command line: a run on a long file with volume, then ``evaluate --json``: the exposure limits
from its JSON, the cadence from equal weight's turnover, the impact from its costs at two capital sizes."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import main

pytestmark = pytest.mark.slow


def _long_file(path, *, days: int = 900, assets: int = 6) -> None:
    rng = np.random.default_rng(3)
    dates = pd.bdate_range("2010-01-04", periods=days).strftime("%Y-%m-%d")
    prices = 40 * np.exp(np.cumsum(rng.normal(0.0002, 0.015, size=(days, assets)), axis=0))
    volume = rng.uniform(2e4, 6e4, size=(days, assets))
    pd.DataFrame(
        {
            "date": np.repeat(dates, assets),
            "ticker": np.tile([f"T{i}" for i in range(assets)], days),
            "close": prices.reshape(-1),
            "volume": volume.reshape(-1),
        }
    ).to_csv(path, index=False)


def _run_and_evaluate(tmp_path, capsys, name: str, *settings: str) -> dict:
    data = tmp_path / "prices.csv"
    if not data.exists():
        _long_file(data)
    argv = ["--preset", "smoke", "--data", str(data), "--checkpoint-uri", str(tmp_path), "--run-name", name]
    sets = [item for setting in settings for item in ("--set", setting)]
    assert main.main([*argv, "--no-progress", "--device", "cpu", "--generations", "1", *sets]) == 0
    capsys.readouterr()
    assert main.main(["evaluate", str(tmp_path / name), "--json", "--out", str(tmp_path / f"{name}-report")]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_a_long_short_run_at_a_cadence_keeps_its_limits_and_pays_for_its_size(tmp_path, capsys):
    book = ("env.book=long_short", "env.rebalance_every=5", "env.gross_leverage=1.5", "env.max_weight=0.4")
    book = (*book, "env.max_participation=1")  # no cap: the same trades at both sizes
    small = _run_and_evaluate(tmp_path, capsys, "small", *book, "env.capital=1e5")
    large = _run_and_evaluate(tmp_path, capsys, "large", *book, "env.capital=1.6e6")
    assert "long-short: gross <= 1.5" in small["conventions"]["book"]
    for document in (small, large):
        for name in ("validation", "holdout"):
            for strategy, figures in document["ranges"][name]["metrics"].items():
                if strategy == "index":
                    continue
                assert figures["max_gross_exposure"] <= 1.5 + 1e-5, (name, strategy)
                assert figures["min_weight"] >= -0.4 - 1e-5, (name, strategy)
                assert -1 - 1e-5 <= figures["net_exposure"] <= 1 + 1e-5
    # equal weight trades on the first of every 5 days, and less in all than a daily rebalance
    daily = _run_and_evaluate(tmp_path, capsys, "daily", "env.book=long_short", "env.capital=1e5")
    equal = {d: doc["ranges"]["holdout"]["metrics"]["equal_weight"] for d, doc in (("k5", small), ("k1", daily))}
    days = equal["k5"]["days"]
    assert equal["k5"]["trading_days"] == -(-days // 5) and equal["k1"]["trading_days"] == days
    assert equal["k5"]["turnover"] < equal["k1"]["turnover"]
    # the same trades at 16 times the capital pay sqrt(16) times the impact per unit of the book traded
    impact = {
        d: doc["ranges"]["holdout"]["metrics"]["equal_weight"]["impact_costs"]
        for d, doc in (("s", small), ("l", large))
    }
    assert impact["s"] > 0
    assert impact["l"] / impact["s"] == pytest.approx(4.0, rel=0.02)
