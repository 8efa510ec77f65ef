"""A fold's result: its run trained to the end, its champion scored on the test year with the baselines, and the
result file (``folds/fold-YEAR-seed-S.json``) checked key by key before it is read back."""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config import override
from offline.backtest.plan import Fold
from offline.holdout import INDEX, score_traders
from offline.overfitting import diagnose
from offline.procedures import TRADERS, traders
from offline.risk import METRICS
from persistence import checkpoint, committing, jsonl
from persistence.generation_contents import read_state
from run.launch import train_to_end
from utils.errors import CheckpointError, ConfigError

STRATEGIES = (*TRADERS, "untrained", "equal_weight", "buy_and_hold", "cash", INDEX)
"""What each fold scores on its test year, in table order: the procedures (``offline.procedures``), then the
baselines."""
SCORED = ("champion", "untrained", "equal_weight", "buy_and_hold", "cash")
"""The strategies every fold result holds (the other procedures from this version on, the index only where the
data has one)."""
REQUIRED = ("total_return", "sharpe", "max_drawdown", "turnover", "costs")
"""The figures every fold result holds (results of this version hold every one of ``offline.risk.METRICS``)."""


def result_path(folder: Path, fold: Fold) -> Path:
    return folder / "folds" / f"{fold.name}.json"


def stored_result(folder: Path, fold: Fold) -> tuple[dict[str, Any] | None, str | None]:
    """The fold's finished result, checked before use: ``(result, None)``; ``(None, why)`` when the file is damaged
    and the fold's run has a checkpoint to recompute it from; ``(None, None)`` when the fold has no result yet.

    Raises:
        ConfigError: the fold was trained on another market than the data gives it now (its result's fingerprint,
            else its run's checkpoint's, differs from ``fold.fingerprint``); the file is damaged and no run is
            left to recompute it from; a folder stands where the file goes, or a file where the run goes.
    """
    path = result_path(folder, fold)
    run_dir = folder / fold.name
    result, problem = None, None
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a fold result; move it away and run the same command again")
    if path.exists() or path.is_symlink():
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as error:
            problem = f"not JSON: {error}"
        else:
            problem = result_problem(result, fold)
        if problem is None and not set(TRADERS) <= result["metrics"].keys() and _has_checkpoint(run_dir):
            problem = "it records only the champion's procedure (an earlier version): scored again from the run"
        if problem is not None:
            result = None
    if result is None and (run_dir.exists() or run_dir.is_symlink()) and not run_dir.is_dir():
        raise ConfigError(
            f"{run_dir} is a file, not the fold's run folder; move it away and run the same command again"
        )
    recorded, source = (result.get("market_fingerprint"), path) if result is not None else (None, path)
    if recorded is None:
        recorded, source = _run_market(run_dir), run_dir
    if recorded is not None and recorded != fold.fingerprint:
        data = fold.config.data.path or "the bundled data set"
        raise ConfigError(
            f"the data changed: {data} no longer gives test year {fold.year} the market {fold.name} was trained on "
            f"({source} records market fingerprint {recorded[:12]}, the data now gives {fold.fingerprint[:12]}); "
            "continue the backtest on the data it was started with, or use another --name for this data"
        )
    if problem is not None and not _has_checkpoint(run_dir):
        raise ConfigError(
            f"{path} is not a valid fold result ({problem}) and the fold's run {run_dir} has no checkpoint to "
            "recompute it from; delete the file to train the fold again"
        )
    return result, problem


def _has_checkpoint(run_dir: Path) -> bool:
    return run_dir.is_dir() and checkpoint.latest_generation(run_dir) is not None


def _run_market(run_dir: Path) -> str | None:
    """The market fingerprint the run's latest complete checkpoint records; None without a readable one (resuming
    the run then reports the damage)."""
    try:
        return read_state(checkpoint.open_generation(run_dir))["market_fingerprint"]  # checked: a string
    except CheckpointError:
        return None


