"""Memory soak: many generations of a preset on the bundled data, then is memory flat once warm?

    python benchmarks/memory_soak.py                      # 100 generations of `default`
    python benchmarks/memory_soak.py --generations 200 --set runtime.device=cpu --json

Warm-up ends with the generation in which the replay buffer becomes full (its pages are touched as it
fills, so RSS rises until then). From ``--settle`` generations later, a leak-free run holds RSS, the
live tensor count and the Python object count flat, and Python's allocated blocks nearly so (CPython's
free lists fill slowly); the verdict is ``utils.telemetry.leak_findings`` over those rows, with the leak
tests' bounds unless told otherwise.
The rows are read back from the run's ``metrics.jsonl`` after the run, so the benchmark holds nothing
per generation while it measures. It never forces a collection or empties an allocator cache.

Also printed: bytes per replay transition at several lookbacks and feature counts (constant, by
design) next to what the replaced design paid (two observation windows per transition), and the cost
of the telemetry itself against a generation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from config import override, parse_assignments, preset
from environment.market import Market, Splits
from models.replay import ReplayBuffer
from persistence import jsonl
from run.launch import start_run
from utils.telemetry import (
    MEMORY_KEYS,
    count_objects,
    format_bytes,
    leak_findings,
    least_squares_slope,
    memory_snapshot,
)

SERIES = (
    "generation",
    *MEMORY_KEYS,
    "replay_bytes",
    "replay_transitions",
    "generation_s",
    "telemetry_s",
)
"""Figures kept from every generation's metrics row."""

BOUNDS = {
    "rss_slope_bytes": 64_000,
    "objects_slack": 0,
    "references_slope_limit": 4,
    "blocks_slope_limit": 100,
    "tensors_exact": True,
}
"""Default leak bounds: those of tests/training/test_leaks.py (tensors and collector objects flat exactly; per
generation: the references they hold within 4 and Python's allocated blocks within 100 (least squares), the median
RSS change within 64 kB)."""
SETTLE = 2
"""Generations after the one that fills the buffer before judging (as the leak tests do)."""

TABLE_ASSETS = 20
TABLE_LOOKBACKS = (16, 63, 252, 504)
TABLE_FEATURES = (6, 30, 120)


def replay_table(num_assets: int = TABLE_ASSETS) -> list[dict[str, int]]:
    """Bytes per transition of a real ReplayBuffer vs the replaced design's 2 x L x N x K x 4 bytes."""
    table = []
    for lookback in TABLE_LOOKBACKS:
        for num_features in TABLE_FEATURES:
            features = torch.randn(lookback + 2, num_assets, num_features)  # (T, N, K), just enough days
            days = range(lookback + 2)
            market = Market(
                dates=tuple(str(day) for day in days),
                tickers=tuple(f"A{i}" for i in range(num_assets)),
                feature_names=tuple(f"f{k}" for k in range(num_features)),
                features=features,
                relatives=torch.ones(lookback + 2, num_assets),
                splits=Splits(train=days, validation=range(0), holdout=range(0)),
            )
            buffer = ReplayBuffer(1024, market, lookback=lookback, execution_delay=1, sample_shape=(1, 1))
            table.append(
                {
                    "lookback": lookback,
                    "features": num_features,
                    "assets": num_assets,
                    "bytes_per_transition": buffer.bytes_per_transition,
                    "replaced_bytes_per_transition": 2 * lookback * num_assets * num_features * 4,
                }
            )
    return table


def telemetry_cost(device: torch.device, repeats: int = 5) -> dict[str, float]:
    """Median wall time (ms) of the per-generation telemetry calls, measured now."""
    count_ms, snapshot_ms = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        count_objects()
        middle = time.perf_counter()
        memory_snapshot(device)
        count_ms.append((middle - start) * 1000)
        snapshot_ms.append((time.perf_counter() - middle) * 1000)
    return {"count_objects_ms": statistics.median(count_ms), "memory_snapshot_ms": statistics.median(snapshot_ms)}


