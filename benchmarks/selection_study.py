"""Which selection design proves what the validation days allow? Record real runs once, judge every design offline.

    python benchmarks/selection_study.py record --kind leaders --scale 0.5 --seeds 0-7
    python benchmarks/selection_study.py record --kind random_walk --seeds 0-19
    python benchmarks/selection_study.py evaluate [--out runs/selection-study]

``record`` trains the preset (default: ``default``, 40 generations) on an ``environment.synthetic`` market of 10
assets and 3000 days per seed and writes, for every generation, what any selection design could look at and what
it should have found (``record.npz`` in ``OUT/KIND-SCALE[-TAG]/seed-S/``; a finished seed is skipped):

* ``excess`` (G, P, D): every agent's daily validation log return minus equal weight's (what the gate sees);
* ``fitness`` (G, P): the training fitness evolution selected on;
* ``blocks_excess`` (G, P, F): the same excess on every fitness block (days no gradient saw), each block one
  episode from cash, noise-free;
* ``fresh_mean`` / ``fresh_std`` (G, P): mean and spread of the daily excess over equal weight on a long fresh
  sample of the same generator (20 years, another seed, features normalised with the run's training statistics):
  each agent's true edge, which no design may look at;
* ``holdout_mean`` (G, P): the same on the run's 252-day holdout;
* the best observable rule's figures on the same days (the rule that reads only today's features; for the
  latent-state kinds the rule of ``environment.synthetic`` is reported beside it).

Training does not depend on the champion (evolution selects on fitness only), so one recording serves every design.
``evaluate`` replays each design of ``benchmarks.selection_designs`` on the records (the arithmetic of
``training.selection``'s gate; ``tests/test_benchmarks.py`` checks that the replay gives the trainer's critical
values and crowns) on two kinds of range: each run's validation days, with the trainer's own resamples, and
*replicates*: the fresh sample's two-year episodes (four-year spans for 1008-day validation) as validation ranges the
run might have had. The agents never saw either, so a replicate measures a design's size and power as the run's
own range does, ten times over (the same agents, so not independent across a run's replicates); an agent's true
edge on a replicate comes from the other fresh days. Printed per market: the fraction of ranges on which a design
crowned an agent, and one with a worthwhile edge (at least ``WORTHWHILE`` of the best observable rule's true edge),
the crowned champion's true edge (0 for equal weight), the generation of the crown and the last look's critical t;
the ungated final population's true edge, the rule's, and the power a perfect single test would have on the days
(one candidate named in advance, one-sided 5%: ``Phi(sqrt(D) IR - 1.645)`` with its true information ratio IR). On
random walks, the crowns with their exact 95% binomial intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from statistics import NormalDist
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import torch

from benchmarks.selection_designs import DESIGNS, TRADING_DAYS, Design, Resampled, replay, resample_counts
from config import Config, override, parse_assignments, preset
from environment.features import FEATURE_CLIP, WARMUP_DAYS, raw_features
from environment.loading import load_market
from environment.market import Market, Splits
from environment.synthetic import make_market
from run.streams import gate_generator
from run.trainer import Trainer
from training import selection
from training.fitness import training_starts
from training.loop import Scores
from training.rollout import Validation
from training.selection import stationary_bootstrap

BASE_STRENGTH = {"random_walk": 0.0, "reversal": 0.01, "leaders": 0.005, "volatility": 0.001}
"""``environment.synthetic.make_market``'s default strength of each kind."""
FRESH_EPISODES, FRESH_DAYS = 10, 504
"""The long fresh sample: 10 episodes of two years each (20 years), each from cash."""
FRESH_SEED_OFFSET = 100_000
"""A fresh sample's generator seed is the run's plus this: the same kind and strength, other days."""
CALIBRATION_DAYS = 60_000
"""Days of the sample the best observable rule is chosen on (its own seed, never a run's)."""
FEATURE_RULES = {"log_return_1d": 0, "log_return_5d": 1, "log_return_21d": 2, "macd_12_26": 5}
"""Features an observable rule may rank the assets by (today's value only, as a one-day observation sees it)."""


# ---------------------------------------------------------------------------------------------- observable rules


