"""Throughput: the batched trainer against the per-agent reference loop, side by side in one run.

    python benchmarks/throughput.py                       # populations 4, 16, 64 on the default preset
    python benchmarks/throughput.py --json                # one JSON object instead of the tables
    python benchmarks/throughput.py --populations 16 --stability-generations 0

For each population size P, on the bundled data and the same machine:

* evaluation agent-steps/s: the trainer's ``collect`` (P agents x E windows in lockstep) against
  ``per_agent.run_episodes`` (one agent, one window, one batch-1 step at a time), both storing transitions;
* agent-updates/s in the update phase: one batched learner update of all P agents against P single-agent updates
  one after another, both sampling their own batches from the same buffer;
* generation wall time: evaluation + validation + ``updates_per_generation`` updates, from the measured phases.

Then: the machine's dense float32 matmul throughput, and the update phase's achieved FLOP/s (counted by
``torch.utils.flop_counter``) as a fraction of it, at the default and the paper network sizes; and the stability of
the trainer's speed over ``--stability-generations`` generations of a real run (steps/s per generation).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.per_agent import TransitionStore, run_episodes, single_sample_view, split_population, update_agents
from config import Config, override, parse_assignments, preset
from environment.loading import load_market
from persistence import jsonl
from run.trainer import Trainer
from runtime.device import resolve_device
from utils.telemetry import least_squares_slope

WARMUP_GENERATIONS = 5
"""Generations left out of the stability figures (allocator and caches settle; the buffer starts filling)."""


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any], *, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls after one untimed warm-up call, in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def matmul_flops(device: torch.device, *, seconds: float = 1.0) -> float:
    """Dense float32 matmul FLOP/s of this machine, measured now (square matrices, no transposes)."""
    n = 4096 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    out = torch.empty(n, n, device=device)
    torch.mm(a, b, out=out)
    reps = 1
    while True:
        synchronize(device)
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b, out=out)
        synchronize(device)
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2 * n**3 * reps / elapsed
        reps *= 2


def with_population(config: Config, popsize: int, **settings: Any) -> Config:
    """``config`` at ``popsize`` agents; elites and tournament shrink to fit a small population."""
    evolution = config.evolution
    sized = {
        "evolution.popsize": popsize,
        "evolution.elites": min(evolution.elites, popsize - 1),
        "evolution.tournament_size": min(evolution.tournament_size, popsize),
    }
    return override(config, {**sized, **settings})


def build_trainer(config: Config, device: torch.device, run_dir: Path, market=None) -> Trainer:
    market = market if market is not None else load_market(config, device)
    return Trainer(config, market, run_dir, log=lambda line: None)


def fill_buffer(trainer: Trainer) -> None:
    """Enough real transitions to sample from: one evaluation phase."""
    trainer.rollouts.run(trainer.rollouts.sample_starts())


def measure_population(
    config: Config, device: torch.device, market, *, updates: int, reference_updates: int, repeats: int
) -> dict[str, Any]:
    cfg_eval, cfg_learner, cfg_env = config.rollout, config.learner, config.env
    popsize = config.evolution.popsize
    with tempfile.TemporaryDirectory() as scratch:
        trainer = build_trainer(config, device, Path(scratch), market)
        fill_buffer(trainer)
        starts = trainer.rollouts.sample_starts()
        steps = popsize * cfg_eval.episodes * cfg_env.episode_days

        # ---- the trainer's way: everything batched
        def evaluate() -> None:
            trainer.rollouts.run(starts)

        def run_validation() -> None:
            trainer.validation.run()

        def update() -> None:
            for index in range(updates):
                trainer.update_phase.update(trainer.population.learner.takes_actor_step(index))

        eval_s = timed(device, evaluate, repeats=repeats)
        validate_s = timed(device, run_validation, repeats=repeats)
        update_s = timed(device, update, repeats=repeats) / updates

        # ---- the per-agent way: same networks, kernel, buffer and update, one agent at a time
        agents = split_population(trainer.population, generator=torch.Generator(device=device).manual_seed(0))
        champion = split_population(trainer.population, generator=torch.Generator(device=device).manual_seed(1))[:1]
        store = TransitionStore(steps, market.num_assets, device)
        start_list = [int(day) for day in starts.cpu()]
        exploring = [bool(flag) for flag in trainer.rollouts.exploring.cpu()]
        validation_list = [int(day) for day in trainer.validation.starts.cpu()]
        episode = {
            "episode_days": cfg_env.episode_days,
            "cost_rate": cfg_env.cost_rate,
            "execution_delay": cfg_env.execution_delay,
        }
        generator = torch.Generator(device=device).manual_seed(2)
        gatherer = trainer.rollouts.env.gatherer
        view = single_sample_view(trainer.buffer, cfg_learner.batch_size)

        ref_eval_s = timed(
            device,
            lambda: run_episodes(
                agents, market, gatherer, start_list, exploring=exploring, store=store, generator=generator, **episode
            ),
            repeats=1,
        )
        ref_validate_s = timed(
            device, lambda: run_episodes(agents + champion, market, gatherer, validation_list, **episode), repeats=1
        )
        ref_update_s = (
            timed(
                device,
                lambda: update_agents(agents, view, reference_updates, generator=generator),
                repeats=1,
            )
            / reference_updates
        )

    updates_per_generation = cfg_learner.updates_per_generation
    generation_s = eval_s + validate_s + updates_per_generation * update_s
    ref_generation_s = ref_eval_s + ref_validate_s + updates_per_generation * ref_update_s
    return {
        "population": popsize,
        "eval_steps_per_s": steps / eval_s,
        "reference_eval_steps_per_s": steps / ref_eval_s,
        "eval_speedup": ref_eval_s / eval_s,
        "updates_per_s": popsize / update_s,
        "reference_updates_per_s": popsize / ref_update_s,
        "update_speedup": ref_update_s / update_s,
        "generation_s": generation_s,
        "reference_generation_s": ref_generation_s,
        "generation_speedup": ref_generation_s / generation_s,
        "validate_s": validate_s,
        "reference_validate_s": ref_validate_s,
    }


def update_efficiency(config: Config, device: torch.device, machine_flops: float, *, repeats: int) -> dict[str, Any]:
    """FLOPs of one batched learner update (sampling included), its achieved FLOP/s, and that over the matmul peak."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = build_trainer(config, device, Path(scratch))
        fill_buffer(trainer)
        step = trainer.update_phase.update
        counter = FlopCounterMode(display=False)
        with counter:
            step()
        flops = counter.get_total_flops()
        seconds = timed(device, step, repeats=repeats)
    achieved = flops / seconds
    return {
        "population": config.evolution.popsize,
        "lookback": config.env.lookback,
        "batch_size": config.learner.batch_size,
        "update_flops": flops,
        "update_s": seconds,
        "achieved_flops": achieved,
        "efficiency": achieved / machine_flops,
    }