def soak(config: Any, generations: int, *, settle: int, bounds: dict[str, Any]) -> dict[str, Any]:
    """Run ``generations`` generations, then judge the rows from ``settle`` generations after the buffer filled.

    The rows are read back from the run's ``metrics.jsonl`` once the run is over, so the benchmark keeps
    nothing per generation in memory while it measures.
    """
    warnings: list[str] = []  # grows only if the trainer warns of growth

    def log(line: str) -> None:
        if line.startswith("memory warning"):
            warnings.append(line)
        print(line, file=sys.stderr, flush=True)

    run = start_run(config, log=log)
    trainer = run.trainer
    capacity = trainer.buffer.capacity
    started = time.perf_counter()
    trainer.run(until=generations)
    wall_s = time.perf_counter() - started
    run.finish()
    cost = telemetry_cost(trainer.device)
    rows = [{key: row[key] for key in SERIES} for row in jsonl.read_rows(trainer.checkpoints.metrics_path)]

    summary: dict[str, Any] = {
        "config": config.to_dict(),
        "device": str(trainer.device),
        "generations": len(rows),
        "wall_s": wall_s,
        "replay_capacity": capacity,
        "replay_bytes": trainer.buffer.nbytes,
        "replay_bytes_per_transition": trainer.buffer.bytes_per_transition,
        "median_generation_s": statistics.median(row["generation_s"] for row in rows),
        "peak_rss_bytes": max(row["peak_rss_bytes"] for row in rows),
        "growth_warnings": warnings,
        "settle": settle,
        "bounds": bounds,
        **cost,
    }
    summary["count_objects_fraction_of_generation"] = cost["count_objects_ms"] / 1000 / summary["median_generation_s"]
    # What the telemetry took in the run itself (the object census only in the generations its budget allowed).
    summary["telemetry_fraction_of_run"] = sum(row["telemetry_s"] for row in rows) / sum(
        row["generation_s"] for row in rows
    )
    summary["censused_generations"] = sum(1 for row in rows if row["python_objects"] is not None)
    full = [i for i, row in enumerate(rows) if row["replay_transitions"] >= capacity]
    summary["full_at_generation"] = full[0] + 1 if full else None
    judged = rows[full[0] + settle :] if full else []
    if len(judged) < 2:
        summary["judged_from_generation"] = None
        summary["verdict"] = ["fewer than 2 generations after warm-up: nothing to judge (run more generations)"]
        return {"summary": summary, "rows": rows}

    def span(key: str) -> list[int]:
        values = [row[key] for row in judged if row[key] is not None]  # object counts: the censused generations
        return [min(values), max(values)] if values else [0, 0]

    rss = [row["rss_bytes"] for row in judged]
    summary.update(
        {
            "judged_from_generation": full[0] + settle + 1,
            "judged_generations": len(judged),
            "rss_slope_bytes_per_generation": least_squares_slope(rss),
            "python_blocks_slope_per_generation": least_squares_slope([row["python_blocks"] for row in judged]),
            "rss_first_last_bytes": [rss[0], rss[-1]],
            "rss_range": span("rss_bytes"),
            "live_tensors_range": span("live_tensors"),
            "python_objects_range": span("python_objects"),
            "python_blocks_range": span("python_blocks"),
            "cuda_allocated_range": span("cuda_allocated_bytes"),
            "cuda_reserved_range": span("cuda_reserved_bytes"),
            "verdict": leak_findings(judged, **bounds),
        }
    )
    return {"summary": summary, "rows": rows}


