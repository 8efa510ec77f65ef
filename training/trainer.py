"""The generation loop: evaluate, validate, evolve, train, record. Everything it uses is built here once.

One generation, as the loop below reads:

1. Evaluate: every agent runs the same E training windows in lockstep. The first
   ``exploring_episodes`` add each agent's exploration noise; every transition goes to the replay
   ring; the fitness comes from the noise-free episodes.
2. Validate: deterministic policies of the agents, the champion and equal weight run the whole
   validation range as one episode from cash; the best agent is crowned only if its edge over equal
   weight passes the selection test (``training.selection``) and beats the champion's on the same days.
   Until then the champion is equal weight.
3. Evolve: selection on the fitness measured in step 1, on the very parameters being selected
   (nothing has trained them since), applied in place.
4. DDPG updates: every agent, offspring included, trains on batches from the shared ring.
5. Record: one metrics row, one console line, one checkpoint.

Step 4 changes the parameters after they were measured; the next generation's step 1 measures them
again before anything selects on them.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from config import Config
from environment.market import Market
from environment.vector_env import VectorPortfolioEnv
from models.ddpg import UpdateLosses, ddpg_update
from models.population import Population
from models.replay import ReplayBuffer, holds_the_ring
from training.checkpointing import CheckpointWriter, StagingBuffers
from training.evolution import EvolutionPlan, evolve_, plan_generation
from training.fitness import episode_returns, fitness, training_windows
from training.overfitting import BLOCKS, block_means
from training.rollout import SharedSteps, collect, validate
from training.selection import (
    SequentialGate,
    choose_champion,
    edge_bounds,
    selection_z,
    t_statistics,
    validation_block_length,
)
from training.sharding import Sharding
from utils import checkpoint, jsonl
from utils.errors import CheckpointError
from utils.telemetry import (
    MEMORY_KEYS,
    GrowthWatch,
    PhaseTimer,
    count_objects,
    format_bytes,
    format_count,
    memory_snapshot,
    python_blocks,
)

HOST_STREAMS = ("init", "episodes", "evolution")
"""Random streams on the CPU that run through the whole run; their states are checkpointed."""
DEVICE_STREAMS = ("exploration", "replay", "mutation")
"""Random streams on the training device, seeded afresh each generation from (seed, generation): nothing
device-specific is checkpointed, so a run resumes on another device type (a CUDA generator's state
means nothing to a CPU one), and each generation's draws do not depend on where the run was before."""

MEASURED_KEYS = frozenset(
    {
        "env_steps_per_s",
        "generation_s",
        "evaluate_s",
        "validate_s",
        "evolve_s",
        "update_s",
        "checkpoint_s",
        "checkpoint_write_s",
        *MEMORY_KEYS,
    }
)
"""Metrics that measure the machine, not the run: they differ between identical runs."""


class Scores(NamedTuple):
    """A generation's figures on the host, after its one synchronisation."""

    fitness: torch.Tensor
    """(P,) training fitness."""
    edges: torch.Tensor
    """(P + 1,) edge bounds over equal weight of the agents and the champion (``training.selection``)."""
    totals: torch.Tensor
    """(P + 2,) validation log returns of the agents, the champion and equal weight."""
    z: float
    """The critical t these edges were measured with (``training.selection``)."""
    excess: torch.Tensor
    """(P, D) float64 daily validation excess log returns of the agents over equal weight."""


class RunStopped(Exception):  # noqa: N818 (a stop, not an error)
    """A stop was requested; ``generation`` is the last complete (checkpointed) generation."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"stopped after generation {generation}")
        self.generation = generation


def _seed_of(sequence: np.random.SeedSequence) -> int:
    return int(sequence.generate_state(1, np.uint64)[0]) & 0x7FFF_FFFF_FFFF_FFFF


def make_generators(seed: int, device: torch.device) -> dict[str, torch.Generator]:
    """The host streams, seeded from independent children of ``seed``, and the device streams (seeded for
    generation 1 by ``seed_device_streams``)."""
    generators = {}
    for name, child in zip(HOST_STREAMS, np.random.SeedSequence(seed).spawn(len(HOST_STREAMS))):
        generators[name] = torch.Generator(device="cpu")
        generators[name].manual_seed(_seed_of(child))
    for name in DEVICE_STREAMS:
        generators[name] = torch.Generator(device=device)
    seed_device_streams(generators, seed, generation=1)
    return generators


def seed_device_streams(generators: dict[str, torch.Generator], seed: int, *, generation: int) -> None:
    """Seed the device streams for ``generation`` (1-based): a function of the seed and the generation only.
    Their spawn keys (stream, generation) cannot collide with the host streams' children (one key each)."""
    for index, name in enumerate(DEVICE_STREAMS):
        sequence = np.random.SeedSequence(seed, spawn_key=(len(HOST_STREAMS) + index, generation))
        generators[name].manual_seed(_seed_of(sequence))


