"""Does learning hold up? Train on markets with a known answer and compare the champion's holdout with the rule.

    python benchmarks/learning.py                                   # every kind, seeds 0 1 2, the default preset
    python benchmarks/learning.py --kinds reversal --seeds 0 --set learner.actor_objective=critic

For each kind of ``environment.synthetic`` market and each seed (the market's and the run's), it writes the prices,
trains a run with the preset (a finished run in ``--out`` is reused, an unfinished one resumed), and scores the
champion on the holdout, as ``python main.py evaluate`` does (one episode from cash, the same costs), against equal
weight (daily) and the rule that knows the planted signal. Printed per run, and as JSON with ``--json-out``:

* ``champion`` / ``equal_weight`` / ``rule``: holdout log return (net of costs);
* ``of_rule``: the champion's log return as a fraction of the rule's (the planted-signal target is >= 0.8);
* ``turnover_ratio``: the champion's turnover over equal weight's (the no-signal target is <= 2);
* ``return_gap``: champion minus equal weight, total return in points (the no-signal target is within 2);
* ``crowned``: the generation the champion was crowned in, 0 when no agent proved an edge (equal weight);
* ``rule_bound``: the selection test's bound for the rule's edge on the validation days, at the run's last critical
  t (%/year): when it is near or below 0, even a perfect learner could not be crowned on that much validation;
* ``rule_t``: the rule's own t statistic of its daily excess over equal weight on the validation days (a single
  one-sided 5% test passes above 1.645), and ``last_z`` the run's last critical t.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from config import Config, override, parse_assignments, preset
from environment.book import LONG_ONLY, Book
from environment.features import WARMUP_DAYS
from environment.kernel import cash_weights, decision_step
from environment.synthetic import KINDS, make_market
from offline.holdout import score_champion
from persistence.jsonl import read_rows
from run.launch import train_to_end
from training.selection import edge_bounds, t_statistics


def rule_log_returns(
    market, rule_weights: np.ndarray, days: range, cost_rate: float, *, execution_delay: int, book: Book = LONG_ONLY
) -> np.ndarray:
    """The rule's daily log returns on ``days``, one episode from cash, through the environment's kernel: the target it
    decides at the close of ``day - 1 - execution_delay`` earns ``day``, as an agent's does, within the ``book``'s
    limits and paying its holding costs."""
    weights = cash_weights((), market.num_assets)
    out = []
    for day in days:
        target = torch.as_tensor(rule_weights[day - 1 - execution_delay + WARMUP_DAYS], dtype=torch.float32)
        step = decision_step(
            weights,
            target,
            market.day_relatives(torch.tensor(day)).cpu(),
            cost_rate=cost_rate,
            fill_relatives=market.day_relatives(torch.tensor(day - 1)).cpu() if execution_delay else None,
            book=book,
        )
        out.append(float(step.rewards))
        weights = step.next_weights
    return np.asarray(out)


SMALL = {
    "data.validation_days": 252,
    "data.holdout_days": 252,
    "env.episode_days": 21,
    "model.encoder_hidden": 16,
    "model.embedding": 8,
    "model.head_hidden": 16,
    "evolution.popsize": 8,
    "rollout.episodes": 8,
    "rollout.exploring_episodes": 4,
    "learner.batch_size": 64,
    "learner.updates_per_generation": 16,
    "learner.buffer_size": 20_000,
    "learner.learning_starts": 500,
    "learner.actor_lr": 3e-4,  # small networks and 25 generations: at 1e-4 the reversal is not learned yet
}
"""A small version of the default preset (8 agents, small networks, the larger actor step of issue 12) for 5-asset
markets of 1500 days: a run takes about a minute on one CPU core. The tests and ``benchmarks/ablation.py`` use it."""
SMALL_MARKET = {"num_days": 1500, "num_assets": 5}


def small_config(generations: int, **settings: Any) -> Config:
    return override(preset("default"), {**SMALL, "runtime.generations": generations, **settings})


def train_on_file(prices, folder: Path, base: Config, seed: int, log) -> tuple:
    """Write the long frame ``prices`` as ``folder/prices.csv`` and train ``base`` on it to the end, quietly, with
    its checkpoints in ``folder``: (trainer, the run's config, seconds of training)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "prices.csv"
    prices.to_csv(path, index=False)
    settings = {"data.path": str(path), "runtime.seed": seed, "runtime.progress": False}
    config = override(base, {**settings, "checkpoint.uri": str(folder), "checkpoint.run_name": "run"})
    start = time.perf_counter()
    trainer = train_to_end(config, log=log)
    return trainer, config, time.perf_counter() - start


def run_one(kind: str, seed: int, base, out: Path, log, **market: Any) -> dict:
    """Train on a ``kind`` market (``market`` overrides ``make_market``'s sizes and strengths) and score it."""
    synthetic = make_market(kind, seed=seed, **market)
    trainer, config, seconds = train_on_file(synthetic.prices, out / f"{kind}-seed-{seed}", base, seed, log)
    market = trainer.market
    results = score_champion(market, config, trainer.population.champion)
    holdout = results["holdout"]
    log_return = {s: float(t.log_returns.sum()) for s, t in holdout.traces.items()}
    delay = config.env.execution_delay
    rule = rule_log_returns(
        market, synthetic.rule_weights, market.splits.holdout, config.env.cost_rate, execution_delay=delay
    )
    champion, equal = holdout.metrics["champion"], holdout.metrics["equal_weight"]
    # Could the selection test have crowned the rule itself? Its bound on the validation days, at the last z.
    rule_validation = rule_log_returns(
        market, synthetic.rule_weights, market.splits.validation, config.env.cost_rate, execution_delay=delay
    )
    equal_validation = np.asarray(results["validation"].traces["equal_weight"].log_returns, dtype=np.float64)
    z = read_rows(trainer.checkpoints.metrics_path)[-1]["selection_z"]  # the run's last critical t
    rule_bound = edge_bounds(torch.as_tensor(rule_validation)[None], torch.as_tensor(equal_validation), z=z)[0]
    rule_t = float(t_statistics(torch.as_tensor(rule_validation - equal_validation)[None])[0])
    return {
        "kind": kind,
        "seed": seed,
        "champion": log_return["champion"],
        "equal_weight": log_return["equal_weight"],
        "untrained": log_return["untrained"],
        "rule": float(rule.sum()),
        "of_rule": log_return["champion"] / float(rule.sum()) if kind != "random_walk" else None,
        "turnover_ratio": champion.turnover / equal.turnover,
        "return_gap": 100 * (champion.total_return - equal.total_return),
        "sharpe": champion.sharpe,
        "sharpe_equal_weight": equal.sharpe,
        "crowned": trainer.champion.generation,
        "bound": trainer.champion.bound,
        "rule_bound": float(rule_bound),
        "rule_t": rule_t,
        "last_z": z,
        "train_s": seconds,
    }


HEADER = (
    f"{'market':<12}{'seed':>5}{'champion':>10}{'equal w.':>10}{'rule':>10}{'of rule':>9}"
    f"{'turnover x':>12}{'gap pts':>9}{'crowned':>9}{'rule bound':>11}{'rule t':>8}{'last z':>8}{'train s':>9}"
)


def format_row(kind: str, seed: int, row: dict) -> str:
    """One ``run_one`` row as a line under ``HEADER``."""
    of_rule = "" if row["of_rule"] is None else f"{row['of_rule']:.2f}"
    return (
        f"{kind:<12}{seed:>5}{row['champion']:>+10.3f}{row['equal_weight']:>+10.3f}{row['rule']:>+10.3f}"
        f"{of_rule:>9}{row['turnover_ratio']:>12.2f}{row['return_gap']:>+9.2f}{row['crowned']:>9}"
        f"{row['rule_bound'] * 100:>+10.1f}%{row['rule_t']:>8.2f}{row['last_z']:>8.2f}{row['train_s']:>9.0f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default="runs/learning", help="folder of the markets and runs (reused)")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    parser.add_argument("--quiet", action="store_true", help="no per-generation lines")
    args = parser.parse_args()
    base = override(preset(args.preset), parse_assignments(args.set))
    log = (lambda line: None) if args.quiet else print
    rows = []
    for kind in args.kinds.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = run_one(kind, seed, base, Path(args.out), log)
            rows.append(row)
            print(HEADER)
            print(format_row(kind, seed, row), flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