def profile_update(config: Config, device: torch.device, *, updates: int = 5, top: int = 10) -> list[dict[str, Any]]:
    """The operators that take the learner update's time: fraction of self time, by operator name."""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = build_trainer(config, device, Path(scratch))
        fill_buffer(trainer)
        for _ in range(2):
            trainer.update_phase.update()
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            for _ in range(updates):
                trainer.update_phase.update()
            synchronize(device)
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = [e for e in profiler.key_averages() if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events)
    events.sort(key=lambda e: getattr(e, key), reverse=True)
    return [
        {"op": e.key, "share": getattr(e, key) / total, "calls_per_update": e.count / updates} for e in events[:top]
    ]


def stability(config: Config, device: torch.device, generations: int) -> dict[str, Any]:
    """Run the trainer for ``generations`` generations; how much does its speed move once warm?"""
    with tempfile.TemporaryDirectory() as scratch:
        trainer = build_trainer(config, device, Path(scratch))
        trainer.run(until=generations)
        rows = list(jsonl.read_rows(trainer.checkpoints.metrics_path))
    steps = [row["env_steps_per_s"] for row in rows][WARMUP_GENERATIONS:]
    seconds = [row["generation_s"] - row["checkpoint_s"] for row in rows][WARMUP_GENERATIONS:]
    median = statistics.median(steps)
    deviations = [100 * (value / median - 1) for value in steps]
    half = len(steps) // 2
    return {
        "generations": generations,
        "warmup_generations": WARMUP_GENERATIONS,
        "steps_per_s": steps,
        "median_steps_per_s": median,
        "max_deviation_pct": max(abs(d) for d in deviations),
        "within_5pct": sum(abs(d) <= 5 for d in deviations),
        "first_half_vs_second_half_pct": 100 * (statistics.median(steps[half:]) / statistics.median(steps[:half]) - 1),
        "trend_pct_per_generation": 100 * least_squares_slope(steps) / median,
        "median_generation_s": statistics.median(seconds),
        "max_generation_s_deviation_pct": max(abs(100 * (s / statistics.median(seconds) - 1)) for s in seconds),
    }


