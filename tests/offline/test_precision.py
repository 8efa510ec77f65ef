"""``evaluate`` and ``export`` run a champion in float32 on the CPU, whatever the run trained with: a run trained with
bfloat16 encoders is scored as the float32 actor of its parameters, and its export says so."""

from __future__ import annotations

import csv
import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import main
from config import Config
from environment.loading import load_market
from models.networks import Actor
from offline import evaluate as report_module
from offline.bundle import PRECISION
from offline.bundle import VERSION as ACTOR_FORMAT_VERSION
from offline.holdout import RANGES, run_range
from persistence import checkpoint

pytestmark = pytest.mark.slow  # its fixture trains a run with bf16 encoders and crowns an agent


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory) -> Path:
    """A 2-generation smoke run trained with ``model.bf16_encoder=true``, an agent crowned (as ``smoke_run``'s)."""
    root = tmp_path_factory.mktemp("bf16-runs")
    argv = ["--preset", "smoke", "--generations", "2", "--set", "model.bf16_encoder=true"]
    argv += ["--checkpoint-uri", str(root), "--run-name", "r", "--no-progress", "--device", "cpu"]
    # An equal-weight champion's heads are zero: its output would not depend on the encoder's precision.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("training.loop.choose_champion", lambda edges, *_, **__: int(edges.argmax()))
        assert main.main(argv) == 0
    return root / "r"


@pytest.fixture(scope="module")
def evaluated(bf16_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bf16-evaluation")
    assert main.main(["evaluate", str(bf16_run), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def exported(bf16_run, tmp_path_factory) -> Path:
    out_dir = tmp_path_factory.mktemp("bf16-export") / "actor"
    assert main.main(["export", str(bf16_run), str(out_dir)]) == 0
    return out_dir


def champion_returns(report: Path) -> dict[str, list[float]]:
    """The champion's daily log returns per range, as ``daily.csv`` holds them."""
    rows = list(csv.DictReader((report / "daily.csv").open()))
    return {name: [float(row["champion_log_return"]) for row in rows if row["range"] == name] for name in RANGES}


def champion_actor(run: Path, *, bf16: bool) -> tuple[Actor, Config]:
    """The run's champion rebuilt here, its encoder in bfloat16 autocast or in float32."""
    gen = checkpoint.open_generation(run)
    config = Config.from_dict(checkpoint.read_document(gen, "state")["config"])
    market = load_market(config, torch.device("cpu"))
    model = dataclasses.replace(config.model, bf16_encoder=bf16)
    actor = Actor(1, config.env.lookback * market.num_features, model)
    tensors = checkpoint.read_tensors(gen, "population")
    actor.load_state_dict({name: tensors[f"champion.{name}"] for name, _ in actor.named_parameters()})
    return actor.requires_grad_(False), config


def scored(run: Path, *, bf16: bool) -> dict[str, list[float]]:
    """The champion's daily log returns per range, scored here as ``evaluate`` scores it, in the given precision."""
    actor, config = champion_actor(run, bf16=bf16)
    market = load_market(config, torch.device("cpu"))
    env = config.env
    settings = {"lookback": env.lookback, "cost_rate": env.cost_rate, "execution_delay": env.execution_delay}
    actors = {"champion": actor, "untrained": actor}  # evaluate's slot count, so the environment batches alike
    return {
        name: run_range(market, actors, getattr(market.splits, name), name=name, **settings)
        .traces["champion"]
        .log_returns.tolist()
        for name in RANGES
    }


def test_the_run_trained_with_bf16_encoders_and_crowned_an_agent(bf16_run):
    state = checkpoint.read_document(checkpoint.open_generation(bf16_run), "state")
    assert state["config"]["model"]["bf16_encoder"] is True
    assert state["champion_generation"] >= 1


def test_evaluate_builds_the_champion_in_float32(bf16_run, tmp_path):
    champion = report_module.load_champion(str(bf16_run), tmp_path)
    assert not champion.actor.encoder.bf16 and not champion.config.model.bf16_encoder
    assert all(p.dtype == torch.float32 for p in champion.actor.parameters())


def test_a_bf16_run_is_evaluated_with_float32_numbers(bf16_run, evaluated):
    figures = champion_returns(evaluated)
    float32, bfloat16 = scored(bf16_run, bf16=False), scored(bf16_run, bf16=True)
    for name in RANGES:
        assert figures[name] == float32[name]  # bit for bit: daily.csv holds every float's repr
        assert not np.array_equal(figures[name], bfloat16[name])


def test_the_export_records_float32_and_how_the_run_trained(bf16_run, exported):
    spec = json.loads((exported / "actor.json").read_text())
    assert spec["format_version"] == ACTOR_FORMAT_VERSION and spec["precision"] == PRECISION == "float32"
    assert spec["training_precision"]["bf16_encoder"] is True
    assert spec["training_precision"]["matmul_precision"] == "highest"
    state = checkpoint.read_document(checkpoint.open_generation(bf16_run), "state")
    assert spec["training_precision"]["device"] == state["device"] and state["device"]["type"] == "cpu"
    assert spec["source"]["config"]["model"]["bf16_encoder"] is True  # the run's config, as it trained
    readme = (exported / "README.md").read_text()
    assert "runs in float32" in readme and "bfloat16 autocast" in readme


def test_the_export_evaluates_like_the_run(exported, evaluated, tmp_path):
    assert main.main(["evaluate", str(exported), "--out", str(tmp_path / "report")]) == 0
    assert champion_returns(tmp_path / "report") == champion_returns(evaluated)


def test_a_version_1_export_without_precision_still_evaluates(exported, evaluated, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(exported, old)
    spec = json.loads((old / "actor.json").read_text())
    del spec["precision"], spec["training_precision"]
    (old / "actor.json").write_text(json.dumps({**spec, "format_version": 1}))
    assert main.main(["evaluate", str(old), "--out", str(tmp_path / "report")]) == 0
    assert champion_returns(tmp_path / "report") == champion_returns(evaluated)


def test_a_version_2_export_still_reads_its_champion_score(exported, evaluated, tmp_path):
    """Version 3 calls the champion's validation score as the checkpoint does; a bundle that says validation_score
    evaluates the same and reports its score under the one name."""
    old = tmp_path / "old"
    shutil.copytree(exported, old)
    spec = json.loads((old / "actor.json").read_text())
    score = spec.pop("champion_score")
    del spec["champion_bound"]
    (old / "actor.json").write_text(json.dumps({**spec, "validation_score": score, "format_version": 2}))
    assert main.main(["evaluate", str(old), "--out", str(tmp_path / "report")]) == 0
    assert champion_returns(tmp_path / "report") == champion_returns(evaluated)
    source = json.loads((tmp_path / "report" / "evaluation.json").read_text())["source"]
    assert source["champion_score"] == score and source["champion_bound"] is None


@pytest.mark.parametrize(
    ("change", "phrase"),
    [({"precision": "bfloat16"}, "precision 'bfloat16'"), ({"format_version": 99}, "format_version 99")],
)
def test_an_export_this_version_cannot_run_is_refused(exported, tmp_path, capsys, change, phrase):
    changed = tmp_path / "changed"
    shutil.copytree(exported, changed)
    spec = json.loads((changed / "actor.json").read_text())
    (changed / "actor.json").write_text(json.dumps({**spec, **change}))
    capsys.readouterr()
    assert main.main(["evaluate", str(changed), "--out", str(tmp_path / "report")]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1 and phrase in lines[0], err
    assert not (tmp_path / "report").exists()
