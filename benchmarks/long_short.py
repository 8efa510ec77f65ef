"""A signal that marks losers: does a long-short book take more of it than a long-only one, none when borrow eats it?

    python benchmarks/long_short.py                            # seeds 0,1,2, 25 generations, every arm
    python benchmarks/long_short.py --seeds 0 --arms long_short --generations 3

The market (``warned_market``): 5 assets whose daily log returns are a market factor plus noise, as in
``benchmarks/user_feature.py``; each day ``MARKED`` assets, drawn at random, are marked in the long file's ``warn``
column (1 for them, 0 for the others), and they fall by ``strength`` on the day a decision that observed the mark earns
(the close of the mark's day + ``env.execution_delay`` fills it, the next day pays), while the others gain as much in
all, so the marks leave the average asset's return as it was. A long-only book can only hold the unmarked assets; a
long-short book can also sell the marked ones short, which earns their fall, less the borrow.
Two rules know the marks: the long-only rule holds the unmarked assets at equal weight; the long-short rule holds the
same longs and sells the marked assets short, ``SHORT`` of the book in all (gross 1.5, net 0.5: inside the long-short
book's default limits). Arms, each trained with ``benchmarks.learning``'s small runs on ``data.features=builtin,warn``
and scored on the holdout as ``python main.py evaluate`` does:

* ``long_only``: ``env.book=long_only``: the most it can take is the long-only rule;
* ``long_short``: ``env.book=long_short`` at the default borrow (0.5%/y): the long-short rule is open to it;
* ``long_short_costly``: the same book with ``env.borrow_rate`` ``COSTLY_BORROW``, more a day than the fall a short
  earns: shorting the marks loses money by itself, and the long-only rule beats the long-short one (a short that
  funds longs beyond the book's value, which the net limit allows no other way, can still pay).

Printed per run: the champion's and equal weight's holdout log return, the arm's own rule's (within the arm's book and
fees), both rules' (the long-short rule at the default borrow: the one yardstick for every arm), the champion's as a
fraction of the long-short rule's (``of LS``) and of its excess over equal weight (``of LS x``: a year whose market
falls leaves the plain fraction without meaning), the generation crowned (0: none, the champion is equal weight) and
the training seconds.
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
from environment.book import LONG_ONLY, TRADING_DAYS, Book
from offline.holdout import score_champion

STRENGTH = 0.0035
"""The daily fall of a marked asset. A borrow rate must stay below 100%/y, whose day (0.40%) must beat the fall for
the costly arm to lose money by shorting: so the fall is smaller than ``benchmarks/user_feature.py``'s 0.6% gain."""
MARKED = 2
"""Assets marked a day (of 5): two give either rule more edge for the noise it takes on than one would."""
SHORT = 0.5
"""The long-short rule's short leg, as a fraction of the book, split over the marked assets."""
COSTLY_BORROW = 1.1 * TRADING_DAYS * STRENGTH
"""97.0%/y, 0.385% a day of the short's value: 10% more than the 0.35% fall, more still than a short earns (the fall
less the asset's usual drift of about 0.04% a day). Fee and fall both scale with the short: its size cancels."""
FEATURES = "builtin,warn"
ARMS = {
    "long_only": {"env.book": "long_only"},
    "long_short": {"env.book": "long_short"},
    "long_short_costly": {"env.book": "long_short", "env.borrow_rate": COSTLY_BORROW},
}
"""Arm -> its settings beside ``data.features``."""


