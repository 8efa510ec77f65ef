"""Does an embargo between the days the gradient fits and the days that select change the gate's size or power?

    python benchmarks/embargo.py --seeds 0-19 --jobs 2                 # random walks and persistent leaders

Fitness blocks sit beside the days the learning episodes fill the buffer with, and the validation range right after
the training range, while a day's features look back up to 26 days: an agent that memorised its training days sees
familiar features on the first days of a block or of validation. The embargo keeps those days apart
(``rollout.fitness_embargo_days`` around each fitness block, ``data.gap_days`` between training and validation, with
``data.gap_before_validation``). Each market seed trains ``benchmarks/learning.py``'s small run twice, without and
with an embargo of ``--days`` (26: the features' span), on a random walk (the gate's size: the fraction of runs that
crown an agent where none has an edge) and on persistent leaders at 0.5%/day (its power: the share that crown
one, and how much of the rule's excess over equal weight the champion keeps on the holdout year). Printed with exact
95% binomial intervals; ``--json-out`` writes every run.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy.stats import beta

from benchmarks.learning import SMALL_MARKET, run_one, small_config

MARKETS = {"random_walk": {}, "leaders": {"strength": 0.005}}
"""The null market, and persistent leaders at the strength where the small runs crown some seeds and not others."""


def settings(embargo: int) -> dict[str, Any]:
    return {"rollout.fitness_embargo_days": embargo, "data.gap_days": embargo, "data.gap_before_validation": True}


def one(job: tuple[str, int, int, int, str]) -> dict[str, Any]:
    kind, seed, embargo, generations, out = job
    import torch

    torch.set_num_threads(1)
    config = small_config(generations, **settings(embargo))
    folder = Path(out) / f"embargo-{embargo}"
    row = run_one(kind, seed, config, folder, lambda line: None, **SMALL_MARKET, **MARKETS[kind])
    return {"embargo": embargo, **row}


def interval(hits: int, runs: int) -> str:
    low = 0.0 if hits == 0 else beta.ppf(0.025, hits, runs - hits + 1)
    high = 1.0 if hits == runs else beta.ppf(0.975, hits + 1, runs - hits)
    return f"{hits}/{runs} [{low:.2f}, {high:.2f}]"


def seeds_of(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last) + 1)) if last else [int(s) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0-19")
    parser.add_argument("--days", type=int, default=26, help="the embargo tried against none")
    parser.add_argument("--generations", type=int, default=25)
    parser.add_argument("--kinds", default=",".join(MARKETS))
    parser.add_argument("--jobs", type=int, default=1, help="runs at once, one torch thread each")
    parser.add_argument("--out", default="runs/embargo")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    jobs = [
        (kind, seed, embargo, args.generations, args.out)
        for kind in args.kinds.split(",")
        for seed in seeds_of(args.seeds)
        for embargo in (0, args.days)
    ]
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(one, jobs))
    print(f"{'market':<12}{'embargo':>8}{'crowned (95% interval)':>26}{'of rule, mean':>15}")
    for kind in args.kinds.split(","):
        for embargo in (0, args.days):
            mine = [r for r in rows if r["kind"] == kind and r["embargo"] == embargo]
            crowned = sum(r["crowned"] > 0 for r in mine)
            kept = [
                (r["champion"] - r["equal_weight"]) / (r["rule"] - r["equal_weight"])
                for r in mine
                if kind != "random_walk" and r["rule"] != r["equal_weight"]
            ]
            share = f"{sum(kept) / len(kept):+.2f}" if kept else "-"
            print(f"{kind:<12}{embargo:>8}{interval(crowned, len(mine)):>26}{share:>15}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