def rule_returns(weights: np.ndarray, relatives: np.ndarray, *, cost_rate: float) -> np.ndarray:
    """(R, T, N + 1) target weights decided at the close of day t, (T, N) relatives -> (R, T - 1) daily log returns
    net of costs, one episode from cash, by the arithmetic of ``environment.kernel``."""
    rules, days, width = weights.shape
    held = np.zeros((rules, width))
    held[:, 0] = 1.0
    out = np.empty((rules, days - 1))
    ones = np.ones(1)
    for t in range(days - 1):
        target = weights[:, t]
        turnover = np.abs(target[:, 1:] - held[:, 1:]).sum(axis=1)
        grown = target * np.concatenate([ones, relatives[t + 1]])
        growth = grown.sum(axis=1)
        out[:, t] = np.log(growth) + np.log1p(-cost_rate * turnover)
        held = grown / growth[:, None]
    return out


def observable_rules(features: np.ndarray) -> dict[str, np.ndarray]:
    """(T, N, K) raw features -> every rule of the family: hold the top k (1 to 3) assets by one feature of today,
    highest or lowest first, equally weighted; plus equal weight. Each (T, N + 1), cash first."""
    days, assets, _ = features.shape
    rules = {"equal_weight": np.concatenate([np.zeros((days, 1)), np.full((days, assets), 1.0 / assets)], axis=1)}
    for name, column in FEATURE_RULES.items():
        for sign, direction in ((1.0, "top"), (-1.0, "bottom")):
            order = np.argsort(-sign * np.nan_to_num(features[:, :, column]), axis=1)
            for k in (1, 2, 3):
                weights = np.zeros((days, assets + 1))
                np.put_along_axis(weights[:, 1:], order[:, :k], 1.0 / k, axis=1)
                rules[f"{direction}{k} {name}"] = weights
    return rules


def best_observable_rule(kind: str, strength: float, *, cost_rate: float) -> dict[str, Any]:
    """The rule of the family with the highest information ratio over equal weight on a long calibration sample of
    the generator (its own seed), with its expected t on 504 days."""
    synthetic = make_market(kind, num_days=CALIBRATION_DAYS, seed=999_999, strength=strength or None)
    prices = synthetic.prices.drop(columns="date").to_numpy()
    relatives = prices[WARMUP_DAYS:] / prices[WARMUP_DAYS - 1 : -1]
    rules = observable_rules(raw_features(prices)[WARMUP_DAYS:])
    names = list(rules)
    returns = rule_returns(np.stack([rules[n] for n in names]), relatives, cost_rate=cost_rate)
    excess = returns - returns[0]
    latent = rule_returns(synthetic.rule_weights[None, WARMUP_DAYS:], relatives, cost_rate=cost_rate)[0] - returns[0]
    ratio = {n: excess[i].mean() / excess[i].std() if excess[i].std() > 0 else 0.0 for i, n in enumerate(names)}
    best = max(names, key=lambda n: ratio[n])
    i = names.index(best)
    return {
        "rule": best,
        "edge": float(excess[i].mean() * 252),
        "daily_ir": float(ratio[best]),
        "expected_t_504": float(ratio[best] * math.sqrt(504)),
        "latent_edge": float(latent.mean() * 252),
        "latent_expected_t_504": float(latent.mean() / latent.std() * math.sqrt(504)) if latent.std() > 0 else 0.0,
    }


# ---------------------------------------------------------------------------------------------- the recorder


def fresh_market(kind: str, strength: float, seed: int, like: Market) -> tuple[Market, np.ndarray, np.ndarray]:
    """A long fresh sample of the generator, its features normalised with ``like``'s training statistics, its raw
    features and its latent rule's weights (for the rules), rows aligned with the market's."""
    days = WARMUP_DAYS + FRESH_EPISODES * FRESH_DAYS + 2
    synthetic = make_market(kind, num_days=days, seed=seed + FRESH_SEED_OFFSET, strength=strength or None)
    prices = synthetic.prices.drop(columns="date").to_numpy()
    raw = raw_features(prices)[WARMUP_DAYS:]
    mean, std = like.feature_mean.cpu().numpy(), like.feature_std.cpu().numpy()
    features = np.ascontiguousarray(np.clip((raw - mean) / std, -FEATURE_CLIP, FEATURE_CLIP), dtype=np.float32)
    relatives = np.ascontiguousarray(prices[WARMUP_DAYS:] / prices[WARMUP_DAYS - 1 : -1], dtype=np.float32)
    count = len(relatives)
    market = Market(
        dates=tuple(str(i) for i in range(count)),
        tickers=like.tickers,
        feature_names=like.feature_names,
        features=torch.from_numpy(features),
        relatives=torch.from_numpy(relatives),
        splits=Splits(train=range(0, 1), validation=range(1, count), holdout=range(count, count)),
    )
    return market, raw, synthetic.rule_weights[WARMUP_DAYS:]


