"""A run killed at any moment resumes from its last complete generation and ends where an
uninterrupted run ends, bit for bit; SIGTERM and SIGINT stop it cleanly at a safe point."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from persistence import checkpoint
from tests import hold_points
from tests.run_checks import deterministic, finish, rows, state_digest, wait_for

pytestmark = pytest.mark.slow  # each test runs, kills and resumes training processes

REPO = Path(__file__).resolve().parents[2]
GENERATIONS = 4
TRAIN = ["--preset", "smoke", "--seed", "3", "--no-progress"]


def start(root: Path, name: str, *extra: str, pause: str | None = None, hold: dict[str, str] | None = None):
    """``main.py`` in a child process; with ``pause``, through ``tests/pause_points.py``; with ``hold`` (its
    variables, ``hold_points.environment``), through ``tests/hold_points.py`` (see there)."""
    script = [str(REPO / "main.py")]
    if pause:
        script = [str(REPO / "tests" / "pause_points.py"), pause]
    elif hold:
        script = [hold_points.SCRIPT]
    return subprocess.Popen(
        [sys.executable, *script, *TRAIN, "--checkpoint-uri", str(root), "--run-name", name, *extra],
        cwd=root.parent,
        env={**os.environ, **(hold or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def resume(root: Path, name: str) -> str:
    process = subprocess.Popen(
        [
            sys.executable,
            str(REPO / "main.py"),
            "--resume",
            "--no-progress",
            "--checkpoint-uri",
            str(root),
            "--run-name",
            name,
            "--generations",
            str(GENERATIONS),
        ],
        cwd=root.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return finish(process)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("reference") / "runs"
    root.mkdir()
    finish(start(root, "ref", "--generations", str(GENERATIONS)))
    return root / "ref"


def assert_same_end(run_dir: Path, reference: Path) -> None:
    assert checkpoint.latest_generation(run_dir) == GENERATIONS
    assert [deterministic(r) for r in rows(run_dir)] == [deterministic(r) for r in rows(reference)]
    assert state_digest(run_dir) == state_digest(reference)


@pytest.mark.parametrize(
    ("pause", "complete_after_kill"),
    [
        ("files-written@3", [1, 2]),
        ("manifest-written@3", [1, 2]),
        ("renamed@3", [1, 2, 3]),  # in place but LATEST still names 2: either is a sound start
        ("latest-written@3", [1, 2, 3]),
    ],
)
def test_sigkill_while_writing_a_checkpoint_in_the_background(tmp_path, reference, pause, complete_after_kill):
    root = tmp_path / "runs"
    process = start(root, "r", "--generations", str(GENERATIONS), pause=pause)
    marker = root / "r" / f".paused-{pause.split('@')[0]}"
    # Killed once generation 4 has trained on while generation 3's write is paused (the loop then waits for it).
    wait_for(lambda: marker.exists() and (root / "r" / f".recording-{GENERATIONS}").exists())
    process.kill()
    process.communicate()
    run_dir = root / "r"
    assert checkpoint.complete_generations(run_dir) == complete_after_kill
    latest = checkpoint.latest_generation(run_dir)
    assert latest in complete_after_kill
    assert checkpoint.verify_generation(run_dir / checkpoint.generation_dirname(latest)) == []
    marker.unlink()
    resume(root, "r")
    assert_same_end(run_dir, reference)


def test_sigkill_in_the_middle_of_a_generation(tmp_path, reference):
    root = tmp_path / "runs"
    process = start(root, "r", "--generations", str(GENERATIONS), pause="updating@3")
    run_dir = root / "r"
    # Killed inside generation 3's training, once generation 2's background write is complete.
    wait_for(lambda: (run_dir / ".paused-updating").exists() and checkpoint.latest_generation(run_dir) == 2)
    process.kill()
    process.communicate()
    assert checkpoint.complete_generations(run_dir) == [1, 2]
    (run_dir / ".paused-updating").unlink()
    resume(root, "r")
    assert_same_end(run_dir, reference)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_ends_at_a_safe_point_and_says_how_to_resume(tmp_path, reference, signum):
    root, marks = tmp_path / "runs", tmp_path / "marks"
    # Held at the start of generation 2 (tests/hold_points.py) until the stop has reached the run.
    process = start(root, "r", "--generations", str(GENERATIONS), hold=hold_points.environment(marks, "start@2"))
    hold_points.wait_until_held(process, marks, ["r"])
    process.send_signal(signum)
    hold_points.wait_until_stop_seen(process, marks, ["r"])
    hold_points.release(marks, ["r"])
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 128 + signum, output
    assert "Traceback" not in output
    stopped_at = checkpoint.latest_generation(root / "r")
    assert stopped_at == 1  # at the first safe point after the stop: generation 2 abandoned
    assert f"after generation {stopped_at}" in output
    assert f"--resume --checkpoint-uri {root} --run-name r" in output
    assert checkpoint.verify_generation(root / "r" / checkpoint.generation_dirname(stopped_at)) == []
    resume(root, "r")
    assert_same_end(root / "r", reference)