def warned_market(
    *,
    seed: int,
    num_days: int,
    num_assets: int,
    execution_delay: int,
    planted: bool,
    strength: float = STRENGTH,
    marked: int = MARKED,
) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """A long price file with a ``warn`` column, and each rule's (T, N + 1) target weights (cash first) by row, keyed
    by the book it trades in (``long_only``, ``long_short``)."""
    rng = np.random.default_rng(seed)
    log_returns = rng.normal(0.0003, 0.008, size=(num_days, 1)) + rng.normal(0.0, 0.012, size=(num_days, num_assets))
    warn = np.zeros((num_days, num_assets))
    np.put_along_axis(warn, rng.random((num_days, num_assets)).argsort(axis=1)[:, :marked], 1.0, axis=1)
    if planted:  # the decision at row t's close fills at the close of t + delay and earns row t + delay + 1
        lag = execution_delay + 1
        # the others gain what the marked lose: the market's mean stays, so cash or a net short gains nothing from it
        shift = strength * (marked / (num_assets - marked) * (1.0 - warn) - warn)
        log_returns[lag:] += shift[: num_days - lag]
    prices = 100.0 * np.exp(np.cumsum(log_returns, axis=0))
    dates = pd.bdate_range("2000-01-03", periods=num_days).strftime("%Y-%m-%d")
    tickers = [f"S{i:02d}" for i in range(num_assets)]
    frame = pd.DataFrame(
        {
            "date": np.repeat(dates, num_assets),
            "ticker": np.tile(tickers, num_days),
            "close": prices.reshape(-1),
            "warn": warn.reshape(-1),
        }
    )
    longs = (1.0 - warn) / (num_assets - marked)
    shorts = SHORT * warn / marked
    rules = {
        "long_only": np.concatenate([np.zeros((num_days, 1)), longs], axis=1),
        "long_short": np.concatenate([np.full((num_days, 1), SHORT), longs - shorts], axis=1),
    }
    return frame, rules


def run_arm(arm: str, seed: int, generations: int, out: Path, log) -> dict:
    base = small_config(generations, **{"data.features": FEATURES, **ARMS[arm]})
    delay, cost = base.env.execution_delay, base.env.cost_rate
    frame, rules = warned_market(seed=seed, execution_delay=delay, planted=True, **SMALL_MARKET)
    trainer, config, seconds = train_on_file(frame, out / f"{arm}-seed-{seed}", base, seed, log)
    market = trainer.market
    holdout = score_champion(market, config, trainer.population.champion)["holdout"]
    champion, equal = (float(holdout.traces[s].log_returns.sum()) for s in ("champion", "equal_weight"))

    def rule(kind: str, book: Book) -> float:
        earned = rule_log_returns(market, rules[kind], market.splits.holdout, cost, execution_delay=delay, book=book)
        return float(earned.sum())

    book = Book.from_env(config.env)
    long_short = rule("long_short", Book.from_env(small_config(generations, **ARMS["long_short"]).env))  # 0.5%/y
    return {
        "arm": arm,
        "seed": seed,
        "book": config.env.book,
        "borrow_rate": config.env.borrow_rate,
        "champion": champion,
        "equal_weight": equal,
        "rule": rule(book.kind, book),
        "long_only_rule": rule("long_only", LONG_ONLY),
        "long_short_rule": long_short,
        "of_long_short_rule": champion / long_short,
        "of_long_short_excess": (champion - equal) / (long_short - equal),
        "crowned": trainer.champion.generation,
        "train_s": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--generations", type=int, default=25)
    parser.add_argument("--out", default="runs/long_short", help="folder of the markets and runs")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    args = parser.parse_args()
    print(
        f"{'arm':<19}{'seed':>5}{'champion':>10}{'equal w.':>10}{'rule':>9}{'LO rule':>9}{'LS rule':>9}"
        f"{'of LS':>7}{'of LS x':>9}{'crowned':>9}{'train s':>9}"
    )
    rows = []
    for arm in args.arms.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = run_arm(arm, seed, args.generations, Path(args.out), log=lambda line: None)
            rows.append(row)
            print(
                f"{arm:<19}{seed:>5}{row['champion']:>+10.3f}{row['equal_weight']:>+10.3f}{row['rule']:>+9.3f}"
                f"{row['long_only_rule']:>+9.3f}{row['long_short_rule']:>+9.3f}{row['of_long_short_rule']:>7.2f}"
                f"{row['of_long_short_excess']:>9.2f}{row['crowned']:>9}{row['train_s']:>9.0f}",
                flush=True,
            )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
