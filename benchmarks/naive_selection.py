"""What the selection test protects against, on a finished backtest: the naive champion of every fold.

    python main.py backtest                                   # first: the folds, in runs/backtest
    python benchmarks/naive_selection.py runs/backtest

For each fold of the backtest folder, the naive champion is the agent of the fold's last generation with the best
validation log return (no test, no allowance for the number of agents compared). It trades the fold's test year
from cash with the same costs, beside equal weight. Printed per fold, then the mean Sharpe of both, the difference,
its spread and worst, and the turnover ratio; ``--json-out`` writes the rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config import Config, override
from offline.holdout import run_range
from persistence import run_folder
from run.launch import train_to_end


def naive_fold(run_dir: Path) -> dict:
    config = Config.from_dict(json.loads(run_folder.config_path(run_dir).read_text()))
    config = override(
        config,
        {"checkpoint.uri": str(run_dir.parent), "checkpoint.run_name": run_dir.name, "runtime.progress": False},
    )
    trainer = train_to_end(config, log=lambda line: None)  # a finished fold: loads its last generation
    market, actor = trainer.market, trainer.population.actor
    env = config.env
    settings = {"lookback": env.lookback, "cost_rate": env.cost_rate, "execution_delay": env.execution_delay}
    agents = {f"agent{i}": actor.agent(i) for i in range(actor.popsize)}
    validation = run_range(market, agents, market.splits.validation, name="validation", **settings)
    best = max(agents, key=lambda name: float(validation.traces[name].log_returns.sum()))
    test = run_range(market, {best: agents[best]}, market.splits.holdout, name="test year", **settings)
    naive, equal = test.metrics[best], test.metrics["equal_weight"]
    return {
        "fold": run_dir.name,
        "agent": best,
        "validation": float(validation.traces[best].log_returns.sum()),
        "validation_equal_weight": float(validation.traces["equal_weight"].log_returns.sum()),
        "sharpe": naive.sharpe,
        "sharpe_equal_weight": equal.sharpe,
        "total_return": naive.total_return,
        "total_return_equal_weight": equal.total_return,
        "turnover_ratio": naive.turnover / equal.turnover,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backtest", type=Path, help="a backtest folder (runs/backtest by default)")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    args = parser.parse_args()
    folds = sorted(p for p in args.backtest.glob("fold-*-seed-*") if run_folder.is_run_folder(p))
    if not folds:
        raise SystemExit(f"error: no finished fold under {args.backtest}")
    rows = []
    print(f"{'fold':<20}{'Sharpe':>8}{'eq. w.':>8}{'return':>9}{'eq. w.':>9}{'turnover x':>12}{'validation':>12}")
    for run_dir in folds:
        row = naive_fold(run_dir)
        rows.append(row)
        print(
            f"{row['fold']:<20}{row['sharpe']:>+8.2f}{row['sharpe_equal_weight']:>+8.2f}"
            f"{row['total_return']:>+9.1%}{row['total_return_equal_weight']:>+9.1%}{row['turnover_ratio']:>11.1f}x"
            f"{row['validation'] - row['validation_equal_weight']:>+12.3f}",
            flush=True,
        )
    difference = [r["sharpe"] - r["sharpe_equal_weight"] for r in rows]
    spread = statistics.stdev(difference) if len(difference) > 1 else 0.0
    print(
        f"mean Sharpe: naive {statistics.mean(r['sharpe'] for r in rows):+.2f}, "
        f"equal weight {statistics.mean(r['sharpe_equal_weight'] for r in rows):+.2f}; difference mean "
        f"{statistics.mean(difference):+.2f}, spread {spread:.2f}, worst {min(difference):+.2f}; "
        f"won {sum(d > 0 for d in difference)}/{len(rows)}; turnover "
        f"{statistics.median(r['turnover_ratio'] for r in rows):.0f}x equal weight's (median)"
    )
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
