"""``selection.deploy``: a run started with ``best_on_validation`` or ``ensemble`` exports, evaluates and trades that
procedure's agents (``offline.procedures``), not its gated champion; the export's plain-PyTorch code gives the
project's orders, and an exported ensemble evaluates as the run does."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import safetensors.torch
import torch

import main
from config import Config
from environment.observation import Observation, WindowGatherer
from models.networks import Actor
from offline.procedures import Ensemble, ranking, validation_scores
from offline.stored import locate, read_generation
from persistence import checkpoint
from tests.offline.test_export import readme_namespace
from tests.offline.test_trade import _long_frame

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=["best_on_validation", "ensemble"])
def deployed_run(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    _long_frame().to_csv(root / "prices.csv", index=False)
    argv = ["--preset", "smoke", "--data", str(root / "prices.csv"), "--checkpoint-uri", str(root), "--run-name", "r"]
    argv += ["--no-progress", "--seed", "4"]
    settings = ["--set", f"selection.deploy={request.param}", "--set", "backtest.ensemble_size=3"]
    assert main.main([*argv, *settings, "--device", "cpu", "--generations", "2"]) == 0
    assert main.main(["export", str(root / "r"), str(root / "export")]) == 0
    for target, out in ((root / "r", "report-run"), (root / "export", "report-export")):
        assert main.main(["evaluate", str(target), "--out", str(root / out)]) == 0
    return request.param, root


def _population(root):
    located = locate(root / "r")
    _, config, market = read_generation(located, refusal="cannot read")
    gen = checkpoint.open_generation(root / "r")
    tensors = checkpoint.read_tensors(gen, "population")
    size = config.env.lookback * market.num_features
    population = Actor(config.evolution.popsize, size, config.model)
    population.load_state_dict({name: tensors[f"actor.{name}"] for name, _ in population.named_parameters()})
    return config, market, population.requires_grad_(False)


def test_the_export_holds_the_deployed_agents_ranked_on_validation(deployed_run):
    procedure, root = deployed_run
    config, market, population = _population(root)
    assert isinstance(config, Config) and config.selection.deploy == procedure
    order = ranking(validation_scores(market, config, population))
    spec = json.loads((root / "export" / "actor.json").read_text())
    chosen = order[:1] if procedure == "best_on_validation" else order[:3]
    assert spec["procedure"] == {"deploy": procedure, "members": chosen}
    params = safetensors.torch.load_file(str(root / "export" / "actor.safetensors"))
    for j, i in enumerate(chosen):
        for name, tensor in population.named_parameters():
            key = name if len(chosen) == 1 else f"member{j}.{name}"
            assert torch.equal(params[key], tensor[i])
    # The README's plain-PyTorch order is the project's.
    namespace = readme_namespace(root / "export")
    loaded, spec = namespace["load_actor"](root / "export")
    days = torch.tensor([config.env.lookback - 1, market.splits.validation.start, market.num_days - 2])
    windows = WindowGatherer(market.features, config.env.lookback).gather(days)  # (M, N, L * K)
    weights = torch.softmax(torch.randn(len(days), market.num_assets + 1, generator=torch.Generator()), dim=-1)
    ours = namespace["procedure_weights"](loaded, windows, weights, None, spec["book"])
    members = population.agents(chosen)
    project = Ensemble(members) if len(chosen) > 1 else members
    expected = project(Observation(windows, weights[None]))[0]
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)


def test_the_run_and_its_export_evaluate_the_same_procedure(deployed_run):
    procedure, root = deployed_run
    run, export = (json.loads((root / out / "evaluation.json").read_text()) for out in ("report-run", "report-export"))
    assert run["source"]["procedure"] == export["source"]["procedure"] == procedure
    assert run["source"]["members"] == export["source"]["members"]
    for name in ("validation", "holdout"):
        ours, theirs = (np.array(r["ranges"][name]["metrics"]["champion"]["total_return"]) for r in (run, export))
        assert ours == pytest.approx(theirs, abs=1e-6)


def test_trade_sends_the_deployed_procedures_order_as_evaluate_recorded_it(deployed_run, capsys, tmp_path):
    """No look-ahead for the deployed procedure either: the file cut after a holdout day gives evaluate's order."""
    _, root = deployed_run
    document = json.loads((root / "report-run" / "evaluation.json").read_text())
    start = document["ranges"]["holdout"]["episode_starts"][0]
    with (root / "report-run" / "weights.csv").open() as f:
        weights = {row["date"]: row for row in csv.DictReader(f)}
    t = sorted(date for date in weights if date >= start)[5]
    frame = _long_frame()
    frame[frame["date"] <= t].to_csv(tmp_path / "cut.csv", index=False)
    capsys.readouterr()
    status = main.main(
        [
            "trade",
            str(root / "r"),
            "--data",
            str(tmp_path / "cut.csv"),
            "--since",
            start,
            "--json",
            "--out",
            str(tmp_path / "orders"),
        ]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    orders = json.loads(out.strip().splitlines()[-1])
    assert orders["decided"] == t
    assert {row["ticker"]: row["target_weight"] for row in orders["orders"]} == {
        name: float(weights[t][name]) for name in weights[t] if name != "date"
    }
