"""A generation's console line says what the figures are: how far the agent closest to proof is from being proven
and how many validation days would prove it, or the champion's edge and its bound; the tensor count when it was
counted. The same figures in a row, by hand, and the sentence ``inspect`` and ``evaluate`` print."""

from __future__ import annotations

import math

import pytest
import torch

from run.records import closest_to_proof, format_line, selection_verdict
from training.loop import Scores
from training.selection import TRADING_DAYS, ValidationReturns, edge_bounds, edges

ROW = {
    "generation": 3,
    "best_fitness": 0.1,
    "mean_fitness": 0.0,
    "worst_fitness": -0.1,
    "champion_score": 0.2,
    "champion_generation": 0,
    "champion_edge": 0.0,
    "champion_bound": 0.0,
    "best_edge": 0.028,
    "best_edge_needed": 0.159,
    "buffer_size": 10,
    "env_steps_per_s": 1e4,
    "generation_s": 0.5,
    "rss_bytes": 5e8,
    "live_tensors": 432,
}
PROOF = {
    **ROW,
    "selection_z": 2.3,
    "selection_last_z": 1.71,
    "selection_min_edge": 0.01,
    "closest_edge": 0.082,
    "closest_t": 1.21,
    "days_to_prove": 1007,
}


def test_a_crowned_champion_shows_its_edge_and_its_bound():
    crowned = {**ROW, "champion_generation": 2, "champion_edge": 0.061, "champion_bound": 0.012}
    assert "(gen 2; edge +6.1%/y, bound +1.2%/y)" in format_line(crowned, generations=5, buffer_capacity=100)


def test_the_tensor_count_is_shown_only_when_it_was_counted():
    assert format_line(PROOF, generations=5, buffer_capacity=100).endswith("| 432 tensors")
    assert "tensors" not in format_line({**PROOF, "live_tensors": None}, generations=5, buffer_capacity=100)


def test_before_a_crowning_the_line_says_how_many_days_would_prove_the_closest_agent():
    line = format_line(PROOF, generations=5, buffer_capacity=100)
    assert "(equal weight; closest edge +8.2%/y at t 1.21, 1.71 needed: proven in ~1,007 validation days)" in line
    passing = {**PROOF, "closest_t": 1.9, "days_to_prove": 409}  # would pass the last look, not this one
    assert "closest edge +8.2%/y at t 1.90, 1.71 needed at the last look)" in format_line(
        passing, generations=5, buffer_capacity=100
    )


def test_an_edge_below_the_margin_or_none_at_all_is_said_to_be_not_worth_more_days():
    small = {**PROOF, "best_edge": 0.004, "closest_edge": 0.004, "closest_t": -2.5, "days_to_prove": None}
    assert "(equal weight; best edge +0.4%/y, below the +1.0%/y worth its costs)" in format_line(
        small, generations=5, buffer_capacity=100
    )
    losing = {**small, "selection_min_edge": 0.0, "best_edge": -0.003}
    assert "(equal weight; no agent beats it: best edge -0.3%/y)" in format_line(
        losing, generations=5, buffer_capacity=100
    )
    clones = {**PROOF, "closest_t": None, "days_to_prove": None, "selection_last_z": math.inf}
    assert "(equal weight; no agent trades differently from it)" in format_line(
        clones, generations=5, buffer_capacity=100
    )


def test_the_row_names_the_agent_closest_to_proof_and_the_days_it_would_need():
    """Constructed days: agent 1 has the highest t over the margin (not the highest edge, agent 2's, whose excess
    is noisier); its days to proof are (last z * spread / (mean - margin))^2, by hand."""
    days = 252
    signs = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(days // 2)  # (D,) +1, -1, ...
    equal_weight = 0.0003 * torch.ones(days, dtype=torch.float64)
    excess = torch.stack([-0.0001 + 0.004 * signs, 0.0004 + 0.002 * signs, 0.0006 + 0.02 * signs])  # (P, D)
    rows = torch.cat([equal_weight + excess, equal_weight[None], equal_weight[None]])  # agents, champion, EW
    returns = ValidationReturns(rows)
    candidates = returns.candidates
    scores = Scores(
        fitness=torch.zeros(3, dtype=torch.float64),
        returns=returns,
        z=2.4,
        last_z=1.8,
        min_edge=0.01,
        edges=edges(candidates, equal_weight),
        bounds=edge_bounds(candidates, equal_weight, z=2.4),
    )
    figures = closest_to_proof(excess, scores)
    margin = 0.01 / TRADING_DAYS
    spread = float(excess[1].std(correction=1))
    assert figures["closest_agent"] == 1 and int(scores.edges[:3].argmax()) == 2
    assert figures["closest_edge"] == pytest.approx(0.0004 * TRADING_DAYS)
    assert figures["closest_t"] == pytest.approx(math.sqrt(days) * (0.0004 - margin) / spread)
    assert figures["days_to_prove"] == math.ceil((1.8 * spread / (0.0004 - margin)) ** 2)


def test_the_verdict_for_inspect_and_evaluate():
    verdict = selection_verdict(PROOF, validation_days=504)
    assert verdict == (
        "no agent proven: the closest has edge +8.2%/y, t 1.21 over the +1.0%/y margin where 1.71 is needed; about "
        "1,007 validation days (4.0 years) at this edge and spread would prove it; the run validates on 504"
    )
    small = {**PROOF, "best_edge": 0.004, "days_to_prove": None}
    assert "below the +1.0%/y worth its costs (selection.min_edge); more validation days would not prove it" in (
        selection_verdict(small, validation_days=504)
    )
    crowned = {**PROOF, "champion_generation": 2, "champion_edge": 0.061, "champion_bound": 0.012}
    assert selection_verdict(crowned, validation_days=504).startswith("the champion was proven in generation 2")
    stored = {**PROOF, "selection_last_z": None, "closest_t": None, "days_to_prove": None}  # infinities as stored
    assert selection_verdict(stored, validation_days=504) == (
        "no agent proven: no agent trades differently from equal weight"
    )
    passing = {**PROOF, "closest_t": 1.9, "days_to_prove": 409}  # selection.method=final before its last look
    assert selection_verdict(passing, validation_days=504) == (
        "no agent proven yet: the closest has edge +8.2%/y, t 1.90 over the +1.0%/y margin, above the 1.71 the run's "
        "last look needs"
    )
    assert selection_verdict(ROW, validation_days=504) is None  # a row of an earlier version
    assert selection_verdict({**PROOF, "days_to_prove": "many"}, validation_days=504) is None  # a damaged one
