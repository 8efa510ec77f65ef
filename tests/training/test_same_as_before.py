"""With the conventions of earlier versions (fills at the close observed, the common universe, the built-in features,
cash at 0), a run's results are those of the version before they could be changed, bit for bit.

``reference_2660d34.json`` holds what ``tests/training/reference_run.py`` printed at commit 2660d34 on the machine
it names. CPU kernels differ between instruction sets and torch versions, so the comparison runs where those match,
and says why it cannot elsewhere.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REFERENCE = json.loads((HERE / "reference_2660d34.json").read_text())
MACHINE = {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


CHANGED_SINCE = ("calmar", "under_a_year")
"""Risk figures whose reporting changed since: a sample under a year (the smoke preset's half-year ranges) has no
Calmar ratio now, and says it is under a year; every other figure is compared as it was."""


def comparable(figures: dict) -> dict:
    for metrics in figures["metrics"].values():
        for strategy in metrics.values():
            for key in CHANGED_SINCE:
                strategy.pop(key, None)
    return figures


def figures(*settings: str) -> dict:
    args = [arg for setting in settings for arg in ("--set", setting)]
    done = subprocess.run(
        [sys.executable, str(HERE / "reference_run.py"), *args], capture_output=True, text=True, check=True
    )
    return comparable(json.loads(done.stdout))


@pytest.mark.slow
@pytest.mark.skipif(REFERENCE["machine"] != MACHINE, reason=f"the reference was recorded on {REFERENCE['machine']}")
@pytest.mark.parametrize("universe", ["common", "point_in_time"])
def test_the_earlier_conventions_give_the_earlier_results_bit_for_bit(universe):
    # The bundled stocks all trade every day, so the point-in-time universe is the common one there.
    got = figures("env.execution_delay=0", f"data.universe={universe}", "env.cash_rate=0", "data.features=builtin")
    assert got == comparable(REFERENCE["figures"])


@pytest.mark.slow
def test_the_default_fills_a_day_later_and_so_trains_other_numbers():
    """The default delay changes what is learned (the check above would pass for a change that did nothing)."""
    got = figures()
    reference = comparable(REFERENCE["figures"])
    assert got["params_sha256"] != reference["params_sha256"]
    # Equal weight's trades do not depend on what it observes: from cash, it makes the same ones a day later.
    for name in ("validation", "holdout"):
        assert got["metrics"][name]["equal_weight"] == reference["metrics"][name]["equal_weight"]