def result_problem(result: Any, fold: Fold) -> str | None:
    """What makes ``result`` unfit to be ``fold``'s result in the summary, table and plot (None: nothing): every key
    they read, with its type."""
    if not isinstance(result, dict):
        return f"a JSON {_json_type(result)}, not an object"
    for key, wanted in (("year", fold.year), ("seed", fold.seed)):
        if type(result.get(key)) is not int or result[key] != wanted:
            return f"{key} is {result.get(key)!r}, not {wanted}"
    generation = result.get("champion_generation")
    if type(generation) is not int or generation < 0:
        return f"champion_generation is {generation!r}, not a generation number"
    for key in ("deflated_sharpe", "pbo"):  # absent from results of earlier versions
        if result.get(key) is not None and not _is_number(result[key]):
            return f"{key} is {result[key]!r}, not a number"
    diagnostics = result.get("diagnostics")  # absent from results of earlier versions
    if diagnostics is not None:
        problem = _diagnostics_problem(diagnostics)
        if problem is not None:
            return problem
    if not isinstance(result.get("market_fingerprint", ""), str):
        return "market_fingerprint is not a string"
    metrics = result.get("metrics")
    if not isinstance(metrics, dict) or not set(SCORED) <= metrics.keys() <= set(STRATEGIES):
        return f"metrics must hold the figures of {', '.join(SCORED)} (and {INDEX} where the data has it)"
    for strategy, figures in metrics.items():
        if (
            not isinstance(figures, dict)
            or not all(key in figures and (figures[key] is None or _is_number(figures[key])) for key in REQUIRED)
            or not all(figures[key] is None or _is_number(figures[key]) for key in figures)
        ):
            return f"metrics.{strategy} must hold {', '.join(REQUIRED)}, each a number or null"
    test_dates = result.get("test_dates")
    if not isinstance(test_dates, list) or not test_dates or not all(_is_day(d, fold.year) for d in test_dates):
        return f"test_dates must list the days of {fold.year}"
    daily = result.get("daily")
    if not isinstance(daily, dict) or not daily.keys() <= set(STRATEGIES):
        return "daily must map strategies to their daily log returns"
    if not {"champion", "equal_weight"} <= daily.keys():  # the pooled test's excess
        return "daily must hold the champion's and equal weight's log returns"
    if not {t for t in TRADERS if t in metrics} <= daily.keys():
        return "daily must hold the log returns of every procedure the metrics score"
    members = result.get("members", {})  # absent from results of earlier versions
    if not isinstance(members, dict) or not all(
        isinstance(v, list) and v and all(type(i) is int and i >= 0 for i in v) for v in members.values()
    ):
        return "members must map procedures to the population indices they trade with"
    for strategy, returns in daily.items():
        if not isinstance(returns, list) or len(returns) != len(test_dates) or not all(map(_is_number, returns)):
            return f"daily.{strategy} must hold one log return per test day"
    dates = result.get("dates")
    if not isinstance(dates, dict) or not all(_is_span(dates.get(k)) for k in ("train", "validation", "test")):
        return "dates must give the first and last day of train, validation and test"
    if dates.get("gap") is not None and not _is_span(dates["gap"]):
        return "dates.gap must give its first and last day, or be null"
    return None


def _diagnostics_problem(diagnostics: Any) -> str | None:
    """What the pooled test's deflated Sharpe ratio reads of a fold's diagnostics (each may be null: no history)."""
    if not isinstance(diagnostics, dict):
        return "diagnostics is not an object"
    for key, least in (("trials", 1), ("days", 2)):
        value = diagnostics.get(key)
        if value is not None and (type(value) is not int or value < least):
            return f"diagnostics.{key} is {value!r}, not a count >= {least}"
    variance = diagnostics.get("trial_sharpe_variance")
    if variance is not None and not (_is_number(variance) and variance >= 0):
        return f"diagnostics.trial_sharpe_variance is {variance!r}, not a number >= 0"
    return None


def _json_type(value: Any) -> str:
    names = {list: "array", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_day(value: Any, year: int | None = None) -> bool:
    try:
        day = dt.date.fromisoformat(value) if isinstance(value, str) and len(value) == 10 else None
    except ValueError:
        day = None
    return day is not None and (year is None or day.year == year)


def _is_span(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(map(_is_day, value))


def run_fold(
    folder: Path,
    fold: Fold,
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    on_generation: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train the fold's run (or finish it) and score its champion on the test year; the result is also written
    to ``folder/folds/NAME.json`` and read back from there next time."""
    stored, _ = stored_result(folder, fold)
    if stored is not None:
        return stored
    config = override(
        fold.config,
        {"checkpoint.uri": str(folder), "checkpoint.run_name": fold.name, "runtime.progress": False},
    )
    trainer = train_to_end(config, log=log, should_stop=should_stop, on_generation=on_generation)
    if trainer.fingerprint != fold.fingerprint:
        raise ConfigError(f"the data changed while the backtest ran: test year {fold.year} has another market now")
    market = trainer.market
    found, chosen = traders(market, config, trainer.population.champion, trainer.population.actor)
    results = score_traders(market, config, found)
    test = results["holdout"]
    validation = results["validation"].traces
    overfitting = diagnose(
        jsonl.read_rows(trainer.checkpoints.metrics_path),
        validation["champion"].log_returns - validation["equal_weight"].log_returns,
        crowned=trainer.champion.generation > 0,
    )
    splits = market.splits
    result = {
        "year": fold.year,
        "seed": fold.seed,
        "dates": {
            "train": [market.dates[splits.train.start], market.dates[splits.train.stop - 1]],
            "validation": [market.dates[splits.validation.start], market.dates[splits.validation.stop - 1]],
            "gap": [market.dates[splits.gap.start], market.dates[splits.gap.stop - 1]] if len(splits.gap) else None,
            "test": [market.dates[splits.holdout.start], market.dates[splits.holdout.stop - 1]],
        },
        "champion_generation": trainer.champion.generation,
        "champion_bound": trainer.champion.bound,  # results of earlier versions named it champion_edge
        "members": chosen,
        "deflated_sharpe": overfitting["deflated_sharpe"],
        "pbo": overfitting["pbo"],
        "diagnostics": overfitting,
        "metrics": {
            s: {metric.name: _finite(getattr(m, metric.name)) for metric in METRICS}
            for s, m in test.metrics.items()
            if s in STRATEGIES
        },
        "daily": {s: [float(x) for x in t.log_returns] for s, t in test.traces.items() if s in STRATEGIES},
        "test_dates": test.dates,
        "market_fingerprint": trainer.fingerprint,
    }
    path = result_path(folder, fold)
    path.parent.mkdir(exist_ok=True)
    committing.write_file_atomically(path, (json.dumps(result, allow_nan=False) + "\n").encode())
    return result


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None
