"""A backtest's report: the summary over every fold and seed, its table, and the files (``summary.json``,
``summary.csv``, ``backtest.png``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from config import SelectionConfig, describe_conventions
from offline.backtest.inference import family_verdict, pooled_test
from offline.backtest.results import STRATEGIES
from offline.holdout import INDEX
from offline.procedures import TRADER_NAMES, TRADERS
from persistence import committing

OUTPUTS = ("summary.json", "summary.csv", "backtest.png")
"""The report's files in the backtest's folder."""


def summarise(
    results: list[dict[str, Any]],
    *,
    trading: dict[str, Any] | None = None,
    alpha: float = SelectionConfig.alpha,
    min_edge: float = SelectionConfig.min_edge,
) -> dict[str, Any]:
    """The headline figures over every fold and seed (see the module docstring); ``trading``: the conventions the
    folds traded by (``config.conventions``), stated with them; ``alpha`` and ``min_edge``: the pooled test's level
    and the edge worth having (``selection.alpha``, ``selection.min_edge``).

    Raises:
        ValueError: two results of one fold (year and seed), which would count it twice.
    """
    folds = [(r["year"], r["seed"]) for r in results]
    repeated = next((fold for fold in folds if folds.count(fold) > 1), None)
    if repeated is not None:
        raise ValueError(f"test year {repeated[0]} seed {repeated[1]} is given twice")
    rows = [_fold_row(r) for r in results]
    diffs = [row["sharpe_difference"] for row in rows if row["sharpe_difference"] is not None]
    turnover = [(row["turnover"]["champion"], row["turnover"]["equal_weight"]) for row in rows]
    turnover = [pair for pair in turnover if None not in pair]  # (champion, equal weight) where both are known
    turnover_equal = sum(equal for _, equal in turnover)

    def mean_of(strategy: str) -> float | None:
        values = [row["sharpe"].get(strategy) for row in rows]
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    def known(key: str) -> list[float]:
        return [row[key] for row in rows if row[key] is not None]

    judged = [t for t in TRADERS if results and all(t in r["daily"] for r in results)]
    procedures = {
        t: {
            **pooled_test(results, alpha=alpha, min_edge=min_edge, trader=t, procedures=len(judged)),
            "members": _members(results, t),
            "mean_sharpe": mean_of(t),
            "mean_turnover": _mean([row["turnover"].get(t) for row in rows]),
            "mean_costs": _mean([row["costs"].get(t) for row in rows]),
        }
        for t in judged
    }
    return {
        "conventions": trading,
        "folds": rows,
        "mean_sharpe": {s: mean_of(s) for s in STRATEGIES},
        "sharpe_difference_mean": statistics.fmean(diffs) if diffs else None,
        "sharpe_difference_std": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
        "sharpe_difference_min": min(diffs) if diffs else None,
        "won": sum(d > 1e-9 for d in diffs) / len(diffs) if diffs else None,
        "tied": sum(abs(d) <= 1e-9 for d in diffs) / len(diffs) if diffs else None,
        "crowned": sum(row["crowned"] > 0 for row in rows) / len(rows) if rows else None,
        "crowned_folds": sum(row["crowned"] > 0 for row in rows),
        "deflated_sharpe_mean": statistics.fmean(known("deflated_sharpe")) if known("deflated_sharpe") else None,
        "deflated_sharpe_folds": len(known("deflated_sharpe")),
        "pbo_mean": statistics.fmean(known("pbo")) if known("pbo") else None,
        "pbo_folds": len(known("pbo")),
        "turnover_ratio": sum(champion for champion, _ in turnover) / turnover_equal if turnover_equal > 0 else None,
        # the champion's test, as summaries before the other procedures held it
        "pooled": procedures.get("champion"),  # every fold result holds the champion's days: None with no folds
        "traders": procedures,
        "family": family_verdict(results, judged, alpha=alpha) if judged else None,
    }


def _fold_row(result: dict[str, Any]) -> dict[str, Any]:
    """One fold's line of the summary: each strategy's figures, and the champion's Sharpe over equal weight's."""
    m = result["metrics"]
    sharpe, base = m["champion"]["sharpe"], m["equal_weight"]["sharpe"]
    return {
        "year": result["year"],
        "seed": result["seed"],
        "crowned": result["champion_generation"],
        "sharpe": {s: m[s]["sharpe"] for s in m},
        "total_return": {s: m[s]["total_return"] for s in m},
        "turnover": {s: m[s]["turnover"] for s in m},
        "costs": {s: m[s]["costs"] for s in m},
        "sharpe_difference": None if sharpe is None or base is None else sharpe - base,
        # None in fold results of earlier versions, and where the fold's history cannot give them
        "deflated_sharpe": result.get("deflated_sharpe"),
        "pbo": result.get("pbo"),
    }


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _members(results: list[dict[str, Any]], trader: str) -> str:
    """How many agents the procedure traded with, in words."""
    if trader == "champion":
        return "gated: equal weight where no agent was crowned"
    sizes = sorted({len(r.get("members", {}).get(trader, [])) for r in results} - {0})
    agents = "/".join(str(k) for k in sizes) or "?"
    return f"{agents} agent{'s' if sizes != [1] else ''} with the best validation return"


def fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _percent(value: float | None) -> float | None:
    return None if value is None else value * 100


def table(summary: dict[str, Any], *, benchmark: str | None = None) -> str:
    """The per-fold table and the summary lines; ``benchmark``: what the index column holds."""
    trading = summary.get("conventions")
    lines = [
        *([f"trading: {describe_conventions(trading)}"] if trading else []),
        *([f"index: {benchmark}"] if benchmark else []),
        f"{'test year':<10}{'seed':>5}{'crowned':>9}{'Sharpe':>9}{'eq. w.':>9}{'diff':>8}{'best':>7}{'ens.':>7}"
        f"{'untrained':>10}"
        f"{'index':>8}{'return':>9}{'eq. w.':>9}{'turnover':>10}{'eq. w.':>8}{'DSR':>6}{'PBO':>6}",
    ]
    for row in summary["folds"]:
        sharpe, ret, turn = row["sharpe"], row["total_return"], row["turnover"]
        lines.append(
            f"{row['year']:<10}{row['seed']:>5}{row['crowned'] or 'no':>9}{fmt(sharpe['champion'], '+.2f'):>9}"
            f"{fmt(sharpe['equal_weight'], '+.2f'):>9}{fmt(row['sharpe_difference'], '+.2f'):>8}"
            f"{fmt(sharpe.get('best_on_validation'), '+.2f'):>7}{fmt(sharpe.get('ensemble'), '+.2f'):>7}"
            f"{fmt(sharpe['untrained'], '+.2f'):>10}{fmt(sharpe.get(INDEX), '+.2f'):>8}"
            f"{fmt(_percent(ret['champion']), '+.1f'):>8}%{fmt(_percent(ret['equal_weight']), '+.1f'):>8}%"
            f"{fmt(turn['champion'], '.1f'):>9}x{fmt(turn['equal_weight'], '.1f'):>7}x"
            f"{fmt(row['deflated_sharpe'], '.2f'):>6}{fmt(row['pbo'], '.2f'):>6}"
        )
    mean = summary["mean_sharpe"]
    lines += [
        "",
        f"mean Sharpe: champion {fmt(mean['champion'], '+.2f')}, equal weight {fmt(mean['equal_weight'], '+.2f')}, "
        f"untrained {fmt(mean['untrained'], '+.2f')}, index {fmt(mean[INDEX], '+.2f')}",
        f"Sharpe difference to equal weight: mean {fmt(summary['sharpe_difference_mean'], '+.2f')}, "
        f"spread (stdev) {fmt(summary['sharpe_difference_std'], '.2f')}, "
        f"worst {fmt(summary['sharpe_difference_min'], '+.2f')}",
        f"folds won {fmt(summary['won'], '.0%')}, tied {fmt(summary['tied'], '.0%')} "
        f"(an agent was crowned in {fmt(summary['crowned'], '.0%')}; otherwise the champion is equal weight); "
        f"turnover {fmt(summary['turnover_ratio'], '.2f')}x equal weight's",
        _overfitting_line(summary),
        *(_pooled_lines(summary.get("pooled")) if not summary.get("traders") else []),  # earlier versions
        *_procedure_lines(summary),
    ]
    return "\n".join(lines)


def _procedure_lines(summary: dict[str, Any]) -> list[str]:
    """Each procedure's pooled test, then the family's verdict (which to deploy)."""
    traders = summary.get("traders") or {}
    lines: list[str] = []
    for trader, pooled in traders.items():
        sharpe, turnover = fmt(pooled["mean_sharpe"], "+.2f"), fmt(pooled["mean_turnover"], ".1f")
        costs = fmt(_percent(pooled["mean_costs"]), ".2f")
        lines += [
            "",
            f"{TRADER_NAMES.get(trader, trader)} ({pooled['members']}): mean Sharpe {sharpe}, turnover {turnover}x "
            f"a year, costs {costs}% a year (fold means)",
            *_pooled_lines(pooled),
        ]
    family = summary.get("family")
    if family:
        lines += ["", f"family of {len(family['traders'])} procedures ({family['method']}): {family['verdict']}"]
    return lines


def _overfitting_line(summary: dict[str, Any]) -> str:
    folds = len(summary["folds"])

    def mean(key: str) -> str:
        counted = summary[f"{key}_folds"]
        if not counted:
            return "n/a (no fold recorded it)"
        return f"{summary[f'{key}_mean']:.2f}" + ("" if counted == folds else f" (over {counted} of {folds} folds)")

    return (
        f"overfitting: an agent was crowned in {summary['crowned_folds']} of {folds} folds; "
        f"mean deflated Sharpe {mean('deflated_sharpe')} (the champion's where crowned, else the best candidate's), "
        f"mean PBO {mean('pbo')}"
    )


def _pooled_lines(pooled: dict[str, Any] | None) -> list[str]:
    """The pooled test (``offline.backtest.inference``): its figures, the deflated Sharpe ratio over every trial,
    and the verdict."""
    if pooled is None:
        return []
    seeds = f"{pooled['seeds']} seed{'s' if pooled['seeds'] != 1 else ''}"
    lines = [
        f"pooled test over every test day ({pooled['days']} days, {pooled['years']:.1f} years, {seeds} averaged per "
        f"day): mean excess over equal weight {fmt(_percent(pooled['mean_excess']), '+.2f')} log %/y"
    ]
    if pooled["p_value"] is not None:
        low, high = pooled["interval"]
        lines[0] += (
            f", {pooled['interval_level']:.0%} interval {_percent(low):+.2f} to {_percent(high):+.2f}, "
            f"t {fmt(pooled['t'], '+.2f')}, one-sided p {pooled['p_value']:.4f} (stationary bootstrap, mean block "
            f"{pooled['block_length']:.1f} days, {pooled['draws']} draws)"
        )
    return [*lines, pooled["deflated_sharpe_reading"], f"verdict: {pooled['verdict']}"]


def write_outputs(
    folder: Path, summary: dict[str, Any], results: list[dict[str, Any]], *, benchmark: str | None = None
) -> list[str]:
    """``summary.json``, ``summary.csv`` and ``backtest.png`` (walk-forward equity: the test years chained);
    ``benchmark``: what the index is."""
    from offline.plots import SeriesPanel, plot_equity

    committing.write_file_atomically(
        folder / "summary.json", (json.dumps(summary, indent=2, allow_nan=False) + "\n").encode()
    )
    with (folder / "summary.csv").open("w") as out:
        out.write("year,seed,crowned,strategy,sharpe,total_return,annual_turnover,deflated_sharpe,pbo\n")
        for row in summary["folds"]:
            diagnostics = ",".join("" if row[k] is None else str(row[k]) for k in ("deflated_sharpe", "pbo"))
            for s in row["sharpe"]:
                out.write(
                    f"{row['year']},{row['seed']},{row['crowned']},{s},{row['sharpe'][s]},"
                    f"{row['total_return'][s]},{row['turnover'][s]},{diagnostics}\n"
                )
    panels = []
    labels = {"champion": "champion", "untrained": "untrained (same seed)", "equal_weight": "equal weight, daily"}
    labels[INDEX] = benchmark or "index"
    for seed in sorted({r["seed"] for r in results}):
        chain = sorted((r for r in results if r["seed"] == seed), key=lambda r: r["year"])
        dates = [d for r in chain for d in r["test_dates"]]
        series = {}
        for strategy, label in labels.items():
            if all(strategy in r["daily"] for r in chain):
                log_returns = np.concatenate([r["daily"][strategy] for r in chain])
                series[label] = [1.0, *np.exp(np.cumsum(log_returns)).tolist()]
        years = ", ".join(str(r["year"]) for r in chain)
        panels.append(
            SeriesPanel(
                f"seed {seed}: test years {years} chained",
                [chain[0]["dates"]["gap"][1] if chain[0]["dates"]["gap"] else dates[0], *dates],
                series,
            )
        )
    plot_equity(
        folder / "backtest.png", panels, title="Walk-forward backtest: each year traded by a run trained before it"
    )
    return ["summary.json", "summary.csv", "backtest.png"]
