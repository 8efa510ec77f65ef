"""``python main.py backtest``: the walk-forward evidence of whether learning holds up.

For each of K test years (by default the last K calendar years of the data) and each seed, a fresh run trains on
everything before that year: its training range, then its own validation range (which chooses the champion), then a
gap of ``env.lookback`` days that nothing trades, so the first test decision's observation window holds no day that
training or validation earned. The test year is the run's holdout. The champion is then scored on the test year with
the baselines of ``python main.py evaluate`` (equal weight rebalanced daily and held, the untrained population of
the same seed, the index, cash), one episode from cash with the same costs.

Every fold is an ordinary run folder ``NAME/fold-YEAR-seed-S`` (checkpointed every generation and resumable); its
scores go to ``NAME/folds/fold-YEAR-seed-S.json`` once it is done. Running the same command again continues a
killed backtest where it stopped: finished folds are read back, an unfinished one resumes from its last checkpoint
(bit for bit), so the table is the same as an uninterrupted backtest's. ``NAME/plan.json`` holds what the backtest
was asked; the same name with a different plan is refused, naming the first difference. A summary describes one plan
on one market: each fold result records the fingerprint of the market it was trained on (``market_fingerprint``;
a fold without one, finished by an earlier version or not yet finished, is checked against its run's checkpoint), and
a backtest whose data no longer gives every fold that market is refused before anything is trained or written.
Fold results are read back only after every key the summary reads has been checked; a damaged one is recomputed from
the fold's run when that run has a checkpoint, else refused with what to do.

The summary: per fold and seed the champion's Sharpe against equal weight's, and over all of them the mean and
spread of the Sharpe difference, the share of folds the champion won (and tied: an equal-weight champion ties),
and the champion's turnover over equal weight's. Each fold also carries the overfitting diagnostics of its run's
choice on its validation range (``offline.overfitting``: deflated Sharpe ratio and PBO); the summary gives how
many folds crowned an agent and the mean of both.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from config import Config, override
from offline.holdout import INDEX, evaluate
from offline.overfitting import diagnose
from persistence import checkpoint, jsonl
from persistence.provenance import market_fingerprint
from training.fitness import training_windows
from training.loop import Trainer
from training.runs import load_market, load_table, resolve_device, resume_or_start
from utils.cli import ArgumentParser
from utils.errors import CheckpointError, ConfigError, InputError

STRATEGIES = ("champion", "untrained", "equal_weight", "buy_and_hold", "cash", INDEX)
"""What each fold scores on its test year, in table order."""
SCORED = STRATEGIES[:-1]
"""The strategies every fold result holds (the index only where the data has one)."""
METRICS = ("total_return", "sharpe", "max_drawdown", "turnover", "costs")
DEFAULT_FOLDS = 4
"""Test years when neither ``--folds`` nor ``--years`` is given: the last four of the data."""
OUTPUTS = ("summary.json", "summary.csv", "backtest.png")


def train_to_end(
    config: Config,
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    on_generation: Callable[[dict[str, Any]], None] | None = None,
) -> Trainer:
    """Train the run ``config.checkpoint.uri / run_name`` to ``runtime.generations``: resume it from its last
    complete generation, or start it (``training.runs.resume_or_start``, as a pod's start command does)."""
    run = resume_or_start(config, {}, log=log, should_stop=should_stop)
    run.trainer.run(until=config.runtime.generations, on_generation=on_generation)
    run.finish()
    return run.trainer


@dataclass(frozen=True)
class Fold:
    year: int
    seed: int
    config: Config
    fingerprint: str
    """``training.loop.market_fingerprint`` of the fold's market: what its run must be trained on."""

    @property
    def name(self) -> str:
        return f"fold-{self.year}-seed-{self.seed}"


def plan_folds(
    config: Config, *, seeds: Sequence[int], years: Sequence[int] = (), folds: int | None = None
) -> list[Fold]:
    """One fold per test year and seed; ``years`` empty means the last ``folds`` (default 4) calendar years of the
    data. Every test year's market is built here (on the CPU), so a plan the data cannot train is refused, naming
    the year, before anything is written.

    Raises:
        ConfigError: a seed or year given twice, a test year the data does not hold, or one whose fold has too few
            days before it for the settings.
    """
    if not seeds:
        raise ConfigError("--seeds names no seed")
    _refuse_repeats(seeds, "--seeds", "seed")
    _refuse_repeats(years, "--years", "year")
    table = load_table(config)
    calendar = table.dates.year
    available = sorted(set(int(y) for y in calendar))
    if not years:
        count = DEFAULT_FOLDS if folds is None else folds
        asked = f"--folds {folds}" if folds is not None else f"the default --folds {DEFAULT_FOLDS}"
        if count < 1:
            raise ConfigError("--folds must be >= 1")
        if count >= len(available):
            raise ConfigError(
                f"{asked}: the data spans {len(available)} calendar years ({available[0]} to {available[-1]}); "
                "leave one to train on (fewer --folds, or --years)"
            )
        years = available[-count:]
    missing = sorted(set(years) - set(available))
    if missing:
        raise ConfigError(f"test year {missing[0]} is not in the data ({available[0]} to {available[-1]})")
    plan = []
    for year in sorted(years):
        in_year = np.flatnonzero(calendar == year)
        fold_config = override(
            config,
            {
                "data.end": table.dates[in_year[-1]].strftime("%Y-%m-%d"),
                "data.holdout_days": len(in_year),
                "data.gap_days": config.env.lookback,
            },
        )
        try:
            market = load_market(fold_config, torch.device("cpu"))
            training_windows(fold_config, market)  # the fold's trainer checks this too: refused before the plan
        except InputError as error:
            raise ConfigError(f"test year {year}: {error}") from None
        fingerprint = market_fingerprint(market)
        for seed in seeds:
            plan.append(Fold(year, seed, override(fold_config, {"runtime.seed": seed}), fingerprint))
    return plan


def _refuse_repeats(values: Sequence[int], flag: str, what: str) -> None:
    """A value given twice would count its folds twice in every mean and share of the summary: refused, since the
    command cannot know whether another value was meant."""
    for value in values:
        if list(values).count(value) > 1:
            raise ConfigError(f"{flag} names {what} {value} twice; give each once")


def _plan_document(config: Config, folds: list[Fold]) -> dict[str, Any]:
    base = config.to_dict()
    base["checkpoint"] = {k: v for k, v in base["checkpoint"].items() if k not in ("uri", "run_name", "local_dir")}
    base["runtime"] = {k: v for k, v in base["runtime"].items() if k not in ("progress", "device")}
    return {"config": base, "folds": [{"year": f.year, "seed": f.seed} for f in folds]}


def open_backtest(folder: Path, config: Config, folds: list[Fold]) -> list[str]:
    """Create ``folder`` with its plan, or check that an existing one was asked the same, on the same data, and
    that its files can be used. Every check comes before anything is written.

    Returns:
        One line for each fold result that is damaged and will be recomputed from the fold's run.

    Raises:
        ConfigError: ``folder`` or a folder above it is a file; it holds something other than a backtest, or a
            backtest with another plan or trained on other data; a fold result is damaged with no run left to
            recompute it; a folder stands where a file of the backtest goes.
    """
    _check_folder(folder)
    plan = json.loads(json.dumps(_plan_document(config, folds)))  # as it reads back: tuples become lists
    plan_path = folder / "plan.json"
    if not plan_path.exists() and not plan_path.is_symlink():
        if folder.is_dir() and any(folder.iterdir()):
            raise ConfigError(f"{folder} exists and is not a backtest; use another --name")
        folder.mkdir(parents=True, exist_ok=True)
        checkpoint.write_file_atomically(plan_path, (json.dumps(plan, indent=2, sort_keys=True) + "\n").encode())
        return []
    try:
        saved = json.loads(plan_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        saved = None
    if not isinstance(saved, dict) or not isinstance(saved.get("config"), dict) or "folds" not in saved:
        raise ConfigError(f"{plan_path} is not a backtest plan; use another --name")
    difference = _plan_difference(saved, plan)
    if difference is not None:
        raise ConfigError(
            f"backtest {folder} was started with other settings: {difference}; "
            "run it with the same ones to continue it, or use another --name"
        )
    in_the_way = [folder / "folds"] if (folder / "folds").exists() and not (folder / "folds").is_dir() else []
    in_the_way += [folder / name for name in OUTPUTS if (folder / name).exists() and not (folder / name).is_file()]
    if in_the_way:
        kind = "a file" if in_the_way[0].name == "folds" else "a folder"
        raise ConfigError(
            f"{in_the_way[0]} is {kind}, not the backtest's {in_the_way[0].name}; "
            "move it away and run the same command again (finished folds are kept)"
        )
    notes = []
    for fold in folds:
        _, problem = stored_result(folder, fold)
        if problem is not None:
            notes.append(
                f"{result_path(folder, fold)} is not a valid fold result ({problem}); "
                f"recomputing it from the fold's run {folder / fold.name}"
            )
    return notes


def _check_folder(folder: Path) -> None:
    """``folder`` is, or can become, a folder: it and every existing folder above it are folders."""
    for place in (folder, *folder.parents):
        if place.is_dir():
            return
        if place.exists() or place.is_symlink():
            fix = "use another --name" if place == folder else "give --checkpoint-uri a folder"
            raise ConfigError(f"{place} is a file, not a folder; {fix}")


def _plan_difference(saved: dict[str, Any], plan: dict[str, Any]) -> str | None:
    """The first thing ``saved`` (plan.json) and ``plan`` (this command) disagree on, in words; None if nothing."""
    if saved.get("folds") != plan["folds"]:
        before, now = _folds_text(saved.get("folds")), _folds_text(plan["folds"])
        return f"the test years and seeds ({before} in plan.json, now {now})"
    old, new = _flat(saved["config"]), _flat(plan["config"])
    for key in sorted(old.keys() | new.keys()):
        if old.get(key, ...) != new.get(key, ...):
            before, now = (repr(d[key]) if key in d else "not set" for d in (old, new))
            return f"{key} ({before} in plan.json, now {now})"
    return None if saved == plan else "plan.json holds other keys"


def _folds_text(folds: Any) -> str:
    if not isinstance(folds, list) or not all(isinstance(f, dict) for f in folds):
        return "no valid list of folds"
    years = ", ".join(str(y) for y in dict.fromkeys(f.get("year") for f in folds))
    seeds = ", ".join(str(s) for s in dict.fromkeys(f.get("seed") for f in folds))
    return f"years {years or 'none'}, seeds {seeds or 'none'}"


def _flat(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


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
            problem = _result_problem(result, fold)
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
    if problem is not None and checkpoint.latest_generation(run_dir) is None:
        raise ConfigError(
            f"{path} is not a valid fold result ({problem}) and the fold's run {run_dir} has no checkpoint to "
            "recompute it from; delete the file to train the fold again"
        )
    return result, problem


def _run_market(run_dir: Path) -> str | None:
    """The market fingerprint the run's latest complete checkpoint records; None without a readable one (resuming
    the run then reports the damage)."""
    try:
        state = checkpoint.read_document(checkpoint.open_generation(run_dir), "state")
    except CheckpointError:
        return None
    recorded = state.get("market_fingerprint") if isinstance(state, dict) else None
    return recorded if isinstance(recorded, str) else None


def _result_problem(result: Any, fold: Fold) -> str | None:
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
    if not isinstance(result.get("market_fingerprint", ""), str):
        return "market_fingerprint is not a string"
    metrics = result.get("metrics")
    if not isinstance(metrics, dict) or not set(SCORED) <= metrics.keys() <= set(STRATEGIES):
        return f"metrics must hold the figures of {', '.join(SCORED)} (and {INDEX} where the data has it)"
    for strategy, figures in metrics.items():
        if not isinstance(figures, dict) or not all(
            key in figures and (figures[key] is None or _is_number(figures[key])) for key in METRICS
        ):
            return f"metrics.{strategy} must hold {', '.join(METRICS)}, each a number or null"
    test_dates = result.get("test_dates")
    if not isinstance(test_dates, list) or not test_dates or not all(_is_day(d, fold.year) for d in test_dates):
        return f"test_dates must list the days of {fold.year}"
    daily = result.get("daily")
    if not isinstance(daily, dict) or not daily.keys() <= set(STRATEGIES):
        return "daily must map strategies to their daily log returns"
    for strategy, returns in daily.items():
        if not isinstance(returns, list) or len(returns) != len(test_dates) or not all(map(_is_number, returns)):
            return f"daily.{strategy} must hold one log return per test day"
    dates = result.get("dates")
    if not isinstance(dates, dict) or not all(_is_span(dates.get(k)) for k in ("train", "validation", "test")):
        return "dates must give the first and last day of train, validation and test"
    if dates.get("gap") is not None and not _is_span(dates["gap"]):
        return "dates.gap must give its first and last day, or be null"
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
    results = evaluate(market, config, trainer.population.champion)
    test = results["holdout"]
    validation = results["validation"].traces
    overfitting = diagnose(
        jsonl.read_rows(trainer.metrics_path),
        validation["champion"].log_returns - validation["equal_weight"].log_returns,
        crowned=trainer.champion_generation > 0,
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
        "champion_generation": trainer.champion_generation,
        "champion_edge": trainer.champion_edge,
        "deflated_sharpe": overfitting["deflated_sharpe"],
        "pbo": overfitting["pbo"],
        "diagnostics": overfitting,
        "metrics": {
            s: {k: _finite(getattr(m, k)) for k in METRICS} for s, m in test.metrics.items() if s in STRATEGIES
        },
        "daily": {s: [float(x) for x in t.log_returns] for s, t in test.traces.items() if s in STRATEGIES},
        "test_dates": test.dates,
        "market_fingerprint": trainer.fingerprint,
    }
    path = result_path(folder, fold)
    path.parent.mkdir(exist_ok=True)
    checkpoint.write_file_atomically(path, (json.dumps(result, allow_nan=False) + "\n").encode())
    return result


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures over every fold and seed (see the module docstring).

    Raises:
        ValueError: two results of one fold (year and seed), which would count it twice.
    """
    folds = [(r["year"], r["seed"]) for r in results]
    repeated = next((fold for fold in folds if folds.count(fold) > 1), None)
    if repeated is not None:
        raise ValueError(f"test year {repeated[0]} seed {repeated[1]} is given twice")
    rows = []
    for r in results:
        m = r["metrics"]
        sharpe, base = m["champion"]["sharpe"], m["equal_weight"]["sharpe"]
        rows.append(
            {
                "year": r["year"],
                "seed": r["seed"],
                "crowned": r["champion_generation"],
                "sharpe": {s: m[s]["sharpe"] for s in m},
                "total_return": {s: m[s]["total_return"] for s in m},
                "turnover": {s: m[s]["turnover"] for s in m},
                "sharpe_difference": None if sharpe is None or base is None else sharpe - base,
                # None in fold results of earlier versions, and where the fold's history cannot give them
                "deflated_sharpe": r.get("deflated_sharpe"),
                "pbo": r.get("pbo"),
            }
        )
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

    return {
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
    }


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _percent(value: float | None) -> float | None:
    return None if value is None else value * 100


def table(summary: dict[str, Any]) -> str:
    """The per-fold table and the summary lines."""
    lines = [
        f"{'test year':<10}{'seed':>5}{'crowned':>9}{'Sharpe':>9}{'eq. w.':>9}{'diff':>8}{'untrained':>10}"
        f"{'index':>8}{'return':>9}{'eq. w.':>9}{'turnover':>10}{'eq. w.':>8}{'DSR':>6}{'PBO':>6}"
    ]
    for row in summary["folds"]:
        sharpe, ret, turn = row["sharpe"], row["total_return"], row["turnover"]
        lines.append(
            f"{row['year']:<10}{row['seed']:>5}{row['crowned'] or 'no':>9}{_fmt(sharpe['champion'], '+.2f'):>9}"
            f"{_fmt(sharpe['equal_weight'], '+.2f'):>9}{_fmt(row['sharpe_difference'], '+.2f'):>8}"
            f"{_fmt(sharpe['untrained'], '+.2f'):>10}{_fmt(sharpe.get(INDEX), '+.2f'):>8}"
            f"{_fmt(_percent(ret['champion']), '+.1f'):>8}%{_fmt(_percent(ret['equal_weight']), '+.1f'):>8}%"
            f"{_fmt(turn['champion'], '.1f'):>9}x{_fmt(turn['equal_weight'], '.1f'):>7}x"
            f"{_fmt(row['deflated_sharpe'], '.2f'):>6}{_fmt(row['pbo'], '.2f'):>6}"
        )
    mean = summary["mean_sharpe"]
    lines += [
        "",
        f"mean Sharpe: champion {_fmt(mean['champion'], '+.2f')}, equal weight {_fmt(mean['equal_weight'], '+.2f')}, "
        f"untrained {_fmt(mean['untrained'], '+.2f')}, index {_fmt(mean[INDEX], '+.2f')}",
        f"Sharpe difference to equal weight: mean {_fmt(summary['sharpe_difference_mean'], '+.2f')}, "
        f"spread (stdev) {_fmt(summary['sharpe_difference_std'], '.2f')}, "
        f"worst {_fmt(summary['sharpe_difference_min'], '+.2f')}",
        f"folds won {_fmt(summary['won'], '.0%')}, tied {_fmt(summary['tied'], '.0%')} "
        f"(an agent was crowned in {_fmt(summary['crowned'], '.0%')}; otherwise the champion is equal weight); "
        f"turnover {_fmt(summary['turnover_ratio'], '.2f')}x equal weight's",
        _overfitting_line(summary),
    ]
    return "\n".join(lines)


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


def write_outputs(folder: Path, summary: dict[str, Any], results: list[dict[str, Any]]) -> list[str]:
    """``summary.json``, ``summary.csv`` and ``backtest.png`` (walk-forward equity: the test years chained)."""
    from offline.plots import SeriesPanel, plot_equity

    checkpoint.write_file_atomically(
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
    labels[INDEX] = "index"
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


# ---------------------------------------------------------------------------------------------------------------------
# command line


def _parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="python main.py backtest",
        description="Walk-forward backtest: per test year and seed, train on the years before it, score the year.",
    )
    parser.add_argument("--preset", default="default", help="smoke | default | paper (default: default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--data", help="price file (CSV or Parquet); default: the bundled 20 stocks")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run per seed and year (0,1,2)")
    parser.add_argument("--folds", type=int, help=f"test years: the last FOLDS years of the data ({DEFAULT_FOLDS})")
    parser.add_argument("--years", help="comma-separated test years instead of --folds")
    parser.add_argument("--generations", type=int, help="generations of every fold's run")
    parser.add_argument("--population", type=int, help="agents in the population")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], help="training device")
    parser.add_argument("--checkpoint-uri", default="runs", help="local folder the backtest folder goes in (runs)")
    parser.add_argument("--name", default="backtest", help="the backtest's folder; the same name continues it")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    parser.add_argument("--verbose", action="store_true", help="print every generation's line")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _integers(text: str, flag: str) -> list[int]:
    try:
        values = [int(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise InputError(f"{flag} expects comma-separated integers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise InputError(f"{flag} expects comma-separated integers >= 0, got {text!r}")
    return values


def main(argv: Sequence[str]) -> int:
    """``backtest``'s command line; returns the exit status (InputError propagates to ``main.py``)."""
    from config import parse_assignments, preset
    from training.loop import RunStopped
    from utils.progress import GenerationProgress
    from utils.signals import StopRequest

    args = _parser().parse_args(list(argv))
    seeds = _integers(args.seeds, "--seeds")
    years = _integers(args.years, "--years") if args.years is not None else []
    if args.checkpoint_uri.startswith("gs://"):
        raise InputError("backtest writes to a local folder: give --checkpoint-uri a local path")
    if not args.name or args.name in (".", "..") or "/" in args.name or "\\" in args.name:
        raise InputError(f"--name must be a plain folder name, got {args.name!r}")
    settings: dict[str, Any] = dict(parse_assignments(args.set))
    flags = {
        "data.path": args.data,
        "runtime.generations": args.generations,
        "evolution.popsize": args.population,
        "runtime.device": args.device,
    }
    settings.update({k: v for k, v in flags.items() if v is not None})
    config = override(preset(args.preset), settings)
    folds = plan_folds(config, seeds=seeds, years=years, folds=args.folds)
    resolve_device(config.runtime.device)  # a device this machine lacks is refused before the plan is written
    folder = Path(args.checkpoint_uri) / args.name
    notes = open_backtest(folder, config, folds)

    results = []
    with StopRequest() as stop, GenerationProgress(enabled=not args.no_progress, unit="fold") as progress:
        # With --json, stdout holds the summary alone: the per-fold lines go to stderr.
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else progress.write
        log = say if args.verbose else (lambda line: None)
        for note in notes:
            say(note)
        progress.reset(total=len(folds), initial=0)
        for fold in folds:
            progress.describe(f"{fold.name}")

            def on_generation(row: dict[str, Any], fold: Fold = fold) -> None:
                progress.describe(f"{fold.name}: generation {row['generation']}/{fold.config.runtime.generations}")

            try:
                result = run_fold(folder, fold, log=log, should_stop=stop, on_generation=on_generation)
            except RunStopped:
                progress.close()
                say(
                    f"stopped by {stop.name} in {fold.name}; finished folds and the last checkpoint are kept. "
                    f"Run the same command to continue."
                )
                return 128 + (stop.signum or 0)
            results.append(result)
            m = result["metrics"]
            gen = result["champion_generation"]
            crowned = f"crowned in generation {gen}" if gen else "equal weight (no agent proved an edge)"
            say(
                f"{fold.name}: champion Sharpe {_fmt(m['champion']['sharpe'], '+.2f')} "
                f"(equal weight {_fmt(m['equal_weight']['sharpe'], '+.2f')}), "
                f"{crowned}; deflated Sharpe {_fmt(result.get('deflated_sharpe'), '.2f')}, "
                f"PBO {_fmt(result.get('pbo'), '.2f')}"
            )
            progress.update()
    summary = summarise(results)
    written = write_outputs(folder, summary, results)
    if args.json:
        print(json.dumps(summary, allow_nan=False))
    else:
        print(f"backtest {folder}: {len(folds)} folds\n\n{table(summary)}\n\nreport: {folder} ({', '.join(written)})")
    return 0
