"""Genetic operators: the plan, exact elitism, masked mutation, blending, seeding, everything in place."""

from __future__ import annotations

import pytest
import torch

from models.population import Population
from tests.synthetic import make_population
from training.evolution import EvolutionPlan, crossover_, evolve_, mutate_, plan_generation, tournament

P = 6
PLAN = dict(elites=2, tournament_size=3, crossover_prob=0.5, mutation_prob=0.7)
MUTATION = dict(mutation_fraction=0.2, mutation_stdev=0.1)


TEXTBOOK = {"gamma": 0.9, "actor_objective": "critic"}
"""DDPG whose critic and targets are read, so that offspring inherit every part of the learner."""


def _population(seed: int = 0, **learning) -> Population:
    population = make_population(P, 6, seed=seed, **(learning or TEXTBOOK))
    g = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():  # every agent tensor distinct per slot, moments and targets included
        for tensor in population.agent_tensors().values():
            tensor.copy_(torch.randn(tensor.shape, generator=g))
    return population


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _plan(fitness: torch.Tensor, seed: int, **overrides) -> EvolutionPlan:
    return plan_generation(fitness, **{**PLAN, **overrides}, generator=torch.Generator().manual_seed(seed))


FITNESS = torch.tensor([0.3, -1.0, 2.0, 0.9, 0.1, 1.5])  # ranking: 2, 5, 3, 0, 4, 1


# --------------------------------------------------------------------------- plan


@pytest.mark.parametrize("elites", [0, 1, 2, 5])
def test_plan_keeps_exactly_the_fittest_as_elites(elites):
    plan = _plan(FITNESS, seed=0, elites=elites)
    assert plan.elite.dtype == torch.bool and int(plan.elite.sum()) == elites
    assert set(torch.nonzero(plan.elite).flatten().tolist()) == set([2, 5, 3, 0, 4][:elites])
    slots = torch.arange(P)
    assert torch.equal(plan.parents[plan.elite], slots[plan.elite])
    assert torch.equal(plan.mates[plan.elite], slots[plan.elite])
    assert (plan.blend[plan.elite] == 1).all() and not plan.mutate[plan.elite].any()
    assert torch.equal(plan.offspring, slots[~plan.elite])


def test_elite_ties_are_broken_by_slot_index():
    plan = _plan(torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0, 2.0]), seed=0, elites=2)
    assert torch.nonzero(plan.elite).flatten().tolist() == [1, 2]


def test_plan_parents_and_blends_are_valid():
    for seed in range(20):
        plan = _plan(FITNESS, seed=seed)
        for index in (plan.parents, plan.mates):
            assert index.dtype == torch.long and ((index >= 0) & (index < P)).all()
        assert ((plan.blend >= 0.5) & (plan.blend <= 1.0)).all()
        # A blend needs a mate, and the parent of a blend is the fitter of the two.
        blended = plan.blend < 1
        assert (FITNESS[plan.parents[blended]] >= FITNESS[plan.mates[blended]]).all()
        assert torch.equal(plan.mates[~blended], plan.parents[~blended])


def test_a_tournament_of_the_whole_population_picks_the_best():
    fitness = torch.tensor([0.5, 0.1, 0.9, 0.3])
    winners = tournament(fitness, 200, size=fitness.numel(), generator=torch.Generator().manual_seed(0))
    assert (winners == 2).all(), f"the best slot won {int((winners == 2).sum())} of 200"


def test_a_tournament_of_one_draws_uniformly():
    """With ``tournament_size`` 1 and no crossover, the parent is a uniform draw: no hidden selection."""
    fitness = torch.arange(8.0)
    parents = torch.cat(
        [_plan(fitness, seed=s, elites=0, tournament_size=1, crossover_prob=0.0).parents for s in range(300)]
    )
    # Uniform over 8 slots: mean 3.5, standard error 0.07 over 2400 draws.
    assert abs(parents.float().mean().item() - 3.5) < 0.3, parents.bincount(minlength=8).tolist()


