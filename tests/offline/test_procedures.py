"""The procedures a backtest judges and a run deploys (``offline.procedures``): the best agent on validation and the
ensemble come from the generation's validation ranking, and an ensemble's order is the mean of its members' targets,
inside the book's limits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from config import override, preset
from environment.book import Book
from environment.observation import Observation
from models.networks import Actor
from offline.holdout import run_range
from offline.procedures import Ensemble, members, ranking, traders


def _config(**changes):
    return override(
        preset("smoke"),
        {"env.lookback": 4, "env.episode_days": 10, "evolution.popsize": 5, "model.encoder_hidden": 8, **changes},
    )


def _population(config, window: int, popsize: int = 5) -> Actor:
    actor = Actor(popsize, window, config.model, book=Book.from_env(config.env))
    actor.reset_parameters(torch.Generator().manual_seed(3))
    return actor.requires_grad_(False)


def test_the_ranking_puts_the_highest_score_first_and_ties_to_the_lower_index():
    assert ranking([0.1, 0.3, 0.3, -1.0]) == [1, 2, 0, 3]
    assert members("best_on_validation", [4, 0, 2], 3) == [4]
    assert members("ensemble", [4, 0, 2], 2) == [4, 0] and members("ensemble", [4, 0, 2], 9) == [4, 0, 2]
    with pytest.raises(ValueError, match="not a procedure drawn from the population"):
        members("champion", [0], 1)


def test_best_on_validation_and_the_ensemble_are_the_agents_the_validation_days_rank_first(market):
    config = _config(**{"backtest.ensemble_size": 3})
    window = config.env.lookback * market.num_features
    population = _population(config, window)
    champion = population.agent(0)
    found, chosen = traders(market, config, champion, population)
    scores = run_range(
        market,
        {f"a{i}": population.agent(i) for i in range(5)},
        market.splits.validation,
        name="validation",
        lookback=config.env.lookback,
        cost_rate=config.env.cost_rate,
        execution_delay=config.env.execution_delay,
    )
    totals = [scores.traces[f"a{i}"].log_returns.sum() for i in range(5)]
    assert chosen["best_on_validation"] == [int(np.argmax(totals))]
    assert chosen["ensemble"] == sorted(range(5), key=lambda i: -totals[i])[:3]
    assert found["champion"] is champion
    best = population.agent(chosen["best_on_validation"][0])
    assert all(torch.equal(a, b) for a, b in zip(found["best_on_validation"].parameters(), best.parameters()))
    assert isinstance(found["ensemble"], Ensemble) and found["ensemble"].members.popsize == 3


@pytest.mark.parametrize("book", ["long_only", "long_short"])
def test_an_ensembles_order_is_the_mean_of_its_members_targets_and_keeps_the_books_limits(market, book):
    config = _config(**{"env.book": book, "env.gross_leverage": 1.5, "env.net_exposure": (-0.2, 0.6)})
    window = config.env.lookback * market.num_features
    population = _population(config, window, popsize=4)
    generator = torch.Generator().manual_seed(0)
    windows = torch.randn(6, market.num_assets, window, generator=generator)  # 6 observations, no agent dim
    held = torch.softmax(torch.randn(1, 6, market.num_assets + 1, generator=generator), dim=-1)
    obs = Observation(windows, held)
    order = Ensemble(population.agents([2, 0, 3]))(obs)  # (1, 6, N + 1)
    each = [population.agent(i)(obs) for i in (2, 0, 3)]  # every member on the book the ensemble holds
    torch.testing.assert_close(order, torch.stack(each).mean(dim=0))
    assets = order[0, :, 1:]
    assert torch.allclose(order[0].sum(dim=-1), torch.ones(6))  # cash closes the book
    if book == "long_only":
        assert (order >= 0).all()
    else:
        assert (assets.abs().sum(dim=-1) <= 1.5 + 1e-6).all()
        net = assets.sum(dim=-1)
        assert ((net >= -0.2 - 1e-6) & (net <= 0.6 + 1e-6)).all()
