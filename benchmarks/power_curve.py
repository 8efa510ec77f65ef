"""How weak a planted signal can the trainer still prove, against what the validation days can prove at all?

    python benchmarks/power_curve.py --kinds reversal,leaders --scales 1,0.5,0.25,0.125 --seed 0

For each kind and each scale of its signal's strength (``environment.synthetic``'s default strength times the
scale), it trains the preset on that market (``benchmarks.learning.run_one``) and prints whether an agent was
crowned, the champion's fraction of the rule's holdout log return, and the rule's own t statistic on the validation
days (a single one-sided 5% test passes above 1.645). Then, per kind: the weakest scale at which the trainer crowned
an agent, against the weakest at which the rule passes that single test; the target is a ratio within 1.5.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.learning import run_one
from config import override, parse_assignments, preset

BASE_STRENGTH = {"reversal": 0.01, "leaders": 0.005, "volatility": 0.001}
"""``environment.synthetic.make_market``'s default strength of each kind."""
SINGLE_TEST = 1.645
"""One-sided 5% quantile of the standard normal: the rule's single test."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="reversal,leaders")
    parser.add_argument("--scales", default="1,0.5,0.25,0.125")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--preset", default="default")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default="runs/power-curve")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    base = override(preset(args.preset), parse_assignments(args.set))
    scales = [float(s) for s in args.scales.split(",")]
    rows = []
    print(f"{'market':<10}{'scale':>7}{'crowned':>9}{'of rule':>9}{'rule t':>8}{'last z':>8}")
    for kind in args.kinds.split(","):
        for scale in scales:
            out = Path(args.out) / f"scale-{scale:g}"
            row = run_one(kind, args.seed, base, out, lambda line: None, strength=BASE_STRENGTH[kind] * scale)
            row["scale"] = scale
            rows.append(row)
            print(
                f"{kind:<10}{scale:>7g}{row['crowned']:>9}{row['of_rule']:>9.2f}{row['rule_t']:>8.2f}"
                f"{row['last_z']:>8.2f}",
                flush=True,
            )
        mine = [r for r in rows if r["kind"] == kind]
        crowned = min((r["scale"] for r in mine if r["crowned"] > 0), default=None)
        provable = min((r["scale"] for r in mine if r["rule_t"] > SINGLE_TEST), default=None)
        ratio = "" if crowned is None or provable is None else f", ratio {crowned / provable:.2f}"
        print(f"{kind}: weakest crowned scale {crowned}, weakest the rule proves alone {provable}{ratio}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
