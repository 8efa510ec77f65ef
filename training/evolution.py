"""Genetic operators over the population dimension: a plan from fitness, then in-place application.

Planning is pure index arithmetic on the fitness vector (with an explicit generator), so it can run
wherever the fitness is gathered; applying a plan is a copy, a blend and masked noise on dim 0 of
stacked tensors.

The rule, exactly: the ``elites`` fittest slots (ties broken by slot index) are kept bit for bit.
Every other slot receives an offspring: a parent chosen by tournament (the fittest of
``tournament_size`` distinct slots drawn at random); with probability ``crossover_prob`` its actor is a
blend ``w * parent + (1 - w) * mate`` of that parent and a second tournament winner, the fitter of
the two counting as the parent and ``w ~ U(0.5, 1)``; with probability ``mutation_prob`` a random
``mutation_fraction`` of its actor's entries get Gaussian noise of stdev ``mutation_stdev``. What
else an offspring takes is the learner's to say (``models.learner.Learner.inheritance``): from the
parent, its actor's moments and what it learned beside the actor (critics, their moments and targets,
where they are trained and read); a target network restarts from the offspring's new network.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from models.population import Population
from models.share import Donors, Share


class EvolutionPlan(NamedTuple):
    parents: torch.Tensor
    """(P,) long: the slot each slot copies from (itself for elites)."""
    mates: torch.Tensor
    """(P,) long: the second parent of a crossover (equal to ``parents`` otherwise)."""
    blend: torch.Tensor
    """(P,) float: weight of ``parents`` in the actor blend; 1 means a plain copy."""
    mutate: torch.Tensor
    """(P,) bool: offspring whose actor is mutated."""
    elite: torch.Tensor
    """(P,) bool: slots kept exactly."""

    def to(self, device: torch.device | str) -> EvolutionPlan:
        """The plan on ``device``: moved once per generation, not once per tensor it is applied to."""
        return EvolutionPlan(*(field.to(device) for field in self))

    @property
    def offspring(self) -> torch.Tensor:
        """(num_offspring,) long: the slots that receive an offspring."""
        return torch.nonzero(~self.elite).flatten()


@torch.no_grad()
def tournament(fitness: torch.Tensor, count: int, *, size: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` winners (slot indices), each the fittest of ``size`` distinct slots drawn at random;
    NaN fitness never wins."""
    candidates = torch.rand(count, fitness.numel(), generator=generator).argsort(dim=1)[:, :size]
    best = torch.nan_to_num(fitness[candidates], nan=-torch.inf).argmax(dim=1)
    return candidates[torch.arange(count), best]


@torch.no_grad()
def plan_generation(
    fitness: torch.Tensor,
    *,
    elites: int,
    tournament_size: int,
    crossover_prob: float,
    mutation_prob: float,
    generator: torch.Generator,
) -> EvolutionPlan:
    """Decide who copies whom; ``fitness`` is (P,) on the CPU, higher is better."""
    popsize = fitness.numel()
    fitness = torch.nan_to_num(fitness.float(), nan=-torch.inf)
    order = torch.sort(-fitness, stable=True).indices
    elite = torch.zeros(popsize, dtype=torch.bool)
    elite[order[:elites]] = True
    slots = torch.arange(popsize)

    parents = tournament(fitness, popsize, size=tournament_size, generator=generator)
    mates = tournament(fitness, popsize, size=tournament_size, generator=generator)
    crossover = torch.rand(popsize, generator=generator) < crossover_prob
    weights = 0.5 + 0.5 * torch.rand(popsize, generator=generator)
    mutate = torch.rand(popsize, generator=generator) < mutation_prob
    # The fitter of the two parents of a blend is the one whose critic and optimiser state the child
    # inherits; a plain copy keeps its one tournament winner.
    swap = crossover & (fitness[mates] > fitness[parents])
    parents, mates = torch.where(swap, mates, parents), torch.where(swap, parents, mates)

    crossover &= ~elite
    return EvolutionPlan(
        parents=torch.where(elite, slots, parents),
        mates=torch.where(crossover, mates, torch.where(elite, slots, parents)),
        blend=torch.where(crossover, weights, torch.ones(popsize)),
        mutate=mutate & ~elite,
        elite=elite,
    )


