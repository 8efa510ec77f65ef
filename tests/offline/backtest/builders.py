"""What the backtest tests build: a small config, the command line, a listing of files, fold results; and the
check that a command was refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import main
from config import override, preset
from offline.backtest.results import STRATEGIES

ROOT = Path(__file__).resolve().parents[3]


def small_config(prices: Path):
    return override(
        preset("smoke"),
        {"data.path": str(prices), "data.tickers": (), "data.start": "", "data.validation_days": 126},
    )


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


def refusal(command: list[str], capsys) -> str:
    """Run ``command``: it must exit with status 2, print nothing to stdout and one line to stderr; that line."""
    assert main.main(command) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    return err


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


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
