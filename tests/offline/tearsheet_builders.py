"""What the tear sheet's tests build: a market calendar, an evaluation's two ranges (seeded random days) and a
backtest's fold results with its summary, without training anything."""

from __future__ import annotations

import numpy as np
import pandas as pd

from environment.prices import BUNDLED_BENCHMARK_LABEL
from offline import tearsheet
from offline.backtest.report import summarise
from offline.evaluate import LABELS
from offline.holdout import INDEX, RangeResult, Trace
from offline.risk import risk_metrics

TICKERS = ("AAA", "BBB", "CCC")
STRATEGIES = ("champion", "untrained", "equal_weight", "buy_and_hold", "cash", INDEX)
PROCEDURES = ("best_on_validation", "ensemble")
"""What a backtest's folds trade beside the champion (``offline.procedures``)."""
WITH_INDEX = {**LABELS, INDEX: BUNDLED_BENCHMARK_LABEL}
CASH_DAILY = 1e-4


def calendar(first: str = "2019-01-02", days: int = 900) -> list[str]:
    """Weekdays from ``first``: the market's trading days."""
    return [d.date().isoformat() for d in pd.bdate_range(first, periods=days)]


def range_result(name: str, days: list[str], *, seed: int, index: bool = True, cash: float = CASH_DAILY) -> RangeResult:
    """Every strategy on ``days``: seeded normal log returns, Dirichlet weights and turnover; cash earns ``cash`` a
    day; the index without weights or trades."""
    generator = np.random.default_rng(seed)
    count = len(days)
    traces = {}
    for strategy in STRATEGIES if index else STRATEGIES[:-1]:
        if strategy == "cash":
            traces[strategy] = Trace(np.full(count, cash), np.zeros(count), np.zeros(count), np.eye(4)[[0] * count])
            continue
        returns = generator.normal(4e-4, 0.01, count)
        if strategy == INDEX:
            traces[strategy] = Trace(returns, np.zeros(count), np.zeros(count), None)
            continue
        turnover = generator.uniform(0.0, 0.3, count)
        weights = generator.dirichlet(np.ones(len(TICKERS) + 1), count)  # (D, N + 1)
        traces[strategy] = Trace(returns, turnover, 5e-4 * turnover, weights)
    cash_returns = traces["cash"].log_returns
    metrics = {
        s: risk_metrics(t.log_returns, turnover=t.turnover, costs=t.costs, risk_free=cash_returns)
        for s, t in traces.items()
    }
    return RangeResult(name, days, [days[0]], traces, metrics, cash_returns)


def evaluation_results(
    market: list[str], *, validation: int = 300, holdout: int = 126, index: bool = True
) -> dict[str, RangeResult]:
    """The validation range, then the holdout up to the market's last day (which ends inside a month)."""
    holdout_days = market[-holdout:]
    validation_days = market[-holdout - validation : -holdout]
    return {
        "validation": range_result("validation", validation_days, seed=1, index=index),
        "holdout": range_result("holdout", holdout_days, seed=2, index=index),
    }


def evaluation_sheet(*, index: bool = True, holdout: int = 126, validation: int = 300) -> tearsheet.Sheet:
    market = calendar()
    return tearsheet.evaluation_sheet(
        evaluation_results(market, validation=validation, holdout=holdout, index=index),
        labels=WITH_INDEX if index else LABELS,
        tickers=TICKERS,
        calendar=market,
        title="Tear sheet: champion of runs/r (generation 3)",
        lines=["champion of runs/r (generation 3)", "trading: fills 1 trading day after the decision"],
        overfitting={
            "deflated_sharpe": 0.42,
            "deflated_sharpe_of": "champion",
            "trials": 12,
            "deflated_sharpe_reading": "deflated Sharpe 0.42: no evidence of skill",
            "pbo": 0.31,
            "pbo_reading": "PBO 0.31: choosing by validation return here is partly luck",
            "pbo_splits": 12870,
        },
        selection="selection: the champion was proven in generation 3",
    )


def fold_result(year: int, seed: int) -> dict:
    """A fold's result as ``run_fold`` writes it, with a whole test year of seeded daily returns."""
    generator = np.random.default_rng(year * 10 + seed)
    days = [d for d in calendar(f"{year}-01-01", 262) if d.startswith(str(year))]
    strategies = (*STRATEGIES[:1], *PROCEDURES, *STRATEGIES[1:])
    daily = {s: generator.normal(3e-4, 0.01, len(days)).tolist() for s in strategies}
    daily["cash"] = [CASH_DAILY] * len(days)
    figures = {"total_return": 0.1, "sharpe": 1.0, "max_drawdown": 0.1, "turnover": 4.0, "costs": 0.002}
    metrics = {s: {**figures, "sharpe": 1.0 + 0.1 * i} for i, s in enumerate(strategies)}
    metrics["cash"] = {**figures, "sharpe": None, "turnover": 0.0, "costs": 0.0}
    gap = [f"{year - 1}-12-20", f"{year - 1}-12-31"]
    return {
        "year": year,
        "seed": seed,
        "champion_generation": 2 if seed else 0,
        "deflated_sharpe": 0.6,
        "pbo": 0.3,
        "metrics": metrics,
        "dates": {"train": ["2010-01-04", "2015-12-31"], "validation": ["2016-01-04", "2017-12-29"], "gap": gap},
        "daily": daily,
        "test_dates": days,
    }


def backtest_inputs(pooled: dict | None = None) -> tuple[dict, list[dict]]:
    """Two seeds over the test years 2019 and 2020: the summary and the fold results. The summary's ``pooled``
    object is the one given, or none at all (a summary written before the pooled test existed)."""
    results = [fold_result(year, seed) for year in (2019, 2020) for seed in (0, 1)]
    summary = summarise(
        results,
        trading={
            "execution_delay": 1,
            "universe": "common",
            "features": ["builtin"],
            "cash": 0.0,
            "benchmark": "bundled",
        },
    )
    for key in ("pooled", "traders", "family"):  # as written before the procedures and their tests
        summary.pop(key)
    if pooled is not None:
        summary["pooled"] = pooled
    return summary, results


POOLED = {
    "verdict": "no edge over equal weight is proven on the 1,004 test days (pooled over seeds)",
    "days": 1004,
    "edge": -0.012,
    "t": -0.4,
    "proven": False,
    "blocks": [1, 2, 3],
}
"""A pooled test as the summary may hold it: a verdict, scalars, and a list the page leaves out."""


def backtest_sheet(pooled: dict | None = POOLED) -> tearsheet.Sheet:
    summary, results = backtest_inputs(pooled)
    return tearsheet.backtest_sheet(summary, results, labels=WITH_INDEX, title="Tear sheet: walk-forward backtest b")
