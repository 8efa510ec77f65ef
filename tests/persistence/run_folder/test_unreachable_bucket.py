"""Every command that reads or writes a bucket nobody answers for (a refused connection on 127.0.0.1) says so in
one line, naming the location as given, within seconds, with exit status 2 and nothing written."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import main
from persistence.gcs import EMULATOR_ENV
from tests.gcs_server import free_port

TARGET = "gs://bucket/runs/r"
BOUND_S = 20.0  # generous: a refusal takes well under a second; retrying it took 10 to 60 s


@pytest.fixture
def refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """An endpoint nobody listens on, and an empty working folder (evaluate's default report goes there)."""
    monkeypatch.setenv(EMULATOR_ENV, f"http://127.0.0.1:{free_port()}")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


def run_timed(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, float, str]:
    started = time.monotonic()
    code = main.main(argv)
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert captured.out == ""
    return code, elapsed, captured.err.strip()


@pytest.mark.parametrize(
    "argv",
    [
        ["inspect", TARGET],
        ["inspect", TARGET + "/gen-000003", "--json"],
        ["evaluate", TARGET],
        ["evaluate", TARGET, "--out", "../report"],
        ["export", TARGET, "../exported"],
    ],
    ids=["inspect", "inspect-generation", "evaluate", "evaluate-out", "export"],
)
def test_an_offline_command_against_a_refused_endpoint_is_one_prompt_line(
    argv: list[str], refused: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, elapsed, err = run_timed(argv, capsys)
    assert code == 2
    assert elapsed < BOUND_S, f"{argv[0]} took {elapsed:.1f} s"
    assert len(err.splitlines()) == 1 and err.startswith("error: cannot reach")
    assert argv[1] in err and "connection refused" in err
    assert "actor.json" not in err  # evaluate's probe for an export is not what the user asked about
    assert list(refused.parent.iterdir()) == [refused] and list(refused.iterdir()) == []  # nothing written


def test_training_against_a_refused_endpoint_stops_before_anything_is_written(
    refused: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = "gs://bucket/runs"
    argv = ["--preset", "smoke", "--checkpoint-uri", uri, "--local-dir", str(refused / "local"), "--no-progress"]
    code, elapsed, err = run_timed(argv, capsys)
    assert code == 2 and elapsed < BOUND_S
    assert len(err.splitlines()) == 1 and f"while listing {uri}: connection refused" in err
    assert list(refused.iterdir()) == []
