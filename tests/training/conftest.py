"""A real checkpoint for the tests that read one (inspect, export): one smoke run per test session; the metrics
rows the overfitting diagnostics read."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import main
from training.overfitting import block_means


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


@pytest.fixture
def add_validation_keys() -> Callable[..., list[dict[str, Any]]]:
    """Gives metrics rows the two keys the trainer writes for ``training.overfitting`` (``validation_blocks``,
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
