"""The gate's size in real runs: how often does training on a market with no signal crown an agent?

    python benchmarks/null_markets.py --seeds 0-19 --generations 20

Each seed makes a random walk (``environment.synthetic``, 5 assets, 1500 days: ``benchmarks.learning``'s small
market) and trains ``benchmarks.learning.small_config`` on it. Printed per run: whether an agent was crowned, the
champion's holdout total return against equal weight's (points), and the run's last critical t; then the fraction of
runs that crowned any agent, which the gate promises to keep at or below ``selection.alpha`` (0.05), with its
binomial standard error.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.learning import SMALL_MARKET, run_one, small_config


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1)) if "," not in text else [int(s) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-19")
    parser.add_argument("--generations", type=int, default=20)
    parser.add_argument("--out", default="runs/null-markets")
    args = parser.parse_args()
    config = small_config(args.generations)
    crowned = []
    print(f"{'seed':>5}{'crowned':>9}{'gap pts':>9}{'last z':>8}")
    for seed in seeds_of(args.seeds):
        row = run_one("random_walk", seed, config, Path(args.out), lambda line: None, **SMALL_MARKET)
        crowned.append(row["crowned"] > 0)
        print(f"{seed:>5}{row['crowned']:>9}{row['return_gap']:>+9.2f}{row['last_z']:>8.2f}", flush=True)
    share = sum(crowned) / len(crowned)
    error = math.sqrt(max(share * (1 - share), 1e-12) / len(crowned))
    print(f"crowned in {sum(crowned)} of {len(crowned)} runs: {share:.3f} (standard error {error:.3f}); alpha 0.05")


if __name__ == "__main__":
    main()
