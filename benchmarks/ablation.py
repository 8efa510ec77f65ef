"""What each part of "learning that does not fool itself" does: small synthetic markets, one part off at a time.

    python benchmarks/ablation.py                         # every variant, seeds 0 1
    python benchmarks/ablation.py --variants default,critic --seeds 0

Each variant trains ``benchmarks.learning.small_config`` runs (8 agents, 5 assets, 1500 days, about a minute on one
core) on a planted one-day reversal (strength 0.02) and on a random walk, and prints the holdout figures of
``benchmarks/learning.py``. The variants:

* ``default``: as shipped.
* ``critic``: the actor climbs the critic (plain DDPG), not the exact next-day reward (``learner.actor_objective``).
* ``no_tilt``: agents start from full-scale random heads and no cash bias, not as small tilts around equal weight.
* ``best_on_validation``: selection as it was: crown the agent with the best validation log return whenever it
  beats the champion's, with no allowance for noise or for the number of candidates compared (z = 0).
* ``lookback_8``: observation windows of 8 days instead of 1 (``env.lookback``).
* ``choose_by_bound``: of the agents with a proven edge, crown the highest bound, not the highest validation
  return (``selection.choose_by``).
* ``observation_noise``: Gaussian noise of stdev 0.5 on the replayed features (``learner.observation_noise``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.learning import HEADER, SMALL_MARKET, format_row, run_one, small_config

VARIANTS = (
    "default",
    "critic",
    "no_tilt",
    "best_on_validation",
    "lookback_8",
    "choose_by_bound",
    "observation_noise",
)
SETTINGS = {
    "critic": {"learner.actor_objective": "critic"},
    "lookback_8": {"env.lookback": 8},
    "choose_by_bound": {"selection.choose_by": "bound"},
    "observation_noise": {"learner.observation_noise": 0.5},
}
"""The variants that are config overrides; the others patch the trainer while they run."""
GENERATIONS = 25
MARKETS = (("reversal", {"strength": 0.02}), ("random_walk", {}))


@contextlib.contextmanager
def variant(name: str) -> Iterator[dict[str, str]]:
    """Patches the trainer for ``name`` while the run trains; yields its config overrides."""
    import models.networks as networks
    import training.loop as trainer

    saved = (networks.HEAD_INIT_SCALE, networks.CASH_LOGIT, trainer.selection_z)
    try:
        if name == "no_tilt":
            networks.HEAD_INIT_SCALE, networks.CASH_LOGIT = 1.0, 0.0
        if name == "best_on_validation":
            trainer.selection_z = lambda popsize, generation, alpha: 0.0
        yield SETTINGS.get(name, {})
    finally:
        networks.HEAD_INIT_SCALE, networks.CASH_LOGIT, trainer.selection_z = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--out", default="runs/ablation", help="folder of the markets and runs (reused)")
    parser.add_argument("--json-out", help="write the rows as JSON here")
    args = parser.parse_args()
    rows = []
    print(f"{'variant':<20}{HEADER}", flush=True)
    for name in args.variants.split(","):
        if name not in VARIANTS:
            raise SystemExit(f"unknown variant {name!r} (choose from {', '.join(VARIANTS)})")
        for kind, strengths in MARKETS:
            for seed in (int(s) for s in args.seeds.split(",")):
                with variant(name) as settings:
                    out = Path(args.out) / name
                    row = run_one(
                        kind,
                        seed,
                        small_config(GENERATIONS, **settings),
                        out,
                        lambda line: None,
                        **SMALL_MARKET,
                        **strengths,
                    )
                rows.append({"variant": name, **row})
                print(f"{name:<20}{format_row(kind, seed, row)}", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
