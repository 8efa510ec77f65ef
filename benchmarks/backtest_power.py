"""Size and power of the backtest's pooled test (``offline.backtest.inference``), on synthetic backtests a CPU can run.

    python benchmarks/backtest_power.py                      # random walks 0-19, leaders x0.5 0-19, null series
    python benchmarks/backtest_power.py --parts power --power-seeds 20-29     # more leaders markets
    python benchmarks/backtest_power.py --parts report       # the table of what is finished
    python benchmarks/backtest_power.py --parts null --null-scenarios "AR(1) 0.3" --null-block-scale 2

Each synthetic backtest is the real one: an ``environment.synthetic`` market (``--assets`` assets over ``--years``
calendar years of business days from 2000, the market's seed), written as a CSV, then ``python main.py backtest`` in
this process (``offline.backtest.command.main``) with the default preset, ``benchmarks/learning.py``'s SMALL
settings, ``--generations``, ``--folds`` test years (the last ones) and ``--run-seeds``; the pooled test is read from
its ``summary.json``. A finished backtest is read back (its folds are not trained again), an unfinished one continues.

* **size**: random-walk markets (``--size-seeds``): no strategy beats equal weight but by luck, so the fraction of
  backtests whose pooled test rejects at ``selection.alpha`` (5%) is the test's size, with an exact 95% interval;
* **power**: persistent leaders at ``--strength`` (0.0025: half the default strength, the "leaders x0.5" market of
  ``benchmarks/selection_study.py``, whose ``--scale 0.5`` multiplies the default 0.005) over ``--power-seeds``: the
  fraction of backtests that reject;
* per procedure (``offline.procedures``: the gated champion, the best agent on validation, the ensemble), each with
  its pooled test, and the family (the stepdown max-t over the three): how often it proves any, each, and which it
  deploys; beside them the single-run gate on the same folds (the fraction of folds that crowned an agent);
* **family** (``--parts family``): the family test alone on ``--null-series`` triples of correlated null series of
  1500 days: its family-wise size;
* ``--ensemble-sizes`` (e.g. ``1,2,3,5,8``): the same folds traded by the ensemble of each size, tested alone: what
  ``backtest.ensemble_size`` does to size and power;
* **null** (``--null-series``): the test alone (``offline.backtest.inference.mean_test``, block length chosen from
  the data) on simulated series of 12 x 252 days with mean 0: independent normal days, AR(1) days (0.3), Student-t
  days (3 degrees of freedom), and one year of normal days among eleven years of zeros (one crowned fold in twelve,
  the shape random-walk backtests give when the gate crowns by luck); on request (``--null-scenarios``) AR(1) days
  at 0.1, 0.2 and 0.5: how the size grows with the autocorrelation. ``--null-block-scale`` multiplies the chosen
  block length (a scale other than 1 is kept apart from the test's own figures: whether a longer block holds the
  level where the series is autocorrelated).

Printed as a table; ``--json-out`` (default ``OUT/power.json``) holds every backtest's pooled figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd
import torch

from benchmarks.learning import SMALL
from benchmarks.selection_study import binomial_interval, seeds_of
from config import Config, override
from environment.book import Book
from environment.synthetic import make_market
from offline.backtest.command import main as backtest
from offline.backtest.inference import family_test, mean_test, pooled_test
from offline.holdout import run_range
from offline.procedures import TRADER_NAMES, ranking, trader_actor, validation_scores
from persistence import run_folder
from run.launch import train_to_end
from training.selection import block_length

START = "2000-01-03"
"""``environment.synthetic.make_market``'s first day."""
NULL_DAYS = 12 * 252
"""Days of a simulated null series: twelve test years."""


def market_days(years: int) -> int:
    """Business days from ``START`` to the end of the ``years``-th calendar year: whole test years."""
    return len(pd.bdate_range(START, f"{int(START[:4]) + years - 1}-12-31"))


def backtest_args(prices: Path, root: Path, args: argparse.Namespace) -> list[str]:
    """``python main.py backtest``'s arguments for one synthetic backtest."""
    settings = {**SMALL, "data.tickers": "", "data.start": "", **dict(s.split("=", 1) for s in args.set)}
    flags = [item for key, value in settings.items() for item in ("--set", f"{key}={value}")]
    return [
        "--preset",
        "default",
        "--data",
        str(prices),
        *flags,
        "--generations",
        str(args.generations),
        "--folds",
        str(args.folds),
        "--seeds",
        args.run_seeds,
        "--checkpoint-uri",
        str(root),
        "--no-progress",
        "--jobs",
        str(args.jobs),
    ]


