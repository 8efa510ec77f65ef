"""``backtest``'s page: the summary's figures, each procedure's test and the family's verdict, then the test years
chained per seed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from config import describe_conventions
from offline.holdout import INDEX
from offline.procedures import TRADERS
from offline.tearsheet.sheet import Part, Sheet, Table, Verdict, fixed, percent, ratio, scalar_rows


def _fold_rows(summary: Mapping[str, Any], labels: Mapping[str, str]) -> Table:
    strategies = [s for s in ("champion", "equal_weight", "untrained", INDEX) if s in labels]
    header = ["test year", "seed", "crowned", *(f"Sharpe: {labels[s]}" for s in strategies), "difference", "DSR", "PBO"]
    rows = []
    for fold in summary.get("folds", []):
        sharpe = fold.get("sharpe", {})
        rows.append(
            [
                str(fold.get("year")),
                str(fold.get("seed")),
                f"generation {fold['crowned']}" if fold.get("crowned") else "no",
                *(ratio(sharpe.get(s)) for s in strategies),
                ratio(fold.get("sharpe_difference")),
                fixed(fold.get("deflated_sharpe")),
                fixed(fold.get("pbo")),
            ]
        )
    return Table(header, rows, "Each test year and seed (summary.json: folds)")


def backtest_verdict(summary: Mapping[str, Any], labels: Mapping[str, str]) -> Verdict:
    """The summary's figures (``offline.backtest.report.summarise``), read with ``.get`` so that a summary of another
    version still renders; its ``pooled`` object, where present, as its verdict sentence and its scalar fields."""
    sentences = []
    mean = summary.get("mean_sharpe", {})
    sentences.append(
        "mean Sharpe: " + ", ".join(f"{labels.get(s, s)} {ratio(v)}" for s, v in mean.items() if v is not None)
    )
    figures = [
        ["Sharpe difference to equal weight, mean", ratio(summary.get("sharpe_difference_mean"))],
        ["Sharpe difference, spread (stdev)", fixed(summary.get("sharpe_difference_std"))],
        ["Sharpe difference, worst fold", ratio(summary.get("sharpe_difference_min"))],
        ["folds won", percent(summary.get("won"), 0).lstrip("+")],
        ["folds tied", percent(summary.get("tied"), 0).lstrip("+")],
        ["folds where an agent was crowned", percent(summary.get("crowned"), 0).lstrip("+")],
        ["mean deflated Sharpe ratio", fixed(summary.get("deflated_sharpe_mean"))],
        ["mean PBO", fixed(summary.get("pbo_mean"))],
        ["turnover over equal weight's", fixed(summary.get("turnover_ratio"))],
    ]
    tables = [
        Table(["figure", "value"], figures, "Over every fold and seed (summary.json)"),
        _fold_rows(summary, labels),
    ]
    traders = summary.get("traders")
    family = summary.get("family")
    if isinstance(traders, Mapping) and traders:
        for trader, pooled in traders.items():
            if isinstance(pooled, Mapping) and pooled.get("verdict"):
                sentences.append(f"{labels.get(trader, trader)}: {pooled['verdict']}")
        if isinstance(family, Mapping) and family.get("verdict"):
            sentences.append(f"which to deploy ({family.get('method', 'family')}): {family['verdict']}")
        tables.append(_procedure_rows(traders, family if isinstance(family, Mapping) else {}, labels))
        return Verdict("Backtest summary", sentences, tables)
    pooled = summary.get("pooled")  # a summary of an earlier version: the champion's test alone
    if isinstance(pooled, Mapping):
        if pooled.get("verdict"):
            sentences.append(f"pooled test: {pooled['verdict']}")
        known = {k: v for k, v in pooled.items() if v is not None}  # a figure not computed is left out, not n/a
        tables.append(
            Table(["figure", "value"], scalar_rows(known, skip=("verdict",)), "The pooled test (summary.json: pooled)")
        )
    return Verdict("Backtest summary", sentences, tables)


def _procedure_rows(traders: Mapping[str, Any], family: Mapping[str, Any], labels: Mapping[str, str]) -> Table:
    """One row per procedure: its pooled test over every test day, the family's adjusted p-value, what it traded."""
    adjusted = family.get("adjusted_p") or {}
    header = [
        "procedure",
        "mean excess, log %/y",
        "90% interval",
        "t",
        "one-sided p",
        "family-adjusted p",
        "turnover a year",
        "costs a year",
        "deflated Sharpe",
    ]
    rows = []
    for trader, pooled in traders.items():
        interval = pooled.get("interval")
        rows.append(
            [
                labels.get(trader, trader),
                _percent_points(pooled.get("mean_excess")),
                "not tested" if not interval else f"{interval[0] * 100:+.2f} to {interval[1] * 100:+.2f}",
                "not tested" if pooled.get("t") is None else f"{pooled['t']:+.2f}",
                "not tested" if pooled.get("p_value") is None else f"{pooled['p_value']:.4f}",
                "not tested" if adjusted.get(trader) is None else f"{adjusted[trader]:.4f}",
                "n/a" if pooled.get("mean_turnover") is None else f"{pooled['mean_turnover']:.1f}x",
                "n/a" if pooled.get("mean_costs") is None else f"{100 * pooled['mean_costs']:.2f}%",
                "n/a" if pooled.get("deflated_sharpe") is None else f"{pooled['deflated_sharpe']:.2f}",
            ]
        )
    return Table(header, rows, "Each procedure over every test day (summary.json: traders, family)")


