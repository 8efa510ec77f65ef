"""Choosing the champion: the selection test's quantile, the edge bound, and its false-positive rate."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import pytest
import torch

from training.selection import TRADING_DAYS, choose_champion, edge_bounds, selection_z


def test_the_quantile_spends_alpha_over_generations_and_candidates():
    # generation g may spend alpha / (g (g + 1)) shared by P candidates; the shares sum to alpha
    assert selection_z(16, 1, 0.05) == pytest.approx(NormalDist().inv_cdf(1 - 0.05 / 32))
    zs = [selection_z(16, g, 0.05) for g in range(1, 50)]
    assert all(a < b for a, b in itertools.pairwise(zs))  # later generations need more evidence
    assert selection_z(32, 3, 0.05) > selection_z(16, 3, 0.05) > selection_z(16, 3, 0.2)
    spent = sum(0.05 / (g * (g + 1)) for g in range(1, 100_000))
    assert spent < 0.05
    for bad in ((0, 1, 0.05), (4, 0, 0.05), (4, 1, 0.0), (4, 1, 1.0)):
        with pytest.raises(ValueError):
            selection_z(*bad)


def test_the_edge_bound_by_hand():
    baseline = torch.tensor([0.01, -0.02, 0.005, 0.0])
    excess = torch.tensor([0.002, 0.001, 0.003, -0.001])
    daily = (baseline + excess).unsqueeze(0)
    mean = float(excess.mean())
    std = float(excess.std(correction=1))
    expected = (mean - 2.0 * std / math.sqrt(4)) * TRADING_DAYS
    assert float(edge_bounds(daily, baseline, z=2.0)[0]) == pytest.approx(expected, rel=1e-5)


def test_equal_weight_itself_has_an_edge_of_exactly_zero():
    baseline = torch.randn(300, generator=torch.Generator().manual_seed(0)) * 0.01
    assert float(edge_bounds(baseline.unsqueeze(0), baseline, z=3.0)[0]) == 0.0


def test_a_steady_edge_is_found_and_a_lucky_streak_is_not():
    g = torch.Generator().manual_seed(1)
    baseline = torch.randn(504, generator=g) * 0.01
    noise = torch.randn(2, 504, generator=g) * 0.002
    steady = baseline + 0.0015 + noise[0]  # information ratio ~ 0.75 a day: unmistakable
    lucky = baseline + noise[1]
    lucky[:5] += 0.03  # five great days, nothing else
    edges = edge_bounds(torch.stack([steady, lucky]), baseline, z=selection_z(16, 40, 0.05))
    assert edges[0] > 0 > edges[1]
    assert float(lucky.sum()) > float(baseline.sum())  # the lucky one did beat equal weight in total


def test_the_family_wide_false_positive_rate_is_at_most_alpha():
    """Candidates with no edge at all, tested as a run would over many generations: crowns happen at most
    at the promised rate (here far below, since Bonferroni is conservative)."""
    g = torch.Generator().manual_seed(2)
    runs, popsize, generations, days, alpha = 400, 8, 10, 126, 0.2
    false_crowns = 0
    for _ in range(runs):
        baseline = torch.randn(days, generator=g) * 0.01
        crowned = False
        for generation in range(1, generations + 1):
            daily = baseline + torch.randn(popsize, days, generator=g) * 0.004
            edges = edge_bounds(daily, baseline, z=selection_z(popsize, generation, alpha))
            crowned |= choose_champion(edges, 0.0, daily.sum(dim=1), float(baseline.sum()), by="return") is not None
        false_crowns += crowned
    assert false_crowns / runs <= alpha


def test_choose_champion_crowns_only_a_proven_agent_and_then_by_bound_or_return():
    returns = torch.tensor([0.9, 0.5, 0.2])

    def choose(edges, champion_edge=0.0, champion_return=0.1, by="bound"):
        return choose_champion(torch.tensor(edges), champion_edge, returns, champion_return, by=by)

    for by in ("bound", "return"):
        assert choose([-0.1, -0.02, 0.0], by=by) is None  # no proven edge: the highest return does not count
    # agent 0 earns most but is not proven; of the proven ones, 1 earns more and 2 has the higher bound
    assert choose([-0.1, 0.03, 0.05], by="bound") == 2
    assert choose([-0.1, 0.03, 0.05], by="return") == 1
    # the champion is replaced only by a better one on the rule's own measure
    assert choose([-0.1, 0.03, 0.05], champion_edge=0.06, by="bound") is None
    assert choose([-0.1, 0.03, 0.05], champion_edge=0.06, champion_return=0.4, by="return") == 1
    assert choose([-0.1, 0.03, 0.05], champion_edge=0.01, champion_return=0.6, by="return") is None
