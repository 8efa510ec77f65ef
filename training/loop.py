"""The generation loop of evolutionary DDPG: roll out, validate and crown, evolve, update, record.

One generation, as ``Trainer.run_generation`` reads:

1. Roll out: every agent runs the same E training windows in lockstep. The first ``exploring_episodes`` add each
   agent's exploration noise and fill the replay ring; the fitness comes from the noise-free episodes, on training
   days the ring never holds (``training.fitness``).
2. Validate and crown: deterministic policies of the agents, the champion and equal weight run the whole
   validation range as one episode from cash; the best agent is crowned only if its edge over equal weight passes
   the selection gate (``training.selection``) and beats the champion's on the same days. Until then the champion
   is equal weight.
3. Evolve: selection on the fitness measured in step 1, on the very parameters being selected (nothing has trained
   them since), applied in place (``training.evolution``).
4. Update: every agent, offspring included, takes DDPG steps on batches from the shared ring (``models.ddpg``).
5. Record: one metrics row and console line (``training.records``), one checkpoint (``training.run_state``).

Step 4 changes the parameters after they were measured; the next generation's step 1 measures them again before
anything selects on them. Everything the loop uses is built once in ``Trainer.__init__``.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from config import Config
from environment.market import Market
from environment.vector_env import VectorPortfolioEnv
from models.ddpg import UpdateLosses, ddpg_update
from models.population import Population
from models.replay import ReplayBuffer
from persistence.provenance import market_fingerprint
from training.boundary import to_host
from training.evolution import EvolutionPlan, evolve_, plan_generation
from training.fitness import episode_returns, fitness, training_windows
from training.graphs import GraphedStep
from training.records import Scores, format_line, generation_row
from training.rollout import (
    SharedSteps,
    collect,
    equal_weights,
    exploration_scale,
    rollout_day,
    validate,
    validation_day,
)
from training.run_state import LoopCheckpoints
from training.selection import SequentialGate, choose_champion, edge_bounds, selection_z, validation_block_length
from training.sharding import Sharding
from training.streams import gate_generator, make_generators, seed_device_streams
from utils.telemetry import GrowthWatch, ObjectCensus, PhaseTimer, memory_snapshot, python_blocks


class RunStopped(Exception):  # noqa: N818 (a stop, not an error)
    """A stop was requested; ``generation`` is the last complete (checkpointed) generation."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"stopped after generation {generation}")
        self.generation = generation


def make_gate(config: Config, market: Market) -> SequentialGate | None:
    """The run's selection gate (``training.selection``); None with ``selection.method=bonferroni``. Its resamples
    come from a stream of their own, drawn once from the seed: every look and every resume sees the same ones."""
    selection = config.selection
    if selection.method != "bootstrap":
        return None
    validation = market.splits.validation
    relatives = to_host(market.relatives[validation.start : validation.stop])  # (D, N)
    mean_block = selection.block_days or validation_block_length(relatives)
    return SequentialGate(
        len(validation),
        alpha=selection.alpha,
        draws=selection.bootstrap_draws,
        mean_block=mean_block,
        half_spent_at=selection.half_spent_at,
        generator=gate_generator(config.runtime.seed),
    )