def run_backtest(kind: str, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    """One synthetic backtest (trained, continued or read back): its procedures' pooled tests and the family's."""
    root = Path(args.out) / f"{kind}-seed-{seed}"
    root.mkdir(parents=True, exist_ok=True)
    prices = root / "prices.csv"
    strength = args.strength if kind == "leaders" else None
    synthetic = make_market(
        kind, num_days=market_days(args.years), num_assets=args.assets, seed=seed, strength=strength
    )
    synthetic.prices.to_csv(prices, index=False)
    start = time.perf_counter()
    with (root / "backtest.log").open("a") as log, contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
        status = backtest(backtest_args(prices, root, args))
    if status != 0:
        raise SystemExit(f"the backtest of {root} ended with status {status}; see {root / 'backtest.log'}")
    summary = json.loads((root / "backtest" / "summary.json").read_text())
    pooled = summary["pooled"]
    return {
        "kind": kind,
        "seed": seed,
        "strength": strength,
        "folds": len(summary["folds"]),
        "crowned_folds": summary["crowned_folds"],
        "pooled": pooled,
        "traders": summary["traders"],
        "family": summary["family"],
        "ensembles": ensemble_sizes(root / "backtest", args) if args.ensemble_sizes else None,
        "seconds": time.perf_counter() - start,  # of this call: training, or reading a finished backtest back
    }


def ensemble_sizes(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The pooled test of the backtest's folds traded by ensembles of each size of ``--ensemble-sizes`` (cached in
    ``ensembles.json``): what the choice of ``backtest.ensemble_size`` does to size and power."""
    sizes = [int(k) for k in args.ensemble_sizes.split(",")]
    cache = folder / "ensembles.json"
    saved = json.loads(cache.read_text()) if cache.exists() else {}
    if all(str(k) in saved for k in sizes):
        return {str(k): saved[str(k)] for k in sizes}
    results = {k: [] for k in sizes}
    for result_file in sorted((folder / "folds").glob("fold-*.json")):
        result = json.loads(result_file.read_text())
        for k, daily in ensemble_daily(folder / result_file.stem, sizes).items():
            results[k].append({**result, **daily})
    selection = Config.from_dict(json.loads((folder / "plan.json").read_text())["config"]).selection
    for k in sizes:
        saved[str(k)] = pooled_test(results[k], alpha=selection.alpha, min_edge=selection.min_edge)
    cache.write_text(json.dumps(saved, indent=1) + "\n")
    return {str(k): saved[str(k)] for k in sizes}


def ensemble_daily(run_dir: Path, sizes: list[int]) -> dict[int, dict[str, Any]]:
    """A finished fold's test year traded by the ensembles of its ``sizes`` best agents on validation, as fold
    results hold the champion's days."""
    config = Config.from_dict(json.loads(run_folder.config_path(run_dir).read_text()))
    config = override(
        config,
        {"checkpoint.uri": str(run_dir.parent), "checkpoint.run_name": run_dir.name, "runtime.progress": False},
    )
    trainer = train_to_end(config, log=lambda line: None)  # finished: loads its last generation
    market, population, env = trainer.market, trainer.population.actor, config.env
    order = ranking(validation_scores(market, config, population))
    actors = {f"k{k}": trader_actor(population, order[:k]) for k in sizes}
    settings = {"lookback": env.lookback, "cost_rate": env.cost_rate, "execution_delay": env.execution_delay}
    test = run_range(market, actors, market.splits.holdout, name="test year", book=Book.from_env(env), **settings)
    equal = [float(x) for x in test.traces["equal_weight"].log_returns]
    return {
        k: {
            "daily": {"champion": [float(x) for x in test.traces[f"k{k}"].log_returns], "equal_weight": equal},
            "test_dates": list(test.dates),
        }
        for k in sizes
    }


# ---------------------------------------------------------------------------------------------- null series


def null_series(scenario: str, rng: np.random.Generator) -> np.ndarray:
    """(NULL_DAYS,) a series whose expected value is 0 (see the module docstring)."""
    sd = 0.004
    if scenario == "independent normal":
        return rng.normal(0.0, sd, NULL_DAYS)
    if scenario.startswith("AR(1) "):
        phi = float(scenario.removeprefix("AR(1) "))
        shocks = rng.normal(0.0, sd * math.sqrt(1 - phi**2), NULL_DAYS)
        x = np.empty(NULL_DAYS)
        x[0] = rng.normal(0.0, sd)
        for t in range(1, NULL_DAYS):
            x[t] = phi * x[t - 1] + shocks[t]
        return x
    if scenario == "Student t(3)":
        return rng.standard_t(3, NULL_DAYS) * sd / math.sqrt(3)
    x = np.zeros(NULL_DAYS)  # one crowned year in twelve
    year = int(rng.integers(12))
    x[year * 252 : (year + 1) * 252] = rng.normal(0.0, sd, 252)
    return x


NULL_SCENARIOS = (
    "independent normal",
    "AR(1) 0.3",
    "Student t(3)",
    "one year in twelve",
    "AR(1) 0.1",
    "AR(1) 0.2",
    "AR(1) 0.5",
)


def null_size(scenario: str, reps: int, *, alpha: float, draws: int, block_scale: float = 1.0) -> dict[str, Any]:
    rng = np.random.default_rng(NULL_SCENARIOS.index(scenario))  # each scenario its own fixed stream
    rejected, blocks = 0, []
    for rep in range(reps):
        x = null_series(scenario, rng)
        block = block_length(x) * block_scale
        test = mean_test(x, alpha=alpha, generator=torch.Generator().manual_seed(rep), draws=draws, mean_block=block)
        rejected += test.p_value <= alpha
        blocks.append(test.block_length)
    return {
        "scenario": scenario,
        "block_scale": block_scale,
        "reps": reps,
        "draws": draws,
        "rejected": rejected,
        "mean_block": float(np.mean(blocks)),
    }


def family_null_size(reps: int, *, draws: int, days: int = 1500) -> dict[str, Any]:
    """The family test (``family_test``) on ``reps`` triples of null series of ``days`` days: a shared part and an
    own part each, as procedures drawn from one population trade alike. The share of triples in which any is proven
    is the family-wise size."""
    rng = np.random.default_rng(2026)
    rejected = 0
    for rep in range(reps):
        shared = rng.normal(0.0, 0.003, days)
        series = {f"trader{j}": shared + rng.normal(0.0, 0.003, days) for j in range(3)}
        test = family_test(series, generator=torch.Generator().manual_seed(rep), draws=draws)
        rejected += any(p is not None and p <= 0.05 for p in test.adjusted_p)
    return {"reps": reps, "draws": draws, "days": days, "rejected": rejected}


# ---------------------------------------------------------------------------------------------- the table


def share(hits: int, total: int) -> str:
    low, high = binomial_interval(hits, total) if total else (0.0, 1.0)
    return f"{hits}/{total} = {hits / max(total, 1):.3f} [{low:.3f}, {high:.3f}]"


def report(rows: list[dict[str, Any]], nulls: list[dict[str, Any]]) -> str:
    traders = list(TRADER_NAMES)
    lines = [
        f"{'market':<12}{'seed':>5}{'crowned':>9}{'days':>6}"
        + "".join(f"{name[:13] + ' %/y':>18}{'p':>8}{'adj. p':>8}" for name in traders)
        + "  deploy"
    ]
    for row in rows:
        family, cells = row["family"], ""
        for trader in traders:
            p = row["traders"][trader]
            cells += (
                f"{_f(p['mean_excess'], '+18.2f', 100)}{_f(p['p_value'], '8.4f')}"
                f"{_f(family['adjusted_p'].get(trader), '8.4f')}"
            )
        lines.append(
            f"{row['kind']:<12}{row['seed']:>5}{row['crowned_folds']:>5}/{row['folds']:<3}"
            f"{row['pooled']['days']:>6}{cells}  {family['deploy'] or 'none'}"
        )
    lines.append("")
    for kind, what in (("random_walk", "size"), ("leaders", "power")):
        group = [row for row in rows if row["kind"] == kind]
        if not group:
            continue
        crowned = sum(row["crowned_folds"] for row in group)
        folds = sum(row["folds"] for row in group)
        lines.append(f"{kind} ({what}): the single-run gate crowned {share(crowned, folds)} folds")
        for trader in traders:
            tests = [row["traders"][trader] for row in group]
            hits = sum(t["outcome"] == "proven" for t in tests)
            mean = np.mean([t["mean_excess"] for t in tests]) * 100
            turnover = np.mean([t["mean_turnover"] for t in tests])
            lines.append(
                f"  {TRADER_NAMES[trader]}: pooled test rejects in {share(hits, len(group))}; mean excess "
                f"{mean:+.2f} log %/y, turnover {turnover:.1f}x a year"
            )
        any_proven = sum(bool(row["family"]["proven"]) for row in group)
        deployed = {}
        for row in group:
            deployed[row["family"]["deploy"] or "none"] = deployed.get(row["family"]["deploy"] or "none", 0) + 1
        lines.append(
            f"  family (max-t over {len(traders)}): proves at least one trader in {share(any_proven, len(group))}; "
            f"per trader "
            + ", ".join(
                f"{TRADER_NAMES[t]} {share(sum(t in row['family']['proven'] for row in group), len(group))}"
                for t in traders
            )
            + "; deploys "
            + ", ".join(f"{name} {count}" for name, count in sorted(deployed.items()))
        )
        sizes = [row["ensembles"] for row in group if row.get("ensembles")]
        for k in sizes[0] if sizes else []:
            hits = sum(size[k]["outcome"] == "proven" for size in sizes)
            mean = np.mean([size[k]["mean_excess"] for size in sizes]) * 100
            lines.append(
                f"  ensemble of {k}: pooled test rejects in {share(hits, len(sizes))}; mean {mean:+.2f} log %/y"
            )
    for null in nulls:
        lines.append(
            f"null series, {null['scenario']}{block_scale_note(null)}: rejects {share(null['rejected'], null['reps'])} "
            f"(mean block {null['mean_block']:.1f} days)"
        )
    return "\n".join(lines)


def block_scale_note(null: dict[str, Any]) -> str:
    scale = null.get("block_scale", 1.0)
    return "" if scale == 1.0 else f", block x{scale:g}"


def _f(value: float | None, spec: str, scale: float = 1.0) -> str:
    width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
    return f"{'n/a':>{width}}" if value is None else format(value * scale, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--parts", default="size,power,null", help="size, power, null, family, report (comma-separated)"
    )
    parser.add_argument("--size-seeds", default="0-19", help="random-walk markets")
    parser.add_argument("--power-seeds", default="0-19", help="leaders markets")
    parser.add_argument("--strength", type=float, default=0.0025, help="the leaders' edge a day (default: half)")
    parser.add_argument("--assets", type=int, default=5)
    parser.add_argument("--years", type=int, default=17, help="calendar years of the market, from 2000")
    parser.add_argument("--folds", type=int, default=12, help="test years: the last FOLDS years")
    parser.add_argument("--generations", type=int, default=15)
    parser.add_argument("--run-seeds", default="0", help="the backtest's --seeds: runs per test year")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="after SMALL's settings")
    parser.add_argument("--jobs", type=int, default=1, help="the backtest's --jobs")
    parser.add_argument("--ensemble-sizes", default="", help="e.g. 1,2,3,5,8: each size's ensemble tested too")
    parser.add_argument("--null-series", type=int, default=2000, help="simulated series per null scenario")
    parser.add_argument("--null-draws", type=int, default=1000, help="bootstrap resamples per simulated series")
    parser.add_argument("--null-scenarios", default=",".join(NULL_SCENARIOS[:4]), help="comma-separated")
    parser.add_argument("--null-block-scale", type=float, default=1.0, help="times the chosen block length")
    parser.add_argument("--out", default="runs/backtest-power")
    parser.add_argument("--json-out", help="default: OUT/power.json")
    args = parser.parse_args()
    unknown = set(args.null_scenarios.split(",")) - set(NULL_SCENARIOS)
    if unknown:
        parser.error(f"--null-scenarios: unknown {sorted(unknown)}; choose from {list(NULL_SCENARIOS)}")
    torch.set_num_threads(1)
    parts = set(args.parts.split(","))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    json_out = Path(args.json_out or out / "power.json")
    saved = json.loads(json_out.read_text()) if json_out.exists() else {"backtests": [], "null": []}
    rows = {(r["kind"], r["seed"]): r for r in saved["backtests"]}
    nulls = {(n["scenario"], n.get("block_scale", 1.0)): n for n in saved["null"]}
    plan = [("random_walk", s) for s in seeds_of(args.size_seeds)] if "size" in parts else []
    plan += [("leaders", s) for s in seeds_of(args.power_seeds)] if "power" in parts else []
    for kind, seed in plan:
        row = run_backtest(kind, seed, args)
        rows[(kind, seed)] = row
        p = row["pooled"]
        print(
            f"{kind} seed {seed}: crowned {row['crowned_folds']}/{row['folds']}, champion {p['outcome']}, "
            f"family proves {row['family']['proven']} ({row['seconds']:.0f} s)",
            flush=True,
        )
        _save(json_out, rows, nulls, args)
    if "family" in parts:
        family = family_null_size(args.null_series, draws=args.null_draws)
        print(f"family of three null series: rejects {share(family['rejected'], family['reps'])}", flush=True)
    if "null" in parts:
        for scenario in args.null_scenarios.split(","):
            key = (scenario, args.null_block_scale)
            done = nulls.get(key, {})
            if (done.get("reps"), done.get("draws")) == (args.null_series, args.null_draws):
                continue  # measured already
            nulls[key] = null_size(
                scenario, args.null_series, alpha=0.05, draws=args.null_draws, block_scale=args.null_block_scale
            )
            print(f"null series, {scenario}: {nulls[key]}", flush=True)
            _save(json_out, rows, nulls, args)
    ordered = sorted(rows.values(), key=lambda r: (r["kind"] != "random_walk", r["seed"]))
    print(report(ordered, list(nulls.values())))


def _save(path: Path, rows: dict, nulls: dict, args: argparse.Namespace) -> None:
    document = {"settings": vars(args), "backtests": list(rows.values()), "null": list(nulls.values())}
    path.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
