"""What the memory check reads off a run's parts, and what that costs at start-up.

    python benchmarks/memory_check.py            # a few seconds
    python benchmarks/memory_check.py --json
    python benchmarks/memory_check.py --phases   # and what the days' phases allocate at once (a minute)

For each preset at the bundled universe's shape (20 assets, 6 features), on the CPU and as on CUDA: each item
``run.sizing.held_bytes`` reads off the parts built on the meta device, the seconds one check of a fresh config
takes, and the bytes the meta build allocates on the host (the profiler's allocations, which should be the episodes'
start days alone). With ``--phases``: what the rollout and validation allocate at once (``sizing.PeakBytes``) when
run once on that meta build, beside the check's estimate of it (``sizing.working_bytes``). Figures are printed, never
asserted.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.profiler import ProfilerActivity, profile

from config import preset
from run import sizing
from run.parts import build_phases
from runtime.sharding import Sharding

PRESETS = ("smoke", "default", "paper")
DEVICES = ("cpu", "cuda")
SHAPE = (20, 6)


def measure(name: str, device: str) -> dict[str, Any]:
    shape = sizing.RunShape(*SHAPE, device=device)
    config = preset(name)
    sizing.held_bytes(config, shape)  # imports and first-use work, once per process
    fresh = dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, seed=config.runtime.seed + 1))
    started = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        held = sizing.held_bytes(fresh, shape)  # a config not measured before (the measure is cached by config)
    seconds = time.perf_counter() - started
    host = sum(event.self_cpu_memory_usage for event in profiler.events() if event.self_cpu_memory_usage > 0)
    return {
        "preset": name,
        "device": device,
        "held_mb": {k: v / 1e6 for k, v in held.items()},
        "seconds": seconds,
        "host_allocated_mb": host / 1e6,
    }


def phase_peaks(name: str, device: str) -> dict[str, Any]:
    """The rollout's and validation's peak allocation, run once on the meta build, and the check's estimates."""
    shape = sizing.RunShape(*SHAPE, device=device)
    config = preset(name)
    market = sizing.shaped_market(config, shape)
    sharding = Sharding(config.evolution.popsize, device="meta")
    parts = build_phases(config, market, sharding, block_device=torch.device(device))
    starts = torch.zeros(config.rollout.episodes, dtype=torch.long, device="meta")
    peaks = {}
    for phase, run in (("rollout", lambda: parts.rollouts.run(starts)), ("validation", parts.validation.run)):
        with sizing.PeakBytes() as peak:
            run()
        peaks[phase] = peak.peak
    estimates = sizing.working_bytes(config, shape)
    return {
        "preset": name,
        "device": device,
        "blocks": {"rollout": parts.rollouts.blocks[0], "validation": parts.validation.blocks[0]},
        "peak_mb": {phase: peak / 1e6 for phase, peak in peaks.items()},
        "estimate_mb": {phase: estimates[phase] / 1e6 for phase in peaks},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    parser.add_argument("--phases", action="store_true", help="also run the days' phases once on the meta build")
    args = parser.parse_args()
    rows = [measure(name, device) for name in PRESETS for device in DEVICES]
    phases = [phase_peaks(name, device) for name in PRESETS for device in DEVICES] if args.phases else []
    if args.json:
        print(json.dumps({"held": rows, "phases": phases}, indent=1))
        return
    for row in rows:
        items = ", ".join(f"{item.split(' (')[0]} {mb:.3f}" for item, mb in row["held_mb"].items())
        print(
            f"{row['preset']:8s} {row['device']:5s} {items} MB | check {row['seconds']:.2f} s, "
            f"host allocations during it {row['host_allocated_mb']:.2f} MB"
        )

    for row in phases:
        figures = ", ".join(
            f"{phase} {row['peak_mb'][phase]:.2f} (estimate {row['estimate_mb'][phase]:.2f}, blocks of "
            f"{row['blocks'][phase]} days)"
            for phase in row["peak_mb"]
        )
        print(f"{row['preset']:8s} {row['device']:5s} allocated at once: {figures} MB")


if __name__ == "__main__":
    main()
