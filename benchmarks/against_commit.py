"""This code against an earlier commit, side by side on this machine: seconds a generation and its phases, and
whether both trained the same numbers.

    python benchmarks/against_commit.py 1c6d6df                        # default preset, 8 generations, 1 thread each
    python benchmarks/against_commit.py 1c6d6df --generations 12 --set runtime.device=cpu --threads 1

The commit is unpacked from this clone's history (``git archive``) into a temporary folder, and each tree trains
the bundled data in a process of its own (``main.py --no-progress``, one intra-op thread each unless told), both at
once so that the machine's load is the same for both. Printed: the medians over the generations after the first of
``generation_s`` and each phase's seconds, their ratios (earlier / this), and each generation's best fitness and
champion (the agent's score and the generation that crowned it) compared exactly.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PHASES = ("generation_s", "rollout_s", "validate_s", "evolve_s", "update_s", "checkpoint_s", "telemetry_s")
SAME = ("best_fitness", "mean_fitness", "validation_best", "champion_score", "champion_generation")


def unpack(commit: str, into: Path) -> Path:
    archive = subprocess.run(["git", "archive", commit], cwd=HERE, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def start(tree: Path, runs: Path, args: argparse.Namespace) -> subprocess.Popen:
    command = [sys.executable, "main.py", "--preset", args.preset, "--generations", str(args.generations)]
    command += ["--checkpoint-uri", str(runs), "--run-name", "r", "--no-progress"]
    command += [arg for setting in args.set for arg in ("--set", setting)]
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "PYTHONPATH": str(tree)}
    return subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def rows(runs: Path) -> list[dict]:
    return [json.loads(line) for line in (runs / "r" / "metrics.jsonl").read_text().splitlines()]


def medians(table: list[dict]) -> dict[str, float]:
    steady = table[1:] or table
    return {key: statistics.median(row.get(key, 0.0) or 0.0 for row in steady) for key in PHASES}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("commit", help="the earlier commit (any name git knows)")
    parser.add_argument("--preset", default="default")
    parser.add_argument("--generations", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of each process (default 1)")
    parser.add_argument("--set", action="append", default=["runtime.device=cpu"], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="against-") as scratch:
        scratch = Path(scratch)
        earlier = unpack(args.commit, scratch / "earlier")
        trees = {args.commit: earlier, "this": HERE}
        jobs = {name: start(tree, scratch / f"runs-{index}", args) for index, (name, tree) in enumerate(trees.items())}
        for name, job in jobs.items():
            if job.wait() != 0:
                raise SystemExit(f"{name} failed: {job.stderr.read()[-2000:]}")
        tables = {name: rows(scratch / f"runs-{index}") for index, name in enumerate(trees)}
    figures = {name: medians(table) for name, table in tables.items()}
    before, now = figures[args.commit], figures["this"]
    print(f"{args.preset}, {args.generations} generations, {args.threads} thread(s) each, both at once; medians of")
    print("generations 2.. in seconds")
    print(f"| phase | {args.commit} | this | {args.commit} / this |")
    print("|---|---:|---:|---:|")
    for key in PHASES:
        ratio = before[key] / now[key] if now[key] else float("nan")
        print(f"| {key} | {before[key]:.3f} | {now[key]:.3f} | {ratio:.2f}x |")
    same = {key: [r.get(key) for r in tables[args.commit]] == [r.get(key) for r in tables["this"]] for key in SAME}
    verdicts = ", ".join(f"{key} {'yes' if ok else 'NO'}" for key, ok in same.items())
    print("the same numbers, every generation:", verdicts)


if __name__ == "__main__":
    main()
