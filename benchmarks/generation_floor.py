"""How far each phase of a generation is from what a GPU could do at best: its floor on a named card.

    python benchmarks/generation_floor.py                                  # default preset, the training device
    python benchmarks/generation_floor.py --preset paper --card h200 --check-profiler
    python benchmarks/generation_floor.py --preset default --set runtime.device=cpu --json

A trainer is built from the preset and the bundled data, its buffer filled (to capacity when the update is graphed,
so its graphs are never captured again), and ``--warmup`` generations run. Then, for each phase of a generation,
one eager call is counted (CUDA graphs off: every kernel dispatched) and ``--generations`` generations are timed as
the loop runs them. The columns:

* kernels: launches counted by ``benchmarks/update_roofline.py``'s dispatch mode (``count_kernels``: views and
  allocations launch nothing). With ``--check-profiler``, ``profiled`` is torch.profiler's count of the same eager
  call (on CUDA the kernels, memcpys and memsets the GPU ran, the count that holds with ``runtime.torch_compile``,
  whose fused kernels the dispatch mode never sees; on the CPU a proxy), and the launch floor uses it on CUDA.
  Per day: the launches that set the floor (``profiled`` on CUDA, else ``kernels``) over the days: rollout's
  ``env.episode_days``, validation's the validation range.
* MB, GFLOP: bytes the kernels read and write as launched (``moved_bytes``), matmul FLOPs (``FlopCounterMode``).
* floors on the card: launch = kernels x a launch's cost (``--graph-launch-us`` for the graphed phases, rollout,
  validation and update, when ``runtime.cuda_graphs`` is on; ``--eager-launch-us`` otherwise), bandwidth = bytes /
  the card's memory bandwidth, compute = FLOPs / its dense TF32 peak (float32 with ``matmul_precision=highest``; the
  gate's float64 matmuls too); floor = the largest. The whole generation's launch floor is its phases' plus the
  eager cost of what it launches outside them (the host's scores and plan, the record, a checkpoint's staging).
  Counted on the CPU, the floor is what the card would do with these counts.
* measured: the median over the timed generations that captured no CUDA graph (``graph_captures == 0``) of the
  trainer's own durations (``rollout_s``, ``validate_s``, ``evolve_s``, ``update_s``, ``generation_s``). The loop
  times the gate inside ``validate_s``: its own row is ``gate.look`` timed alone (median of ``--generations`` calls).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.update_roofline import SPEC_PEAKS, count_kernels, profiler_check, synchronize
from config import override, parse_assignments, preset
from environment.loading import load_market
from run.trainer import Trainer
from runtime.boundary import to_host
from runtime.device import resolve_device
from training.selection import TRADING_DAYS, ValidationReturns

GRAPHED = ("rollout", "validation", "update")
"""The phases whose device work a CUDA graph replays (``runtime.graphs``) with ``runtime.cuda_graphs``."""
TIMED = {"rollout": "rollout_s", "validation": "validate_s", "evolution": "evolve_s", "update": "update_s"}


def card_peaks(card: str) -> tuple[str, tuple[float, float, float]]:
    """The first of update_roofline's ``SPEC_PEAKS`` whose name contains ``card`` (any case): h100 is the SXM."""
    for name, peaks in SPEC_PEAKS.items():
        if card.lower() in name.lower():
            return name, peaks
    raise SystemExit(f"no card named like {card!r}: one of {', '.join(SPEC_PEAKS)}")


@contextlib.contextmanager
def eager(trainer: Trainer) -> Iterator[None]:
    """The trainer's graphed calls run eagerly inside (their graphs kept for after): each kernel dispatched."""
    steps = [trainer.rollouts.graphed, trainer.validation.graphed, *trainer.update_phase.graphed.values()]
    enabled = [step.enabled for step in steps]
    for step in steps:
        step.enabled = False
    try:
        yield
    finally:
        for step, was in zip(steps, enabled):
            step.enabled = was


def cuda_kernels(work: Callable[[], object], device: torch.device) -> int:
    """The kernels, memcpys and memsets the GPU ran for one call of ``work``, as torch.profiler records them (the
    count that holds for compiled code: no dispatch mode can watch a compiled function run)."""
    work()
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiled:
        work()
        synchronize(device)
    return sum(event.device_type == DeviceType.CUDA for event in profiled.events())


