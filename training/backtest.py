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
was asked; the same name with a different plan is refused.

The summary: per fold and seed the champion's Sharpe against equal weight's, and over all of them the mean and
spread of the Sharpe difference, the share of folds the champion won (and tied: an equal-weight champion ties),
and the champion's turnover over equal weight's. Each fold also carries the overfitting diagnostics of its run's
choice on its validation range (``training.overfitting``: deflated Sharpe ratio and PBO); the summary gives how
many folds crowned an agent and the mean of both.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from config import Config, override
from training.evaluation import INDEX, evaluate
from training.overfitting import diagnose
from training.runs import load_table, resume_run, start_run
from training.trainer import Trainer
from utils import checkpoint, jsonl
from utils.cli import ArgumentParser
from utils.errors import ConfigError, InputError

STRATEGIES = ("champion", "untrained", "equal_weight", "buy_and_hold", "cash", INDEX)
"""What each fold scores on its test year, in table order."""
METRICS = ("total_return", "sharpe", "max_drawdown", "turnover", "costs")


def train_to_end(
    config: Config,
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    on_generation: Callable[[dict[str, Any]], None] | None = None,
) -> Trainer:
    """Train the run ``config.checkpoint.uri / run_name`` to ``runtime.generations``: start it, or resume it from
    its last complete generation. A folder without one (killed before its first checkpoint) holds nothing to keep
    and is started afresh."""
    run_dir = Path(config.checkpoint.uri) / config.checkpoint.run_name
    if run_dir.is_dir() and checkpoint.latest_generation(run_dir) is None:
        shutil.rmtree(run_dir)
    if run_dir.is_dir():
        run = resume_run(config, {}, log=log, should_stop=should_stop)
    else:
        run = start_run(config, log=log, should_stop=should_stop)
    run.trainer.run(until=config.runtime.generations, on_generation=on_generation)
    run.finish()
    return run.trainer


@dataclass(frozen=True)
class Fold:
    year: int
    seed: int
    config: Config

    @property
    def name(self) -> str:
        return f"fold-{self.year}-seed-{self.seed}"


def plan_folds(config: Config, *, seeds: Sequence[int], years: Sequence[int] = (), folds: int = 4) -> list[Fold]:
    """One fold per test year and seed; ``years`` empty means the last ``folds`` calendar years of the data.

    Raises:
        ConfigError: a test year the data does not hold, or no year before it to train on.
    """
    table = load_table(config)
    calendar = table.dates.year
    available = sorted(set(int(y) for y in calendar))
    if not years:
        if folds < 1:
            raise ConfigError("--folds must be >= 1")
        if folds >= len(available):
            raise ConfigError(f"--folds {folds}: the data spans {len(available)} calendar years; leave one to train on")
        years = available[-folds:]
    missing = sorted(set(years) - set(available))
    if missing:
        raise ConfigError(f"test year {missing[0]} is not in the data ({available[0]} to {available[-1]})")
    plan = []
    for year in sorted(set(years)):
        in_year = np.flatnonzero(calendar == year)
        fold_config = override(
            config,
            {
                "data.end": table.dates[in_year[-1]].strftime("%Y-%m-%d"),
                "data.holdout_days": len(in_year),
                "data.gap_days": config.env.lookback,
            },
        )
        for seed in seeds:
            plan.append(Fold(year, seed, override(fold_config, {"runtime.seed": seed})))
    return plan


def _plan_document(config: Config, folds: list[Fold]) -> dict[str, Any]:
    base = config.to_dict()
    base["checkpoint"] = {k: v for k, v in base["checkpoint"].items() if k not in ("uri", "run_name", "local_dir")}
    base["runtime"] = {k: v for k, v in base["runtime"].items() if k not in ("progress", "device")}
    return {"config": base, "folds": [{"year": f.year, "seed": f.seed} for f in folds]}


def open_backtest(folder: Path, config: Config, folds: list[Fold]) -> None:
    """Create ``folder`` with its plan, or check that an existing one was asked the same."""
    plan = json.loads(json.dumps(_plan_document(config, folds)))  # as it reads back: tuples become lists
    plan_path = folder / "plan.json"
    if plan_path.is_file():
        try:
            saved = json.loads(plan_path.read_text())
        except (OSError, ValueError):
            raise ConfigError(f"{plan_path} is not a backtest plan; use another --name") from None
        if saved != plan:
            raise ConfigError(
                f"backtest {folder} was started with other settings (config, test years or seeds); "
                "run it with the same ones to continue it, or use another --name"
            )
        return
    if folder.exists() and any(folder.iterdir()):
        raise ConfigError(f"{folder} exists and is not a backtest; use another --name")
    folder.mkdir(parents=True, exist_ok=True)
    plan_path.write_text(json.dumps(plan, indent=2, sort_keys=True) + "\n")


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
    result_path = folder / "folds" / f"{fold.name}.json"
    if result_path.is_file():
        return json.loads(result_path.read_text())
    config = override(
        fold.config,
        {"checkpoint.uri": str(folder), "checkpoint.run_name": fold.name, "runtime.progress": False},
    )
    trainer = train_to_end(config, log=log, should_stop=should_stop, on_generation=on_generation)
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
    }
    result_path.parent.mkdir(exist_ok=True)
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, allow_nan=False) + "\n")
    tmp.replace(result_path)
    return result


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline figures over every fold and seed (see the module docstring)."""
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
    turnover = [row["turnover"]["champion"] for row in rows]
    turnover_equal = [row["turnover"]["equal_weight"] for row in rows]

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
        "turnover_ratio": sum(turnover) / sum(turnover_equal) if sum(turnover_equal) > 0 else None,
    }


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


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
            f"{_fmt(ret['champion'] * 100, '+.1f'):>8}%{_fmt(ret['equal_weight'] * 100, '+.1f'):>8}%"
            f"{turn['champion']:>9.1f}x{turn['equal_weight']:>7.1f}x"
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
    from utils.plots import SeriesPanel, plot_equity

    (folder / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n")
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
    parser.add_argument("--folds", type=int, default=4, help="test years: the last FOLDS years of the data (4)")
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
    from training.trainer import RunStopped
    from utils.progress import GenerationProgress
    from utils.signals import StopRequest

    args = _parser().parse_args(list(argv))
    seeds = _integers(args.seeds, "--seeds")
    years = _integers(args.years, "--years") if args.years else []
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
    folder = Path(args.checkpoint_uri) / args.name
    open_backtest(folder, config, folds)

    results = []
    with StopRequest() as stop, GenerationProgress(enabled=not args.no_progress, unit="fold") as progress:
        # With --json, stdout holds the summary alone: the per-fold lines go to stderr.
        say = (lambda line: print(line, file=sys.stderr, flush=True)) if args.json else progress.write
        log = say if args.verbose else (lambda line: None)
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
