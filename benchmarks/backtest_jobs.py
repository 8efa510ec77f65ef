"""Folds at once against one at a time: the same backtest with ``--jobs 1`` and ``--jobs 2``, in one run.

    python benchmarks/backtest_jobs.py                  # default preset, test years 2021-2022 x seeds 0, 1: 4 folds
    python benchmarks/backtest_jobs.py --generations 4 --jobs 1,2,4 --seeds 0,1,2,3
    python benchmarks/backtest_jobs.py --device cuda --preset paper --jobs 1,2,4 --generations 20

Each backtest runs as a user runs it, ``python main.py backtest ... --jobs N --no-progress``, in a fresh folder, timed
from the command to its table (the process's end). It prints each time, its speed-up over the first, and whether its
fold results, ``summary.json`` and ``summary.csv`` are the first's, byte for byte.

First it measures what the machine gives two processes at once: a one-thread float32 matmul loop alone, then two of
them side by side; ``capacity`` is twice the time alone over the time side by side (2.0 on two free cores, about 1.0
where other work takes the second core). No ``--jobs 2`` can beat one fold at a time by more than it.

``--reference-threads T`` (by default this machine's cores, 0 for none) also times ``--jobs 1`` with T torch threads
per fold: one fold at a time on every core, as backtests ran before ``--threads``. Its figures differ (a fold's
figures depend on its threads), so it shows what fixing the threads costs one fold at a time, not a speed-up of the
same work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def backtest(args: argparse.Namespace, root: Path, name: str, *, jobs: int, threads: int) -> float:
    """Seconds from ``python main.py backtest`` to its table."""
    command = [
        sys.executable,
        str(REPO / "main.py"),
        "backtest",
        "--preset",
        args.preset,
        "--folds",
        str(args.folds),
        "--seeds",
        args.seeds,
        "--generations",
        str(args.generations),
        "--device",
        args.device,
        "--jobs",
        str(jobs),
        "--threads",
        str(threads),
        "--checkpoint-uri",
        str(root),
        "--name",
        name,
        "--no-progress",
        *[f"--set={setting}" for setting in args.set],
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        sys.exit(f"--jobs {jobs} --threads {threads} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds


PROBE = """
import time, torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
a @ a
started = time.perf_counter()
for _ in range(3000):
    a @ a
print(time.perf_counter() - started)
"""


def capacity() -> tuple[float, float]:
    """Seconds of the matmul loop alone and side by side with a second one (the slower of the two)."""

    def start() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", PROBE], stdout=subprocess.PIPE, text=True)

    alone = float(start().communicate()[0])
    pair = [start(), start()]
    together = max(float(process.communicate()[0]) for process in pair)
    return alone, together


def report_files(folder: Path) -> dict[str, bytes]:
    """Each fold's result file, the summary and its table's figures."""
    files = {f"folds/{p.name}": p.read_bytes() for p in sorted((folder / "folds").glob("*.json"))}
    return {**files, **{name: (folder / name).read_bytes() for name in ("summary.json", "summary.csv")}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--folds", type=int, default=2, help="test years: the data's last FOLDS (2)")
    parser.add_argument("--seeds", default="0,1", help="seeds of every test year (0,1)")
    parser.add_argument("--generations", type=int, default=10, help="generations of every fold (10)")
    parser.add_argument("--jobs", default="1,2", help="the --jobs to time, the first the baseline (1,2)")
    parser.add_argument("--threads", type=int, default=1, help="--threads of every timed backtest (1)")
    parser.add_argument("--reference-threads", type=int, default=os.cpu_count() or 1, help="see above; 0: none")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    jobs = [int(n) for n in args.jobs.split(",")]
    folds = args.folds * len(args.seeds.split(","))
    figures: dict = {"command": sys.argv, "preset": args.preset, "folds": folds, "generations": args.generations}
    figures.update({"threads": args.threads, "cores": os.cpu_count(), "runs": []})
    if not args.json:
        print(
            f"backtest: {args.preset} preset, {folds} folds (the last {args.folds} test years x seeds {args.seeds}), "
            f"{args.generations} generations, {args.threads} torch thread(s) per fold, {args.device}, "
            f"{os.cpu_count()} cores",
            flush=True,
        )
    alone, together = capacity()
    figures["capacity"] = {"alone_s": alone, "together_s": together, "ratio": 2 * alone / together}
    if not args.json:
        print(
            f"two processes at once: a one-thread matmul loop takes {alone:.2f} s alone, {together:.2f} s beside "
            f"another: capacity {2 * alone / together:.2f} of 2",
            flush=True,
        )
    with tempfile.TemporaryDirectory(prefix="backtest-jobs-") as scratch:
        root = Path(scratch)
        first = None
        for n in jobs:
            seconds = backtest(args, root, f"jobs-{n}", jobs=n, threads=args.threads)
            files = report_files(root / f"jobs-{n}")
            first = first or (seconds, files)
            run = {"jobs": n, "threads": args.threads, "seconds": seconds, "speedup": first[0] / seconds}
            run["identical"] = files == first[1]
            figures["runs"].append(run)
            if not args.json:
                same = "identical" if run["identical"] else "DIFFERENT"
                print(f"--jobs {n}: {seconds:7.1f} s  {run['speedup']:.2f}x  results {same}", flush=True)
        if args.reference_threads:
            t = args.reference_threads
            seconds = backtest(args, root, "reference", jobs=1, threads=t)
            same = report_files(root / "reference") == first[1]
            figures["reference"] = {"jobs": 1, "threads": t, "seconds": seconds, "identical": same}
            if not args.json:
                print(
                    f"--jobs 1 --threads {t}: {seconds:7.1f} s  (one fold at a time on {t} threads, as before "
                    f"--threads; figures {'identical' if same else 'of their own'})",
                    flush=True,
                )
    if args.json:
        print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    main()