def test_nan_fitness_never_wins():
    fitness = torch.tensor([0.2, float("nan"), -0.5, 0.1, -3.0, -1.0])
    # Plain argmax would let NaN win most tournaments of size P here; it may only win one made of
    # nothing but itself ((1/6)^6 per tournament): with these seeds, never.
    for seed in range(50):
        plan = _plan(fitness, seed=seed, elites=0, tournament_size=P, crossover_prob=1.0)
        assert not (plan.parents == 1).any() and not (plan.mates == 1).any()
        plan = _plan(fitness, seed=seed, elites=2)
        assert torch.nonzero(plan.elite).flatten().tolist() == [0, 3]
    plan = _plan(torch.tensor([float("nan"), 1.0, float("nan"), 0.0]), seed=0, elites=3)
    assert torch.nonzero(plan.elite).flatten().tolist() == [0, 1, 3]  # NaN ranks last, even among elites


# --------------------------------------------------------------------------- operators


def test_evolve_keeps_elites_bit_for_bit_and_gives_offspring_their_parents_state():
    population = _population()
    tensors = population.agent_tensors()
    plan = _plan(FITNESS, seed=3)
    elites = torch.nonzero(plan.elite).flatten()
    with torch.no_grad():  # signed zeros in the elites: a copy that goes through arithmetic would lose them
        for tensor in tensors.values():
            for slot in elites.tolist():
                tensor[slot].view(-1)[0] = -0.0
    before = {k: t.clone() for k, t in tensors.items()}
    assert all((_bits(t[elites]) == _bits(torch.tensor(-0.0))).any() for t in before.values())
    stdevs = population.exploration_stdev.clone()

    evolve_(population, plan, **MUTATION, generator=torch.Generator().manual_seed(4))

    actor_target = dict(population.learner.actor_target.named_parameters())
    for key, tensor in tensors.items():
        for slot in elites.tolist():
            assert torch.equal(_bits(tensor[slot]), _bits(before[key][slot])), (key, slot)
        for slot in plan.offspring.tolist():
            parent = int(plan.parents[slot])
            if key.startswith(("critic", "actor_optim")):  # critic, critic target, both Adams
                assert torch.equal(tensor[slot], before[key][parent]), (key, slot)
            elif key.startswith("actor."):  # the offspring's actor target restarts from its new actor
                assert torch.equal(actor_target[key.removeprefix("actor.")][slot], tensor[slot]), (key, slot)
    assert torch.equal(population.exploration_stdev, stdevs)  # belongs to the slot, not the agent
    assert plan.offspring.numel() == P - PLAN["elites"]


def test_with_no_critic_read_an_offspring_moves_its_actor_and_its_moments_only():
    """The default settings train no critic and read no target (``models.learner``): evolution copies nothing of them,
    work whose result nothing would use; the actor and its moments evolve as with textbook DDPG."""
    population, textbook = _population(gamma=0.0, actor_objective="model"), _population()
    before = {k: t.clone() for k, t in population.agent_tensors().items()}
    plan = _plan(FITNESS, seed=3)
    for evolving in (population, textbook):
        evolve_(evolving, plan, **MUTATION, generator=torch.Generator().manual_seed(4))
    for key, tensor in population.agent_tensors().items():
        if key.startswith(("actor.", "actor_optim.")):
            assert torch.equal(tensor, textbook.agent_tensors()[key]), key
        else:
            assert torch.equal(tensor, before[key]), key


def test_offspring_actor_is_the_parents_blend_before_mutation():
    population = _population()
    before = {k: t.clone() for k, t in population.agent_tensors().items()}
    plan = _plan(FITNESS, seed=3)
    evolve_(population, plan, mutation_fraction=0.2, mutation_stdev=0.0, generator=torch.Generator().manual_seed(4))
    for name, tensor in population.actor.named_parameters():
        old = before[f"actor.{name}"]
        for slot in plan.offspring.tolist():
            parent, mate, w = int(plan.parents[slot]), int(plan.mates[slot]), plan.blend[slot].item()
            expected = old[parent] if w == 1 else torch.lerp(old[mate], old[parent], w)
            torch.testing.assert_close(tensor[slot], expected, rtol=0, atol=0)


