"""Choosing the champion: the bootstrap gate (its false-positive rate on null candidates, independent and cloned,
its power against Bonferroni, its resume), the block length, the edge bound, and the Bonferroni quantile."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import pytest
import torch

from training.selection import (
    TRADING_DAYS,
    SequentialGate,
    block_length,
    choose_champion,
    edge_bounds,
    selection_z,
    spent_alpha,
    stationary_bootstrap,
    t_statistics,
)

F64 = torch.float64


def make_gate(days: int, *, seed: int, alpha: float = 0.1, draws: int = 1000, mean_block: float = 1.0, half: int = 2):
    generator = torch.Generator().manual_seed(seed)
    return SequentialGate(
        days, alpha=alpha, draws=draws, mean_block=mean_block, half_spent_at=half, generator=generator
    )


def false_crown_rate(make_excess, *, runs: int, looks: int, days: int, alpha: float = 0.1, seed: int = 0) -> float:
    """Share of simulated runs in which the gate proves any candidate of any look; ``make_excess(look, g)`` gives
    that look's (S, D) null candidates."""
    g = torch.Generator().manual_seed(seed)
    crowned = 0
    for run in range(runs):
        gate = make_gate(days, seed=10_000 + run, alpha=alpha, draws=500)
        state = {}
        hit = False
        for look in range(1, looks + 1):
            excess = make_excess(look, g, state)
            hit |= bool((t_statistics(excess) > gate.look(excess, look)).any())
        crowned += hit
    return crowned / runs


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

    def choose(bounds, champion_bound=0.0, champion_return=0.1, by="bound"):
        return choose_champion(torch.tensor(bounds), champion_bound, returns, champion_return, by=by)

    for by in ("bound", "return"):
        assert choose([-0.1, -0.02, 0.0], by=by) is None  # no proven edge: the highest return does not count
    # agent 0 earns most but is not proven; of the proven ones, 1 earns more and 2 has the higher bound
    assert choose([-0.1, 0.03, 0.05], by="bound") == 2
    assert choose([-0.1, 0.03, 0.05], by="return") == 1
    # the champion is replaced only by a better one on the rule's own measure
    assert choose([-0.1, 0.03, 0.05], champion_bound=0.06, by="bound") is None
    assert choose([-0.1, 0.03, 0.05], champion_bound=0.06, champion_return=0.4, by="return") == 1
    assert choose([-0.1, 0.03, 0.05], champion_bound=0.01, champion_return=0.6, by="return") is None


def test_the_spent_budget_rises_towards_alpha_and_never_reaches_it():
    spent = [spent_alpha(g, 0.05, 10) for g in range(1, 10_000)]
    assert spent[9] == pytest.approx(0.025)
    assert all(a < b < 0.05 for a, b in itertools.pairwise(spent))
    with pytest.raises(ValueError):
        spent_alpha(0, 0.05, 10)


def test_stationary_bootstrap_draws_blocks_of_the_asked_mean_length():
    g = torch.Generator().manual_seed(0)
    plain = stationary_bootstrap(200, draws=400, mean_block=1.0, generator=g)
    assert plain.shape == (400, 200) and plain.min() >= 0 and plain.max() < 200
    blocks = stationary_bootstrap(200, draws=400, mean_block=8.0, generator=g)
    continues = (blocks[:, 1:] == (blocks[:, :-1] + 1) % 200).double().mean()
    assert float(continues) == pytest.approx(1 - 1 / 8, abs=0.01)  # a block ends with probability 1/8 a day
    # with mean 1, a day follows its predecessor only by chance (1 / D)
    assert float((plain[:, 1:] == (plain[:, :-1] + 1) % 200).double().mean()) < 0.02


def test_block_length_is_one_without_dependence_and_grows_with_it():
    rng = torch.Generator().manual_seed(3)
    noise = torch.randn(2000, generator=rng, dtype=F64)
    lengths = []
    for phi in (0.0, 0.3, 0.6, 0.9):
        series = noise.clone()
        for t in range(1, len(series)):
            series[t] += phi * series[t - 1]
        lengths.append(block_length(series.numpy()))
    assert lengths[0] == pytest.approx(1.0, abs=0.5)
    assert all(a < b for a, b in itertools.pairwise(lengths))
    assert lengths[-1] > 20
    assert block_length(torch.zeros(100).numpy()) == 1.0


def test_the_gate_crowns_independent_null_candidates_at_most_at_alpha():
    """Eight independent candidates with no edge in each of six looks (the worst case for the looks: nothing
    carries over), Student-t days. Measured: 0.093 of 300 runs with 2000 resamples, where 0.075 of alpha = 0.1 was
    spent (the bootstrap's tails are a little light at these small increments); the promise is alpha."""
    student = torch.distributions.StudentT(torch.tensor(4.0, dtype=F64))

    def independent(look, g, state):
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=g)))
        return student.sample((8, 126)) * 0.01

    assert false_crown_rate(independent, runs=200, looks=6, days=126) <= 0.1


