"""The generation loop of evolutionary actor-critic learning: roll out, validate and crown, evolve, update.

One generation, as ``GenerationLoop.run_generation`` reads:

1. Roll out: every agent runs the same E training episodes in lockstep. The first ``exploring_episodes`` add each
   agent's exploration noise and fill the replay buffer; the fitness comes from the noise-free episodes, on training
   days the buffer never holds (``training.rollout``, ``training.fitness``).
2. Validate and crown: deterministic policies of the agents, the champion and equal weight run the whole
   validation range as one episode from cash; the best agent is crowned only if its edge over equal weight passes
   the champion gate (``training.selection``) and beats the champion's on the same days. Until then the champion
   is equal weight.
3. Evolve: tournaments on the fitness measured in phase 1, on the very parameters being bred (nothing has trained
   them since), applied in place (``training.evolution``).
4. Update: every agent, offspring included, takes learner updates on batches from the shared buffer
   (``training.update``, ``models.learner``).

Phase 4 changes the parameters after they were measured; the next generation's phase 1 measures them again before
anything selects on them. The loop knows nothing of checkpoints, records, streams' seeding or stopping: a run
(``run.trainer``) drives it, builds its parts once (``run.parts``) and may stop it at its pause points. Each phase
runs on the training device, and its results come to the host in one place (``runtime.boundary``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from config import Config
from environment.market import Market
from models.population import Population
from models.replay import ReplayBuffer
from runtime.boundary import to_host
from runtime.compiled import Compilation
from runtime.sharding import Sharding
from training.evolution import EvolutionPlan, evolve_, plan_generation
from training.rollout import Rollouts, Validation
from training.selection import (
    EQUAL_WEIGHT,
    TRADING_DAYS,
    ChampionRecord,
    Look,
    SequentialGate,
    ValidationReturns,
    choose_champion,
    edge_bounds,
    edges,
    selection_z,
)
from training.update import UpdatePhase
from utils.telemetry import PhaseTimer


class Parts(NamedTuple):
    """What the loop is made of, built once before the first generation (``run.parts.build_parts``)."""

    sharding: Sharding
    """The slots this process holds (all of them without torchrun), and the collectives over them."""
    generators: dict[str, torch.Generator]
    """The run's random streams (``run.streams``)."""
    population: Population
    buffer: ReplayBuffer
    """The replay buffer all agents share: a ring of transitions, never of observations."""
    rollouts: Rollouts
    validation: Validation
    update_phase: UpdatePhase
    gate: SequentialGate | None
    """The selection gate (``training.selection``); None with ``selection.method=bonferroni``."""
    compilation: Compilation
    """``torch.compile`` around the device arithmetic (``runtime.torch_compile``), and its time."""


class Scores(NamedTuple):
    """A generation's figures on the host, after its one synchronisation."""

    fitness: torch.Tensor
    """(P,) training fitness."""
    returns: ValidationReturns
    """Daily validation log returns of the agents, the champion and equal weight."""
    z: float
    """The critical t the bounds were measured with (``training.selection``)."""
    last_z: float
    """The critical t the run's last look would set on these agents (``training.selection.Look``)."""
    min_edge: float
    """The annual edge an agent must be proven above (``selection.min_edge``)."""
    edges: torch.Tensor
    """(P + 1,) annualised edges over equal weight of the agents and the champion (``training.selection.edges``)."""
    bounds: torch.Tensor
    """(P + 1,) their lower bounds at ``z``: positive for a proven edge (``training.selection.edge_bounds``)."""


class Outcome(NamedTuple):
    """What one generation's phases measured and did, for its record."""

    scores: Scores
    champion_slot: int
    """The champion's row in ``scores.returns`` (the agent crowned now, or the champion's own)."""
    plan: EvolutionPlan
    updates: int
    losses: dict[str, torch.Tensor]
    """Each loss the learner computed: (P,) every agent's mean over the updates, by name."""


