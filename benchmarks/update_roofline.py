"""The DDPG update against the machine: its FLOP/s and bytes/s beside the device's peaks, and its kernel launches.

    python benchmarks/update_roofline.py                                   # default preset, the training device
    python benchmarks/update_roofline.py --preset paper --set runtime.device=cuda --set runtime.cuda_graphs=true
    python benchmarks/update_roofline.py --json

One batched update of every agent (``Updates.step``: the buffer's sample, both losses and backward passes, the
per-agent clip, both Adams, Polyak averaging), timed over ``--updates`` calls after the buffer is filled by rollouts
and the first calls are left out; with ``runtime.cuda_graphs`` on CUDA, as the loop runs it (``training.graphs``).

* FLOP per update: counted by ``torch.utils.flop_counter`` (matmuls; elementwise work is not counted).
* Bytes per update, two ways: what it must move at least (parameters, gradients, Adam moments and target networks
  read and written once, the activations saved for backward written and read once, measured with
  ``saved_tensors_hooks``), and what its kernels read and write as launched (the operands and results of every
  operation, counted by a dispatch mode: no cache could save more than that).
* Kernel launches per update: operations dispatched (a CUDA graph replays them as one launch).
* Peaks: measured in the same run (a large matmul in the run's precision, a large copy), and the maker's figures
  for known GPUs. An update far below both peaks with many launches is launch-bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from config import override, parse_assignments, preset
from training.loop import Trainer
from training.setup import load_market, resolve_device

SPEC_PEAKS = {
    # name fragment: (dense float32 FLOP/s, dense TF32 FLOP/s, memory bytes/s), the makers' data sheets
    "H100 80GB HBM3": (67e12, 494.7e12, 3.35e12),  # SXM
    "H100 PCIe": (51e12, 378e12, 2.0e12),
    "H100 NVL": (60e12, 417.5e12, 3.9e12),
    "H200": (67e12, 494.7e12, 4.8e12),
    "A100-SXM4-80GB": (19.5e12, 156e12, 2.039e12),
    "A100-SXM4-40GB": (19.5e12, 156e12, 1.555e12),
    "A100-PCIE-40GB": (19.5e12, 156e12, 1.555e12),
    "L4": (30.3e12, 60e12, 0.3e12),
}
"""Published peaks of a few GPUs; a GPU not listed is compared with the measured peaks only."""


class KernelCount(TorchDispatchMode):
    """Operations dispatched and the bytes of their tensor operands and results."""

    def __init__(self) -> None:
        super().__init__()
        self.operations: Counter[str] = Counter()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.operations[str(func)] += 1
        seen: set[int] = set()
        for value in (*args, *(kwargs or {}).values(), *(out if isinstance(out, (tuple, list)) else [out])):
            for tensor in value if isinstance(value, (tuple, list)) else [value]:
                if isinstance(tensor, torch.Tensor) and id(tensor) not in seen and tensor.device.type != "meta":
                    seen.add(id(tensor))
                    self.bytes += tensor.numel() * tensor.element_size()
        return out


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(work, device: torch.device, repeats: int, *, warmup: int = 1) -> float:
    """Seconds per call of ``work``, after ``warmup`` calls."""
    for _ in range(warmup):
        work()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def measured_peaks(device: torch.device, *, size: int) -> dict[str, float]:
    """A large matmul's FLOP/s (in the precision set) and a large copy's bytes/s (read and write) on ``device``."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, generator=generator, device=device)
    b = torch.randn(size, size, generator=generator, device=device)
    out = torch.empty_like(a)
    matmul_s = timed(lambda: torch.mm(a, b, out=out), device, repeats=5)
    big = torch.empty(2**26, device=device)  # 256 MB: past any cache
    copy = torch.empty_like(big)
    copy_s = timed(lambda: copy.copy_(big), device, repeats=10)
    return {"matmul_flops_per_s": 2 * size**3 / matmul_s, "copy_bytes_per_s": 2 * big.nbytes / copy_s}


def compulsory_bytes(trainer: Trainer) -> int:
    """Bytes an update must move at least: the trained parameters read twice (forward, backward) and written once by
    Adam, gradients written and read, both Adam moments read and written, the targets it reads read and written by
    Polyak averaging, and the activations saved for backward written and read once."""
    learner = trainer.population.learner
    trained = [learner.actor, *(learner.critics if learner.trains_critic else [])]
    parameters = sum(p.numel() * p.element_size() for m in trained for p in m.parameters())
    read_targets = [target for _, target in learner.trained_pairs()] if learner.reads_targets else []
    targets = sum(p.numel() * p.element_size() for m in read_targets for p in m.parameters())
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainer.updates.step()
    return 3 * parameters + 2 * parameters + 4 * parameters + 2 * targets + 2 * saved[0]


