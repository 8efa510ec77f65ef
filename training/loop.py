"""The generation loop of evolutionary actor-critic learning: roll out, validate and crown, evolve, update, record.

One generation, as ``Trainer.run_generation`` reads:

1. Roll out: every agent runs the same E training episodes in lockstep. The first ``exploring_episodes`` add each
   agent's exploration noise and fill the replay buffer; the fitness comes from the noise-free episodes, on training
   days the buffer never holds (``training.rollout``, ``training.fitness``).
2. Validate and crown: deterministic policies of the agents, the champion and equal weight run the whole
   validation range as one episode from cash; the best agent is crowned only if its edge over equal weight passes
   the selection gate (``training.selection``) and beats the champion's on the same days. Until then the champion
   is equal weight.
3. Evolve: selection on the fitness measured in step 1, on the very parameters being selected (nothing has trained
   them since), applied in place (``training.evolution``).
4. Update: every agent, offspring included, takes learner steps on batches from the shared buffer (``training.update``,
   ``models.learner``).
5. Record: one metrics row and console line (``training.records``), one checkpoint every ``checkpoint.every``
   generations (``training.checkpointing``).

Step 4 changes the parameters after they were measured; the next generation's step 1 measures them again before
anything selects on them. Everything the loop uses is built once, before the first generation
(``training.parts``); each phase runs on the training device, and its results come to the host in one place
(``runtime.boundary``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from config import Config
from environment.market import Market
from persistence.provenance import market_fingerprint
from runtime.boundary import to_host
from runtime.sharding import Sharding
from training.checkpointing import Checkpointing, TrainerState
from training.evolution import EvolutionPlan, evolve_, plan_generation
from training.parts import build_parts
from training.records import Scores, format_line, generation_row
from training.selection import (
    EQUAL_WEIGHT,
    TRADING_DAYS,
    ChampionRecord,
    Look,
    ValidationReturns,
    choose_champion,
    edge_bounds,
    edges,
    selection_z,
)
from training.streams import HOST_STREAMS, seed_device_streams
from utils.errors import CheckpointError
from utils.telemetry import PhaseTimer, Telemetry


class RunStopped(Exception):  # noqa: N818 (a stop, not an error)
    """A stop was requested; ``generation`` is the last complete (checkpointed) generation."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"stopped after generation {generation}")
        self.generation = generation


