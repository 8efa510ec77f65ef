"""Choosing the champion: the bootstrap gate (its false-positive rate on null candidates, independent and cloned,
its power against Bonferroni, its resume), the budget kept for the run's last look, the margin, the days that would
prove an edge, the block length, the edge bound, and the Bonferroni quantile."""

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
    days_to_prove,
    edge_bounds,
    selection_z,
    spent_alpha,
    stationary_bootstrap,
    t_statistics,
)

F64 = torch.float64


def make_gate(
    days: int,
    *,
    seed: int,
    alpha: float = 0.1,
    draws: int = 1000,
    mean_block: float = 1.0,
    half: int = 2,
    early_fraction: float | None = None,
):
    generator = torch.Generator().manual_seed(seed)
    return SequentialGate(
        days,
        alpha=alpha,
        draws=draws,
        mean_block=mean_block,
        half_spent_at=half,
        generator=generator,
        early_fraction=early_fraction,
    )


def false_crown_rate(
    make_excess,
    *,
    runs: int,
    looks: int,
    days: int,
    alpha: float = 0.1,
    seed: int = 0,
    early_fraction: float | None = None,
    margin: float = 0.0,
) -> float:
    """Share of simulated runs in which the gate proves any candidate of any look; ``make_excess(look, g)`` gives
    that look's (S, D) null candidates; with ``early_fraction`` the last look is the run's last; ``margin`` daily."""
    g = torch.Generator().manual_seed(seed)
    crowned = 0
    for run in range(runs):
        gate = make_gate(days, seed=10_000 + run, alpha=alpha, draws=500, early_fraction=early_fraction)
        state = {}
        hit = False
        for look in range(1, looks + 1):
            excess = make_excess(look, g, state)
            critical = gate.look(excess, look, last=look == looks, margin=margin).critical
            hit |= bool((t_statistics(excess - margin) > critical).any())
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_the_gate_crowns_cloned_null_candidates_within_budget_and_clones_cost_little():
    """No edge, near-clones: the false-crown rate is within the budget spent (200 runs: stdev 0.019); and the
    critical value is far below Bonferroni's, since a look at clones is close to one look at one candidate."""
    assert false_crown_rate(clones, runs=200, looks=6, days=252, seed=1) <= spent_alpha(6, 0.1, 2) + 2 * 0.019
    gate, g, state = make_gate(504, seed=5, alpha=0.05, half=10), torch.Generator().manual_seed(5), {}
    critical = [gate.look(clones(look, g, state, candidates=16, days=504), look).critical for look in range(1, 21)]
    assert max(critical[9:]) < 3.0 < selection_z(16, 10, 0.05)


@pytest.mark.slow
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
            crowned += any(bool((t_statistics(x) > gate.look(x, i + 1).critical).any()) for i, x in enumerate(shocks))
        return crowned / 150

    with_blocks = rate(lambda excess: max(block_length(series.numpy()) for series in excess))
    with_days = rate(lambda excess: 1.0)
    assert with_blocks <= 0.15 and with_days >= 3 * with_blocks


@pytest.mark.slow
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
                proven_by_gate = bool((t > gate.look(excess, look).critical).any())
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


def gathered_look(excess, resamples, crossed, spent, *, below, margin=0.0):
    """A look as written before the counts (the gate's critical value from every resampled day gathered), for the
    test below: (critical, the resamples' maxima)."""
    days = excess.shape[1]
    spread = excess.std(dim=-1, correction=1)
    t = t_statistics(excess - margin)
    centre = torch.where(t < below, torch.full_like(t, margin), excess.mean(dim=-1))
    drawn = excess[:, resamples]  # (S, B, D)
    drawn_spread = drawn.std(dim=-1, correction=1)
    drawn_spread = torch.where(drawn_spread > 0, drawn_spread, spread[:, None])
    maxima = (math.sqrt(days) * (drawn.mean(dim=-1) - centre[:, None]) / drawn_spread).max(dim=0).values
    open_maxima = maxima[~crossed].sort(descending=True).values
    room = math.floor(spent * len(resamples)) - int(crossed.sum())
    return max(float(open_maxima[min(max(room, 0), len(open_maxima) - 1)]), 0.0), maxima


