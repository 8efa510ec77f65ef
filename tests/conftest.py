"""Fixtures shared by the tests; the builders behind them live in tests/synthetic.py."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from environment.market import Market
from tests.gcs_server import GCSEmulator, emulator_binary
from tests.synthetic import make_market
from utils.gcs import EMULATOR_ENV


@pytest.fixture
def market() -> Market:
    return make_market()


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
