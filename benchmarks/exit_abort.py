"""How often a finished torchrun process aborts in the interpreter's teardown, and under which conditions.

    python benchmarks/exit_abort.py --runs 40                       # every variant, 40 two-process jobs each
    python benchmarks/exit_abort.py --runs 40 --variants train-interpreter --generations 4

Each job is ``torchrun --standalone --nproc-per-node 2`` (in a network namespace of its own, ``tests/loopback_only.py``)
of one of these, counted as aborted when it fails with "terminate called" in its output:

* ``train-interpreter``: a smoke run (``--generations``, default 1) of the command line that ends through the
  interpreter's teardown (``sys.exit``), as every process did before ``main.exit_process`` (a small script of its own
  calls ``main.main``);
* ``train-os-exit``: the same run of ``main.py`` itself, ending as it does now (``main.exit_process``: ``os._exit``
  in a torchrun process, once its output is flushed);
* ``gloo-dynamo``: no training; a gloo process group, one all-reduce, ``torch._dynamo`` imported (as the memory
  check's meta-device update imports it in every run), the group destroyed, the interpreter's teardown;
* ``gloo``: the same without importing ``torch._dynamo``.

Prints, per variant, the jobs that aborted, that failed otherwise, and the mean wall time of a job; the last lines of
each job that did not succeed go to stderr.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("train-interpreter", "train-os-exit", "gloo-dynamo", "gloo")


INTERPRETER_EXIT = """import sys
sys.path.insert(0, sys.argv.pop(1))
import main
sys.exit(main.main(sys.argv[1:]))  # through the interpreter's teardown, as before main.exit_process
"""
"""The ``train-interpreter`` variant's script: the command line's work, ended by ``sys.exit``."""


def train_command(variant: str, folder: str, generations: int) -> list[str]:
    """What torchrun starts in each process of a ``train-*`` job: ``main.py`` itself (its own ending), or the script
    that ends it through the interpreter's teardown."""
    train = ["--preset", "smoke", "--generations", str(generations), "--seed", "1", "--no-progress"]
    train += ["--device", "cpu", "--checkpoint-uri", folder, "--run-name", "abort"]
    if variant == "train-os-exit":
        return [str(REPO / "main.py"), *train]
    script = Path(folder) / "interpreter_exit.py"
    script.write_text(INTERPRETER_EXIT)
    return [str(script), str(REPO), *train]


def worker(variant: str, folder: str, generations: int) -> None:
    """One process of a ``gloo*`` job (run by torchrun)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    total = torch.ones(1)
    dist.all_reduce(total)
    if variant == "gloo-dynamo":
        import torch._dynamo
    dist.destroy_process_group()
    sys.exit(0 if total.item() == 2 else 1)


def job(variant: str, generations: int) -> tuple[str, float]:
    """Run one two-process job of ``variant``: ("aborted" | "failed" | "ok", seconds)."""
    from tests import loopback_only

    with tempfile.TemporaryDirectory(prefix="exit-abort-") as folder:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        if variant.startswith("train"):
            worker = train_command(variant, folder, generations)
        else:
            worker = [__file__, "--worker", variant, "--folder", folder, "--generations", str(generations)]
        command = loopback_only.command([*torchrun, *worker])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        started = time.monotonic()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        seconds = time.monotonic() - started
    output = done.stdout + done.stderr
    if done.returncode == 0:
        return "ok", seconds
    outcome = "aborted" if "terminate called" in output else "failed"
    print(f"--- {variant} {outcome} (exit status {done.returncode}), the job's last lines:", file=sys.stderr)
    print("\n".join(output.splitlines()[-15:]), file=sys.stderr, flush=True)
    return outcome, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=40, help="jobs per variant (default 40)")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--generations", type=int, default=1, help="generations of each training job (default 1)")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.folder, args.generations)
        return
    sys.path.insert(0, str(REPO))
    for variant in args.variants:
        outcomes, seconds = [], []
        for _ in range(args.runs):
            outcome, took = job(variant, args.generations)
            outcomes.append(outcome)
            seconds.append(took)
        print(
            f"{variant:<18} aborted {outcomes.count('aborted')}/{args.runs}, failed otherwise "
            f"{outcomes.count('failed')}/{args.runs}, {sum(seconds) / len(seconds):.1f} s a job",
            flush=True,
        )


if __name__ == "__main__":
    main()
