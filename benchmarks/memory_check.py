"""What the memory check reads off a run's parts, and what that costs at start-up.

    python benchmarks/memory_check.py            # a few seconds
    python benchmarks/memory_check.py --json

For each preset at the bundled universe's shape (20 assets, 6 features), on the CPU and as on CUDA: each item
``run.sizing.held_bytes`` reads off the parts built on the meta device, the seconds one check of a fresh config
takes, and the bytes the meta build allocates on the host (the profiler's allocations, which should be the episodes'
start days alone). Figures are printed, never asserted.
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

from torch.profiler import ProfilerActivity, profile

from config import preset
from run import sizing

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of lines")
    args = parser.parse_args()
    rows = [measure(name, device) for name in PRESETS for device in DEVICES]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for row in rows:
        items = ", ".join(f"{item.split(' (')[0]} {mb:.3f}" for item, mb in row["held_mb"].items())
        print(
            f"{row['preset']:8s} {row['device']:5s} {items} MB | check {row['seconds']:.2f} s, "
            f"host allocations during it {row['host_allocated_mb']:.2f} MB"
        )


if __name__ == "__main__":
    main()