@pytest.mark.parametrize("margin", [0.0, 0.02 / TRADING_DAYS])
def test_the_gate_from_day_counts_gives_the_gathered_resamples_statistics(margin):
    """The gate holds its resamples as day counts (two matrix products a look); its critical values equal those of
    every resampled day gathered within 1e-12 relative, and the same resamples cross, look after look."""
    days, draws = 252, 600
    gate = make_gate(days, seed=4, draws=draws, mean_block=3.0)
    resamples = stationary_bootstrap(days, draws=draws, mean_block=3.0, generator=torch.Generator().manual_seed(4))
    assert torch.equal(gate.counts, torch.stack([torch.bincount(r, minlength=days) for r in resamples]).double())
    crossed = torch.zeros(draws, dtype=torch.bool)
    g = torch.Generator().manual_seed(5)
    for look in range(1, 9):
        excess = 0.01 * torch.randn(12, days, generator=g, dtype=F64) + 0.0008 * look / 8  # learning as it goes
        excess[0] = -0.002 + 0.001 * torch.randn(days, generator=g, dtype=F64)  # far below: recentred
        expected, maxima = gathered_look(
            excess, resamples, crossed, gate.spent(look, last=False), below=gate._recentre_below, margin=margin
        )
        got = gate.look(excess, look, margin=margin).critical
        assert got == pytest.approx(expected, rel=1e-12, abs=0.0)
        crossed |= maxima > expected
        assert torch.equal(gate.crossed, crossed)
    assert 0 < int(crossed.sum()) < draws  # the looks crossed some resamples and not all


def test_equal_weight_clones_are_never_proven():
    gate = make_gate(100, seed=0)
    assert gate.look(torch.zeros(4, 100, dtype=F64), 1).critical == math.inf
    assert torch.equal(t_statistics(torch.zeros(3, 50, dtype=F64)), torch.zeros(3, dtype=F64))


@pytest.mark.slow
def test_the_final_method_crowns_cloned_null_candidates_at_most_at_alpha():
    """Drifting null near-clones, the looks before the last spending a fifth of alpha and the last look the rest:
    the share of runs ever crowned stays within alpha (200 runs: stdev 0.021). Measured: 0.080."""
    rate = false_crown_rate(clones, runs=200, looks=6, days=252, seed=1, early_fraction=0.2)
    assert rate <= 0.1 + 2 * 0.021


@pytest.mark.slow
def test_candidates_whose_edge_is_exactly_the_margin_are_crowned_at_most_at_alpha():
    """The margin's null hypothesis at its boundary: drifting near-clones whose expected edge is exactly 1 %/y,
    tested against that margin (every look alike, and the final method): the share of runs ever crowned stays
    within what was spent (200 runs: stdev 0.02). Measured: 0.065 and 0.080; zero-edge clones without a margin:
    0.065."""
    margin = 0.01 / TRADING_DAYS

    def at_the_margin(look, g, state):
        return clones(look, g, state) + margin

    alike = false_crown_rate(at_the_margin, runs=200, looks=6, days=252, seed=1, margin=margin)
    assert alike <= spent_alpha(6, 0.1, 2) + 2 * 0.019
    rate = false_crown_rate(at_the_margin, runs=200, looks=6, days=252, seed=1, early_fraction=0.2, margin=margin)
    assert rate <= 0.1 + 2 * 0.021


@pytest.mark.slow
def test_keeping_the_budget_for_the_last_look_lowers_its_critical_value():
    """Sixteen drifting near-clones over 20 looks, alpha 0.05: spending alike leaves the last look a critical t far
    above one test's 1.645; keeping four fifths for the last look brings it close (the same candidates, the same
    resamples). Measured (5 runs): about 2.2 and 1.8."""
    alike, final = [], []
    for run in range(5):
        gates = [make_gate(504, seed=run, alpha=0.05, half=10, draws=500, early_fraction=s) for s in (None, 0.2)]
        g, state = torch.Generator().manual_seed(100 + run), {}
        for look in range(1, 21):
            excess = clones(look, g, state, candidates=16, days=504)
            looks = [gate.look(excess, look, last=look == 20) for gate in gates]
        alike.append(looks[0].critical)
        final.append(looks[1].critical)
        assert looks[1].critical < looks[0].critical
    assert sum(final) / 5 < 1.9 < 2.1 < sum(alike) / 5