def measure(config: Any, *, updates: int) -> dict[str, Any]:
    device = resolve_device(config.runtime.device)
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(config, load_market(config, device), Path(folder), log=lambda line: None)
        while len(trainer.buffer) < max(config.ddpg.learning_starts, config.ddpg.batch_size):
            trainer.rollouts.run(trainer.rollouts.sample_starts())
        with FlopCounterMode(display=False) as flops:
            trainer.updates.step()
        with KernelCount() as kernels:
            trainer.updates.step()
        compulsory = compulsory_bytes(trainer)
        # The loop's update, as the update phase calls it: graphed with runtime.cuda_graphs on CUDA.
        trainer.updates.begin(frozen=torch.zeros(len(trainer.sharding.slots), dtype=torch.bool))
        graphed = trainer.updates.steps[True]
        seconds = timed(lambda: trainer.updates(0), device, repeats=updates, warmup=graphed.warmup + 2)  # past capture
        precision = torch.get_float32_matmul_precision()
        peaks = measured_peaks(device, size=8192 if device.type == "cuda" else 1024)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        spec = next((figures for fragment, figures in SPEC_PEAKS.items() if fragment in name), None)
        result = {
            "device": name,
            "preset_shape": {
                "popsize": config.evolution.popsize,
                "batch_size": config.ddpg.batch_size,
                "num_assets": trainer.market.num_assets,
                "widths": [config.model.encoder_hidden, config.model.embedding, config.model.head_hidden],
            },
            "cuda_graphs": graphed.enabled,
            "matmul_precision": precision,
            "update_s": seconds,
            "flop_per_update": flops.get_total_flops(),
            "compulsory_bytes_per_update": compulsory,
            "launched_bytes_per_update": kernels.bytes,
            "kernels_per_update": sum(kernels.operations.values()),
            "measured_peaks": peaks,
            "spec_peaks": None
            if spec is None
            else {"float32_flops_per_s": spec[0], "tf32_flops_per_s": spec[1], "memory_bytes_per_s": spec[2]},
        }
    result["flops_per_s"] = result["flop_per_update"] / seconds
    result["compulsory_bytes_per_s"] = compulsory / seconds
    result["launched_bytes_per_s"] = result["launched_bytes_per_update"] / seconds
    return result


def report(r: dict[str, Any]) -> str:
    shape = r["preset_shape"]
    peaks, spec = r["measured_peaks"], r["spec_peaks"]
    graphs = "on" if r["cuda_graphs"] else "off"
    lines = [
        f"{r['device']} | P={shape['popsize']} B={shape['batch_size']} N={shape['num_assets']} widths "
        f"{shape['widths']} | matmul precision {r['matmul_precision']} | CUDA graphs {graphs}",
        f"update: {r['update_s'] * 1000:.2f} ms, {r['kernels_per_update']} kernels "
        f"({r['update_s'] * 1e6 / r['kernels_per_update']:.1f} us a kernel)",
        f"FLOP: {r['flop_per_update'] / 1e9:.2f} GFLOP an update -> {r['flops_per_s'] / 1e12:.3f} TFLOP/s; "
        f"measured matmul peak {peaks['matmul_flops_per_s'] / 1e12:.2f} TFLOP/s "
        f"({100 * r['flops_per_s'] / peaks['matmul_flops_per_s']:.1f} %)",
        f"bytes: at least {r['compulsory_bytes_per_update'] / 1e9:.3f} GB an update "
        f"({r['compulsory_bytes_per_s'] / 1e9:.1f} GB/s), as launched {r['launched_bytes_per_update'] / 1e9:.3f} GB "
        f"({r['launched_bytes_per_s'] / 1e9:.1f} GB/s); measured copy peak {peaks['copy_bytes_per_s'] / 1e9:.1f} GB/s "
        f"({100 * r['launched_bytes_per_s'] / peaks['copy_bytes_per_s']:.1f} % as launched)",
    ]
    if spec is not None:
        flop_peak = spec["tf32_flops_per_s"] if r["matmul_precision"] != "highest" else spec["float32_flops_per_s"]
        bandwidth = spec["memory_bytes_per_s"]
        floor_ms = 1000 * max(r["flop_per_update"] / flop_peak, r["compulsory_bytes_per_update"] / bandwidth)
        lines.append(
            f"data sheet: {flop_peak / 1e12:.0f} TFLOP/s ({100 * r['flops_per_s'] / flop_peak:.2f} %), "
            f"{bandwidth / 1e12:.2f} TB/s ({100 * r['launched_bytes_per_s'] / bandwidth:.2f} % as launched); "
            f"at those peaks an update could take {floor_ms:.3f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--updates", type=int, default=20, help="updates timed (default 20)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = override(preset(args.preset), {"runtime.progress": False, **parse_assignments(args.set)})
    result = measure(config, updates=args.updates)
    print(json.dumps(result, indent=2) if args.json else report(result))


if __name__ == "__main__":
    main()
