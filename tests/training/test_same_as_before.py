"""With the conventions of earlier versions (fills at the close observed, the common universe, the built-in features,
cash at 0), a run's results are those of the version before they could be changed, bit for bit; and the default run at
delays 1 and 2 trains the numbers of the code before the generation was made faster (1c6d6df), bit for bit.

The earlier version is commit 2660d34, run here: ``tests/training/reference_run.py`` prints the same small CPU run's
figures in a copy of that commit's tree (it imports the ``main`` two folders above it) and in this one. CPU kernels
differ between machines of one kind (the same torch and instruction set on another processor moves figures in the
8th digit), so figures recorded elsewhere cannot be compared bit for bit; the old code run on this machine can.
The commit comes from this clone's history; a shallow clone lacks it, and the tests skip saying how to fetch it.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from offline.evaluate import EXPOSURE_COLUMNS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path("tests/training/reference_run.py")
"""The run, relative to a tree's root; it did not exist at the reference commit, so it is copied there."""
REFERENCE_COMMIT = "2660d34ca79d77c9b470163606c9da4a7b41bd3c"
"""The last commit before env.execution_delay, data.universe, data.features and env.cash_rate existed."""


CHANGED_SINCE = ("calmar", "under_a_year")
"""Risk figures whose reporting changed since: a sample under a year (the smoke preset's half-year ranges) has no
Calmar ratio now, and says it is under a year; every other figure is compared as it was."""
ADDED_SINCE = EXPOSURE_COLUMNS
"""Figures of the book a strategy held (issue 47), which the earlier version did not report."""


def comparable(figures: dict) -> dict:
    for metrics in figures["metrics"].values():
        for strategy in metrics.values():
            for key in (*CHANGED_SINCE, *ADDED_SINCE):
                strategy.pop(key, None)
    return figures


def run_in(root: Path, *settings: str) -> dict:
    """What reference_run.py prints in the tree at ``root``, with this interpreter."""
    args = [arg for setting in settings for arg in ("--set", setting)]
    done = subprocess.run(
        [sys.executable, str(root / SCRIPT), *args], cwd=root, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"reference_run.py in {root} ended with {done.returncode}:\n{done.stderr[-4000:]}"
    return comparable(json.loads(done.stdout))


def git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)


@contextlib.contextmanager
def tree_of(commit: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of ``commit``'s tree with the current run script, removed afterwards."""
    checkout = git("rev-parse", "--git-dir")
    assert checkout.returncode == 0, f"{ROOT} is not a git checkout: {checkout.stderr.decode().strip()}"
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {commit[:7]} is not in this clone's history (shallow?): git fetch --unshallow")
    tree = tmp_path_factory.mktemp("reference") / commit[:7]
    try:
        archive = git("archive", "--format=tar", commit)
        assert archive.returncode == 0, f"git archive {commit[:7]}: {archive.stderr.decode().strip()}"
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
        (tree / SCRIPT).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / SCRIPT, tree / SCRIPT)
        yield tree
    finally:
        shutil.rmtree(tree, ignore_errors=True)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The reference commit's figures, run once per module in a copy of its tree with the current run script."""
    with tree_of(REFERENCE_COMMIT, tmp_path_factory) as tree:
        # The reference commit has none of the settings the tests vary: its conventions are the earlier ones.
        yield run_in(tree)


SPEED_COMMIT = "1c6d6df"
"""The commit before the generation was made faster (issue 45: the gate on the device, the day's relatives made once,
the compiled whole day, the freed host memory kept): on a panel whose assets all trade, nothing it learns changed."""


@pytest.fixture(scope="module")
def before_the_speed_work(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with tree_of(SPEED_COMMIT, tmp_path_factory) as tree:
        yield tree


@pytest.mark.slow
@pytest.mark.parametrize("universe", ["common", "point_in_time"])
def test_the_earlier_conventions_give_the_earlier_results_bit_for_bit(reference, universe):
    # The bundled stocks all trade every day, so the point-in-time universe is the common one there.
    settings = ("env.execution_delay=0", f"data.universe={universe}", "env.cash_rate=0", "data.features=builtin")
    assert run_in(ROOT, *settings) == reference


@pytest.mark.slow
def test_the_default_fills_a_day_later_and_so_trains_other_numbers(reference):
    """The default delay changes what is learned (the check above would pass for a change that did nothing)."""
    got = run_in(ROOT)
    assert got["params_sha256"] != reference["params_sha256"]
    # Equal weight's trades do not depend on what it observes: from cash, it makes the same ones a day later.
    for name in ("validation", "holdout"):
        assert got["metrics"][name]["equal_weight"] == reference["metrics"][name]["equal_weight"]


@pytest.mark.slow
@pytest.mark.parametrize("delay", [1, 2])
def test_the_faster_generation_trains_the_numbers_of_before_at_every_delay(before_the_speed_work, delay):
    """The default run (the point-in-time universe on the bundled data, whose stocks all trade every day) at delays 1
    and 2 (0 is the test above's): parameters, every generation's fitness, validation and loss, and the evaluation's
    figures equal those of the code before the speed work, bit for bit, run on this machine."""
    setting = f"env.execution_delay={delay}"
    assert run_in(ROOT, setting) == run_in(before_the_speed_work, setting)