class Trainer:
    """Owns the population, environments, replay ring and generators of one run.

    Args:
        config: the resolved config.
        market: built from ``config.data`` on ``device``.
        run_dir: local run folder (created by the caller; checkpoints and metrics go here).
        log: where the per-generation line goes.
        should_stop: polled at safe points; once it returns True the unfinished generation is abandoned
            (its checkpoint is never written) and ``run`` raises ``RunStopped``.
        on_checkpoint: called with (generation, generations to protect) after each committed checkpoint,
            e.g. to hand it to a background uploader; it must not block. It runs on the checkpoint writer's
            thread (``training.run_state``).
        sharding: the slots this process holds when the population is sharded over processes (``torchrun``);
            by default one process holds them all. Only the leader writes checkpoints and metrics; a stop asked
            of any process stops all of them at the same safe point.
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
        self.config = config
        self.should_stop = should_stop
        self.market = market
        self.run_dir = Path(run_dir)
        self.log = log
        self.device = market.device
        # Process-wide, so every run sets it: TF32 on CUDA tensor cores with "high"; exact float32 on the CPU, where
        # "high" could let oneDNN use bfloat16 passes and a CPU run must stay comparable bit for bit.
        precision = config.runtime.matmul_precision if self.device.type == "cuda" else "highest"
        torch.set_float32_matmul_precision(precision)
        self.fingerprint = market_fingerprint(market)
        env_cfg, ddpg, evo, rollout = config.env, config.ddpg, config.evolution, config.rollout
        popsize = evo.popsize
        self.sharding = sharding or Sharding(popsize, device=self.device)
        held = self.sharding.per_rank

        self.generators = make_generators(config.runtime.seed, self.device)
        self.train_env = VectorPortfolioEnv(
            market,
            num_agents=held,
            num_episodes=rollout.episodes,
            episode_days=env_cfg.episode_days,
            lookback=env_cfg.lookback,
            cost_rate=env_cfg.cost_rate,
        )
        # Learning windows fill the ring; fitness windows trade days the ring never holds (training.fitness).
        self.stored_episodes = rollout.exploring_episodes if rollout.splits_fitness_days else rollout.episodes
        self.learning_starts, self.fitness_starts = training_windows(config, market)
        # Validation: the whole range as one episode from cash, for agents, champion and equal weight.
        validation = market.splits.validation
        self.validation_starts = torch.tensor([validation.start - 1], device=self.device)
        self.validation_env = VectorPortfolioEnv(
            market,
            num_agents=held + 2,
            num_episodes=1,
            episode_days=len(validation),
            lookback=env_cfg.lookback,
            cost_rate=env_cfg.cost_rate,
        )
        self.gate = make_gate(config, market)
        self.exploring = torch.arange(rollout.episodes, device=self.device) < rollout.exploring_episodes
        self.fitness_episodes = slice(rollout.episodes - rollout.fitness_episodes, None)  # the noise-free ones

        self.population = Population(
            popsize,
            self.train_env.gatherer.window_size,
            config.model,
            actor_lr=ddpg.actor_lr,
            critic_lr=ddpg.critic_lr,
            exploration=(ddpg.exploration_min, ddpg.exploration_max),
            device=self.device,
            generator=self.generators["init"],
            slots=self.sharding.slots,
        )
        self.buffer = ReplayBuffer(
            ddpg.buffer_size,
            market.num_assets,
            self.train_env.gatherer,
            market.relatives,
            sample_shape=(popsize, ddpg.batch_size),
            device=self.device,
            rows=self.sharding.slots,
        )
        self._shared_steps = SharedSteps(self.sharding, num_episodes=rollout.episodes, num_assets=market.num_assets)
        # Loss accumulators: written on the device every update, read once per generation.
        self._critic_loss_sum = torch.zeros(held, device=self.device)
        self._actor_loss_sum = torch.zeros(held, device=self.device)
        self._timer = PhaseTimer(self.device)
        self._growth = GrowthWatch()
        self._census = ObjectCensus(config.runtime.census_share)
        # ddpg.observation_noise's draws, for all P (each process keeps its rows)
        window_shape = (popsize, ddpg.batch_size, market.num_assets, self.train_env.gatherer.window_size)
        self._noise = torch.empty(window_shape, device=self.device) if ddpg.observation_noise > 0 else None
        self._actor_step_scale = torch.ones(held, device=self.device) if evo.frozen_elites else None

        # The device steps, replayed as CUDA graphs with runtime.cuda_graphs (not across processes: their exchanges
        # are collectives), else run as they are.
        graphs = config.runtime.cuda_graphs and not self.sharding.distributed
        exploration, replay = self.generators["exploration"], self.generators["replay"]
        day = functools.partial(
            rollout_day,
            self.population,
            self.train_env,
            self.buffer,
            noise_scale=exploration_scale(self.population, self.exploring),
            stored_episodes=self.stored_episodes,
            generator=exploration,
            share=self._shared_steps,
        )
        self._rollout_day = GraphedStep(day, device=self.device, enabled=graphs, generators=[exploration])
        day = functools.partial(
            validation_day, self.population, self.validation_env, equal_weights(self.validation_env)
        )
        self._validation_day = GraphedStep(day, device=self.device, enabled=graphs)
        self._update_step = GraphedStep(
            self._ddpg_step_into_sums, device=self.device, enabled=graphs, generators=[replay]
        )
        self._update_ring_size = -1  # the ring's size the update graph draws from (randint's bound is baked in)

        self.generation = 0
        self.champion_score = -math.inf
        self.champion_edge = 0.0
        self.champion_generation = 0  # 0: no agent crowned, the champion is equal weight
        self.metrics_path = self.run_dir / "metrics.jsonl"
        self.checkpoints = LoopCheckpoints(self, on_checkpoint)

    # ------------------------------------------------------------------ the loop

    def run(self, *, until: int, on_generation: Callable[[dict[str, Any]], None] | None = None) -> None:
        """Run generations until ``self.generation == until``, checkpointing each one.

        ``on_generation`` gets each generation's row once its checkpoint is staged, while the write may still be
        in flight. Returns, or raises (``RunStopped`` included), only once the last checkpoint it started is
        committed.
        """
        try:
            while self.generation < until:
                self._check_stop()
                row = self.run_generation()
                if on_generation is not None:
                    on_generation(row)
        finally:
            self.checkpoints.close()

    def run_generation(self) -> dict[str, Any]:
        """One generation: roll out, validate and crown, evolve, update, record (each phase a method below).
        A stop is polled between phases (with several processes, one vote each: ``Ranks.any``)."""
        self._timer.start()
        seed_device_streams(self.generators, self.config.runtime.seed, generation=self.generation + 1)
        fitness_per_agent = self._roll_out()
        self._check_stop()
        scores = self._validate_and_crown(fitness_per_agent)
        plan = self._evolve(scores.fitness)
        self._check_stop()
        updates, losses = self._update(plan)
        self.generation += 1
        return self._record(scores, plan, updates, losses)

    def _roll_out(self) -> torch.Tensor:
        """Phase 1: all agents x E training windows in lockstep, transitions into the ring; (P,) fitness on the
        device."""
        evolution = self.config.evolution
        rewards = self.collect_episodes(self.sample_train_starts())
        returns_per_episode = episode_returns(rewards)  # (P, E) of the agents held here
        fitness_per_agent = fitness(
            returns_per_episode[:, self.fitness_episodes], kind=evolution.fitness, worst_k=evolution.worst_k
        )
        self._timer.mark("rollout_s")
        return self.sharding.gather(fitness_per_agent)  # (P,)

    def _validate_and_crown(self, fitness_per_agent: torch.Tensor) -> Scores:
        """Phase 2: agents, champion and equal weight on the same validation days; crown only a proven edge.
        The generation's one host synchronisation brings back everything the decisions and the log need."""
        popsize = self.config.evolution.popsize
        daily = validate(self.population, self.validation_env, self.validation_starts, day=self._validation_day)
        daily = self._gather_validation(daily)
        # Every decision below is taken on the host, in float64, from the same gathered numbers on every rank.
        daily = to_host(daily, torch.float64)  # (P + 2, D)
        excess = daily[:popsize] - daily[popsize + 1]  # (P, D)
        if self.gate is None:
            z = selection_z(popsize, self.generation + 1, self.config.selection.alpha)
        else:
            z = self.gate.look(excess, self.generation + 1)
        edges = edge_bounds(daily[: popsize + 1], daily[popsize + 1], z=z)  # (P + 1,)
        scores = Scores(to_host(fitness_per_agent), edges, daily.sum(dim=1), z, excess)
        self._timer.mark("validate_s")

        crowned = choose_champion(
            scores.edges[:popsize],
            float(scores.edges[popsize]),
            scores.totals[:popsize],
            float(scores.totals[popsize]),
            by=self.config.selection.choose_by,
        )
        crowned = self.sharding.ranks.leader_choice(crowned)  # it steers the broadcast below: one answer for all
        if crowned is not None:
            owner = self.sharding.owner(crowned)
            if self.sharding.ranks.rank == owner:
                self.population.crown(crowned - self.sharding.slots.start)
            self.sharding.broadcast_(list(self.population.champion.parameters()), src=owner)
            self.champion_generation = self.generation + 1
        slot = popsize if crowned is None else crowned  # the champion's slot, crowned now or before
        self.champion_score = float(scores.totals[slot])
        self.champion_edge = float(scores.edges[slot])
        return scores

    def _gather_validation(self, daily: torch.Tensor) -> torch.Tensor:
        """(P/W + 2, D) validation returns of the agents held here, the champion and equal weight -> (P + 2, D): every
        rank's agents in slot order, then the leader's champion and equal weight, so every rank decides on the same
        numbers."""
        if not self.sharding.distributed:
            return daily
        held = self.sharding.per_rank
        gathered = self.sharding.gather(daily).view(self.sharding.ranks.world_size, held + 2, -1)
        return torch.cat([gathered[:, :held].flatten(0, 1), gathered[0, held:]])

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
        self._timer.mark("evolve_s")
        return plan

    def _update(self, plan: EvolutionPlan) -> tuple[int, torch.Tensor]:
        """Phase 4: DDPG updates, all agents in one batched update per step; (updates, (2, P) mean losses)."""
        ddpg = self.config.ddpg
        updates = ddpg.updates_per_generation if len(self.buffer) >= ddpg.learning_starts else 0
        if self._actor_step_scale is not None:  # evolution.frozen_elites: this generation's elites take no step
            held = plan.elite[self.sharding.slots.start : self.sharding.slots.stop]
            self._actor_step_scale.copy_((~held).to(self._actor_step_scale.dtype))
        self._critic_loss_sum.zero_()
        self._actor_loss_sum.zero_()
        if self.buffer.size != self._update_ring_size:  # the draws' bound changed: a captured update must be redone
            self._update_step.invalidate()
            self._update_ring_size = self.buffer.size
        for _ in range(updates):
            # Between updates a stop is polled on this process only: a vote of all processes per update would
            # cost a collective each; they vote once before and once after the phase.
            if not self.sharding.distributed and self.should_stop():
                raise RunStopped(self.generation)
            self._update_step()
        sums = self.sharding.gather(torch.stack([self._critic_loss_sum, self._actor_loss_sum], dim=1))  # (P, 2)
        losses_host = to_host(sums.T) / max(updates, 1)
        self._timer.mark("update_s")
        return updates, losses_host

    def _record(self, scores: Scores, plan: EvolutionPlan, updates: int, losses: torch.Tensor) -> dict[str, Any]:
        """Phase 5: the metrics row, the checkpoint (staged here, written by the writer thread, which appends the
        row to metrics.jsonl once the generation is committed), the console line."""
        cfg = self.config
        popsize = cfg.evolution.popsize
        # The previous generation's write: done before the telemetry, so the figures never count its buffers.
        waited = self.checkpoints.wait()
        started = time.perf_counter()
        telemetry = self._telemetry()
        durations = {**self._timer.durations(), "telemetry_s": time.perf_counter() - started}
        row = generation_row(
            self.generation,
            scores,
            champion={
                "champion_score": self.champion_score,
                "champion_edge": self.champion_edge,
                "champion_generation": self.champion_generation,
            },
            elites=[int(i) for i in torch.nonzero(plan.elite).flatten()],
            losses=losses,
            updates=updates,
            buffer_size=len(self.buffer),
            env_steps=popsize * cfg.rollout.episodes * cfg.env.episode_days,
            durations=durations,
            telemetry=telemetry,
        )
        self.checkpoints.save(row, waited=waited)
        self.log(format_line(row, generations=cfg.runtime.generations, buffer_capacity=self.buffer.capacity))
        return row

    def collect_episodes(self, start_days: torch.Tensor) -> torch.Tensor:
        """Step 1's rollout: every agent on the E windows starting at ``start_days``, transitions into the ring.

        Returns (P, E, D) per-step rewards (the environment's history array, valid until its next reset).
        """
        return collect(
            self.population,
            self.train_env,
            start_days,
            exploring=self.exploring,
            buffer=self.buffer,
            stored_episodes=self.stored_episodes,
            generator=self.generators["exploration"],
            share=self._shared_steps,
            day=self._rollout_day,
        )

    def ddpg_step(self) -> UpdateLosses:
        """Step 4's unit: one batch per agent from the ring, one batched DDPG update of all agents."""
        ddpg = self.config.ddpg
        batch = self.buffer.sample(self.generators["replay"])
        if self._noise is not None:  # in place: the windows are the ring's own gather buffers
            slots = self.sharding.slots
            for windows in (batch.windows, batch.next_windows):
                torch.randn(self._noise.shape, generator=self.generators["replay"], out=self._noise)
                windows.add_(self._noise[slots.start : slots.stop], alpha=ddpg.observation_noise)
        return ddpg_update(
            self.population,
            batch,
            gamma=ddpg.gamma,
            tau=ddpg.tau,
            max_grad_norm=ddpg.max_grad_norm,
            objective=ddpg.actor_objective,
            cost_rate=self.config.env.cost_rate,
            tilt_penalty=ddpg.tilt_penalty,
            actor_step_scale=self._actor_step_scale,
        )

    def _ddpg_step_into_sums(self) -> None:
        """``ddpg_step`` with its losses added to the generation's sums: the update phase's graphed step."""
        losses = self.ddpg_step()
        self._critic_loss_sum += losses.critic
        self._actor_loss_sum += losses.actor

    def _telemetry(self) -> dict[str, int | None]:
        """Memory figures of this generation (the object counts when the census takes them, else None); warns
        (once per streak) when they keep growing after warm-up."""
        counts = self._census.take()
        reading = {
            **memory_snapshot(self.device),
            "live_tensors": None if counts is None else counts.tensors,
            "python_objects": None if counts is None else counts.objects,
            "python_blocks": python_blocks(),
            "python_references": None if counts is None else counts.references,
            "replay_bytes": self.buffer.nbytes,
            "replay_transitions": len(self.buffer),
        }
        warning = self._growth.update(reading, warm=len(self.buffer) == self.buffer.capacity)
        if warning:
            self.log(warning)
        return reading

    def _check_stop(self) -> None:
        if self.sharding.ranks.any(self.should_stop()):
            raise RunStopped(self.generation)

    def sample_train_starts(self) -> torch.Tensor:
        """(E,) start days: the first ``stored_episodes`` from the learning windows, the rest from the fitness ones."""
        episodes, stored = self.config.rollout.episodes, self.stored_episodes
        generator = self.generators["episodes"]
        learning = self.learning_starts[torch.randint(len(self.learning_starts), (stored,), generator=generator)]
        picks = torch.randint(len(self.fitness_starts), (episodes - stored,), generator=generator)
        fitness = self.fitness_starts[picks]
        return torch.cat([learning, fitness]).to(self.device)