class Trainer:
    """One run's generation loop over the parts ``training.parts`` builds once.

    Args:
        config: the resolved config.
        market: built from ``config.data`` on the training device.
        run_dir: local run folder (created by the caller; checkpoints and metrics go here).
        log: where the per-generation line goes.
        should_stop: polled at safe points; once it returns True the unfinished generation is abandoned (its
            checkpoint is never written) and ``run`` raises ``RunStopped``, the last complete generation
            checkpointed. If that one was not (``checkpoint.every``) and the next has begun, its state is gone: the
            next one is finished instead, and checkpointed.
        on_checkpoint: called with (generation, generations to protect) after each committed checkpoint, e.g. to
            hand it to the uploader; it must not block, and runs on the checkpoint writer's thread.
        sharding: the slots this process holds when the population is sharded over processes (``torchrun``); by
            default one process holds them all. Only the leader writes checkpoints and metrics; a stop asked of any
            process stops all of them at the same safe point.
    """

    def __init__(
        self,
        config: Config,
        market: Market,
        run_dir: Path,
        *,
        log: Callable[[str], None] = print,
        should_stop: Callable[[], bool] = lambda: False,
        on_checkpoint: Callable[[int, set[int]], None] | None = None,
        sharding: Sharding | None = None,
    ) -> None:
        self.config, self.market, self.run_dir = config, market, Path(run_dir)
        self.log, self.should_stop = log, should_stop
        self.device = market.device
        self.fingerprint = market_fingerprint(market)
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
        ) = build_parts(config, market, sharding)
        self.generation = 0
        self._until = config.runtime.generations  # the last generation ``run`` makes: always checkpointed
        self.champion: ChampionRecord = EQUAL_WEIGHT
        self.checkpoints = Checkpointing(
            self.run_dir,
            config=config,
            market=market,
            fingerprint=self.fingerprint,
            sharding=self.sharding,
            on_checkpoint=on_checkpoint,
        )
        self.timer = PhaseTimer(self.device)
        self._captured = 0  # graphs captured before the current generation (``_captures``)
        self.telemetry = Telemetry(self.device, census_fraction=config.runtime.census_fraction)

    def run(self, *, until: int, on_generation: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Run generations until ``self.generation == until``, checkpointing every ``checkpoint.every``-th one and
        the last; a stop (``RunStopped``) checkpoints the last complete generation first if it was not.

        ``on_generation`` gets each generation's row once its checkpoint is staged (or its row held, for a generation
        not checkpointed), while the write may still be in flight. Returns, or raises (``RunStopped`` included), only
        once the last checkpoint it started is committed.
        """
        self._until = until
        try:
            while self.generation < until:
                if self.sharding.ranks.any(self.should_stop()):
                    if self.checkpoints.holding:  # the last complete generation, not checkpointed yet
                        self.checkpoints.save(self.state())
                    raise RunStopped(self.generation)
                row = self.run_generation()
                if on_generation is not None:
                    on_generation(row)
        finally:
            self.checkpoints.close()

    def run_generation(self) -> dict[str, Any]:
        """One generation: roll out, validate and crown, evolve, update, record (each phase a method below).
        A stop is polled between phases (with several processes, one vote each: ``Ranks.any``)."""
        generation = self.generation + 1  # the one being computed
        self.timer.start()
        seed_device_streams(self.generators, self.config.runtime.seed, generation=generation)
        fitness_per_agent = self._roll_out()
        self._check_stop()
        scores = self._validate(fitness_per_agent, generation)
        champion_slot = self._crown(scores, generation)
        plan = self._evolve(scores.fitness)
        self._check_stop()
        updates, losses = self._update(plan)
        self.generation = generation
        return self._record(scores, champion_slot, plan, updates, losses)

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
            sharding=self.sharding,
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
            if not self.sharding.distributed and not self.checkpoints.holding and self.should_stop():
                raise RunStopped(self.generation)
            self.update_phase(index)
        sums = to_host(self.sharding.gather(self.update_phase.loss_sums).T)  # (losses, P)
        counted = self.update_phase.updates_counted(updates)
        means = sums / torch.tensor(
            [[max(counted[name], 1)] for name in self.update_phase.loss_names], dtype=sums.dtype
        )
        losses = dict(zip(self.update_phase.loss_names, means))
        self.timer.mark("update_s")
        return updates, losses

    def _record(
        self, scores: Scores, champion_slot: int, plan: EvolutionPlan, updates: int, losses: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        """Phase 5: the metrics row, the checkpoint every ``checkpoint.every`` generations and at the last (staged
        here, written by the writer thread, which appends the rows held since the last one to metrics.jsonl once the
        generation is committed), the console line."""
        cfg = self.config
        checkpointed = self.generation % cfg.checkpoint.every == 0 or self.generation >= self._until
        # The write before: done before the telemetry, so the figures never count its buffers; a generation not
        # checkpointed waits for nothing (its figures may count a write in flight).
        waited = self.checkpoints.wait() if checkpointed else 0.0
        started = time.perf_counter()
        telemetry, warning = self.telemetry.measure(
            warm=len(self.buffer) == self.buffer.capacity,
            replay_bytes=self.buffer.nbytes,
            replay_transitions=len(self.buffer),
        )
        if warning:
            self.log(warning)
        durations = {**self.timer.durations(), "telemetry_s": time.perf_counter() - started}
        compiled = self.compilation.report()  # once, after the generation that compiled
        if compiled is not None:
            self.log(compiled)
        popsize = cfg.evolution.popsize
        row = generation_row(
            self.generation,
            scores,
            champion=self.champion,
            champion_edge=float(scores.edges[champion_slot]),
            elites=[int(i) for i in torch.nonzero(plan.elite).flatten()],
            losses=losses,
            loss_names=self.population.learner.losses,
            updates=updates,
            buffer_size=len(self.buffer),
            env_steps=popsize * cfg.rollout.episodes * cfg.env.episode_days,
            durations=durations,
            telemetry=telemetry,
            graph_captures=self._captures() - self._captured,
        )
        self._captured = self._captures()
        if checkpointed:
            self.checkpoints.save(self.state(), row, waited=waited)
        else:
            self.checkpoints.hold(row)
        self.log(format_line(row, generations=cfg.runtime.generations, buffer_capacity=self.buffer.capacity))
        return row

    def _captures(self) -> int:
        """CUDA graphs captured so far by the rollouts, validation and the update phase (``runtime.graphs``)."""
        steps = [self.rollouts.step, self.validation.step, *self.update_phase.steps.values()]
        return sum(step.captures for step in steps)

    def _check_stop(self) -> None:
        """Inside a generation: abandon it if a stop was asked, unless the one before is not checkpointed (then this
        one is finished, and ``run`` checkpoints it before it stops)."""
        if not self.checkpoints.holding and self.sharding.ranks.any(self.should_stop()):
            raise RunStopped(self.generation)

    # ------------------------------------------------------------------ its state, as one value

    def state(self) -> TrainerState:
        """The trainer's state after its last generation, referring to the live tensors (what a checkpoint holds)."""
        population = self.population
        return TrainerState(
            generation=self.generation,
            champion=self.champion,
            population=population.state_tensors(),
            optimiser_steps=population.learner.step_counts(),
            buffer=self.buffer.state(),
            streams={name: self.generators[name].get_state() for name in HOST_STREAMS},  # copies
            gate=None if self.gate is None else self.gate.state_tensors(),  # a copy
        )

    @torch.no_grad()
    def load_state_(self, state: TrainerState) -> None:
        """Take ``state`` (a checkpoint's, ``Checkpointing.restore``) into the live tensors, in place.

        Raises:
            CheckpointError: a part of ``state`` does not fit this trainer (its config's shapes), named by file.
        """
        population = self.population
        parts = {
            "population": lambda: population.load_state_tensors(state.population),
            "replay": lambda: self.buffer.load_state_(state.buffer),
            "rng": lambda: [self.generators[name].set_state(state.streams[name]) for name in HOST_STREAMS],
        }
        if self.gate is not None and state.gate is not None:
            parts["selection"] = lambda: self.gate.load_state_tensors(state.gate)
        for name, load in parts.items():
            try:
                load()
            except (KeyError, ValueError, RuntimeError) as error:
                raise CheckpointError(
                    f"{state.source}/{name}.safetensors does not fit the run's config: {error}"
                ) from None
        for name, count in population.learner.step_counts().items():
            if name not in state.optimiser_steps:
                raise CheckpointError(f"{state.source}/state.json has no step count of the {name} optimiser")
            count.fill_(float(state.optimiser_steps[name]))
        self.generation, self.champion = state.generation, state.champion