def clones(look, g, state, *, candidates=8, days=252):
    """Near-clones: one parent mix of five assets that drifts look by look, plus small offspring noise."""
    if look == 1:
        state["assets"] = torch.randn(5, days, generator=g, dtype=F64) * 0.01
        state["mix"] = torch.randn(1, 5, generator=g, dtype=F64)
    state["mix"] = state["mix"] + 0.1 * torch.randn(1, 5, generator=g, dtype=F64)
    mixes = state["mix"] + 0.05 * torch.randn(candidates, 5, generator=g, dtype=F64)
    return mixes @ state["assets"] + 0.001 * torch.randn(candidates, days, generator=g, dtype=F64)


def test_the_gate_crowns_cloned_null_candidates_within_budget_and_clones_cost_little():
    """No edge, near-clones: the false-crown rate is within the budget spent (200 runs: stdev 0.019); and the
    critical value is far below Bonferroni's, since a look at clones is close to one look at one candidate."""
    assert false_crown_rate(clones, runs=200, looks=6, days=252, seed=1) <= spent_alpha(6, 0.1, 2) + 2 * 0.019
    gate, g, state = make_gate(504, seed=5, alpha=0.05, half=10), torch.Generator().manual_seed(5), {}
    critical = [gate.look(clones(look, g, state, candidates=16, days=504), look) for look in range(1, 21)]
    assert max(critical[9:]) < 3.0 < selection_z(16, 10, 0.05)


def test_blocks_keep_the_size_when_days_depend_on_each_other():
    """Null candidates whose excess is an AR(1) with 0.3 (far more dependence than daily excess returns show:
    the Politis-White length is 1 for 18 of the 20 bundled stocks): resampling single days under-states the spread
    of the mean and crowned luck in 0.43 of the runs; blocks of the Politis-White length in 0.13, where 0.06 of
    alpha = 0.1 was spent. The block bootstrap's variance is biased low with ~25 blocks: RESULTS.md reports it."""

    def rate(block_of):
        g = torch.Generator().manual_seed(2)
        crowned = 0
        for run in range(150):
            shocks = torch.randn(3, 8, 252, generator=g, dtype=F64) * 0.01
            for t in range(1, 252):
                shocks[..., t] += 0.3 * shocks[..., t - 1]
            gate = make_gate(252, seed=run, draws=500, mean_block=block_of(shocks[0]))
            crowned += any(bool((t_statistics(x) > gate.look(x, i + 1)).any()) for i, x in enumerate(shocks))
        return crowned / 150

    with_blocks = rate(lambda excess: max(block_length(series.numpy()) for series in excess))
    with_days = rate(lambda excess: 1.0)
    assert with_blocks <= 0.15 and with_days >= 3 * with_blocks


def test_the_gate_proves_a_modest_edge_that_bonferroni_misses():
    """Sixteen near-clones whose mean excess gives a single t of about 3 on 504 days, looked at in generations
    1..20: the gate proves them in most runs, Bonferroni (z = 4.3 by generation 20) in few."""
    gate_hits = bonferroni_hits = 0
    g = torch.Generator().manual_seed(4)
    for run in range(40):
        gate = make_gate(504, seed=run, alpha=0.05, half=10)
        common = torch.randn(504, generator=g, dtype=F64) * 0.005
        proven_by_gate = proven_by_bonferroni = False
        for look in range(1, 21):
            excess = 0.00067 + common + 0.001 * torch.randn(16, 504, generator=g, dtype=F64)
            t = t_statistics(excess)
            if not proven_by_gate:  # once proven, later looks change nothing: skip the bootstrap (the draws go on)
                proven_by_gate = bool((t > gate.look(excess, look)).any())
            proven_by_bonferroni |= bool((t > selection_z(16, look, 0.05)).any())
        gate_hits += proven_by_gate
        bonferroni_hits += proven_by_bonferroni
    assert gate_hits >= 30 and bonferroni_hits <= gate_hits - 10  # measured: 33 and 19 of 40


def test_a_gate_restored_from_its_state_looks_exactly_as_one_never_stopped():
    g = torch.Generator().manual_seed(6)
    looks = [torch.randn(8, 252, generator=g, dtype=F64) * 0.01 + 0.001 for _ in range(6)]
    straight = make_gate(252, seed=9)
    expected = [straight.look(excess, i + 1) for i, excess in enumerate(looks)]
    first = make_gate(252, seed=9)
    for i in range(3):
        assert first.look(looks[i], i + 1) == expected[i]
    saved = {k: v.clone() for k, v in first.state_tensors().items()}
    assert 0 < int(saved["crossed"].sum()) < len(saved["crossed"])  # the state matters
    resumed = make_gate(252, seed=9)
    resumed.load_state_tensors(saved)
    assert [resumed.look(looks[i], i + 1) for i in range(3, 6)] == expected[3:]
    fresh = make_gate(252, seed=9)  # forgetting the state would give other critical values
    assert [fresh.look(looks[i], i + 1) for i in range(3, 6)] != expected[3:]
    with pytest.raises(ValueError, match="resamples"):
        resumed.load_state_tensors({"crossed": torch.zeros(5, dtype=torch.uint8)})


def test_equal_weight_clones_are_never_proven():
    gate = make_gate(100, seed=0)
    assert gate.look(torch.zeros(4, 100, dtype=F64), 1) == math.inf
    assert torch.equal(t_statistics(torch.zeros(3, 50, dtype=F64)), torch.zeros(3, dtype=F64))
