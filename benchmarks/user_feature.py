"""A signal that only a user's column shows: is it learned when the column is a feature, and only then?

    python benchmarks/user_feature.py                          # seeds 0,1,2, 25 generations, every arm
    python benchmarks/user_feature.py --seeds 0 --arms with_column

The market (``announced_market``): 5 assets whose daily log returns are a market factor plus noise, as in
``environment.synthetic``; each day one asset, drawn at random, is announced in the long file's ``news`` column
(1 for it, 0 for the others), and it gains ``strength`` on the day a decision that observed the announcement earns
(the close of the announcement day + ``env.execution_delay`` fills it, the next day pays). Its prices carry nothing
about the next announcement, so the built-in features, which come from prices, cannot find it. The rule holds the
announced asset. Arms, each trained with ``benchmarks.learning``'s small runs and scored on the holdout as
``python main.py evaluate`` does:

* ``with_column``: ``data.features=builtin,news``: the column is a feature;
* ``prices_only``: ``data.features=builtin``: the same market, the column left out;
* ``null_column``: the column given but nothing planted (the announcements are noise): no edge to crown.

Printed per run: the champion's, equal weight's and the rule's holdout log return, the champion's as a fraction of
the rule's, the generation crowned (0: none, the champion is equal weight) and the training seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pandas as pd

from benchmarks.learning import SMALL_MARKET, rule_log_returns, small_config, train_on_file
from offline.holdout import score_champion

ARMS = {
    "with_column": ("builtin,news", True),
    "prices_only": ("builtin", True),
    "null_column": ("builtin,news", False),
}
"""Arm -> (data.features, whether the announcement is planted in the returns)."""
STRENGTH = 0.006


def announced_market(
    *, seed: int, num_days: int, num_assets: int, execution_delay: int, planted: bool, strength: float = STRENGTH
) -> tuple[pd.DataFrame, np.ndarray]:
    """A long price file with a ``news`` column, and the rule's (T, N + 1) target weights (cash first) by row."""
    rng = np.random.default_rng(seed)
    log_returns = rng.normal(0.0003, 0.008, size=(num_days, 1)) + rng.normal(0.0, 0.012, size=(num_days, num_assets))
    announced = rng.integers(num_assets, size=num_days)
    if planted:  # the decision at row t's close fills at the close of t + delay and earns row t + delay + 1
        earns = np.arange(num_days) + execution_delay + 1
        inside = earns < num_days
        log_returns[earns[inside], announced[inside]] += strength
    prices = 100.0 * np.exp(np.cumsum(log_returns, axis=0))
    news = np.zeros((num_days, num_assets))
    news[np.arange(num_days), announced] = 1.0
    dates = pd.bdate_range("2000-01-03", periods=num_days).strftime("%Y-%m-%d")
    tickers = [f"S{i:02d}" for i in range(num_assets)]
    frame = pd.DataFrame(
        {
            "date": np.repeat(dates, num_assets),
            "ticker": np.tile(tickers, num_days),
            "close": prices.reshape(-1),
            "news": news.reshape(-1),
        }
    )
    rule = np.concatenate([np.zeros((num_days, 1)), news], axis=1)
    return frame, rule


def run_arm(arm: str, seed: int, generations: int, out: Path, log) -> dict:
    features, planted = ARMS[arm]
    base = small_config(generations, **{"data.features": features})
    delay = base.env.execution_delay
    frame, rule_weights = announced_market(seed=seed, execution_delay=delay, planted=planted, **SMALL_MARKET)
    trainer, config, seconds = train_on_file(frame, out / f"{arm}-seed-{seed}", base, seed, log)
    market = trainer.market
    holdout = score_champion(market, config, trainer.population.champion)["holdout"]
    log_return = {s: float(t.log_returns.sum()) for s, t in holdout.traces.items()}
    rule = float(
        rule_log_returns(market, rule_weights, market.splits.holdout, config.env.cost_rate, execution_delay=delay).sum()
    )
    return {
        "arm": arm,
        "seed": seed,
        "features": list(market.feature_names),
        "champion": log_return["champion"],
        "equal_weight": log_return["equal_weight"],
        "rule": rule,
        "of_rule": log_return["champion"] / rule if planted else None,
        "crowned": trainer.champion.generation,
        "train_s": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--generations", type=int, default=25)
    parser.add_argument("--out", default="runs/user_feature", help="folder of the markets and runs")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    args = parser.parse_args()
    print(
        f"{'arm':<13}{'seed':>5}{'champion':>10}{'equal w.':>10}{'rule':>9}{'of rule':>9}{'crowned':>9}{'train s':>9}"
    )
    rows = []
    for arm in args.arms.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = run_arm(arm, seed, args.generations, Path(args.out), log=lambda line: None)
            rows.append(row)
            of_rule = "" if row["of_rule"] is None else f"{row['of_rule']:.2f}"
            print(
                f"{arm:<13}{seed:>5}{row['champion']:>+10.3f}{row['equal_weight']:>+10.3f}{row['rule']:>+9.3f}"
                f"{of_rule:>9}{row['crowned']:>9}{row['train_s']:>9.0f}",
                flush=True,
            )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