class GenerationLoop:
    """The loop's state (the generation, the champion, the parts' tensors) and its phases, one method each.

    ``pause_point`` is called between phases (``collective``: on every process at once) and between updates (on
    this process alone): a driver overrides it to stop there (``run.trainer.Trainer``).
    """

    def __init__(self, config: Config, market: Market, parts: Parts) -> None:
        self.config, self.market = config, market
        self.device = market.device
        (
            self.sharding,
            self.generators,
            self.population,
            self.buffer,
            self.rollouts,
            self.validation,
            self.update_phase,
            self.gate,
            self.compilation,
        ) = parts
        self.generation = 0
        self.champion: ChampionRecord = EQUAL_WEIGHT
        self.timer = PhaseTimer(self.device)

    def pause_point(self, *, collective: bool) -> None:
        """A point where the loop may be left (the generation abandoned); the loop alone never leaves."""

    def run_phases(self) -> Outcome:
        """One generation: roll out, validate and crown, evolve, update (each phase a method below), the generation
        counted once the update is done. Each phase's duration is marked on ``self.timer``, started by the caller."""
        generation = self.generation + 1  # the one being computed
        fitness_per_agent = self._roll_out()
        self.pause_point(collective=True)
        scores = self._validate(fitness_per_agent, generation)
        champion_slot = self._crown(scores, generation)
        plan = self._evolve(scores.fitness)
        self.pause_point(collective=True)
        updates, losses = self._update(plan)
        self.generation = generation
        return Outcome(scores, champion_slot, plan, updates, losses)

    # ------------------------------------------------------------------ the phases

    def _roll_out(self) -> torch.Tensor:
        """Phase 1: every agent on E training episodes in lockstep, transitions into the buffer; (P,) fitness of the
        whole population, on the device."""
        rewards = self.rollouts.run(self.rollouts.sample_starts())  # (P, E, D) of the agents held here
        fitness_per_agent = self.rollouts.fitness_of(rewards)
        self.timer.mark("rollout_s")
        return self.sharding.gather(fitness_per_agent)  # (P,)

    def _validate(self, fitness_per_agent: torch.Tensor, generation: int) -> Scores:
        """Phase 2a: the agents, the champion and equal weight on the same validation days, brought to the host
        with the fitness (the generation's one synchronisation), and the gate's critical t on them (the run's planned
        last generation is its last look)."""
        daily = self._gather_validation(self.validation.run())  # (P + 2, D)
        selection = self.config.selection
        if self.gate is None:
            z = selection_z(self.config.evolution.popsize, generation, selection.alpha)
            look = Look(z, z)
        else:  # on the device, before anything comes over: only its critical values do
            last = generation >= self.config.runtime.generations
            excess = ValidationReturns(daily.to(torch.float64)).excess  # (P, D)
            look = self.gate.look(excess, generation, last=last, margin=selection.min_edge / TRADING_DAYS)
        # Every decision below is taken on the host, in float64, from the same gathered numbers on every rank.
        returns = ValidationReturns(to_host(daily, torch.float64))
        candidates, baseline = returns.candidates, returns.equal_weight
        scores = Scores(
            fitness=to_host(fitness_per_agent),
            returns=returns,
            z=look.critical,
            last_z=look.last_critical,
            min_edge=selection.min_edge,
            edges=edges(candidates, baseline),
            bounds=edge_bounds(candidates, baseline, z=look.critical),
        )
        self.timer.mark("validate_s")
        return scores

    def _crown(self, scores: Scores, generation: int) -> int:
        """Phase 2b: the best agent with a proven edge (above ``selection.min_edge``) becomes the champion if it beats
        the current one on the same days; returns the champion's row in this generation's validation returns (the
        agent crowned, or the champion's own)."""
        popsize = self.config.evolution.popsize
        totals = scores.returns.totals  # (P + 2,)
        choice = choose_champion(
            scores.bounds[:popsize],
            float(scores.bounds[popsize]),
            totals[:popsize],
            float(totals[popsize]),
            by=self.config.selection.choose_by,
            margin=scores.min_edge,
        )
        crowned = self.sharding.crown(self.population, choice)  # the leader's choice, on every process
        slot = popsize if crowned is None else crowned  # the champion's slot, crowned now or before
        self.champion = ChampionRecord(
            score=float(totals[slot]),
            bound=float(scores.bounds[slot]),
            generation=self.champion.generation if crowned is None else generation,
        )
        return slot

    def _gather_validation(self, daily: torch.Tensor) -> torch.Tensor:
        """(P/W + 2, D) validation returns of the agents held here, the champion and equal weight -> (P + 2, D): every
        rank's agents in slot order, then the leader's champion and equal weight, so every rank decides on the same
        numbers."""
        if not self.sharding.distributed:
            return daily
        local = self.sharding.share.agents
        gathered = self.sharding.gather(daily).view(self.sharding.ranks.world_size, local + 2, -1)
        return torch.cat([gathered[:, :local].flatten(0, 1), gathered[0, local:]])

    def _evolve(self, fitness_host: torch.Tensor) -> EvolutionPlan:
        """Phase 3: select on the fitness of exactly these parameters; the plan is made on the host, applied in
        place on the device."""
        evolution = self.config.evolution
        plan = plan_generation(
            fitness_host,
            elites=evolution.elites,
            tournament_size=evolution.tournament_size,
            crossover_prob=evolution.crossover_prob,
            mutation_prob=evolution.mutation_prob,
            generator=self.generators["evolution"],
        )
        evolve_(
            self.population,
            plan,
            mutation_fraction=evolution.mutation_fraction,
            mutation_stdev=evolution.mutation_stdev,
            generator=self.generators["mutation"],
            donors=self.sharding.donors,
        )
        self.timer.mark("evolve_s")
        return plan

    def _update(self, plan: EvolutionPlan) -> tuple[int, dict[str, torch.Tensor]]:
        """Phase 4: the learner's updates, all agents in one batched update each; (updates, each loss's (P,) mean
        over the updates that computed it, by name)."""
        settings = self.config.learner
        updates = settings.updates_per_generation if len(self.buffer) >= settings.learning_starts else 0
        self.update_phase.begin(frozen=self.sharding.share.mine(plan.elite))  # this generation's elites held here
        for index in range(updates):
            # Between updates a stop is polled on this process only: a vote of all processes per update would
            # cost a collective each; they vote once before and once after the phase.
            if not self.sharding.distributed:
                self.pause_point(collective=False)
            self.update_phase(index)
        sums = to_host(self.sharding.gather(self.update_phase.loss_sums).T)  # (losses, P)
        counted = self.update_phase.updates_counted(updates)
        means = sums / torch.tensor(
            [[max(counted[name], 1)] for name in self.update_phase.loss_names], dtype=sums.dtype
        )
        losses = dict(zip(self.update_phase.loss_names, means))
        self.timer.mark("update_s")
        return updates, losses

    def captures(self) -> int:
        """CUDA graphs captured so far by the rollouts, validation and the update phase (``runtime.graphs``)."""
        calls = [self.rollouts.graphed, self.validation.graphed, *self.update_phase.graphed.values()]
        return sum(call.captures for call in calls)