def make_gate(config: Config, market: Market) -> SequentialGate | None:
    """The run's selection gate (``training.selection``); None with ``selection.method=bonferroni``. Its resamples
    come from a stream of their own, drawn once from the seed: every look and every resume sees the same ones."""
    selection = config.selection
    if selection.method != "bootstrap":
        return None
    validation = market.splits.validation
    mean_block = selection.block_days or validation_block_length(market.relatives[validation.start : validation.stop])
    generator = torch.Generator(device="cpu")
    key = (len(HOST_STREAMS) + len(DEVICE_STREAMS),)  # after the host children and the device streams' keys
    generator.manual_seed(_seed_of(np.random.SeedSequence(config.runtime.seed, spawn_key=key)))
    return SequentialGate(
        len(validation),
        alpha=selection.alpha,
        draws=selection.bootstrap_draws,
        mean_block=mean_block,
        half_spent_at=selection.half_spent_at,
        generator=generator,
    )


def describe_device(device: torch.device) -> dict[str, str]:
    """What a checkpoint records of the machine that wrote it: bit-exact resume holds only on the same kind."""
    described = {"type": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        described |= {
            "name": torch.cuda.get_device_name(device),
            "capability": f"{major}.{minor}",
            "cuda": str(torch.version.cuda),
        }
    return described


def device_change_note(written: dict[str, Any] | None, current: dict[str, str]) -> str | None:
    """One line when the device that wrote a checkpoint differs from this one (the run continues), else None."""
    if written == current:
        return None
    if written is None:
        return (
            "note: the checkpoint does not record the device that wrote it: "
            "the run goes on, bit for bit only if it was this kind"
        )

    def name(described: dict[str, Any]) -> str:
        parts = [str(described.get("name") or described.get("type"))]
        if described.get("capability"):
            parts.append(f"compute {described['capability']}, CUDA {described.get('cuda')}")
        parts.append(f"torch {described.get('torch')}")
        return ", ".join(parts)

    return (
        f"note: the checkpoint was written on {name(written)}; continuing on {name(current)}: "
        "the run goes on, but not bit for bit as it would have on the first"
    )


def market_fingerprint(market: Market) -> str:
    """SHA-256 of everything the trainer reads from the market: a resumed run must see the same data."""
    digest = hashlib.sha256()
    for tensor in (market.features, market.relatives):
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update("\n".join(market.tickers + market.dates + market.feature_names).encode())
    digest.update(repr(market.splits).encode())
    return digest.hexdigest()


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
            thread (``training.checkpointing``).
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
        self.on_checkpoint = on_checkpoint
        self.market = market
        self.run_dir = Path(run_dir)
        self.log = log
        self.device = market.device
        # Process-wide, so every run sets it: TF32 on CUDA tensor cores with "high", exact float32 with "highest".
        torch.set_float32_matmul_precision(config.runtime.matmul_precision)
        self.fingerprint = market_fingerprint(market)
        env_cfg, ddpg, evo, evaluation = config.env, config.ddpg, config.evolution, config.evaluation
        popsize = evo.popsize
        self.sharding = sharding or Sharding(popsize, device=self.device)
        held = self.sharding.per_rank

        self.generators = make_generators(config.runtime.seed, self.device)
        self.train_env = VectorPortfolioEnv(
            market,
            num_agents=held,
            num_episodes=evaluation.episodes,
            episode_days=env_cfg.episode_days,
            lookback=env_cfg.lookback,
            cost_rate=env_cfg.cost_rate,
        )
        # Learning windows fill the ring; fitness windows trade days the ring never holds (training.fitness).
        self.stored_episodes = evaluation.exploring_episodes if evaluation.splits_fitness_days else evaluation.episodes
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
        self.exploring = torch.arange(evaluation.episodes, device=self.device) < evaluation.exploring_episodes
        fitness_from = evaluation.exploring_episodes if evaluation.exploring_episodes < evaluation.episodes else 0
        self.fitness_episodes = slice(fitness_from, None)

        self.population = Population(
            popsize,
            self.train_env.gatherer.window_size,
            encoder_hidden=config.model.encoder_hidden,
            embedding=config.model.embedding,
            head_hidden=config.model.head_hidden,
            bf16_encoder=config.model.bf16_encoder,
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
        self._shared_steps = SharedSteps(self.sharding, num_episodes=evaluation.episodes, num_assets=market.num_assets)
        # Loss accumulators: written on the device every update, read once per generation.
        self._critic_loss_sum = torch.zeros(held, device=self.device)
        self._actor_loss_sum = torch.zeros(held, device=self.device)
        self._timer = PhaseTimer(self.device)
        self._growth = GrowthWatch()
        self._staging = StagingBuffers(self.device)
        self._noise: torch.Tensor | None = None  # ddpg.observation_noise's draws
        self._writer = CheckpointWriter()
        self._gathered: dict[str, torch.Tensor] | None = None  # the leader's whole-population staging

        self.generation = 0
        self.champion_score = -math.inf
        self.champion_edge = 0.0
        self.champion_generation = 0  # 0: no agent crowned, the champion is equal weight
        self.metrics_path = self.run_dir / "metrics.jsonl"

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
            self.finish_checkpoints()

    def run_generation(self) -> dict[str, Any]:
        """One generation: evaluate, validate and crown, evolve, update, record (each phase a method below)."""
        self._timer.start()
        seed_device_streams(self.generators, self.config.runtime.seed, generation=self.generation + 1)
        fitness_per_agent = self._evaluate()
        self._check_stop()
        scores = self._validate_and_crown(fitness_per_agent)
        plan = self._evolve(scores.fitness)
        updates, losses = self._update()
        self.generation += 1
        return self._record(scores, plan, updates, losses)

    def _evaluate(self) -> torch.Tensor:
        """Phase 1: all agents x E training windows in lockstep, transitions into the ring; (P,) fitness on the
        device."""
        evolution = self.config.evolution
        rewards = self.collect_episodes(self._sample_train_starts())
        returns_per_episode = episode_returns(rewards)  # (P, E) of the agents held here
        fitness_per_agent = fitness(
            returns_per_episode[:, self.fitness_episodes], kind=evolution.fitness, worst_k=evolution.worst_k
        )
        self._timer.mark("evaluate_s")
        return self.sharding.gather(fitness_per_agent)  # (P,)

    def _validate_and_crown(self, fitness_per_agent: torch.Tensor) -> Scores:
        """Phase 2: agents, champion and equal weight on the same validation days; crown only a proven edge.
        The generation's one host synchronisation brings back everything the decisions and the log need."""
        popsize = self.config.evolution.popsize
        daily = self._gather_validation(validate(self.population, self.validation_env, self.validation_starts))
        # Every decision below is taken on the host, in float64, from the same gathered numbers on every rank.
        daily = daily.cpu().to(torch.float64)  # (P + 2, D)
        excess = daily[:popsize] - daily[popsize + 1]  # (P, D)
        if self.gate is None:
            z = selection_z(popsize, self.generation + 1, self.config.selection.alpha)
        else:
            z = self.gate.look(excess, self.generation + 1)
        edges = edge_bounds(daily[: popsize + 1], daily[popsize + 1], z=z)  # (P + 1,)
        scores = Scores(fitness_per_agent.cpu(), edges, daily.sum(dim=1), z, excess)
        self._timer.mark("validate_s")

        crowned = choose_champion(
            scores.edges[:popsize],
            float(scores.edges[popsize]),
            scores.totals[:popsize],
            float(scores.totals[popsize]),
            by=self.config.selection.choose_by,
        )
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

    def _update(self) -> tuple[int, torch.Tensor]:
        """Phase 4: DDPG updates, all agents in one batched update per step; (updates, (2, P) mean losses)."""
        ddpg = self.config.ddpg
        updates = ddpg.updates_per_generation if len(self.buffer) >= ddpg.learning_starts else 0
        self._critic_loss_sum.zero_()
        self._actor_loss_sum.zero_()
        for _ in range(updates):
            self._check_stop()
            losses = self.ddpg_step()
            self._critic_loss_sum += losses.critic
            self._actor_loss_sum += losses.actor
        sums = self.sharding.gather(torch.stack([self._critic_loss_sum, self._actor_loss_sum], dim=1))  # (P, 2)
        losses_host = sums.T.cpu() / max(updates, 1)
        self._timer.mark("update_s")
        return updates, losses_host

    def _record(self, scores: Scores, plan: EvolutionPlan, updates: int, losses: torch.Tensor) -> dict[str, Any]:
        """Phase 5: the metrics row, the checkpoint (staged here, written by the writer thread, which appends the
        row to metrics.jsonl once the generation is committed), the console line."""
        cfg = self.config
        popsize = cfg.evolution.popsize
        # The previous generation's write: done before the telemetry, so the figures never count its buffers.
        waited = self.wait_for_checkpoint()
        validation = scores.totals[:popsize]
        env_steps = popsize * cfg.evaluation.episodes * cfg.env.episode_days
        durations = self._timer.durations()
        row: dict[str, Any] = {
            "generation": self.generation,
            "best_fitness": float(scores.fitness.max()),
            "mean_fitness": float(scores.fitness.mean()),
            "worst_fitness": float(scores.fitness.min()),
            "validation_best": float(validation.max()),
            "validation_mean": float(validation.mean()),
            "validation_equal_weight": float(scores.totals[popsize + 1]),
            "edge_best": float(scores.edges[:popsize].max()),
            "selection_z": scores.z,
            # Every candidate's evidence, for the overfitting diagnostics of evaluate and backtest
            # (training.overfitting): daily excess Sharpe, and mean excess in 16 blocks of the validation days.
            "validation_sharpe": [float(x) for x in t_statistics(scores.excess) / math.sqrt(scores.excess.shape[1])],
            "validation_blocks": [[float(x) for x in agent] for agent in block_means(scores.excess.numpy())]
            if scores.excess.shape[1] >= BLOCKS
            else None,
            "champion_score": self.champion_score,
            "champion_edge": self.champion_edge,
            "champion_generation": self.champion_generation,
            "elites": [int(i) for i in torch.nonzero(plan.elite).flatten()],
            "critic_loss": float(losses[0].mean()),
            "actor_loss": float(losses[1].mean()),
            "updates": updates,
            "buffer_size": len(self.buffer),
            "env_steps": env_steps,
            "env_steps_per_s": env_steps / max(durations["evaluate_s"], 1e-9),
            **durations,
            **self._telemetry(),
        }
        row["generation_s"] = sum(durations.values())
        self.save_checkpoint(row, waited=waited)
        self.log(self.format_line(row))
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
        )

    def ddpg_step(self) -> UpdateLosses:
        """Step 4's unit: one batch per agent from the ring, one batched DDPG update of all agents."""
        ddpg = self.config.ddpg
        batch = self.buffer.sample(self.generators["replay"])
        if ddpg.observation_noise > 0:  # in place: the windows are the ring's own gather buffers
            if self._noise is None:  # allocated once, like every buffer of the loop; drawn for all P (rows kept)
                self._noise = batch.windows.new_empty((self.config.evolution.popsize, *batch.windows.shape[1:]))
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
        )

    def _telemetry(self) -> dict[str, int]:
        """Memory figures of this generation; warns (once per streak) when they keep growing after warm-up."""
        python_objects, live_tensors, python_references = count_objects()
        reading = {
            **memory_snapshot(self.device),
            "live_tensors": live_tensors,
            "python_objects": python_objects,
            "python_blocks": python_blocks(),
            "python_references": python_references,
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

    def _sample_train_starts(self) -> torch.Tensor:
        """(E,) start days: the first ``stored_episodes`` from the learning windows, the rest from the fitness ones."""
        episodes, stored = self.config.evaluation.episodes, self.stored_episodes
        generator = self.generators["episodes"]
        learning = self.learning_starts[torch.randint(len(self.learning_starts), (stored,), generator=generator)]
        picks = torch.randint(len(self.fitness_starts), (episodes - stored,), generator=generator)
        fitness = self.fitness_starts[picks]
        return torch.cat([learning, fitness]).to(self.device)

    def format_line(self, row: dict[str, Any]) -> str:
        total = self.config.runtime.generations
        return (
            f"gen {row['generation']:>4}/{total} | fitness best {row['best_fitness']:+.4f} "
            f"mean {row['mean_fitness']:+.4f} worst {row['worst_fitness']:+.4f} | "
            f"champion {row['champion_score']:+.4f} {self._champion_label(row)} | "
            f"buffer {format_count(row['buffer_size'])}/{format_count(self.buffer.capacity)} | "
            f"{format_count(row['env_steps_per_s'])} steps/s | {row['generation_s']:.1f} s | "
            f"rss {format_bytes(row['rss_bytes'])} | {row['live_tensors']} tensors"
        )

    @staticmethod
    def _champion_label(row: dict[str, Any]) -> str:
        if not row["champion_generation"]:
            return f"(equal weight; best edge {row['edge_best'] * 100:+.1f}%/y)"
        return f"(gen {row['champion_generation']}, edge {row['champion_edge'] * 100:+.1f}%/y)"

    # ------------------------------------------------------------------ checkpoints

    def wait_for_checkpoint(self) -> float:
        """Block until the checkpoint being written, if any, is committed and its row is in ``metrics.jsonl``;
        seconds waited. Raises the error the write failed with."""
        return self._writer.wait()

    def finish_checkpoints(self) -> None:
        """Wait for the checkpoint in flight (raising its error) and end the writer thread; a later checkpoint
        starts a new one."""
        self._writer.close()

    def _staged_tensors(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """This generation's tensor groups as the checkpoint holds them, copied out of the live tensors into the
        staging buffers (free only once no write is in flight). With the population sharded, every rank's slots
        are gathered into the leader's buffers; the other ranks, which write nothing, get None."""
        sources = {"population": self.population.state_tensors()}
        if self.sharding.is_leader:  # the ring is the same on every rank: the leader's is written
            sources["replay"] = self.buffer.storage
        staged = self._staging.capture(sources, rows={"replay": self.buffer.size})
        population = staged["population"]
        if self.sharding.distributed:
            slot_keys = self.population.slot_tensors().keys()
            mine = {key: population[key] for key in slot_keys}
            if self.sharding.is_leader and self._gathered is None:  # allocated once, like the staging buffers
                popsize = self.config.evolution.popsize
                self._gathered = {k: t.new_empty((popsize, *t.shape[1:])) for k, t in mine.items()}
            self.sharding.gather_to_leader(mine, self._gathered)
            if not self.sharding.is_leader:
                return None
            population = {**population, **self._gathered}
        return {
            "population": population,
            **self.buffer.checkpoint_groups(staged["replay"]),  # replay, replay-000, ...
            "rng": {name: self.generators[name].get_state() for name in HOST_STREAMS},  # copies already
            **({} if self.gate is None else {"selection": self.gate.state_tensors()}),  # a copy too
        }

    def state_document(self) -> dict[str, Any]:
        """The checkpoint's ``state.json``: the run's scalars, where the data came from, the config and the device."""
        return {
            "format_version": checkpoint.FORMAT_VERSION,
            "generation": self.generation,
            "champion_score": self.champion_score if math.isfinite(self.champion_score) else None,
            "champion_generation": self.champion_generation,
            "champion_edge": self.champion_edge,
            "actor_optim_steps": self.population.actor_optim.steps,
            "critic_optim_steps": self.population.critic_optim.steps,
            "replay_pos": self.buffer.pos,
            "replay_size": self.buffer.size,
            "market_fingerprint": self.fingerprint,
            "tickers": list(self.market.tickers),
            "splits": {  # first and last day of each range, as dates
                name: [self.market.dates[days.start], self.market.dates[days.stop - 1]]
                for name, days in vars(self.market.splits).items()
                if len(days)
            },
            "config": self.config.to_dict(),
            "device": describe_device(self.device),
        }

    def save_checkpoint(self, latest_row: dict[str, Any], *, waited: float = 0.0) -> None:
        """Stage this generation and start writing it on the writer thread; returns once the live tensors are free
        to change again.

        ``latest_row`` is this generation's metrics row. It gains ``checkpoint_s``, what the loop blocked for (the
        wait for the write before, ``waited`` seconds of it spent earlier by the caller, and the staging copy), which
        is added to its ``generation_s``. It reaches ``metrics.jsonl`` once the generation is committed, with the
        write's own duration (``checkpoint_write_s``); the checkpoint's history holds it without that field.
        """
        start = time.perf_counter()
        self.wait_for_checkpoint()  # the staging buffers belong to the write in flight until it is done
        tensors = self._staged_tensors()
        state = self.state_document()
        latest_row["checkpoint_s"] = waited + time.perf_counter() - start
        latest_row["generation_s"] = latest_row.get("generation_s", 0.0) + latest_row["checkpoint_s"]
        if tensors is None:  # not the leader: its slots are in the leader's checkpoint
            return
        # Everything the writer reads is fixed here: the loop changes the trainer's fields while it writes.
        generation, protect, row = self.generation, {self.champion_generation}, dict(latest_row)
        keep_last = self.config.checkpoint.keep_last

        def write() -> None:
            started = time.perf_counter()
            history = [*jsonl.read_rows(self.metrics_path), jsonl.finite_or_null(row)]
            # Given the retention, unchanged files are linked only to a generation it deletes right after.
            checkpoint.write_generation(
                self.run_dir,
                generation,
                tensors=tensors,
                documents={"state": state, "history": history},
                keep_last=keep_last,
                protect=protect,
            )
            checkpoint.prune_generations(self.run_dir, keep_last=keep_last, protect=protect)
            # The row reaches metrics.jsonl only once its generation is committed.
            jsonl.append_row(self.metrics_path, {**row, "checkpoint_write_s": time.perf_counter() - started})
            if self.on_checkpoint is not None:
                self.on_checkpoint(generation, protect)

        self._writer.start(write)

    def _load_generator_states(self, states: dict[str, torch.Tensor]) -> None:
        for name in HOST_STREAMS:
            self.generators[name].set_state(states[name])

    def restore(self, generation_files: checkpoint.GenerationFiles | None) -> None:
        """Load a complete generation into this trainer's existing storage.

        With the population sharded, the leader reads and verifies the files (the others pass None), every rank
        receives them (``Ranks.share_tensors``) and keeps its slots: a checkpoint of any number of processes
        resumes with any other.
        """
        tensors: dict[str, dict[str, torch.Tensor]] | None = None

        def read() -> dict[str, Any]:
            nonlocal tensors
            state = checkpoint.read_document(generation_files, "state")
            if state.get("market_fingerprint") != self.fingerprint:
                raise CheckpointError(
                    f"{generation_files.path}: the market data differs from the data this run was trained on"
                )
            suffix = checkpoint.TENSORS_SUFFIX
            ring = [n.removesuffix(suffix) for n in generation_files.manifest["files"] if holds_the_ring(n)]
            groups = ["population", "rng", *ring]
            # A checkpoint of an earlier version has no gate state: its gate starts with no resample crossed.
            if self.gate is not None and "selection" + suffix in generation_files.manifest["files"]:
                groups.append("selection")
            tensors = {name: checkpoint.read_tensors(generation_files, name) for name in groups}
            return {"state": state, "history": checkpoint.read_document(generation_files, "history")}

        documents = self.sharding.ranks.from_leader(read)
        tensors = self.sharding.ranks.share_tensors(tensors)
        state = documents["state"]
        if state.get("market_fingerprint") != self.fingerprint:  # a rank that loaded other data
            raise CheckpointError("the market data differs from the data this run was trained on")
        replay = {name: group for name, group in tensors.items() if holds_the_ring(name)}
        gated = "selection" in tensors  # read only when this run has a gate
        loaders = {
            "population": lambda: self.population.load_state_tensors(tensors["population"]),
            "replay": lambda: self.buffer.load_checkpoint_groups(replay),
            "rng": lambda: self._load_generator_states(tensors["rng"]),
            **({"selection": lambda: self.gate.load_state_tensors(tensors["selection"])} if gated else {}),
        }
        where = generation_files.path if generation_files is not None else Path("the checkpoint")
        for name, load in loaders.items():
            try:
                load()
            except (KeyError, ValueError, RuntimeError) as error:
                raise CheckpointError(f"{where / name}.safetensors does not fit the run's config: {error}") from None
        self.population.actor_optim.steps = int(state["actor_optim_steps"])
        self.population.critic_optim.steps = int(state["critic_optim_steps"])
        self.generation = int(state["generation"])
        score = state["champion_score"]
        self.champion_score = -math.inf if score is None else float(score)
        self.champion_generation = int(state["champion_generation"])
        self.champion_edge = float(state["champion_edge"])
        self.restored_device = state.get("device")  # None in checkpoints of earlier versions
        if self.sharding.is_leader:
            # The metrics file on disk may hold rows past this checkpoint (a crash after the row, before
            # the commit); the checkpoint's own history is the truth.
            rows = b"".join(jsonl.encode_row(row) for row in documents["history"])
            checkpoint.write_file_atomically(self.metrics_path, rows)  # never a half-rebuilt file