def counted(work: Callable[[], object], device: torch.device, *, check: bool, compiled: bool) -> dict[str, Any]:
    """One eager call of ``work``: kernels, bytes as launched, matmul FLOPs; with ``check`` the profiler's count.
    With ``compiled`` (``runtime.torch_compile``) the dispatch mode counts the call with compilation set aside (the
    operations the compiled kernels fuse: their bytes as launched eagerly, their FLOPs), and on CUDA ``profiled`` is
    the compiled call's kernels, which set the launch floor; on the CPU there is no such count."""
    stance = torch.compiler.set_stance("force_eager") if compiled else contextlib.nullcontext()
    with stance, FlopCounterMode(display=False) as flops:
        kernels = count_kernels(work)
    synchronize(device)
    if compiled:
        profiled = cuda_kernels(work, device) if device.type == "cuda" else None
    else:
        profiled = profiler_check(work, device)["profiled"] if check else None
    return {"kernels": kernels.kernels, "bytes": kernels.bytes, "flop": flops.get_total_flops(), "profiled": profiled}


def measure(
    config: Any, *, warmup: int = 3, generations: int = 5, check_profiler: bool = False
) -> tuple[torch.device, list[dict[str, Any]]]:
    """Per phase of one generation: its counts (``counted``), its days and its measured seconds (None when every
    timed generation captured a graph)."""
    device = resolve_device(config.runtime.device)
    settings = config.learner
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(config, load_market(config, device), Path(folder), log=lambda line: None)
        graphed_update = any(step.enabled for step in trainer.update_phase.graphed.values())
        enough = trainer.buffer.capacity if graphed_update else max(settings.learning_starts, settings.batch_size)
        while len(trainer.buffer) < enough:  # a graphed update is captured again whenever the buffer grows
            trainer.rollouts.run(trainer.rollouts.sample_starts())
        trainer.run(until=trainer.generation + warmup)

        gate, margin = trainer.gate, config.selection.min_edge / TRADING_DAYS
        excess = ValidationReturns(trainer.validation.run().to(torch.float64)).excess  # (P, D)

        crossed = None if gate is None else gate.crossed.clone()  # what the counted looks cross is forgotten

        def look() -> None:
            gate.look(excess, trainer.generation, margin=margin)

        fitness = to_host(trainer._roll_out())
        plan = trainer._evolve(fitness)  # the plan the counted evolution and update use
        phases: dict[str, Callable[[], object]] = {
            "rollout": trainer._roll_out,
            "validation": trainer.validation.run,
            **({"gate": look} if gate is not None else {}),
            "evolution": lambda: trainer._evolve(fitness),
            "update": lambda: trainer._update(plan),
            "generation": lambda: trainer.run(until=trainer.generation + 1),
        }
        days = {"rollout": config.env.episode_days, "validation": trainer.validation.env.episode_days}
        with eager(trainer):
            compiled = config.runtime.torch_compile
            counts = {
                name: counted(work, device, check=check_profiler, compiled=compiled) for name, work in phases.items()
            }
        if gate is not None:
            gate.crossed.copy_(crossed)

        rows: list[dict[str, Any]] = []
        trainer.run(until=trainer.generation + generations, on_generation=rows.append)
        quiet = [row for row in rows if row["graph_captures"] == 0]
        seconds = {name: [row[key] for row in quiet] for name, key in {**TIMED, "generation": "generation_s"}.items()}
        if gate is not None:
            seconds["gate"] = []
            for _ in range(generations):
                synchronize(device)
                start = time.perf_counter()
                look()
                synchronize(device)
                seconds["gate"].append(time.perf_counter() - start)
    return device, [
        {
            "phase": name,
            **counts[name],
            "days": days.get(name),
            "measured_s": statistics.median(seconds[name]) if seconds[name] else None,
            "timed_generations": len(seconds[name]),
        }
        for name in phases
    ]


