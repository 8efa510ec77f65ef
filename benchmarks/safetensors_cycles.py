"""Does writing a tensor group leave reference cycles? The checkpoint's own writer against the safetensors library's.

    OMP_NUM_THREADS=1 python benchmarks/safetensors_cycles.py

Each writer runs 20 times to warm up, then 100 times with the collector off; the figures are the collector-tracked
objects that appeared and what one ``gc.collect()`` then found unreachable (cycles a healthy run must not leave).
"""

from __future__ import annotations

import gc
import sys
import tempfile
import timeit
from pathlib import Path

import safetensors.torch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from persistence.committing import encode_tensor_group

CALLS = 100


def main() -> None:
    g = torch.Generator().manual_seed(0)
    group = {  # the dtypes and kinds of tensors a checkpoint holds
        "actor.weight": torch.randn(16, 64, 32, generator=g),
        "actor.bias": torch.randn(16, 32, generator=g),
        "days": torch.arange(16),
        "done": torch.zeros(16, dtype=torch.bool),
        "generator": torch.Generator().get_state(),
        "half": torch.randn(8, generator=g).to(torch.bfloat16),
    }
    path = Path(tempfile.mkdtemp()) / "group.safetensors"
    writers = {
        "persistence.committing.encode_tensor_group": lambda: encode_tensor_group("group", group),
        "safetensors.torch.save": lambda: safetensors.torch.save(group),
        "safetensors.torch.save_file": lambda: safetensors.torch.save_file(group, path),
    }
    ours, theirs = b"".join(encode_tensor_group("group", group)), safetensors.torch.save(group)
    print(f"{len(group)} tensors; byte-identical files: {ours == theirs} ({len(ours)} and {len(theirs)} bytes)")
    print(f"{'writer':40s} {'new objects':>12s} {'unreachable':>12s} {'per call':>9s} {'time':>9s}")
    for name, write in writers.items():
        for _ in range(20):
            write()
        gc.collect()
        gc.disable()
        try:
            before = len(gc.get_objects())
            for _ in range(CALLS):
                write()
            grown = len(gc.get_objects()) - before
            unreachable = gc.collect()
        finally:
            gc.enable()
        seconds = min(timeit.repeat(write, number=CALLS, repeat=3)) / CALLS
        print(f"{name:40s} {grown:12d} {unreachable:12d} {unreachable / CALLS:9.1f} {seconds * 1e6:7.0f} us")


if __name__ == "__main__":
    main()