def test_mutate_touches_only_chosen_entries_of_masked_slots():
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randn(4, 40, 25, generator=g), torch.randn(4, 1000, generator=g)]
    for tensor in tensors:  # signed zeros: an unchosen entry must keep its exact bits, not just its value
        tensor.view(4, -1)[:, ::3] = -0.0
    before = [t.clone() for t in tensors]
    slots = torch.tensor([True, False, True, False])
    mutate_(tensors, slots, fraction=0.1, stdev=0.5, generator=torch.Generator().manual_seed(1))
    for tensor, old in zip(tensors, before):
        assert torch.equal(_bits(tensor[~slots]), _bits(old[~slots]))
        changed = tensor[slots] != old[slots]
        assert 0.07 < changed.float().mean().item() < 0.13
        same = ~changed
        assert torch.equal(_bits(tensor[slots][same]), _bits(old[slots][same]))
        delta = (tensor[slots] - old[slots])[changed]
        assert 0.4 < delta.std().item() < 0.6  # the noise has the configured stdev


def test_mutate_with_no_slot_changes_nothing():
    tensor = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    before = tensor.clone()
    mutate_([tensor], torch.zeros(3, dtype=torch.bool), fraction=1.0, stdev=1.0, generator=torch.Generator())
    assert torch.equal(_bits(tensor), _bits(before))


def test_crossover_copies_at_blend_one_and_lerps_otherwise():
    g = torch.Generator().manual_seed(0)
    tensor = torch.randn(4, 6, 5, generator=g)
    tensor[2].view(-1)[:10] = -0.0  # slot 1 copies slot 2: the signed zeros must come along
    before = tensor.clone()
    plan = EvolutionPlan(
        parents=torch.tensor([0, 2, 0, 3]),
        mates=torch.tensor([0, 1, 3, 3]),
        blend=torch.tensor([1.0, 1.0, 0.7, 1.0]),
        mutate=torch.zeros(4, dtype=torch.bool),
        elite=torch.tensor([True, False, False, False]),
    )
    crossover_([tensor], plan)
    assert torch.equal(_bits(tensor[0]), _bits(before[0]))  # elite
    assert torch.equal(_bits(tensor[1]), _bits(before[2]))  # plain copy, even with slot 1 as the mate
    assert torch.equal(tensor[2], torch.lerp(before[3], before[0], 0.7))  # 0.7 * parent + 0.3 * mate
    torch.testing.assert_close(tensor[2], 0.7 * before[0] + 0.3 * before[3])
    assert torch.equal(_bits(tensor[3]), _bits(before[3]))


def _evolved(seed: int) -> tuple[EvolutionPlan, dict[str, torch.Tensor]]:
    population = _population()
    g = torch.Generator().manual_seed(seed)
    plan = plan_generation(FITNESS, **PLAN, generator=g)
    evolve_(population, plan, **MUTATION, generator=g)
    return plan, population.agent_tensors()


def test_same_seed_same_offspring_other_seed_other_offspring():
    plan_a, tensors_a = _evolved(seed=7)
    plan_b, tensors_b = _evolved(seed=7)
    for a, b in zip(plan_a, plan_b):
        assert torch.equal(a, b)
    for key, tensor in tensors_a.items():
        assert torch.equal(_bits(tensor), _bits(tensors_b[key])), key
    plan_c, tensors_c = _evolved(seed=8)
    differs = not all(torch.equal(a, c) for a, c in zip(plan_a, plan_c))
    differs |= not all(torch.equal(tensors_a[k], tensors_c[k]) for k in tensors_a)
    assert differs


def test_evolve_works_in_place():
    population = _population()
    pointers = {k: t.data_ptr() for k, t in population.state_tensors().items()}
    ids = [
        id(p)
        for m in (population.actor, population.learner.critic, population.learner.actor_target)
        for p in m.parameters()
    ]
    optim_ids = [id(p) for p in population.learner.actor_optim.params + population.learner.critic_optim.params]
    before = {k: t.clone() for k, t in population.agent_tensors().items()}
    evolve_(population, _plan(FITNESS, seed=1), **MUTATION, generator=torch.Generator().manual_seed(2))
    assert {k: t.data_ptr() for k, t in population.state_tensors().items()} == pointers
    assert [
        id(p)
        for m in (population.actor, population.learner.critic, population.learner.actor_target)
        for p in m.parameters()
    ] == (ids)
    assert [id(p) for p in population.learner.actor_optim.params + population.learner.critic_optim.params] == optim_ids
    assert any(not torch.equal(t, before[k]) for k, t in population.agent_tensors().items())  # it did evolve