class Scoring:
    """The population's deterministic policies and equal weight on some episodes of a market: (P, E * D) excess."""

    def __init__(self, trainer: Trainer, market: Market, starts: list[int], days: int) -> None:
        self.validation = Validation(
            trainer.config,
            market,
            trainer.population,
            sharding=trainer.sharding,
            starts=starts,
            days=days,
        )

    def excess(self) -> torch.Tensor:
        daily = self.validation.run().double()  # (P + 2, E * D)
        return daily[:-2] - daily[-1]


class RecordingTrainer(Trainer):
    """A trainer that, at each generation's validation, also scores the very parameters validated on the fitness
    blocks, a long fresh sample and the holdout, and keeps every figure a selection design may need."""

    def attach(self, fresh: Market) -> None:
        market, config = self.market, self.config
        blocks = [int(s) for s in training_starts(config, market).fitness]
        self.blocks = Scoring(self, market, blocks, config.env.episode_days)
        self.fresh = Scoring(self, fresh, [1 + e * FRESH_DAYS - 1 for e in range(FRESH_EPISODES)], FRESH_DAYS)
        holdout = market.splits.holdout
        self.holdout = Scoring(self, market, [holdout.start - 1], len(holdout))
        self.records: dict[str, list[np.ndarray]] = {
            k: []
            for k in (
                "excess",
                "fitness",
                "turnover",
                "blocks_excess",
                "fresh_excess",
                "fresh_mean",
                "fresh_std",
                "holdout_mean",
            )
        }
        self.seconds = 0.0

    def _validate(self, fitness_per_agent: torch.Tensor, generation: int) -> Scores:
        scores = super()._validate(fitness_per_agent, generation)
        started = time.perf_counter()
        popsize = self.config.evolution.popsize
        records = self.records
        records["excess"].append(scores.returns.excess.numpy())
        records["fitness"].append(scores.fitness.double().numpy())
        records["turnover"].append(self.validation.env.turnover_per_episode[:popsize].double().mean(dim=(1, 2)).numpy())
        records["blocks_excess"].append(self.blocks.excess().float().numpy())
        fresh = self.fresh.excess()
        records["fresh_excess"].append(fresh.float().numpy())
        records["fresh_mean"].append(fresh.mean(dim=1).numpy())
        records["fresh_std"].append(fresh.std(dim=1).numpy())
        records["holdout_mean"].append(self.holdout.excess().mean(dim=1).numpy())
        self.seconds += time.perf_counter() - started
        return scores


def record_run(kind: str, scale: float, seed: int, base: Config, folder: Path, rule: dict[str, Any]) -> Path:
    """Train one run and write its ``record.npz`` (skipped when it exists)."""
    out = folder / "record.npz"
    if out.exists():
        return out
    strength = BASE_STRENGTH[kind] * scale
    synthetic = make_market(kind, seed=seed, strength=strength or None)
    folder.mkdir(parents=True, exist_ok=True)
    prices = folder / "prices.csv"
    synthetic.prices.to_csv(prices, index=False)
    config = override(
        base,
        {"data.path": str(prices), "runtime.seed": seed, "runtime.progress": False, "runtime.device": "cpu"},
    )
    market = load_market(config, torch.device("cpu"))
    run_dir = folder / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = RecordingTrainer(config, market, run_dir, log=lambda line: None)
    fresh, fresh_raw, fresh_latent = fresh_market(kind, strength, seed, market)
    trainer.attach(fresh)
    started = time.perf_counter()
    trainer.run(until=config.runtime.generations)
    seconds = time.perf_counter() - started

    # The rules on the run's validation days and on the fresh sample, as the agents were scored.
    cost_rate = config.env.cost_rate
    table = synthetic.prices.drop(columns="date").to_numpy()
    raw = raw_features(table)[WARMUP_DAYS:]
    relatives = market.relatives.double().numpy()
    validation = market.splits.validation
    days = range(validation.start - 1, validation.stop)
    observable = observable_rules(raw)
    weights = np.stack([observable["equal_weight"], observable[rule["rule"]], synthetic.rule_weights[WARMUP_DAYS:]])
    on_validation = rule_returns(
        weights[:, days.start : days.stop], relatives[days.start : days.stop], cost_rate=cost_rate
    )
    fresh_rules = observable_rules(fresh_raw)
    fresh_weights = np.stack([fresh_rules["equal_weight"], fresh_rules[rule["rule"]], fresh_latent])
    fresh_relatives = fresh.relatives.double().numpy()
    rule_fresh = rule_returns(fresh_weights, fresh_relatives, cost_rate=cost_rate)  # earning days 1, 2, ...
    rule_fresh_excess = rule_fresh[1] - rule_fresh[0]
    records = {k: np.stack(v) for k, v in trainer.records.items()}
    np.savez_compressed(
        out,
        **records,
        rule_validation_excess=on_validation[1] - on_validation[0],
        latent_validation_excess=on_validation[2] - on_validation[0],
        rule_fresh_excess=rule_fresh_excess,
        latent_fresh_excess=rule_fresh[2] - rule_fresh[0],
        mean_block=trainer.gate.mean_block if trainer.gate is not None else 1.0,
        meta=json.dumps(
            {
                "kind": kind,
                "scale": scale,
                "strength": strength,
                "seed": seed,
                "rule": rule,
                "generations": config.runtime.generations,
                "popsize": config.evolution.popsize,
                "validation_days": len(validation),
                "train_s": seconds,
                "record_s": trainer.seconds,
                "product_crowned": trainer.champion.generation,
            }
        ),
    )
    return out


