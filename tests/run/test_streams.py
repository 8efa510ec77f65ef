"""A run's random streams and the device it ran on: nothing device-specific is checkpointed, so a run resumes on
another device type, and a checkpoint says which machine wrote it."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import main
from persistence.provenance import describe_device
from run.streams import DEVICE_STREAMS, HOST_STREAMS, make_generators, seed_device_streams

H100 = {"type": "cuda", "torch": "2.13.0", "name": "NVIDIA H100 80GB HBM3", "capability": "9.0", "cuda": "12.8"}


def train(root: Path, *extra: str) -> int:
    args = ["--checkpoint-uri", str(root), "--run-name", "r", "--no-progress", *extra]
    return main.main(["--preset", "smoke", *args] if "--resume" not in extra else args)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    assert train(root, "--device", "cpu") == 0
    return root


def test_the_checkpoint_records_the_device_and_only_the_host_streams(trained):
    generation = trained / "r" / "gen-000003"
    state = json.loads((generation / "state.json").read_text())
    assert state["device"] == describe_device(torch.device("cpu"))
    assert state["device"]["torch"] == torch.__version__
    assert sorted(load_file(generation / "rng.safetensors")) == sorted(HOST_STREAMS)


def test_device_streams_are_a_function_of_the_seed_and_the_generation():
    first, second = make_generators(5, torch.device("cpu")), make_generators(5, torch.device("cpu"))
    for name in DEVICE_STREAMS:
        torch.rand(17, generator=first[name])  # one history of draws, then none for the other
    seed_device_streams(first, 5, generation=8)
    seed_device_streams(second, 5, generation=8)
    draws = {name: torch.rand(4, generator=first[name]) for name in DEVICE_STREAMS}
    for name in DEVICE_STREAMS:
        assert torch.equal(draws[name], torch.rand(4, generator=second[name]))
    seed_device_streams(second, 5, generation=9)
    assert not torch.equal(draws["replay"], torch.rand(4, generator=second["replay"]))
    assert len({float(d[0]) for d in draws.values()}) == len(DEVICE_STREAMS)  # the streams differ


@pytest.mark.parametrize(
    ("device", "phrase"),
    [
        (H100, "written on NVIDIA H100 80GB HBM3, compute 9.0, CUDA 12.8, torch 2.13.0; continuing on cpu"),
        (None, "does not record the device"),  # a checkpoint of an earlier version
    ],
)
def test_a_checkpoint_from_another_machine_resumes_with_a_note(trained, tmp_path, capsys, device, phrase):
    shutil.copytree(trained, tmp_path / "runs")
    generation = tmp_path / "runs" / "r" / "gen-000003"
    state = json.loads((generation / "state.json").read_text())
    state["device"] = device
    if device is None:
        del state["device"]
    (generation / "state.json").write_text(json.dumps(state))
    manifest = json.loads((generation / "manifest.json").read_text())
    data = (generation / "state.json").read_bytes()
    manifest["files"]["state.json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (generation / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    assert train(tmp_path / "runs", "--resume", "--generations", "4", "--device", "cpu") == 0
    out = capsys.readouterr().out
    assert phrase in out, out
    assert (tmp_path / "runs" / "r" / "gen-000004" / "manifest.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("before", "after"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_run_resumes_across_device_types(tmp_path, capsys, cuda, before, after):
    assert train(tmp_path, "--device", before, "--generations", "2") == 0
    capsys.readouterr()
    assert train(tmp_path, "--resume", "--generations", "3", "--device", after) == 0
    assert "not bit for bit" in capsys.readouterr().out
    state = json.loads((tmp_path / "r" / "gen-000003" / "state.json").read_text())
    assert state["device"]["type"] == after


def test_the_precision_settings_train_and_are_kept_by_the_checkpoint(tmp_path):
    settings = ["--set", "model.bf16_encoder=true", "--set", "runtime.matmul_precision=high"]
    try:
        assert train(tmp_path, "--device", "cpu", "--generations", "1", *settings) == 0
        assert torch.get_float32_matmul_precision() == "highest"  # "high" is for CUDA: a CPU run stays exact
    finally:
        torch.set_float32_matmul_precision("highest")
    config = json.loads((tmp_path / "r" / "gen-000001" / "state.json").read_text())["config"]
    assert config["model"]["bf16_encoder"] is True and config["runtime"]["matmul_precision"] == "high"
