"""Equal weight and buy and hold on a point-in-time panel with halts and delistings, by this code and an earlier commit.

    python benchmarks/halts_and_delistings.py                  # this code against 1c6d6df, seeds 0, 1, 2
    python benchmarks/halts_and_delistings.py --commit HEAD~3 --seeds 0-4

A synthetic long file per seed: 12 tickers over 1,500 business days (geometric random walks); three halt, each for a
length drawn from 1 to 20 days, and reopen with a move of -40% to +20%; two delist mid-sample, one with a delisting
return of -60% in the file's ``delisting_return`` column, one without (``data.delisting_return``, 0 by default); one
lists late. Each tree (this one, and the commit unpacked from this clone's history) builds the market a run would
(``environment.loading.load_market``, the default preset) and trades equal weight (rebalanced every day over the day's
tradable assets) and buy and hold from cash over every day after the warm-up, at the run's delay and costs, in its own
vectorised environment. Printed per seed: each baseline's total log return and turnover in both trees.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parents[1]

RUN = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import torch
from config import override, preset
from environment.vector_env import VectorPortfolioEnv
try:
    from environment.loading import load_market
except ImportError:  # before the loading moved to environment/
    from training.setup import load_market
config = override(preset("default"), {"data.path": sys.argv[2], "runtime.device": "cpu"})
market = load_market(config, torch.device("cpu"))
days = market.num_days - 2 - config.env.execution_delay
out = {}
for baseline in ("equal_weight", "buy_and_hold"):
    env = VectorPortfolioEnv(market, num_agents=1, num_episodes=1, episode_days=days, lookback=1,
                             cost_rate=config.env.cost_rate, execution_delay=config.env.execution_delay)
    env.reset(torch.tensor([0]))
    target = torch.empty(1, market.num_assets + 1)
    for day in range(days):
        if baseline == "equal_weight" or day == 0:
            env.equal_weight(out=target)
        else:
            target = env.weights_before_fill()[0].clone()
        env.step(target.unsqueeze(0))
    rewards, turnover = env.rewards_per_episode.sum(), env.turnover_per_episode.sum()
    out[baseline] = {"log_return": float(rewards), "turnover": float(turnover)}
print(json.dumps(out))
"""


def panel(seed: int, path: Path) -> Path:
    rng = np.random.default_rng(seed)
    days, tickers = 1500, [f"T{i:02d}" for i in range(12)]
    dates = pd.bdate_range("2001-01-01", periods=days).strftime("%Y-%m-%d")
    prices = 40.0 * np.exp(np.cumsum(rng.normal(0.0002, 0.015, (days, len(tickers))), axis=0))
    alive = np.ones_like(prices, dtype=bool)
    for j in (0, 1, 2):  # halts, then a move at the reopening
        start, length = int(rng.integers(300, 1200)), int(rng.integers(1, 21))
        alive[start : start + length, j] = False
        prices[start + length :, j] *= 1.0 + rng.uniform(-0.4, 0.2)
    alive[900:, 3] = False  # delists with -60% in the file
    alive[1100:, 4] = False  # delists, the file says nothing
    alive[:400, 5] = False  # lists late
    rows = [
        (dates[d], t, prices[d, j], -0.6 if (j == 3 and d == 899) else np.nan)
        for j, t in enumerate(tickers)
        for d in range(days)
        if alive[d, j]
    ]
    pd.DataFrame(rows, columns=["date", "ticker", "close", "delisting_return"]).to_csv(path, index=False)
    return path


def figures(tree: Path, data: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", RUN, str(tree), str(data)], capture_output=True, text=True, cwd=tree)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commit", default="1c6d6df", help="the earlier commit (default 1c6d6df)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds: 0,1,2 or 0-4")
    args = parser.parse_args(argv)
    seeds = (
        list(range(int(args.seeds.split("-")[0]), int(args.seeds.split("-")[1]) + 1))
        if "-" in args.seeds
        else [int(s) for s in args.seeds.split(",")]
    )
    with tempfile.TemporaryDirectory(prefix="halts-") as scratch:
        scratch = Path(scratch)
        archive = subprocess.run(["git", "archive", args.commit], cwd=HERE, capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(scratch / "earlier", filter="data")
        print(f"| seed | baseline | {args.commit}: log return | turnover | this: log return | turnover |")
        print("|---|---|---:|---:|---:|---:|")
        for seed in seeds:
            data = panel(seed, scratch / f"panel-{seed}.csv")
            before, now = figures(scratch / "earlier", data), figures(HERE, data)
            for name in ("equal_weight", "buy_and_hold"):
                b, n = before[name], now[name]
                print(
                    f"| {seed} | {name} | {b['log_return']:+.4f} | {b['turnover']:.2f} | "
                    f"{n['log_return']:+.4f} | {n['turnover']:.2f} |"
                )


if __name__ == "__main__":
    main()
