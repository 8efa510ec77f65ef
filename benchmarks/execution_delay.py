"""What a fill one day after the decision costs a planted signal: the rule that knows it, and a trained champion.

    python benchmarks/execution_delay.py                     # the rules' edges at delays 0, 1 and 2 (seconds)
    python benchmarks/execution_delay.py --train --seeds 0,1,2 --generations 25   # and trained runs at 0 and 1

A decision observes the close of day ``t``; with ``env.execution_delay`` d its target fills at the close of
``t + d`` and earns day ``t + d + 1``. A signal that lives one day (the ``reversal`` market: yesterday's loser gains
today) is gone by the time a delayed order fills; one that persists (``leaders``: leadership lasts about 120 days)
is still there. Part 1 measures it exactly: each market's rule (``environment.synthetic``) trades a long fresh
sample of its generator through the environment's kernel (``benchmarks.learning.rule_log_returns``, the same
arithmetic, costs and fills as an agent's), and its daily excess over equal weight is reported in %/y with its t
statistic. Part 2 (``--train``) trains ``benchmarks.learning``'s small runs at delays 0 and 1 on the same markets
and reports the champion's holdout against equal weight and the rule at the run's delay.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from benchmarks.learning import SMALL_MARKET, rule_log_returns, run_one, small_config
from environment.features import WARMUP_DAYS, build_market
from environment.market import TRADING_DAYS
from environment.prices import PriceTable
from environment.synthetic import make_market

KINDS = ("random_walk", "reversal", "leaders")
DELAYS = (0, 1, 2)
COST_RATE = 0.0005


def rule_edge(kind: str, seed: int, *, days: int, delays: tuple[int, ...]) -> dict[int, dict[str, float]]:
    """The rule's daily log excess over equal weight on ``days`` fresh days of a ``kind`` market, by delay: the
    mean in %/y and its t statistic."""
    synthetic = make_market(kind, num_days=days, num_assets=SMALL_MARKET["num_assets"], seed=seed)
    frame = synthetic.prices
    table = PriceTable(
        dates=pd.DatetimeIndex(frame["date"]),
        tickers=tuple(frame.columns[1:]),
        prices=frame.iloc[:, 1:].to_numpy(dtype=np.float64),
    )
    market = build_market(table, lookback=1, episode_days=2, validation_days=2, holdout_days=2)
    assets = market.num_assets
    equal = np.zeros_like(synthetic.rule_weights)
    equal[:, 1:] = 1.0 / assets
    earned = range(max(delays) + 2, market.num_days)  # every day each delay's first decision can earn
    out = {}
    for delay in delays:
        rule = rule_log_returns(market, synthetic.rule_weights, earned, COST_RATE, execution_delay=delay)
        base = rule_log_returns(market, equal, earned, COST_RATE, execution_delay=delay)
        excess = rule - base  # (D,); all 0 where the rule is equal weight (the random walk's)
        spread = float(excess.std(ddof=1))
        out[delay] = {
            "edge": float(np.expm1(excess.mean() * TRADING_DAYS) * 100),
            "t": float(excess.mean() / spread * math.sqrt(len(excess))) if spread > 0 else 0.0,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--days", type=int, default=20_000, help="fresh days of each market for the rules' edges")
    parser.add_argument("--train", action="store_true", help="also train runs at delays 0 and 1 (minutes each)")
    parser.add_argument("--generations", type=int, default=25)
    parser.add_argument("--out", default="runs/execution_delay", help="folder of the trained runs (reused)")
    parser.add_argument("--json-out", help="write every figure as JSON here")
    args = parser.parse_args()
    kinds = args.kinds.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    report: dict[str, list] = {"rules": [], "runs": []}

    print(f"the rule's excess over equal weight on {args.days} fresh days ({COST_RATE * 1e4:g} bp costs), %/y (t)")
    print(f"{'market':<12}{'seed':>5}" + "".join(f"{f'delay {d}':>18}" for d in DELAYS))
    for kind in kinds:
        for seed in seeds:
            edges = rule_edge(kind, seed, days=args.days + WARMUP_DAYS, delays=DELAYS)
            report["rules"].append({"kind": kind, "seed": seed, **{str(d): e for d, e in edges.items()}})
            cells = "".join(f"{edges[d]['edge']:>+10.1f} ({edges[d]['t']:>+5.1f})" for d in DELAYS)
            print(f"{kind:<12}{seed:>5}{cells}", flush=True)

    if args.train:
        print("\ntrained champions (benchmarks/learning.py's small runs), holdout log return")
        print(f"{'market':<12}{'seed':>5}{'delay':>6}{'champion':>10}{'equal w.':>10}{'rule':>10}{'crowned':>9}")
        for kind in kinds:
            for seed in seeds:
                for delay in (0, 1):
                    base = small_config(args.generations, **{"env.execution_delay": delay})
                    out = Path(args.out) / f"delay-{delay}"
                    row = run_one(kind, seed, base, out, lambda line: None, **SMALL_MARKET)
                    report["runs"].append({"delay": delay, **row})
                    print(
                        f"{kind:<12}{seed:>5}{delay:>6}{row['champion']:>+10.3f}{row['equal_weight']:>+10.3f}"
                        f"{row['rule']:>+10.3f}{row['crowned']:>9}",
                        flush=True,
                    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
