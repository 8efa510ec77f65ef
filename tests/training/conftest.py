"""A real checkpoint for the tests that read one (inspect, export): one smoke run per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

import main


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> Path:
    """A 3-generation smoke run folder (gen-000001 .. gen-000003). Read it; copy it before changing anything."""
    root = tmp_path_factory.mktemp("smoke-runs")
    argv = ["--preset", "smoke", "--checkpoint-uri", str(root), "--run-name", "r", "--no-progress", "--device", "cpu"]
    assert main.main(argv) == 0
    return root / "r"
