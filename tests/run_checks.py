"""Runs in tests: waiting for a trainer in a child process, and reading what it left (metrics rows, their
deterministic part, the parameters' digest)."""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path

from persistence import checkpoint
from run.records import MEASURED_KEYS


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def deterministic(row: dict) -> dict:
    """A metrics row without the figures that measure the machine (timings, memory)."""
    return {k: v for k, v in row.items() if k not in MEASURED_KEYS}


def state_digest(run_dir: Path) -> str:
    """SHA-256 over every tensor of the latest generation (population, replay buffer, random streams), in key order."""
    gen = checkpoint.open_generation(run_dir)
    digest = hashlib.sha256()
    suffix = checkpoint.TENSORS_SUFFIX
    for name in sorted(n.removesuffix(suffix) for n in gen.manifest["files"] if n.endswith(suffix)):
        tensors = checkpoint.read_tensors(gen, name)
        for key in sorted(tensors):
            digest.update(f"{name}.{key}".encode())
            digest.update(tensors[key].contiguous().numpy().tobytes())
    return digest.hexdigest()


def finish(process: subprocess.Popen, *, timeout: float = 300) -> str:
    """The output of a child run that must succeed."""
    output, _ = process.communicate(timeout=timeout)
    assert process.returncode == 0, output
    return output


def wait_for(predicate, *, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)