def seeds_of(text: str) -> list[int]:
    if "," in text:
        return [int(s) for s in text.split(",")]
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def record_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    base = override(preset(args.preset), parse_assignments(args.set))
    tag = f"{args.kind}-{args.scale:g}" + (f"-{args.tag}" if args.tag else "")
    root = Path(args.out) / tag
    root.mkdir(parents=True, exist_ok=True)
    rule_file = root / "rule.json"
    if rule_file.exists():
        rule = json.loads(rule_file.read_text())
    else:
        rule = best_observable_rule(args.kind, BASE_STRENGTH[args.kind] * args.scale, cost_rate=base.env.cost_rate)
        rule_file.write_text(json.dumps(rule, indent=2))
    print(f"{tag}: best observable rule {rule}", flush=True)
    for seed in seeds_of(args.seeds):
        started = time.perf_counter()
        path = record_run(args.kind, args.scale, seed, base, root / f"seed-{seed}", rule)
        meta = json.loads(str(np.load(path)["meta"]))
        print(
            f"{tag} seed {seed}: {time.perf_counter() - started:.0f} s (train {meta['train_s']:.0f} s, of which "
            f"recording {meta['record_s']:.0f} s), product crowned {meta['product_crowned']}",
            flush=True,
        )


# ---------------------------------------------------------------------------------------------- the evaluation

SINGLE_TEST = NormalDist().inv_cdf(0.95)
"""A perfect test: one candidate named in advance, its t against the one-sided 5% normal quantile."""
COST_RATE = 0.0005
"""The default preset's cost per unit of turnover (the records' runs)."""
WORTHWHILE = 0.25
"""A crown is worthwhile when the champion's true edge is at least this fraction of the best observable rule's."""


def load_record(path: Path) -> dict[str, Any]:
    with np.load(path) as data:
        record = {k: data[k] for k in data.files}
    record["meta"] = json.loads(str(record["meta"]))
    return record


def ranges_of(record: dict[str, Any], replicates: int) -> list[tuple[str, np.ndarray, np.ndarray, np.ndarray]]:
    """The ranges a design is judged on: the run's validation days, then up to ``replicates`` two-year episodes of
    the fresh sample as validation ranges the run might have had (the agents never saw either). Each: (name,
    excess (G, P, D), the agents' true daily edge (G, P) from the other fresh days, the rule's excess on the range)."""
    out = [("validation", record["excess"], record["fresh_mean"], record["rule_validation_excess"])]
    days = record["excess"].shape[-1]
    per = days // FRESH_DAYS  # fresh episodes in one replicate range
    if per < 1 or days % FRESH_DAYS:
        return out
    fresh = record["fresh_excess"].astype(np.float64)  # (G, P, 10 * 504)
    count = FRESH_EPISODES // per
    spans = fresh[..., : count * days].reshape(*fresh.shape[:2], count, days)
    totals = spans.sum(-1)  # (G, P, count)
    rule = record["rule_fresh_excess"]
    for k in range(min(replicates, count)):
        others = (totals.sum(-1) - totals[..., k]) / ((count - 1) * days)
        out.append((f"fresh-{k}", spans[..., k, :], others, rule[k * days : (k + 1) * days]))
    return out