@torch.no_grad()
def copy_from_parents_(tensors: list[torch.Tensor], plan: EvolutionPlan, donors: Donors | None = None) -> None:
    """Offspring slots of every tensor become their parent's slice; elites are not touched. The plan is on
    the tensors' device."""
    donors = donors or Donors.local(tensors)
    slots = donors.held(plan.offspring)
    if slots.numel() == 0:
        return
    parents = donors.row_of[plan.parents[slots]]
    for tensor, table in zip(tensors, donors.tables):
        tensor.index_copy_(0, slots - donors.share.slots.start, table[parents])


@torch.no_grad()
def crossover_(tensors: list[torch.Tensor], plan: EvolutionPlan, donors: Donors | None = None) -> None:
    """Offspring slots become ``blend * parent + (1 - blend) * mate`` (an exact copy where blend is 1)."""
    donors = donors or Donors.local(tensors)
    slots = donors.held(plan.offspring)
    if slots.numel() == 0:
        return
    parents, mates, blend = donors.row_of[plan.parents[slots]], donors.row_of[plan.mates[slots]], plan.blend[slots]
    for tensor, table in zip(tensors, donors.tables):
        parent = table[parents]
        weight = blend.to(tensor.dtype).view(-1, *([1] * (tensor.dim() - 1)))
        child = torch.where(weight == 1, parent, torch.lerp(table[mates], parent, weight))
        tensor.index_copy_(0, slots - donors.share.slots.start, child)


@torch.no_grad()
def mutate_(
    tensors: list[torch.Tensor],
    slots: torch.Tensor,
    *,
    fraction: float,
    stdev: float,
    generator: torch.Generator,
    share: Share | None = None,
) -> None:
    """Add N(0, stdev) noise to a random ``fraction`` of the entries of the slots where ``slots`` (P,) is
    True; every other entry keeps its exact bits. Draws for every slot, so the generator advances the
    same way whoever is mutated; with ``share`` (the tensors hold only those agents) the draws are still made for
    all P and the rows held kept, so a slot's mutation does not depend on how the population is split.
    The noise is drawn where the tensors live: ``generator`` is on their device."""
    popsize = slots.numel()
    share = share or Share.whole(popsize)
    chosen_slots = share.mine(slots)
    for tensor in tensors:
        trailing, device = tensor.shape[1:], tensor.device
        noise = share.draw(torch.randn, *trailing, generator=generator, device=device, dtype=tensor.dtype) * stdev
        chosen = share.draw(torch.rand, *trailing, generator=generator, device=device) < fraction
        chosen &= chosen_slots.view(-1, *([1] * (tensor.dim() - 1)))
        tensor.copy_(torch.where(chosen, tensor + noise, tensor))


DonorSource = Callable[[list[torch.Tensor], list[torch.Tensor], torch.Tensor], Donors]
"""(tensors, donor slots of each offspring slot (one (P,) tensor per kind of donor), offspring slots) -> where their
rows are, for a population split over processes (``runtime.sharding.Sharding.donors``)."""


@torch.no_grad()
def evolve_(
    population: Population,
    plan: EvolutionPlan,
    *,
    mutation_fraction: float,
    mutation_stdev: float,
    generator: torch.Generator,
    donors: DonorSource | None = None,
) -> None:
    """Apply ``plan`` (made on the host, the same on every process) to every agent tensor of ``population`` in
    place (see the module docstring); ``generator`` draws the mutations on the population's device; ``donors`` finds
    the parents' and mates' rows of a split population, fetched from the processes that hold them (the tensors
    copied from parents in one exchange, the actors of parents and mates in another); None: this process holds them
    all."""
    share = population.share
    inheritance = population.learner.inheritance()
    actor_tensors = list(inheritance.blended.values())
    parent_tensors = list(inheritance.copied.values())
    offspring, device_plan = plan.offspring, plan.to(population.device)

    def rows_of(group: list[torch.Tensor], kinds: list[torch.Tensor]) -> Donors:
        return Donors.local(group) if donors is None else donors(group, kinds, offspring)

    copy_from_parents_(parent_tensors, device_plan, rows_of(parent_tensors, [plan.parents]))
    actor_donors = rows_of(actor_tensors, [plan.parents, plan.mates])
    crossover_(actor_tensors, device_plan, actor_donors)
    mutate_(
        actor_tensors,
        device_plan.mutate,
        fraction=mutation_fraction,
        stdev=mutation_stdev,
        generator=generator,
        share=share,
    )
    # Each offspring's restarted targets (its actor's, when targets are read) start from its new networks.
    slots = actor_donors.held(device_plan.offspring) - share.slots.start
    for target, source in inheritance.restarted:
        target.index_copy_(0, slots, source[slots])