@pytest.mark.slow
def test_the_last_look_proves_a_weak_late_edge_more_often():
    """Drifting near-clones whose edge grows over 10 looks to about 1 %/day: the gate that keeps its budget for the
    last look proves it in more runs than the one spending alike (measured: 21 and 16 of 40), and an early look of
    it still crowns a strong edge."""
    hits = {None: 0, 0.2: 0}
    g = torch.Generator().manual_seed(7)
    for run in range(40):
        gates = {share: make_gate(252, seed=run, alpha=0.05, half=5, draws=500, early_fraction=share) for share in hits}
        state, proven = {}, dict.fromkeys(hits, False)
        for look in range(1, 11):
            excess = clones(look, g, state, candidates=8, days=252) + 0.0025 * look / 10
            t = t_statistics(excess)
            for share, gate in gates.items():
                proven[share] |= bool((t > gate.look(excess, look, last=look == 10).critical).any())
        for share in hits:
            hits[share] += proven[share]
    assert hits[0.2] >= hits[None] + 4
    strong = make_gate(504, seed=0, alpha=0.05, half=10, early_fraction=0.2)
    excess = 0.002 + 0.001 * torch.randn(16, 504, generator=g, dtype=F64)  # a single t near 30
    assert bool((t_statistics(excess) > strong.look(excess, 3).critical).any())


def test_the_last_critical_is_what_the_last_look_would_set():
    g = torch.Generator().manual_seed(8)
    looks = [torch.randn(8, 252, generator=g, dtype=F64) * 0.01 + 0.0005 for _ in range(4)]
    early, ending = (make_gate(252, seed=3, alpha=0.05, early_fraction=0.2) for _ in range(2))
    for look in range(1, 4):
        early.look(looks[look - 1], look)
        ending.look(looks[look - 1], look)
    probe, last = early.look(looks[3], 4), ending.look(looks[3], 4, last=True)
    assert probe.last_critical == last.critical == last.last_critical < probe.critical
    alike = make_gate(252, seed=3, alpha=0.05)
    assert all(alike.look(x, i + 1).last_critical == alike.look(x, i + 1).critical for i, x in enumerate(looks[:1]))


def test_a_margin_leaves_near_copies_of_equal_weight_out_and_spends_next_to_nothing_on_them():
    """Sixteen near-copies of equal weight with a real edge of 0.5 %/y and a tiny spread (t up to 9.5): proven without
    a margin, never with a margin of 1 %/y; five looks at them then cross 2 of 1000 resamples (the SPA recentring
    leaves a candidate at t -3 in the maximum), where the gate without a margin lets its last look cross 50."""
    g = torch.Generator().manual_seed(9)
    copies = [0.00002 + 0.00007 * torch.randn(16, 504, generator=g, dtype=F64) for _ in range(5)]
    margin = 0.01 / TRADING_DAYS
    plain, gate = (make_gate(504, seed=1, alpha=0.05, half=10, early_fraction=0.2) for _ in range(2))
    for look, excess in enumerate(copies, start=1):
        assert bool((t_statistics(excess) > plain.look(excess, look, last=look == 5).critical).any())
        critical = gate.look(excess, look, last=look == 5, margin=margin).critical
        assert not bool((t_statistics(excess - margin) > critical).any())
    assert int(gate.crossed.sum()) <= 5 and int(plain.crossed.sum()) >= 50


def test_the_days_that_would_prove_an_edge_by_hand():
    """A series of mean m and sample spread s has t = sqrt(D) m / s: it reaches c at D = (c s / m)^2 days."""
    days = 400
    excess = torch.full((days,), 0.0004, dtype=F64)
    excess[::2] += 0.01
    excess[1::2] -= 0.01  # mean 0.0004, spread 0.01 * sqrt(D / (D - 1))
    mean, spread = float(excess.mean()), float(excess.std(correction=1))
    needed = days_to_prove(mean, spread, critical=2.0)
    assert needed == math.ceil((2.0 * spread / mean) ** 2) == 2507  # 2500 * 400 / 399 = 2506.3
    # the same days repeated to that length reach the critical t; a day fewer does not (to within the spread's
    # small-sample correction)
    assert math.sqrt(needed) * mean / spread >= 2.0 > math.sqrt(needed - 1) * mean / spread
    margin = 0.0001
    assert days_to_prove(mean, spread, critical=2.0, margin=margin) == math.ceil((2.0 * spread / (mean - margin)) ** 2)
    assert days_to_prove(mean, spread, critical=2.0, margin=mean) is None  # not above the margin: never
    assert days_to_prove(-mean, spread, critical=2.0) is None
    assert days_to_prove(mean, spread, critical=math.inf) is None