def gate_counts(days: int, *, draws: int, mean_block: float, seed: int) -> torch.Tensor:
    """(B, D) the trainer's own resamples of a run of ``seed`` (``run.streams.gate_generator``) as counts."""
    indices = stationary_bootstrap(days, draws=draws, mean_block=mean_block, generator=gate_generator(seed))
    return selection.resample_counts(indices).to(torch.int32)


def evaluate_records(paths: list[Path], designs: tuple[Design, ...], replicates: int, draws: int) -> dict[str, Any]:
    """Every design on every range of every record; per market (folder), the figures of the module docstring."""
    markets: dict[str, dict[str, Any]] = {}
    for path in paths:
        record = load_record(path)
        meta = record["meta"]
        market = markets.setdefault(path.parent.parent.name, {"meta": meta, "runs": []})
        days = record["excess"].shape[-1]
        mean_block = float(record["mean_block"])
        rule_edge = meta["rule"]["edge"] if meta["kind"] != "random_walk" else 0.0
        rule_ir = meta["rule"]["daily_ir"] if meta["kind"] != "random_walk" else 0.0
        spread = record["fresh_std"][-1]
        ratio = np.where(spread > 0, record["fresh_mean"][-1] / np.where(spread > 0, spread, 1.0), 0.0)  # (P,) true IR
        run: dict[str, Any] = {"seed": meta["seed"], "product_crowned": meta["product_crowned"], "ranges": []}
        for index, (name, excess, true_daily, rule_excess) in enumerate(ranges_of(record, replicates)):
            if index == 0:
                counts = gate_counts(days, draws=draws, mean_block=mean_block, seed=meta["seed"])
            else:
                counts = resample_counts(
                    days, draws=draws, mean_block=mean_block, seed=1000 + meta["seed"] * 16 + index
                )
            resampled = Resampled(excess, counts)
            true_edge = true_daily * TRADING_DAYS  # (G, P)
            figures: dict[str, Any] = {
                "range": name,
                "population_edge": float(true_edge[-1].mean()),
                "naive_edge": float(true_edge[-1][int(np.argmax(excess[-1].sum(-1)))]),
                "rule_t_here": float(math.sqrt(days) * rule_excess.mean() / rule_excess.std(ddof=1))
                if rule_excess.std() > 0
                else 0.0,
                "perfect_power_agent": float(NormalDist().cdf(math.sqrt(days) * ratio.max() - SINGLE_TEST)),
                "perfect_power_rule": float(NormalDist().cdf(math.sqrt(days) * rule_ir - SINGLE_TEST)),
                "designs": {},
            }
            for design in designs:
                outcome = replay(
                    design,
                    resampled,
                    fitness=record["fitness"],
                    blocks=record["blocks_excess"].mean(-1),
                    costs=record["turnover"] * COST_RATE,
                )
                edge = 0.0 if outcome.crowned is None else float(true_edge[outcome.crowned])
                figures["designs"][design.name] = {
                    "crowned": outcome.generation,
                    "edge": edge,
                    "worthwhile": outcome.crowned is not None and rule_edge > 0 and edge >= WORTHWHILE * rule_edge,
                    "last_critical": outcome.last_critical,
                }
            run["ranges"].append(figures)
        market["runs"].append(run)
    return markets


