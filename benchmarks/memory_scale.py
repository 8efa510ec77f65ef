"""The replaced system's shape, measured: 108 assets, a 504-day lookback, 5 features, a 14,000-transition buffer.

    python benchmarks/memory_scale.py            # about a minute or two on a 2-core CPU
    python benchmarks/memory_scale.py --json

The replaced trainer stored two observation windows per transition (504 days x 669 columns x 5
features, float32: 13.5 MB) and died at 175 GB. Here the same buffer length and lookback run on a
synthetic market built directly (random features and price relatives, no price file), with small
networks on the CPU so it finishes in minutes: the networks' size changes nothing that this
benchmark compares (the replay buffer, the feature tensor, the sample buffers).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from config import Config, override, preset
from environment.market import Market, Splits
from run.trainer import Trainer
from utils.telemetry import format_bytes, least_squares_slope, rss_bytes

ASSETS = 108
LOOKBACK = 504
FEATURES = 5
BUFFER = 14_000
POPSIZE = 16
EPISODES = 4
EPISODE_DAYS = 63
VALIDATION_DAYS = 126
HOLDOUT_DAYS = 126
DAYS = 1800
"""504 days of first lookback, 918 more of training episodes, then validation and holdout."""

REPLACED_COLUMNS = 669
"""Columns per day of the replaced system's observation window at this shape (its documents)."""


def replaced_bytes_per_transition(lookback: int, columns: int, features: int) -> int:
    """Two float32 observation windows (obs and next_obs) per transition, as the replaced design stored them."""
    return 2 * lookback * columns * features * 4