def machine_description(device: torch.device) -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    out = {
        "cpu": cpu,
        "cores": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def print_report(report: dict[str, Any]) -> None:
    machine = report["machine"]
    gpu = f" ({machine['gpu']})" if "gpu" in machine else ""
    print(
        f"machine: {machine['cpu']}, {machine['cores']} cores ({machine['torch_threads']} torch threads), "
        f"torch {machine['torch']}, device {machine['device']}{gpu}"
    )
    print(f"dense float32 matmul: {report['matmul_flops'] / 1e9:.1f} GFLOP/s")
    print()
    header = (
        f"{'P':>4} | {'eval agent-steps/s':>30} | {'update agent-updates/s':>30} | {'generation s':>28}\n"
        f"{'':>4} | {'batched':>9} {'per-agent':>10} {'ratio':>8} | {'batched':>9} {'per-agent':>10} "
        f"{'ratio':>8} | {'batched':>8} {'per-agent':>10} {'ratio':>7}"
    )
    print(header)
    for r in report["results"]:
        print(
            f"{r['population']:>4} | {r['eval_steps_per_s']:>9.0f} {r['reference_eval_steps_per_s']:>10.0f} "
            f"{r['eval_speedup']:>7.1f}x | {r['updates_per_s']:>9.1f} {r['reference_updates_per_s']:>10.1f} "
            f"{r['update_speedup']:>7.1f}x | {r['generation_s']:>8.2f} {r['reference_generation_s']:>10.2f} "
            f"{r['generation_speedup']:>6.1f}x"
        )
    print()
    for name, e in report["update_efficiency"].items():
        print(
            f"update phase at {name} size (P={e['population']}, lookback {e['lookback']}, batch {e['batch_size']}): "
            f"{e['update_flops'] / 1e9:.2f} GFLOP per update in {1000 * e['update_s']:.0f} ms = "
            f"{e['achieved_flops'] / 1e9:.1f} GFLOP/s, {100 * e['efficiency']:.0f}% of matmul"
        )
    if "update_profile" in report:
        print()
        print(
            "where a default-size update's time goes: "
            + ", ".join(f"{row['op']} {100 * row['share']:.0f}%" for row in report["update_profile"])
        )
    s = report.get("stability")
    if s:
        print()
        print(
            f"speed over {s['generations']} generations (first {s['warmup_generations']} left out): "
            f"median {s['median_steps_per_s']:.0f} steps/s, largest deviation {s['max_deviation_pct']:.1f}%, "
            f"{s['within_5pct']}/{len(s['steps_per_s'])} generations within 5%, "
            f"second half vs first half {s['first_half_vs_second_half_pct']:+.1f}%, "
            f"trend {s['trend_pct_per_generation']:+.2f}% per generation; "
            f"generation {s['median_generation_s']:.2f} s median, "
            f"largest deviation {s['max_generation_s_deviation_pct']:.1f}%"
        )
        print("steps/s per generation: " + " ".join(f"{v:.0f}" for v in s["steps_per_s"]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default", help="preset the sizes come from (default: default)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    parser.add_argument("--populations", type=int, nargs="+", default=[4, 16, 64])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--updates", type=int, default=8, help="batched updates timed per repeat")
    parser.add_argument("--reference-updates", type=int, default=2, help="updates per agent in the reference")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats of the batched phases (fastest kept)")
    parser.add_argument("--efficiency-population", type=int, default=16)
    parser.add_argument("--stability-generations", type=int, default=50, help="0 skips the stability run")
    parser.add_argument(
        "--stability-set",
        action="append",
        default=["learner.updates_per_generation=4"],
        metavar="KEY=VALUE",
        help="overrides of the stability run (default: 4 updates/generation)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    parser.add_argument("--json-out", type=Path, help="also write the JSON object to this file")
    parser.add_argument("--profile", action="store_true", help="add the top operators of one update at default size")
    args = parser.parse_args(argv)

    device = resolve_device(args.device)
    base = override(preset(args.preset), {**parse_assignments(args.set), "runtime.device": str(device)})
    market = load_market(base, device)
    say = (lambda *a: None) if args.json else (lambda text: print(text, file=sys.stderr, flush=True))

    say("measuring matmul throughput")
    report: dict[str, Any] = {"machine": machine_description(device), "preset": args.preset, "overrides": args.set}
    report["matmul_flops"] = matmul_flops(device)
    report["results"] = []
    for popsize in args.populations:
        say(f"population {popsize}: batched and per-agent")
        config = with_population(base, popsize)
        report["results"].append(
            measure_population(
                config,
                device,
                market,
                updates=args.updates,
                reference_updates=args.reference_updates,
                repeats=args.repeats,
            )
        )
    report["update_efficiency"] = {}
    for name in ("default", "paper"):
        say(f"update efficiency at the {name} network size")
        sizes = {
            "runtime.device": str(device),
            "learner.buffer_size": 100_000,
            "rollout.episodes": 4,
            "rollout.exploring_episodes": 2,
            **({"env.lookback": 252} if name == "paper" else {}),  # the stress shape BENCHMARKS.md reports
        }
        config = with_population(preset(name), args.efficiency_population, **sizes)
        report["update_efficiency"][name] = update_efficiency(
            config, device, report["matmul_flops"], repeats=args.repeats
        )
    if args.stability_generations > 0:
        say(f"stability: {args.stability_generations} generations")
        config = override(base, {**parse_assignments(args.stability_set), "checkpoint.keep_last": 1})
        report["stability"] = stability(config, device, args.stability_generations)
    if args.profile:
        say("profiling the learner update at the default size")
        config = override(preset("default"), {"runtime.device": str(device), "learner.buffer_size": 100_000})
        report["update_profile"] = profile_update(config, device)
    if args.json_out:
        args.json_out.write_text(json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report))
    else:
        print_report(report)


if __name__ == "__main__":
    main()
