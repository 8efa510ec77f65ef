"""Every command on CUDA: train, resume bit for bit, the pod's start command healing a damaged generation,
TensorBoard, torchrun with one process, backtest, and inspect, evaluate and export of a run trained on CUDA, read on
the GPU's machine and on one without a GPU.

Each runs twice: on the emulated CUDA device of ``tests/emulated_cuda.py`` (every machine: the CUDA path, as strict as
a GPU) and on a real GPU (``gpu``-marked, skipped without one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import main
from persistence import checkpoint
from tests import loopback_only
from tests.conftest import ROOT
from tests.run_checks import deterministic, rows, state_digest

pytestmark = pytest.mark.slow  # each test runs main.py in a process of its own on the emulated device

SMOKE = ["--preset", "smoke", "--no-progress", "--device", "cuda"]


def train(root: Path, name: str, *extra: str) -> int:
    args = ["--checkpoint-uri", str(root), "--run-name", name, "--no-progress", *extra]
    return main.main(args if "--resume" in extra else [*SMOKE, *args])


def without_gpu(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``python main.py COMMAND`` in a process that sees no GPU, as on a laptop."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run(
        [sys.executable, str(ROOT / "main.py"), *command], env=env, capture_output=True, text=True, **kwargs
    )


@pytest.fixture
def trained(cuda, tmp_path) -> Path:
    """A 3-generation smoke run on this CUDA; its run folder."""
    assert train(tmp_path / "runs", "r", "--generations", "3") == 0
    return tmp_path / "runs" / "r"


def test_a_resumed_run_is_bit_for_bit_the_one_never_stopped(cuda, trained, tmp_path, capsys):
    assert train(tmp_path / "again", "r", "--generations", "2") == 0
    capsys.readouterr()
    assert train(tmp_path / "again", "r", "--resume", "--generations", "3") == 0
    assert "not bit for bit" not in capsys.readouterr().out  # the same device kind
    resumed = tmp_path / "again" / "r"
    assert state_digest(resumed) == state_digest(trained)
    assert [deterministic(row) for row in rows(resumed)] == [deterministic(row) for row in rows(trained)]


def test_the_pods_start_command_starts_then_heals_a_damaged_generation(cuda, trained, tmp_path, capsys):
    pod = [*SMOKE, "--checkpoint-uri", str(tmp_path / "pod"), "--run-name", "r", "--resume-or-start", "--fall-back"]
    assert main.main([*pod, "--generations", "2"]) == 0  # nothing there yet: it starts
    population = tmp_path / "pod" / "r" / "gen-000002" / "population.safetensors"
    data = bytearray(population.read_bytes())
    data[len(data) // 2] ^= 0xFF
    population.write_bytes(bytes(data))
    capsys.readouterr()
    assert main.main([*pod, "--generations", "3"]) == 0
    assert "continuing from generation 1" in capsys.readouterr().out
    assert state_digest(tmp_path / "pod" / "r") == state_digest(trained)
    assert len(list((tmp_path / "pod" / "r").glob("gen-000002.damaged-*"))) == 1


def test_tensorboard_logs_every_generation(cuda, tmp_path):
    pytest.importorskip("tensorboard")
    assert train(tmp_path, "r", "--generations", "2", "--tensorboard") == 0
    assert len(list((tmp_path / "r" / "tensorboard").glob("events.out.tfevents.*"))) == 1


def test_torchrun_with_one_process_trains_the_run_one_process_trains(cuda, trained, tmp_path):
    if not loopback_only.available():
        pytest.skip("no network namespace can be made here (unshare --net); torchrun's stores listen everywhere")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]
    args = [*SMOKE, "--checkpoint-uri", str(tmp_path), "--run-name", "r", "--generations", "3"]
    done = subprocess.run(
        loopback_only.command([*torchrun, *cuda.main[1:], *args]), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert state_digest(tmp_path / "r") == state_digest(trained)


def test_a_backtest_trains_its_folds_on_cuda_and_is_read_again_without_a_gpu(cuda, tmp_path, capsys):
    command = ["backtest", "--preset", "smoke", "--folds", "1", "--seeds", "0", "--generations", "2", "--json"]
    where = ["--checkpoint-uri", str(tmp_path), "--no-progress"]
    assert main.main([*command, *where, "--device", "cuda"]) == 0
    summary = json.loads((tmp_path / "backtest" / "summary.json").read_text())
    state = json.loads(next((tmp_path / "backtest").rglob("gen-000002/state.json")).read_text())
    assert state["device"]["type"] == "cuda" and [fold["seed"] for fold in summary["folds"]] == [0]
    again = without_gpu([*command, *where, "--device", "cpu"], timeout=600)  # the same plan, its fold done
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["folds"] == summary["folds"]


@pytest.mark.parametrize("where", ["on the gpu's machine", "without a gpu"])
def test_a_run_trained_on_cuda_is_inspected_evaluated_and_exported(cuda, trained, tmp_path, capsys, where):
    state = json.loads((checkpoint.open_generation(trained).path / "state.json").read_text())
    assert state["device"]["type"] == "cuda"
    commands = {
        "inspect": ["inspect", str(trained), "--json"],
        "evaluate": ["evaluate", str(trained), "--out", str(tmp_path / "report"), "--json"],
        "export": ["export", str(trained), str(tmp_path / "export")],
    }
    outputs = {}
    for name, command in commands.items():
        if where == "without a gpu":
            done = without_gpu(command, timeout=600)
            assert done.returncode == 0, done.stderr
            outputs[name] = done.stdout
        else:
            capsys.readouterr()
            assert main.main(command) == 0
            outputs[name] = capsys.readouterr().out
    inspected = json.loads(outputs["inspect"])
    assert inspected["generation"] == 3 and len(inspected["params_sha256"]) == 64
    assert (tmp_path / "report" / "evaluation.json").exists()
    assert (
        json.loads((tmp_path / "export" / "actor.json").read_text())["training_precision"]["device"]["type"] == "cuda"
    )