def synthetic_market(seed: int = 0) -> Market:
    """Random features ~ N(0, 1) and daily moves of about 1%, built directly on the CPU."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(DAYS, ASSETS, FEATURES, generator=g)  # (T, N, K)
    relatives = (1 + 0.01 * torch.randn(DAYS, ASSETS, generator=g)).clamp(min=0.5)  # (T, N)
    relatives[0] = 1.0
    train_stop = DAYS - VALIDATION_DAYS - HOLDOUT_DAYS
    return Market(
        dates=tuple(f"d{i:04d}" for i in range(DAYS)),
        tickers=tuple(f"A{i:03d}" for i in range(ASSETS)),
        feature_names=tuple(f"f{i}" for i in range(FEATURES)),
        features=features,
        relatives=relatives,
        splits=Splits(
            train=range(0, train_stop),
            validation=range(train_stop, train_stop + VALIDATION_DAYS),
            holdout=range(train_stop + VALIDATION_DAYS, DAYS),
        ),
    )


def scale_config(generations: int, updates: int) -> Config:
    return override(
        preset("default"),
        {
            "data.validation_days": VALIDATION_DAYS,
            "data.holdout_days": HOLDOUT_DAYS,
            "env.lookback": LOOKBACK,
            "env.episode_days": EPISODE_DAYS,
            "model.encoder_hidden": 16,
            "model.embedding": 8,
            "model.head_hidden": 16,
            "learner.batch_size": 32,
            "learner.updates_per_generation": updates,
            "learner.buffer_size": BUFFER,
            "learner.learning_starts": 1_000,
            "evolution.popsize": POPSIZE,
            "rollout.episodes": EPISODES,
            "rollout.exploring_episodes": EPISODES // 2,
            "runtime.device": "cpu",
            "runtime.generations": generations,
            "runtime.progress": False,
        },
    )


def measure(after_full: int, updates: int) -> dict[str, Any]:
    per_generation = POPSIZE * EPISODES * EPISODE_DAYS
    generations = math.ceil(BUFFER / per_generation) + after_full
    config = scale_config(generations, updates)
    rss_start = rss_bytes()
    market = synthetic_market()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="memory-scale-") as run_dir:
        started = time.perf_counter()
        trainer = Trainer(config, market, Path(run_dir), log=lambda line: print(line, file=sys.stderr, flush=True))
        rss_built = rss_bytes()
        trainer.run(until=generations, on_generation=rows.append)
        wall_s = time.perf_counter() - started
    buffer = trainer.buffer
    batch = config.learner.batch_size
    warm = [row for row in rows if row["replay_transitions"] >= BUFFER]
    replaced_here = replaced_bytes_per_transition(LOOKBACK, ASSETS, FEATURES)
    replaced_doc = replaced_bytes_per_transition(LOOKBACK, REPLACED_COLUMNS, FEATURES)
    return {
        "shape": {
            "assets": ASSETS,
            "lookback": LOOKBACK,
            "features": FEATURES,
            "days": DAYS,
            "buffer": BUFFER,
            "popsize": POPSIZE,
            "episodes": EPISODES,
            "episode_days": EPISODE_DAYS,
            "batch_size": batch,
            "updates_per_generation": updates,
            "model": config.to_dict()["model"],
            "device": str(trainer.device),
        },
        "generations": trainer.generation,
        "full_at_generation": warm[0]["generation"] if warm else None,
        "wall_s": wall_s,
        "median_generation_s": sorted(r["generation_s"] for r in rows)[len(rows) // 2],
        "rss_before_market_bytes": rss_start,
        "rss_after_build_bytes": rss_built,
        "rss_per_generation_bytes": [r["rss_bytes"] for r in rows],
        "live_tensors_per_generation": [r["live_tensors"] for r in rows],
        "rss_slope_after_full_bytes": least_squares_slope([r["rss_bytes"] for r in warm]),
        "peak_rss_bytes": max(r["peak_rss_bytes"] for r in rows),
        "features_bytes": market.features.nbytes + market.relatives.nbytes,
        "replay_bytes": buffer.nbytes,
        "replay_bytes_per_transition": buffer.bytes_per_transition,
        "sample_buffers_bytes": 2 * POPSIZE * batch * ASSETS * LOOKBACK * FEATURES * 4,
        "replaced_bytes_per_transition_669_columns": replaced_doc,
        "replaced_buffer_bytes_669_columns": replaced_doc * BUFFER,
        "replaced_bytes_per_transition_108_assets": replaced_here,
        "replaced_buffer_bytes_108_assets": replaced_here * BUFFER,
    }


def report(r: dict[str, Any]) -> str:
    s = r["shape"]
    m = s["model"]
    ratio_doc = r["replaced_bytes_per_transition_669_columns"] / r["replay_bytes_per_transition"]
    ratio_here = r["replaced_bytes_per_transition_108_assets"] / r["replay_bytes_per_transition"]
    return "\n".join(
        [
            f"shape: {s['assets']} assets, lookback {s['lookback']}, {s['features']} features, {s['days']} synthetic "
            f"days; buffer {s['buffer']} transitions; {s['popsize']} agents x {s['episodes']} episodes x "
            f"{s['episode_days']} days",
            f"small networks on {s['device']} so it finishes in minutes: encoder_hidden {m['encoder_hidden']}, "
            f"embedding {m['embedding']}, head_hidden {m['head_hidden']}, batch {s['batch_size']}, "
            f"{s['updates_per_generation']} updates/generation",
            f"generations: {r['generations']} (buffer full at generation {r['full_at_generation']}), "
            f"{r['wall_s']:.0f} s, median {r['median_generation_s']:.1f} s/gen",
            "",
            f"peak RSS (whole process):        {r['peak_rss_bytes'] / 1e6:.1f} MB",
            f"RSS before market / after build: {format_bytes(r['rss_before_market_bytes'])} / "
            f"{format_bytes(r['rss_after_build_bytes'])}",
            "RSS per generation (MB):         " + ", ".join(f"{b / 1e6:.1f}" for b in r["rss_per_generation_bytes"]),
            f"RSS slope once full:             {r['rss_slope_after_full_bytes'] / 1000:+.1f} kB/gen "
            f"(over {r['generations'] - r['full_at_generation'] + 1} generations)",
            "live tensors per generation:     " + ", ".join(str(n) for n in r["live_tensors_per_generation"]),
            f"replay buffer:                     {format_bytes(r['replay_bytes'])} "
            f"({r['replay_bytes_per_transition']} B per transition)",
            f"feature tensor + relatives:      {format_bytes(r['features_bytes'])}",
            f"sample buffers (2 x P x B windows, allocated once, resident from the first update): "
            f"{format_bytes(r['sample_buffers_bytes'])}",
            "",
            "the replaced design (two float32 observation windows per transition):",
            f"  504 x 669 columns x 5 features: {format_bytes(r['replaced_bytes_per_transition_669_columns'])} per "
            f"transition, {format_bytes(r['replaced_buffer_bytes_669_columns'])} for {s['buffer']} transitions "
            f"({ratio_doc:,.0f}x this buffer per transition)",
            f"  504 x 108 assets x 5 features:  {format_bytes(r['replaced_bytes_per_transition_108_assets'])} per "
            f"transition, {format_bytes(r['replaced_buffer_bytes_108_assets'])} for {s['buffer']} transitions "
            f"({ratio_here:,.0f}x this buffer per transition)",
            f"  this run's whole process peaked at {format_bytes(r['peak_rss_bytes'])}: "
            f"{r['replaced_buffer_bytes_669_columns'] / r['peak_rss_bytes']:,.0f}x less than the replaced buffer alone",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--after-full", type=int, default=5, help="generations after the buffer is full (default 5)")
    parser.add_argument("--updates", type=int, default=4, help="learner updates per generation (default 4)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    args = parser.parse_args(argv)
    result = measure(args.after_full, args.updates)
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
