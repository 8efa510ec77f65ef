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
    # Three smoke generations rarely prove an edge, and the readers under test need a crowned agent, not
    # the equal-weight champion: crown the best agent on validation in every generation.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("training.trainer.choose_champion", lambda edges, *_, **__: int(edges.argmax()))
        assert main.main(argv) == 0
    return root / "r"