def floors(
    phases: list[dict[str, Any]], config: Any, device: torch.device, *, card: str, graph_us: float, eager_us: float
) -> dict[str, Any]:
    """Each phase's launch, bandwidth and compute floors on ``card`` (see the module docstring), added in place."""
    name, (fp32, tf32, bandwidth) = card_peaks(card)
    peak = fp32 if config.runtime.matmul_precision == "highest" else tf32
    graphs = config.runtime.cuda_graphs
    inside = 0
    for phase in phases:
        use_profiled = phase["profiled"] is not None and device.type == "cuda"
        kernels = phase["profiled"] if use_profiled else phase["kernels"]
        if phase["phase"] == "generation":  # its phases' launches, and the rest eager
            launch = inside + max(kernels - sum(p["launch_kernels"] for p in phases[:-1]), 0) * eager_us / 1e6
        else:
            launch = kernels * (graph_us if graphs and phase["phase"] in GRAPHED else eager_us) / 1e6
            inside += launch
        phase["launch_kernels"] = kernels
        phase["kernels_per_day"] = kernels / phase["days"] if phase["days"] else None  # the launches that count
        phase["launch_floor_s"] = launch
        phase["bandwidth_floor_s"] = phase["bytes"] / bandwidth
        phase["compute_floor_s"] = phase["flop"] / peak
        phase["floor_s"] = max(phase["launch_floor_s"], phase["bandwidth_floor_s"], phase["compute_floor_s"])
        measured = phase["measured_s"]
        phase["measured_over_floor"] = None if measured is None else measured / phase["floor_s"]
    return {
        "card": name,
        "bandwidth_bytes_per_s": bandwidth,
        "peak_flops_per_s": peak,
        "graph_launch_us": graph_us,
        "eager_launch_us": eager_us,
        "cuda_graphs": graphs,
    }


def report(result: dict[str, Any]) -> str:
    card, machine = result["card"], result["machine"]
    where = "measured on this GPU" if machine["device"] != "cpu" else "counted on the CPU: what the card would do"
    lines = [
        f"{machine['device']} | torch {machine['torch']} | {machine['date']} | preset {result['preset']}",
        f"floors on {card['card']} ({where}): {card['bandwidth_bytes_per_s'] / 1e12:.2f} TB/s, "
        f"{card['peak_flops_per_s'] / 1e12:.1f} TFLOP/s, a launch {card['graph_launch_us']} us in a graph "
        f"(CUDA graphs {'on' if card['cuda_graphs'] else 'off'}), {card['eager_launch_us']} us eager",
        "",
        "| phase | kernels | per day | profiled | MB moved | GFLOP | launch ms | bandwidth ms | compute ms "
        "| floor ms | measured ms | measured / floor |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in result["phases"]:
        per_day = "" if p["kernels_per_day"] is None else f"{p['kernels_per_day']:.1f}"
        measured = "n/a" if p["measured_s"] is None else f"{p['measured_s'] * 1e3:.2f}"
        ratio = p["measured_over_floor"]
        ratio = "n/a" if ratio is None else f"{ratio:,.1f}x" if ratio < 100 else f"{ratio:,.0f}x"
        profiled = "" if p["profiled"] is None else f"{p['profiled']:,}"
        lines.append(
            f"| {p['phase']} | {p['kernels']:,} | {per_day} | {profiled} | {p['bytes'] / 1e6:,.1f} "
            f"| {p['flop'] / 1e9:.3f} | {p['launch_floor_s'] * 1e3:.3f} | {p['bandwidth_floor_s'] * 1e3:.3f} "
            f"| {p['compute_floor_s'] * 1e3:.3f} | {p['floor_s'] * 1e3:.3f} | {measured} | {ratio} |"
        )
    lines.append("")
    lines.append("validation's measured time includes the gate's look (the loop times both as validate_s); the gate's")
    lines.append(f"row is gate.look timed alone. Timed generations without a graph capture: {result['timed']}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--card", default=None, help="the card of the floors (default: this GPU if known, else h100)")
    # 1 us: an H200 replayed 19,700 graphed kernels of validation in 33 ms (the gate included), 1.7 us at most each
    parser.add_argument("--graph-launch-us", type=float, default=1.0, help="a kernel's cost in a CUDA graph (1)")
    parser.add_argument("--eager-launch-us", type=float, default=5.0, help="an eager launch's cost (5)")
    parser.add_argument("--warmup", type=int, default=3, help="generations before anything is counted (3)")
    parser.add_argument("--generations", type=int, default=5, help="generations timed (5)")
    parser.add_argument("--check-profiler", action="store_true", help="count each phase with torch.profiler too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    config = override(preset(args.preset), {"runtime.progress": False, **parse_assignments(args.set)})
    device, phases = measure(
        config, warmup=args.warmup, generations=args.generations, check_profiler=args.check_profiler
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    known = next((fragment for fragment in SPEC_PEAKS if fragment in name), None)
    card = args.card or known or "h100"
    result = {
        "machine": {"device": name, "torch": torch.__version__, "date": datetime.date.today().isoformat()},
        "preset": args.preset,
        "card": floors(phases, config, device, card=card, graph_us=args.graph_launch_us, eager_us=args.eager_launch_us),
        "timed": phases[-1]["timed_generations"],
        "phases": phases,
    }
    print(json.dumps(result, indent=2) if args.json else report(result))


if __name__ == "__main__":
    main()
