"""A run stopped before its first checkpoint lost nothing: --resume, a fresh start with the same settings and
--resume-or-start all simply work; a start with other settings is refused without touching the folder."""

import builtins
import io
import os
from pathlib import Path

import pytest

import main
from config import override, preset
from persistence import checkpoint
from run.launch import start_run
from tests.run_checks import deterministic, rows, state_digest

TRAIN = ["--preset", "smoke", "--seed", "4", "--no-progress", "--device", "cpu"]


def died_before_generation_1(root: Path, name: str = "r") -> Path:
    """What a run killed during its first generation leaves: its config and a half-written generation folder."""
    config = override(preset("smoke"), {"checkpoint.uri": str(root), "checkpoint.run_name": name, "runtime.seed": 4})
    run_dir = start_run(config, log=lambda line: None).trainer.run_dir
    partial = run_dir / ".gen-000001.tmp-999999"
    partial.mkdir()
    (partial / "population.safetensors").write_bytes(b"\0" * 64)
    assert checkpoint.complete_generations(run_dir) == []
    return run_dir


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted 2-generation run of the same settings."""
    root = tmp_path_factory.mktemp("reference")
    assert main.main([*TRAIN, "--checkpoint-uri", str(root), "--run-name", "r", "--generations", "2"]) == 0
    return root / "r"


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "how",
    [
        ["--resume", "--run-name", "r"],
        ["--resume"],  # the most recent run, though it has no complete generation
        ["--run-name", "r"],  # a fresh start with the same settings
        ["--resume-or-start", "--run-name", "r"],
    ],
)
@pytest.mark.slow
def test_a_run_that_died_before_its_first_checkpoint_starts_again(tmp_path, reference, how):
    run_dir = died_before_generation_1(tmp_path)
    assert main.main([*TRAIN, "--checkpoint-uri", str(tmp_path), "--generations", "2", *how]) == 0
    assert checkpoint.complete_generations(run_dir) == [1, 2]
    assert state_digest(run_dir) == state_digest(reference)
    assert [deterministic(r) for r in rows(run_dir)] == [deterministic(r) for r in rows(reference)]


def test_a_start_with_other_settings_is_refused_and_changes_nothing(tmp_path, capsys):
    run_dir = died_before_generation_1(tmp_path)
    before = snapshot(run_dir)
    capsys.readouterr()
    args = [*TRAIN, "--checkpoint-uri", str(tmp_path), "--run-name", "r", "--set", "env.lookback=8"]
    assert main.main(args) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1
    assert "env.lookback" in error and "no checkpoint yet" in error
    assert snapshot(run_dir) == before


def test_resume_or_start_resumes_a_run_with_a_checkpoint(tmp_path, reference):
    common = [*TRAIN, "--checkpoint-uri", str(tmp_path), "--run-name", "r", "--resume-or-start"]
    assert main.main([*common, "--generations", "1"]) == 0
    assert main.main([*common, "--generations", "2"]) == 0  # the pod restarts: same command, the run goes on
    assert state_digest(tmp_path / "r") == state_digest(reference)


@pytest.mark.parametrize(
    ("extra", "phrase"),
    [([], "--run-name"), (["--resume", "--run-name", "r"], "--resume")],
)
def test_resume_or_start_needs_a_run_name_and_no_resume(tmp_path, capsys, extra, phrase):
    capsys.readouterr()
    assert main.main([*TRAIN, "--checkpoint-uri", str(tmp_path), "--resume-or-start", *extra]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: ") and "--resume-or-start" in error and phrase in error
    assert list(tmp_path.iterdir()) == []


class _Killed(BaseException):
    """The process dying in the middle of a write (not an error anything may catch and handle)."""


class _DiesHalfway:
    """A file whose first write puts half its bytes on disk, then the process "dies"."""

    def __init__(self, file) -> None:
        self._file = file

    def write(self, data):
        self._file.write(data[: len(data) // 2])
        self._file.flush()
        raise _Killed

    def writelines(self, chunks):
        self.write(b"".join(chunks))

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()


def die_writing(monkeypatch, name: str) -> None:
    """Every writer of a file called ``name`` (or a temporary of it) dies after writing half of it."""
    real_open = io.open

    def dying_open(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        writing = any(flag in mode for flag in "wxa+")
        return _DiesHalfway(opened) if writing and name in Path(os.fsdecode(file)).name else opened

    monkeypatch.setattr(io, "open", dying_open)
    monkeypatch.setattr(builtins, "open", dying_open)


@pytest.mark.slow
@pytest.mark.parametrize("first_start", [True, False])
def test_a_start_killed_while_writing_config_json_leaves_the_old_file_or_none(tmp_path, monkeypatch, first_start):
    run_dir = died_before_generation_1(tmp_path) if not first_start else tmp_path / "r"
    before = (run_dir / "config.json").read_bytes() if not first_start else None
    command = [*TRAIN, "--checkpoint-uri", str(tmp_path), "--run-name", "r", "--generations", "2"]
    with monkeypatch.context() as patch:
        die_writing(patch, "config.json")
        with pytest.raises(_Killed):
            main.main(command)
    found = (run_dir / "config.json").read_bytes() if (run_dir / "config.json").exists() else None
    assert found == before  # never a part of the new one
    assert main.main(command) == 0  # and the next start (the pod's restart) goes on
    assert checkpoint.complete_generations(run_dir) == [1, 2]


@pytest.mark.slow
@pytest.mark.parametrize("how", [["--resume-or-start"], []])
def test_a_config_json_temporary_left_by_a_killed_start_is_no_obstacle(tmp_path, how):
    """SIGKILL in the middle of the first write leaves only the temporary: the folder holds no run yet."""
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / ".config.json.tmp-999999").write_text('{"data": {"pa')
    args = [*TRAIN, "--checkpoint-uri", str(tmp_path), "--run-name", "r", "--generations", "1"]
    assert main.main([*args, *how]) == 0
    assert checkpoint.complete_generations(tmp_path / "r") == [1]
    assert not (tmp_path / "r" / ".config.json.tmp-999999").exists()  # retention removed it with the other leftovers
