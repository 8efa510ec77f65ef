"""Do the agents decay as training goes on? The validation excess of the best and the mean agent, per generation.

    python benchmarks/learning_curves.py runs/RUN [runs/OTHER ...] [--every 5]

For each run folder it reads ``metrics.jsonl`` and prints, every ``--every`` generations, the best and the mean
agent's validation log return minus equal weight's (the same days, net of costs), the training fitness and the
critical t of the selection gate; then the decay check: the mean agent's excess at the last generation against
generation 5 (the target: not below it), and the least-squares slope of the mean excess over the second half of
the run (per 10 generations).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from persistence import run_folder
from persistence.jsonl import read_rows


def curves(run: Path) -> list[dict[str, float]]:
    """One point per generation: best and mean validation excess over equal weight, mean fitness, critical t."""
    return [
        {
            "generation": row["generation"],
            "best": row["validation_best"] - row["validation_equal_weight"],
            "mean": row["validation_mean"] - row["validation_equal_weight"],
            "fitness": row["mean_fitness"],
            "z": row["selection_z"],
        }
        for row in read_rows(run_folder.metrics_path(run))
    ]


def decay(points: list[dict[str, float]]) -> dict[str, float]:
    """The mean agent's excess at generation 5 and at the last, and the slope of the second half per 10 gens."""
    half = points[len(points) // 2 :]
    slope = statistics.linear_regression([p["generation"] for p in half], [p["mean"] for p in half]).slope
    at_five = next(p["mean"] for p in points if p["generation"] == min(5, points[-1]["generation"]))
    return {"mean_at_5": at_five, "mean_at_last": points[-1]["mean"], "slope_per_10": 10 * slope}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--every", type=int, default=5)
    args = parser.parse_args()
    for run in args.runs:
        points = curves(run)
        print(f"{run}\n{'gen':>5}{'best - ew':>11}{'mean - ew':>11}{'fitness':>10}{'z':>7}")
        for p in points:
            if p["generation"] % args.every == 0 or p["generation"] in (1, points[-1]["generation"]):
                print(f"{p['generation']:>5}{p['best']:>+11.3f}{p['mean']:>+11.3f}{p['fitness']:>+10.3f}{p['z']:>7.2f}")
        d = decay(points)
        verdict = "holds" if d["mean_at_last"] >= d["mean_at_5"] else "DECAYS"
        print(
            f"mean excess at gen 5 {d['mean_at_5']:+.3f}, at the last {d['mean_at_last']:+.3f} ({verdict}); "
            f"second-half slope {d['slope_per_10']:+.3f} per 10 generations\n"
        )


if __name__ == "__main__":
    main()