def binomial_interval(hits: int, trials: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) confidence interval of a binomial share ``hits / trials``, by bisection."""

    def at_most(k: int, p: float) -> float:  # P(X <= k) for X ~ Binomial(trials, p)
        return sum(math.comb(trials, i) * p**i * (1 - p) ** (trials - i) for i in range(k + 1))

    def bisect(falling) -> float:  # the p where a function falling in p crosses zero
        low, high = 0.0, 1.0
        for _ in range(60):
            middle = (low + high) / 2
            low, high = (middle, high) if falling(middle) > 0 else (low, middle)
        return (low + high) / 2

    tail = (1 - level) / 2
    lower = 0.0 if hits == 0 else bisect(lambda p: at_most(hits - 1, p) - (1 - tail))  # P(X >= hits) = tail
    upper = 1.0 if hits == trials else bisect(lambda p: at_most(hits, p) - tail)  # P(X <= hits) = tail
    return lower, upper


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def market_lines(tag: str, market: dict[str, Any], designs: tuple[Design, ...]) -> list[str]:
    """The printed report of one market: its rule and population, then one line per design."""
    runs, meta = market["runs"], market["meta"]
    real = [r["ranges"][0] for r in runs]
    replicas = [f for r in runs for f in r["ranges"][1:]]
    rule = meta["rule"]
    lines = [f"{tag}: {len(runs)} runs, {len(replicas)} replicate validation ranges from their fresh samples"]
    if meta["kind"] != "random_walk":
        lines += [
            f"  best observable rule ({rule['rule']}): true edge {rule['edge']:+.3f}/y, expected t on 504 days "
            f"{rule['expected_t_504']:.2f} (on the runs' validation days: {_mean(f['rule_t_here'] for f in real):.2f})",
            f"  ungated final population: true edge {_mean(f['population_edge'] for f in real):+.3f}/y, its best on "
            f"validation {_mean(f['naive_edge'] for f in real):+.3f}/y; a perfect single test's power on the days: "
            f"{_mean(f['perfect_power_agent'] for f in real):.2f} (best final agent), "
            f"{_mean(f['perfect_power_rule'] for f in real):.2f} (the rule)",
        ]
    lines.append(f"  the trainer crowned in {sum(1 for r in runs if r['product_crowned'])} of {len(runs)} runs")
    lines.append(
        f"  {'design':<38}{'runs: crowned':>15}{'worth':>7}{'edge':>8}{'replicates: crowned':>21}{'worth':>7}"
        f"{'edge':>8}{'gen':>6}{'last t':>8}"
    )
    for design in designs:
        picks = [[f["designs"][design.name] for f in ranges] for ranges in (real, replicas)]
        cells = []
        for chosen in picks:
            crowns = sum(1 for p in chosen if p["crowned"])
            if meta["kind"] == "random_walk":
                low, high = binomial_interval(crowns, len(chosen))
                cells.append(f"{crowns:>4}/{len(chosen):<4} [{low:.2f}, {high:.2f}]")
            else:
                worth = _mean(p["worthwhile"] for p in chosen)
                cells.append(
                    f"{crowns / max(len(chosen), 1):>8.2f}{worth:>7.2f}{_mean(p['edge'] for p in chosen):>+8.3f}"
                )
        generation = _mean(p["crowned"] for p in picks[1] if p["crowned"])
        critical = _mean(p["last_critical"] for p in picks[1] if math.isfinite(p["last_critical"]))
        lines.append(f"  {design.name:<38}{cells[0]:>22}{cells[1]:>36}{generation:>6.1f}{critical:>8.2f}")
    return lines


def evaluate_main(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    root = Path(args.out)
    paths = sorted(root.glob("*/seed-*/record.npz"), key=lambda p: (p.parent.parent.name, int(p.parent.name[5:])))
    if args.markets:
        paths = [p for p in paths if p.parent.parent.name in args.markets.split(",")]
    markets = evaluate_records(paths, DESIGNS, args.replicates, args.draws)
    for tag, market in markets.items():
        print("\n".join(market_lines(tag, market, DESIGNS)) + "\n", flush=True)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({t: m["runs"] for t, m in markets.items()}, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    record = commands.add_parser("record", help="train runs and record every generation")
    record.add_argument("--kind", required=True, choices=list(BASE_STRENGTH))
    record.add_argument("--scale", type=float, default=1.0, help="of the kind's default strength")
    record.add_argument("--seeds", default="0-7")
    record.add_argument("--preset", default="default")
    record.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    record.add_argument("--tag", default="", help="appended to the market's folder name (e.g. for --set variants)")
    record.add_argument("--out", default="runs/selection-study")
    evaluate = commands.add_parser("evaluate", help="replay every design on the records")
    evaluate.add_argument("--out", default="runs/selection-study")
    evaluate.add_argument("--markets", default="", help="folders to evaluate (default: all)")
    evaluate.add_argument("--replicates", type=int, default=FRESH_EPISODES)
    evaluate.add_argument("--draws", type=int, default=2000)
    evaluate.add_argument("--json-out")
    args = parser.parse_args()
    if args.command == "record":
        record_main(args)
    else:
        evaluate_main(args)


if __name__ == "__main__":
    main()
