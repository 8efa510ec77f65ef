"""Fixtures shared by the tests (a market, the GCS emulator, one real smoke run, metrics rows with validation
evidence); the builders behind them live in tests/synthetic.py."""

from __future__ import annotations

import secrets
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch

import main
from environment.market import Market
from persistence.gcs import EMULATOR_ENV
from run.records import block_means
from tests.emulated_cuda import EmulatedCuda, emulate_cuda
from tests.gcs_server import GCSEmulator, emulator_binary
from tests.synthetic import make_market

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def market() -> Market:
    return make_market()


@pytest.fixture
def writer_threads() -> Callable[[], list[threading.Thread]]:
    """The checkpoint writer threads this test started that are still alive (the threads of trainers other tests
    dropped without closing end when those are collected)."""
    earlier = {thread for thread in threading.enumerate() if thread.name == "checkpoint-writer"}
    return lambda: [t for t in threading.enumerate() if t.name == "checkpoint-writer" and t not in earlier]


# ---------------------------------------------------------------------------------------------------------------------
# CUDA: the emulated device on every machine (tests/emulated_cuda.py), a real GPU where there is one (gpu-marked).


class Cuda(NamedTuple):
    kind: str
    """"emulated" (the CPU, strict as a GPU) or "gpu"."""
    mode: EmulatedCuda | None
    """The emulation, active for the test's duration; None on a real GPU."""
    main: list[str]
    """The command that runs ``main.py`` on this CUDA in a process of its own."""


@pytest.fixture(
    params=[
        pytest.param("emulated", id="emulated-cuda"),
        pytest.param(
            "gpu",
            id="gpu",
            marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")],
        ),
    ]
)
def cuda(request: pytest.FixtureRequest) -> Iterator[Cuda]:
    """A CUDA device for the test: emulated on the CPU (every machine runs the CUDA path), or the real GPU."""
    if request.param == "gpu":
        yield Cuda("gpu", None, [sys.executable, str(ROOT / "main.py")])
        return
    with emulate_cuda() as mode:
        yield Cuda("emulated", mode, [sys.executable, str(ROOT / "tests" / "emulated_main.py")])


# ---------------------------------------------------------------------------------------------------------------------
# Google Cloud Storage: a real fake-gcs-server process (tests/gcs_server.py), never a mocked client.


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GCSEmulator]:
    """One emulator for the session, with ``STORAGE_EMULATOR_HOST`` pointing at it (restored at the end).

    A test may ``stop()`` and ``restart()`` it (same port, data kept); ``gcs_bucket`` starts it again if a failed
    test left it down. Tests that kill servers mid-request use ``gcs_private``, a server of their own.
    """
    binary = emulator_binary()
    if binary is None:
        pytest.skip("fake-gcs-server has no bundled binary for this platform")
    server = GCSEmulator(binary, tmp_path_factory.mktemp("fake-gcs"))
    env = pytest.MonkeyPatch()
    try:
        server.start()
        env.setenv(EMULATOR_ENV, server.url)
        yield server
    finally:
        env.undo()
        server.close()


@pytest.fixture
def gcs_bucket(gcs_emulator: GCSEmulator) -> str:
    """A fresh, empty bucket on the session emulator: ``gs://<bucket>/runs``."""
    if not gcs_emulator.running:
        gcs_emulator.start()
    bucket = f"test-{secrets.token_hex(6)}"
    gcs_emulator.create_bucket(bucket)
    return f"gs://{bucket}/runs"


class PrivateGCS(NamedTuple):
    emulator: GCSEmulator
    uri: str  # gs://<bucket>/runs on that emulator


@pytest.fixture
def gcs_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[PrivateGCS]:
    """An emulator of this test's own (free to stop, kill and restart) with one bucket; stopped by process id after."""
    binary = emulator_binary()
    if binary is None:
        pytest.skip("fake-gcs-server has no bundled binary for this platform")
    server = GCSEmulator(binary, tmp_path / "fake-gcs")
    try:
        server.start()
        monkeypatch.setenv(EMULATOR_ENV, server.url)
        bucket = f"test-{secrets.token_hex(6)}"
        server.create_bucket(bucket)
        yield PrivateGCS(server, f"gs://{bucket}/runs")
    finally:
        server.close()


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """A 3-generation smoke run folder (gen-000001 .. gen-000003). Read it; copy it before changing anything."""
    root = tmp_path_factory.mktemp("smoke-runs")
    argv = ["--preset", "smoke", "--checkpoint-uri", str(root), "--run-name", "r", "--no-progress", "--device", "cpu"]
    # Three smoke generations rarely prove an edge, and the readers under test need a crowned agent, not
    # the equal-weight champion: crown the best agent on validation in every generation.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("training.loop.choose_champion", lambda edges, *_, **__: int(edges.argmax()))
        assert main.main(argv) == 0
    return root / "r"


@pytest.fixture
def add_validation_keys() -> Callable[..., list[dict[str, Any]]]:
    """Gives metrics rows the two keys the trainer writes for ``offline.overfitting`` (``validation_blocks``,
    ``validation_sharpe``), from seeded normal daily excess returns: rows of runs made without them get them."""

    def add(rows: list[dict[str, Any]], *, popsize: int = 4, days: int = 126, seed: int = 0) -> list[dict[str, Any]]:
        generator = np.random.default_rng(seed)
        added = []
        for row in rows:
            excess = generator.normal(0.0, 0.01, size=(popsize, days))  # (P, D)
            sharpe = excess.mean(axis=1) / excess.std(axis=1, ddof=1)
            blocks = block_means(excess).tolist()
            added.append({**row, "validation_blocks": blocks, "validation_sharpe": sharpe.tolist()})
        return added

    return add