def _percent_points(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:+.2f}"


TRADED = ("turnover per year", "costs")


def _yearly(figures: Mapping[str, Any]) -> tuple[str, str]:
    """A fold's turnover per year and costs (of starting capital) of one strategy, from its metrics."""
    turnover, costs = figures.get("turnover"), figures.get("costs")
    return (
        "n/a" if turnover is None else f"{turnover:.1f}x",
        "n/a" if costs is None else f"{100 * costs:.2f}%",
    )


def backtest_sheet(
    summary: Mapping[str, Any], results: Sequence[Mapping[str, Any]], *, labels: Mapping[str, str], title: str
) -> Sheet:
    """``backtest``'s page: the summary's figures, then per seed its test years chained (every test day traded by
    the champion of a run trained before that year, against the baselines on the same days).

    Args:
        summary: ``offline.backtest.report.summarise``'s answer (its ``pooled`` object rendered where present).
        results: The fold results (``offline.backtest.results.run_fold``), as they read back from their files.
        labels: Strategy -> name, the index by what it is.
    """
    order = (*TRADERS, "untrained", "equal_weight", "buy_and_hold", "cash", INDEX)
    parts = []
    shown: dict[bytes, int] = {}  # seeds whose chains trade the very same days the very same way show once
    for seed in sorted({r["seed"] for r in results}):
        chain = sorted((r for r in results if r["seed"] == seed), key=lambda r: r["year"])
        strategies = [s for s in order if all(s in r["daily"] for r in chain)]
        traders = [s for s in TRADERS if s in strategies]
        dates = [d for r in chain for d in r["test_dates"]]
        spans = chain[0]["dates"]
        years = [r["year"] for r in chain]
        consecutive = years == list(range(years[0], years[-1] + 1))
        note = (
            f"Seed {seed}: each test year traded from cash by the champion of a run trained on the years before it"
            + ("" if consecutive else "; the years are not consecutive: the days between them are not traded")
            + "."
        )
        log_returns = {
            s: np.concatenate([np.asarray(r["daily"][s], dtype=np.float64) for r in chain]) for s in strategies
        }
        turnover_rows = [
            [str(r["year"]), *(_yearly(r["metrics"].get(s, {})) for s in (*traders, "equal_weight"))] for r in chain
        ]
        same = json.dumps([dates, {s: v.tolist() for s, v in log_returns.items()}, turnover_rows]).encode()
        if same in shown:
            earlier = parts[shown[same]]
            named, rest = earlier.title.split(":", 1)
            parts[shown[same]] = dataclasses.replace(
                earlier,
                title=f"Seeds {named.removeprefix('Seeds ').removeprefix('Seed ')}, {seed}:{rest}",
                note=f"{earlier.note} Seed {seed} traded every test day exactly the same way: shown once.",
            )
            continue
        shown[same] = len(parts)
        part = Part(
            title=f"Seed {seed}: test years {', '.join(map(str, years))} chained",
            note=note,
            dates=dates,
            start=(spans.get("gap") or spans["validation"])[1],
            after=None,
            log_returns=log_returns,
            cash_returns=log_returns.get("cash"),
            trading_note="The fold results keep each strategy's daily log returns, not its daily weights or "
            "trades; each test year's turnover and costs:",
            trading_table=Table(
                ["test year", *(f"{what}: {labels[s]}" for s in (*traders, "equal_weight") for what in TRADED)],
                [[row[0], *(cell for pair in row[1:] for cell in pair)] for row in turnover_rows],
            ),
        )
        parts.append(part)
    years = sorted({r["year"] for r in results})
    seeds = sorted({r["seed"] for r in results})
    lines = [
        f"{len(results)} folds: test years {', '.join(map(str, years))}, seeds {', '.join(map(str, seeds))}; each "
        "fold a run trained on the years before its test year, its champion chosen on its own validation range."
    ]
    if summary.get("conventions"):
        lines.append(f"trading: {describe_conventions(summary['conventions'])}")
    return Sheet(title, lines, labels, backtest_verdict(summary, labels), parts)
