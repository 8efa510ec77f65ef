"""A third algorithm touches ``models/`` and the config only: a learner that answers for its own parts is trained,
checkpointed, resumed bit for bit, recorded, counted and hashed by code that names none of them.

The learner here (built in this test, not shipped) has a stochastic side: an entropy bonus on its target weights with
a learned temperature per agent, a network, an optimiser and a loss that DDPG and TD3 do not have.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import main
from config import LearnerConfig, ModelConfig
from models import learner as learner_module
from models.learner import Learner, Trained
from models.optim import BatchedAdam
from models.replay import ReplayBatch
from tests.run_checks import rows, state_digest
from utils.tensorboard import scalars


class Temperature(nn.Module):
    """Each agent's log temperature: (P, 1)."""

    def __init__(self, agents: int) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.full((agents, 1), -2.0))


def entropy(actions: torch.Tensor) -> torch.Tensor:
    return -(actions * actions.clamp(min=1e-12).log()).sum(-1)  # (P, B)


class EntropyLearner(Learner):
    """The actor's objective plus ``alpha * entropy(target weights)``; ``alpha`` learned to keep the entropy near a
    target (half of equal weight's). Four members: what it holds, what it trains, and the two losses that differ."""

    def __init__(self, agents: int, window_size: int, model, settings, **options) -> None:
        super().__init__(agents, window_size, model, settings, **options)
        with torch.device(options["device"]):
            self.temperature = Temperature(agents)
        self.temperature_optim = BatchedAdam(list(self.temperature.parameters()), lr=1e-3, max_grad_norm=0.0)
        self.target_entropy = 0.5

    def trained(self) -> dict[str, Trained]:
        temperature = Trained({"temperature": self.temperature}, {}, self.temperature_optim, delayed=True)
        return {**super().trained(), "temperature": temperature}

    def actor_loss(self, batch: ReplayBatch) -> torch.Tensor:
        alpha = self.temperature.log_alpha.exp().detach()  # (P, 1)
        bonus = alpha * entropy(self.actor(batch.obs))  # (P, B)
        return super().actor_loss(batch) - bonus.mean(dim=1)

    def update(self, batch: ReplayBatch, *, actor_step: bool = True) -> dict[str, torch.Tensor]:
        losses = super().update(batch, actor_step=actor_step)
        if actor_step:
            with torch.no_grad():
                spread = entropy(self.actor(batch.obs)).mean(dim=1, keepdim=True)  # (P, 1)
            loss = -(self.temperature.log_alpha * (spread - self.target_entropy)).squeeze(1)  # (P,)
            self.temperature_optim.zero_grad()
            loss.sum().backward()
            self.temperature_optim.step()
            losses["temperature"] = loss.detach()
        return losses


def train(root, run: str, generations: int, *extra: str) -> int:
    argv = ["--preset", "smoke", "--checkpoint-uri", str(root), "--run-name", run, "--no-progress", "--device", "cpu"]
    return main.main([*argv, "--generations", str(generations), "--set", "learner.learning_starts=64", *extra])


@pytest.mark.slow
def test_a_third_learner_trains_resumes_records_and_is_inspected_by_code_that_names_none_of_its_parts(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(learner_module.LEARNERS, "ddpg", EntropyLearner)  # the one line a new algorithm adds
    assert train(tmp_path, "whole", 3) == 0
    assert train(tmp_path, "parts", 2) == 0
    resume = ["--resume", "--checkpoint-uri", str(tmp_path), "--run-name", "parts", "--no-progress"]
    assert main.main([*resume, "--generations", "3"]) == 0
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert state_digest(parts) == state_digest(whole)  # its own optimiser's moments and step count resume too
    state = json.loads((whole / "gen-000003" / "state.json").read_text())
    assert set(state["optimiser_steps"]) == {"actor", "critic", "temperature"}
    assert state["optimiser_steps"]["temperature"] > 0
    row = rows(whole)[-1]
    assert row["temperature_loss"] is not None and "loss/temperature" in scalars(row)
    capsys.readouterr()
    assert main.main(["inspect", str(whole), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    population = report["population"]
    assert population["trained_networks"] == ["actor", "critic", "temperature"]
    assert population["parameters_per_network"]["temperature"] == 1
    assert report["params_sha256"] is not None


def test_a_third_learner_declares_what_it_trains_and_the_rest_is_derived():
    """Four members (what it holds, what it trains, the two losses that differ): its optimiser, loss, checkpoint keys,
    step counts and what an offspring inherits come from its one declaration."""
    members = {name for name in vars(EntropyLearner) if not name.startswith("__") or name == "__init__"}
    assert members == {"__init__", "trained", "actor_loss", "update"}
    settings = LearnerConfig(gamma=0.9, actor_objective="critic")
    learner = EntropyLearner(
        2, 6, ModelConfig(), settings, cost_rate=0.0, device="cpu", generator=torch.Generator().manual_seed(0)
    )
    assert learner.losses == ("actor", "critic", "temperature") == learner.loss_names
    assert set(learner.optimisers) == {"actor", "critic", "temperature"}
    assert learner.loss_counts(4) == {"actor": 4, "critic": 4, "temperature": 4}
    assert learner.optimised_names()["temperature"] == ["log_alpha"]
    assert "temperature.log_alpha" in learner.agent_tensors()
    assert learner.trained_networks[-1] is learner.temperature
    copied = learner.inheritance().copied
    assert "temperature.log_alpha" in copied and "temperature_optim.exp_avg.log_alpha" in copied
