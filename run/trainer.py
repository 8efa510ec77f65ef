"""A run's driver of the generation loop: builds its parts, checkpoints and records each generation, and stops.

``Trainer.run_generation`` is the loop's phases (``training.loop``) and the record: one metrics row and console line
(``run.records``), one checkpoint every ``checkpoint.every`` generations and at the last (``run.checkpointing``).
A stop asked between phases abandons the unfinished generation (``RunStopped``).
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
from run.checkpointing import Checkpointing, TrainerState
from run.parts import build_parts
from run.records import format_line, generation_row
from run.streams import HOST_STREAMS, seed_device_streams
from runtime.sharding import Sharding
from training.loop import GenerationLoop, Outcome
from utils.errors import CheckpointError
from utils.telemetry import Telemetry


class RunStopped(Exception):  # noqa: N818 (a stop, not an error)
    """A stop was requested; ``generation`` is the last complete (checkpointed) generation."""

    def __init__(self, generation: int) -> None:
        super().__init__(f"stopped after generation {generation}")
        self.generation = generation


class Trainer(GenerationLoop):
    """One run's generation loop over the parts ``run.parts`` builds once, checkpointed and recorded.

    Args:
        config: the resolved config.
        market: built from ``config.data`` on the training device.
        run_dir: local run folder (created by the caller; checkpoints and metrics go here).
        log: where the per-generation line goes.
        should_stop: polled at the loop's pause points; once it returns True the unfinished generation is abandoned
            (its checkpoint is never written) and ``run`` raises ``RunStopped``, the last complete generation
            checkpointed. If that one was not (``checkpoint.every``) and the next has begun, its state is gone: the
            next one is finished instead, and checkpointed.
        on_checkpoint: called with (generation, generations to protect) after each committed checkpoint, e.g. to
            hand it to the uploader; it must not block, and runs on the checkpoint writer's thread.
        sharding: the slots this process holds when the population is sharded over processes (``torchrun``); by
            default one process holds them all. Only the leader writes checkpoints and metrics; a stop asked of any
            process stops all of them at the same pause point.
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
        super().__init__(config, market, build_parts(config, market, sharding))
        self.run_dir = Path(run_dir)
        self.log, self.should_stop = log, should_stop
        self.fingerprint = market_fingerprint(market)
        self._until = config.runtime.generations  # the last generation ``run`` makes: always checkpointed
        self.checkpoints = Checkpointing(
            self.run_dir,
            config=config,
            market=market,
            fingerprint=self.fingerprint,
            sharding=self.sharding,
            on_checkpoint=on_checkpoint,
        )
        self._captured = 0  # graphs captured before the current generation (``captures``)
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
        """One generation: its device streams seeded, the loop's phases, then its record (and checkpoint)."""
        self.timer.start()
        seed_device_streams(self.generators, self.config.runtime.seed, generation=self.generation + 1)
        return self._record(self.run_phases())

    def pause_point(self, *, collective: bool) -> None:
        """Abandon the generation if a stop was asked (with several processes and ``collective``, one vote each:
        ``Ranks.any``), unless the one before is not checkpointed (then this one is finished, and ``run``
        checkpoints it before it stops)."""
        if self.checkpoints.holding:
            return
        asked = self.sharding.ranks.any(self.should_stop()) if collective else self.should_stop()
        if asked:
            raise RunStopped(self.generation)

    def _record(self, outcome: Outcome) -> dict[str, Any]:
        """The metrics row, the checkpoint every ``checkpoint.every`` generations and at the last (staged here,
        written by the writer thread, which appends the rows held since the last one to metrics.jsonl once the
        generation is committed), the console line."""
        cfg = self.config
        scores = outcome.scores
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
            champion_edge=float(scores.edges[outcome.champion_slot]),
            elites=[int(i) for i in torch.nonzero(outcome.plan.elite).flatten()],
            losses=outcome.losses,
            loss_names=self.population.learner.losses,
            updates=outcome.updates,
            buffer_size=len(self.buffer),
            env_steps=popsize * cfg.rollout.episodes * cfg.env.episode_days,
            durations=durations,
            telemetry=telemetry,
            graph_captures=self.captures() - self._captured,
        )
        self._captured = self.captures()
        if checkpointed:
            self.checkpoints.save(self.state(), row, waited=waited)
        else:
            self.checkpoints.hold(row)
        self.log(format_line(row, generations=cfg.runtime.generations, buffer_capacity=self.buffer.capacity))
        return row

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
