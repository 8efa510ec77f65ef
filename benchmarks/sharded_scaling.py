"""Scaling of the sharded population: the same run with W = 1 and W = 2 processes (torchrun), side by side.

    python benchmarks/sharded_scaling.py --private-network        # P = 16 and 32, W = 1 and 2, on the CPU
    python benchmarks/sharded_scaling.py --device cuda --processes 1,2,4 --preset paper
    python benchmarks/sharded_scaling.py --moved-only --preset paper       # what evolution moves, no training

Each configuration trains ``--generations`` generations of the preset on the bundled data in a fresh run folder,
W = 1 with plain ``python main.py``, larger W under ``torchrun --standalone``; on the CPU every process gets one
thread (``OMP_NUM_THREADS=1``), so W processes use W cores. Per configuration it prints the median seconds per
generation after ``--warmup`` generations, its phases (evaluate, validate, evolve, update, checkpoint), the speed-up
over W = 1 and the parallel efficiency (speed-up / W). The runs themselves are equal whatever W
(tests/training/test_sharded.py), so the figures compare the same work.

First it prints what evolution moves between ranks for one agent another rank's offspring descends from, counted
from the preset's agent tensors: as a parent, as a crossover mate only, and every agent tensor (what moved for
either before mates sent their actor alone and actor targets stayed put).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from persistence import run_folder  # noqa: E402 (after the path)
from tests import loopback_only  # noqa: E402 (after the path)

PHASES = ("rollout_s", "validate_s", "evolve_s", "update_s", "checkpoint_s")


def run(population: int, processes: int, args: argparse.Namespace, root: Path) -> dict[str, float]:
    """Train one configuration; the median of each timing over the generations after the warm-up."""
    name = f"p{population}-w{processes}"
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        if args.private_network:  # torchrun's stores listen on every interface: give them only a loopback
            launcher = loopback_only.command(launcher)
    command = [
        *launcher,
        str(REPO / "main.py"),
        "--preset",
        args.preset,
        "--population",
        str(population),
        "--generations",
        str(args.generations),
        "--device",
        args.device,
        "--checkpoint-uri",
        str(root),
        "--run-name",
        name,
        "--no-progress",
        *[f"--set={setting}" for setting in args.set],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"} if args.device == "cpu" else dict(os.environ)
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in run_folder.metrics_path(root / name).read_text().splitlines()]
    measured = rows[args.warmup :] or rows
    figures = {key: statistics.median(r[key] for r in measured) for key in ("generation_s", *PHASES)}
    figures["wall_s"] = time.perf_counter() - started
    return figures


def moved_per_donor(preset_name: str) -> dict[str, int]:
    """Bytes evolution fetches for one agent held by another rank, from the tensors of the preset's population (what
    its learner says an offspring inherits, ``models.learner.Learner.inheritance``)."""
    import torch

    from config import override, preset
    from environment.loading import load_market
    from run.trainer import Trainer

    config = override(preset(preset_name), {"runtime.device": "cpu", "learner.buffer_size": 1})  # no buffer needed
    with tempfile.TemporaryDirectory() as scratch:
        trainer = Trainer(config, load_market(config, torch.device("cpu")), Path(scratch), log=lambda line: None)
        tensors = trainer.population.agent_tensors()
        inheritance = trainer.population.learner.inheritance()

    def per_agent(group: dict) -> int:
        return sum(tensor[0].numel() * tensor.element_size() for tensor in group.values())

    blended, copied = inheritance.blended, inheritance.copied
    return {"parent": per_agent({**blended, **copied}), "mate": per_agent(blended), "every": per_agent(tensors)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--populations", default="16,32", help="population sizes P (default 16,32)")
    parser.add_argument("--processes", default="1,2", help="process counts W (default 1,2)")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--generations", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="first generations left out (the buffer starts filling)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override")
    parser.add_argument(
        "--private-network",
        action="store_true",
        help="run torchrun in a network namespace of its own, only loopback there (unshare --net; root)",
    )
    parser.add_argument("--moved-only", action="store_true", help="print what evolution moves, then stop")
    args = parser.parse_args(argv)
    moved = moved_per_donor(args.preset)
    print(
        f"evolution moves per agent held elsewhere ({args.preset}): parent {moved['parent'] / 1e6:.2f} MB, "
        f"mate only {moved['mate'] / 1e6:.2f} MB (every agent tensor: {moved['every'] / 1e6:.2f} MB)",
        flush=True,
    )
    if args.moved_only:
        return 0
    populations = [int(p) for p in args.populations.split(",")]
    counts = [int(w) for w in args.processes.split(",")]

    import torch

    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    print(f"sharded scaling | preset {args.preset} | {args.generations} generations (median after {args.warmup})")
    print(f"device: {device}")
    header = f"{'P':>4} {'W':>3} {'s/gen':>8} " + " ".join(f"{p[:-2]:>10}" for p in PHASES)
    print(header + f" {'speed-up':>9} {'efficiency':>10} {'wall s':>7}")
    with tempfile.TemporaryDirectory() as scratch:
        for population in populations:
            baseline = None  # the first W listed: speed-up and efficiency are relative to it
            for processes in counts:
                figures = run(population, processes, args, Path(scratch))
                baseline = baseline or (processes, figures["generation_s"])
                speedup = baseline[1] / figures["generation_s"]
                phases = " ".join(f"{figures[p]:>10.3f}" for p in PHASES)
                print(
                    f"{population:>4} {processes:>3} {figures['generation_s']:>8.3f} {phases} "
                    f"{speedup:>8.2f}x {speedup * baseline[0] / processes:>10.2f} {figures['wall_s']:>7.0f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
