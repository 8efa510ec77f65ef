"""The procedures a backtest judges and a run deploys (``selection.deploy``): which agents of a generation trade.

* ``champion``: the run's champion (``training.selection``), the gate's choice: equal weight unless an agent proved
  an edge over it on the validation days.
* ``best_on_validation``: the generation's agent with the highest validation log return, no gate.
* ``ensemble``: the ``backtest.ensemble_size`` agents with the highest validation log returns (at most the whole
  population). Each member decides on the book the ensemble holds, and the order is the mean of their targets.

The mean of targets that satisfy the book's limits satisfies them too, because every limit bounds a convex set (the
simplex, the weight cap, gross and net exposure). So the ensemble needs no limit of its own; the fill applies them
anyway. The validation ranking is the one ``offline.holdout`` measures (one episode from cash over the validation
days, at the run's delay, costs and book); ties go to the lower agent index, so a ranking is reproducible.
"""

from __future__ import annotations

import torch
from torch import nn

from config import Config
from environment.book import Book
from environment.market import Market
from environment.observation import Observation
from models.networks import Actor
from offline.holdout import run_range

TRADERS = ("champion", "best_on_validation", "ensemble")
"""The procedures, in the order reports list them (``config.Deploy``)."""
TRADER_NAMES = {"champion": "champion", "best_on_validation": "best agent on validation", "ensemble": "ensemble"}
"""How reports and verdicts name each procedure."""


class Ensemble(nn.Module):
    """Several agents trading one book: each decides on the weights the book holds; the order is the mean of their
    target weights (1, M, N + 1)."""

    def __init__(self, members: Actor) -> None:
        super().__init__()
        self.members = members

    def forward(self, obs: Observation) -> torch.Tensor:
        k = self.members.popsize
        weights = obs.weights.expand(k, *obs.weights.shape[1:])  # (1, M, N + 1) -> (k, M, N + 1), one book
        return self.members(obs._replace(weights=weights)).mean(dim=0, keepdim=True)


def validation_scores(market: Market, config: Config, population: Actor) -> list[float]:
    """Every agent's validation log return (summed over the validation days), as evaluation measures it."""
    env = config.env
    result = run_range(
        market,
        {f"agent{i}": population.agent(i) for i in range(population.popsize)},
        market.splits.validation,
        name="validation",
        lookback=env.lookback,
        cost_rate=env.cost_rate,
        execution_delay=env.execution_delay,
        book=Book.from_env(env),
    )
    return [float(result.traces[f"agent{i}"].log_returns.sum()) for i in range(population.popsize)]


def ranking(scores: list[float]) -> list[int]:
    """Agent indices, the highest score first; ties to the lower index."""
    return sorted(range(len(scores)), key=lambda i: (-scores[i], i))


def members(trader: str, order: list[int], ensemble_size: int) -> list[int]:
    """The agents (population indices) a procedure other than the champion trades with, from the validation
    ``order``."""
    if trader == "best_on_validation":
        return order[:1]
    if trader == "ensemble":
        return order[: max(1, min(ensemble_size, len(order)))]
    raise ValueError(f"{trader!r} is not a procedure drawn from the population (choose from {TRADERS[1:]})")


def trader_actor(population: Actor, chosen: list[int]) -> nn.Module:
    """The agents ``chosen`` as one trader: the agent itself for one, an ``Ensemble`` for more."""
    agents = population.agents(chosen)
    return agents if len(chosen) == 1 else Ensemble(agents)


def traders(
    market: Market, config: Config, champion: Actor, population: Actor
) -> tuple[dict[str, nn.Module], dict[str, list[int]]]:
    """Every procedure of ``TRADERS`` for this generation, and the population indices each one other than the
    champion trades with."""
    order = ranking(validation_scores(market, config, population))
    chosen = {trader: members(trader, order, config.backtest.ensemble_size) for trader in TRADERS[1:]}
    return {"champion": champion, **{t: trader_actor(population, chosen[t]) for t in TRADERS[1:]}}, chosen


def deployed_members(market: Market, config: Config, population: Actor) -> list[int]:
    """The population indices the procedure ``selection.deploy`` (not the champion) trades with, for this
    generation."""
    order = ranking(validation_scores(market, config, population))
    return members(config.selection.deploy, order, config.backtest.ensemble_size)