def report(result: dict[str, Any]) -> str:
    s = result["summary"]
    cfg = s["config"]
    lines = [
        f"device {s['device']} | P={cfg['evolution']['popsize']} E={cfg['rollout']['episodes']} "
        f"L={cfg['env']['lookback']} episode_days={cfg['env']['episode_days']} | replay buffer "
        f"{s['replay_capacity']} transitions, {format_bytes(s['replay_bytes'])} "
        f"({s['replay_bytes_per_transition']} B each)",
        f"generations run:             {s['generations']} in {s['wall_s'] / 60:.1f} min "
        f"(median {s['median_generation_s']:.2f} s/gen)",
        f"replay buffer full (warm-up end): generation {s['full_at_generation']}",
        f"peak RSS (whole run):        {format_bytes(s['peak_rss_bytes'])}",
    ]
    if s["judged_from_generation"] is None:
        lines.append(f"verdict: {s['verdict'][0]}")
    else:

        def span(key: str, fmt: Any = str) -> str:
            low, high = s[key]
            return f"{fmt(low)}..{fmt(high)} (spread {fmt(high - low)})"

        first, last = s["rss_first_last_bytes"]
        verdict = "flat, no findings" if not s["verdict"] else "LEAK? " + "; ".join(s["verdict"])
        lines += [
            f"judged: generations {s['judged_from_generation']}..{s['generations']} "
            f"({s['judged_generations']} rows; {s['settle']} settling generations after the buffer filled)",
            f"RSS growth after warm-up:    {s['rss_slope_bytes_per_generation'] / 1000:+.1f} kB/gen (least squares)",
            f"RSS after warm-up:           {span('rss_range', format_bytes)}; "
            f"first {format_bytes(first)}, last {format_bytes(last)}",
            f"live tensors after warm-up:  {span('live_tensors_range')}",
            f"python objects after warm-up: {span('python_objects_range')}",
            f"python blocks after warm-up: {span('python_blocks_range')}, "
            f"{s['python_blocks_slope_per_generation']:+.1f}/gen (least squares)",
        ]
        if s["device"].startswith("cuda"):
            lines.append(
                f"CUDA allocated {span('cuda_allocated_range', format_bytes)}, "
                f"reserved {span('cuda_reserved_range', format_bytes)}"
            )
        bounds = ", ".join(f"{key}={value}" for key, value in s["bounds"].items())
        lines.append(f"leak_findings({bounds}): {verdict}")
    lines.append(f"trainer growth warnings:     {'; '.join(s['growth_warnings']) or 'none'}")
    lines.append(
        f"telemetry cost: count_objects() {s['count_objects_ms']:.1f} ms, memory_snapshot() "
        f"{s['memory_snapshot_ms']:.2f} ms, vs median generation {s['median_generation_s'] * 1000:.0f} ms "
        f"({100 * s['count_objects_fraction_of_generation']:.2f} %); in the run, the telemetry took "
        f"{100 * s['telemetry_fraction_of_run']:.2f} % of the time, the object census counting "
        f"{s['censused_generations']} of {s['generations']} generations (runtime.census_fraction)"
    )
    lines += [
        "",
        f"bytes per replay transition, N={TABLE_ASSETS} assets (this buffer vs the replaced 2 x L x N x K x 4):",
    ]
    lines.append(f"{'L':>5} {'K':>5} {'this buffer':>10} {'replaced':>14} {'ratio':>8}")
    for row in result["replay_table"]:
        old, new = row["replaced_bytes_per_transition"], row["bytes_per_transition"]
        lines.append(f"{row['lookback']:>5} {row['features']:>5} {new:>8} B {old:>12} B {old / new:>7.0f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--generations", type=int, default=100, help="generations to run (default 100)")
    parser.add_argument("--preset", default="default", help="config preset (default: default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key")
    parser.add_argument("--out", help="run folder (must not exist or be empty; default: a temporary one, removed)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the report")
    parser.add_argument("--settle", type=int, default=SETTLE, help="generations after the buffer fills before judging")
    parser.add_argument("--rss-slope-kb", type=float, help="leak bound on RSS growth, kB/gen (default 64)")
    parser.add_argument("--objects-slack", type=int, help="leak bound on the Python object count's rise (default 0)")
    parser.add_argument("--blocks-slope", type=float, help="leak bound on Python's allocated blocks per gen (100)")
    args = parser.parse_args(argv)

    bounds = dict(BOUNDS)
    if args.rss_slope_kb is not None:
        bounds["rss_slope_bytes"] = int(args.rss_slope_kb * 1000)
    if args.objects_slack is not None:
        bounds["objects_slack"] = args.objects_slack
    if args.blocks_slope is not None:
        bounds["blocks_slope_limit"] = args.blocks_slope
    settings: dict[str, Any] = dict(parse_assignments(args.set))
    settings.update({"runtime.generations": args.generations, "runtime.progress": False})
    with tempfile.TemporaryDirectory(prefix="memory-soak-") as scratch:
        run_dir = Path(args.out).resolve() if args.out else Path(scratch) / "soak"
        settings.update({"checkpoint.uri": str(run_dir.parent), "checkpoint.run_name": run_dir.name})
        config = override(preset(args.preset), settings)
        result = soak(config, args.generations, settle=args.settle, bounds=bounds)
    result["replay_table"] = replay_table()
    result["summary"]["run_dir"] = str(run_dir) if args.out else None
    print(json.dumps(result, indent=1) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
