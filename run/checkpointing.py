"""Checkpointing a run's loop: a generation's state staged, written in the background, and read back.

The trainer gives its state as one value (``TrainerState``, from ``Trainer.state``) and takes one back
(``Trainer.load_state_``). A checkpoint of generation g holds that state (the population with its optimiser moments
and exploration scales, the champion, the replay buffer, the host random streams, the selection gate's state) and the
state document (the run's scalars, the config, where the data came from, the device): what each file holds is
``persistence.generation_contents``'.

Saving copies the live tensors into staging buffers allocated once (``persistence.staging``), so the loop can go on
while the writer thread (``persistence.writer``) commits the files; the metrics row reaches ``metrics.jsonl`` only
once its generation is committed. A generation the loop does not checkpoint (``checkpoint.every``) stages nothing:
its row is held until the next checkpoint commits it with its own. With the population sharded over processes,
every rank's slots are gathered into the leader's checkpoint, and on restore the leader reads it and every rank
receives it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch

from config import Config
from environment.market import Market
from models.replay import ReplayState
from persistence import checkpoint, committing, jsonl, run_folder
from persistence.generation_contents import (
    GATE,
    POPULATION,
    STREAMS,
    buffer_from_groups,
    buffer_groups,
    build_state,
    holds_the_buffer,
    read_state,
)
from persistence.provenance import describe_device
from persistence.staging import StagingBuffers
from persistence.writer import CheckpointWriter
from run.streams import HOST_STREAMS
from runtime.sharding import Sharding
from training.selection import ChampionRecord
from utils.errors import CheckpointError

# ---------------------------------------------------------------------------------------------- the trainer's state


class TrainerState(NamedTuple):
    """A trainer's state after a generation, as one value: what its checkpoint holds.

    From ``Trainer.state`` it refers to the live tensors (on the training device, the slots this process holds);
    from ``Checkpointing.restore`` it holds host tensors of the whole population, for ``Trainer.load_state_``.
    """

    generation: int
    champion: ChampionRecord
    population: dict[str, torch.Tensor]
    """Every agent tensor and the champion's, by checkpoint key (``Population.state_tensors``)."""
    optimiser_steps: dict[str, torch.Tensor]
    """Each optimiser's step count (``BatchedAdam.step_count``), by the name the learner gives it."""
    buffer: ReplayState
    streams: dict[str, torch.Tensor]
    """The host random streams' states (``run.streams.HOST_STREAMS``)."""
    gate: dict[str, torch.Tensor] | None
    """The selection gate's state; None for a run without one, or a checkpoint of an earlier version."""
    source: str = "the checkpoint"
    """Where it was read from, for errors."""


class Checkpointing:
    """The checkpoints of one run: ``save`` after a generation (``hold`` after one not checkpointed), ``restore``
    before the first, ``close`` at the end.

    Args:
        run_dir: the local run folder.
        config: the run's config.
        market: the market it trains on (its fingerprint, tickers, dates and splits go into the state document).
        fingerprint: ``persistence.provenance.market_fingerprint`` of ``market``.
        sharding: the slots this process holds; only the leader writes.
        on_checkpoint: called with (generation, generations to protect) after each committed checkpoint, e.g. to
            hand it to the uploader; it must not block. It runs on the writer's thread.
    """

    def __init__(
        self,
        run_dir: Path,
        *,
        config: Config,
        market: Market,
        fingerprint: str,
        sharding: Sharding,
        on_checkpoint: Callable[[int, set[int]], None] | None = None,
    ) -> None:
        self.run_dir, self.config, self.market, self.fingerprint = run_dir, config, market, fingerprint
        self.metrics_path = run_folder.metrics_path(run_dir)
        self.sharding = sharding
        self.on_checkpoint = on_checkpoint
        self.staging = StagingBuffers(market.device)
        self._writer = CheckpointWriter()
        self._gathered: dict[str, torch.Tensor] | None = None  # the leader's whole-population staging
        self.restored_device: dict[str, Any] | None = None  # what the restored checkpoint recorded, if anything
        # Rows of the generations since the last checkpoint (``hold``), at most ``checkpoint.every``: one list.
        self._held: list[dict[str, Any]] = []

    def wait(self) -> float:
        """Block until the checkpoint being written, if any, is committed and its row is in ``metrics.jsonl``;
        seconds waited. Raises the error the write failed with."""
        return self._writer.wait()

    def close(self) -> None:
        """Wait for the checkpoint in flight (raising its error) and end the writer thread; a later checkpoint
        starts a new one."""
        self._writer.close()

    def state_document(self, state: TrainerState, optimiser_steps: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The checkpoint's ``state.json`` for ``state``; ``optimiser_steps``: host copies of its step counts."""
        market = self.market
        return build_state(
            generation=state.generation,
            champion_score=state.champion.score if math.isfinite(state.champion.score) else None,
            champion_generation=state.champion.generation,
            champion_bound=state.champion.bound,
            optimiser_steps={name: int(steps) for name, steps in optimiser_steps.items()},
            market_fingerprint=self.fingerprint,
            tickers=list(market.tickers),
            splits={  # first and last day of each range, as dates
                name: [market.dates[days.start], market.dates[days.stop - 1]]
                for name, days in vars(market.splits).items()
                if len(days)
            },
            config=self.config.to_dict(),
            device=describe_device(market.device),
        )

    @property
    def holding(self) -> bool:
        """Whether the last generation is not checkpointed: its row is held (``hold``)."""
        return bool(self._held)

    def hold(self, latest_row: dict[str, Any]) -> None:
        """Keep this generation's metrics row, of a generation not checkpointed (``checkpoint.every``), for the next
        ``save`` to commit. It gains ``checkpoint_s`` 0: the loop blocked for nothing."""
        latest_row["checkpoint_s"] = 0.0
        self._held.append(dict(latest_row))

    def save(self, state: TrainerState, latest_row: dict[str, Any] | None = None, *, waited: float = 0.0) -> None:
        """Stage ``state`` (``Trainer.state``) and start writing it on the writer thread; returns once the live
        tensors are free to change again.

        ``latest_row`` is this generation's metrics row. It gains ``checkpoint_s``, what the loop blocked for (the
        wait for the write before, ``waited`` seconds of it spent earlier by the caller, and the staging copy), which
        is added to its ``generation_s``. It reaches ``metrics.jsonl`` once the generation is committed, after the
        rows held since the last checkpoint, with the write's own duration (``checkpoint_write_s``; 0 in the held
        rows, whose generations wrote nothing); the checkpoint's history holds them without that field. None: the
        generation's row is the last one held (a stop checkpoints the last complete generation).
        """
        start = time.perf_counter()
        self.wait()  # the staging buffers belong to the write in flight until it is done
        tensors, optimiser_steps = self._staged(state)
        document = self.state_document(state, optimiser_steps)
        if latest_row is not None:
            latest_row["checkpoint_s"] = waited + time.perf_counter() - start
            latest_row["generation_s"] = latest_row.get("generation_s", 0.0) + latest_row["checkpoint_s"]
            self._held.append(dict(latest_row))
        rows, self._held = self._held, []  # the rows this checkpoint commits, in generation order
        if tensors is None:  # not the leader: its slots are in the leader's checkpoint
            return
        # Everything the writer reads is fixed here: the loop goes on changing the live state while it writes.
        generation, protect = state.generation, {state.champion.generation}
        run_dir, metrics_path = self.run_dir, self.metrics_path
        keep_last = self.config.checkpoint.keep_last
        on_checkpoint = self.on_checkpoint

        def write() -> None:
            started = time.perf_counter()
            history = [*jsonl.read_rows(metrics_path), *(jsonl.finite_or_null(row) for row in rows)]
            # Given the retention, unchanged files are linked only to a generation it deletes right after.
            committing.write_generation(
                run_dir,
                generation,
                tensors=tensors,
                documents={"state": document, "history": history},
                keep_last=keep_last,
                protect=protect,
            )
            committing.prune_generations(run_dir, keep_last=keep_last, protect=protect)
            # The rows reach metrics.jsonl only once their generations are committed.
            held = [{**row, "checkpoint_write_s": 0.0} for row in rows[:-1]]
            jsonl.append_rows(metrics_path, [*held, {**rows[-1], "checkpoint_write_s": time.perf_counter() - started}])
            if on_checkpoint is not None:
                on_checkpoint(generation, protect)

        self._writer.start(write)

    def _staged(self, state: TrainerState) -> tuple[dict[str, dict[str, torch.Tensor]] | None, dict[str, torch.Tensor]]:
        """The tensor groups of ``state`` as the checkpoint holds them, copied into the staging buffers (free only
        once no write is in flight), and its optimisers' step counts, staged with them. With the population sharded,
        every rank's slots are gathered into the leader's buffers; the other ranks, which write nothing, get None
        for the groups."""
        sharding = self.sharding
        sources = {POPULATION: state.population, "optimiser_steps": state.optimiser_steps}
        if sharding.is_leader:  # the buffer is the same on every rank: the leader's is written
            sources["replay"] = state.buffer.storage
        staged = self.staging.capture(sources, rows={"replay": state.buffer.size})
        population = staged[POPULATION]
        if sharding.distributed:
            slot_keys = [key for key in population if not key.startswith("champion.")]
            mine = {key: population[key] for key in slot_keys}
            if sharding.is_leader and self._gathered is None:  # allocated once, like the staging buffers
                popsize = self.config.evolution.popsize
                self._gathered = {k: t.new_empty((popsize, *t.shape[1:])) for k, t in mine.items()}
            sharding.gather_to_leader(mine, self._gathered)
            if not sharding.is_leader:
                return None, staged["optimiser_steps"]
            population = {**population, **self._gathered}
        buffer = state.buffer._replace(storage=staged["replay"])
        groups = {
            POPULATION: population,
            **buffer_groups(buffer, capacity=self.config.learner.buffer_size),  # replay, replay-000, ...
            STREAMS: state.streams,  # copies already
            **({} if state.gate is None else {GATE: state.gate}),  # a copy too
        }
        return groups, staged["optimiser_steps"]

    def restore(self, generation_files: checkpoint.GenerationFiles | None, *, gated: bool) -> TrainerState:
        """A complete generation's state, read and verified by the leader (the others pass None) and received by
        every rank: host tensors of the whole population, whatever the number of processes that wrote it. ``gated``:
        the run has a selection gate (a checkpoint of an earlier version has no gate state: the gate then starts
        with no resample crossed). Also rewrites ``metrics.jsonl`` from the checkpoint's history (the leader)."""
        tensors: dict[str, dict[str, torch.Tensor]] | None = None

        def read() -> dict[str, Any]:
            nonlocal tensors
            state = read_state(generation_files)  # checked, and as this version names its keys
            if state.get("market_fingerprint") != self.fingerprint:
                raise CheckpointError(
                    f"{generation_files.path}: the market data differs from the data this run was trained on"
                )
            suffix = checkpoint.TENSORS_SUFFIX
            in_buffer = [n.removesuffix(suffix) for n in generation_files.manifest["files"] if holds_the_buffer(n)]
            groups = [POPULATION, STREAMS, *in_buffer]
            if gated and GATE + suffix in generation_files.manifest["files"]:
                groups.append(GATE)
            tensors = {name: checkpoint.read_tensors(generation_files, name) for name in groups}
            return {"state": state, "history": checkpoint.read_document(generation_files, "history")}

        ranks = self.sharding.ranks
        documents = ranks.from_leader(read)
        tensors = ranks.broadcast_tensors(tensors)
        document = documents["state"]
        if document.get("market_fingerprint") != self.fingerprint:  # a rank that loaded other data
            raise CheckpointError("the market data differs from the data this run was trained on")
        self.restored_device = document.get("device")  # None in checkpoints of earlier versions
        if self.sharding.is_leader:
            # The metrics file on disk may hold rows past this checkpoint (a crash after the row, before the commit);
            # the checkpoint's own history is the truth.
            rows = b"".join(jsonl.encode_row(row) for row in documents["history"])
            committing.write_file_atomically(self.metrics_path, rows)  # never a half-rebuilt file
        source = str(generation_files.path) if generation_files is not None else "the checkpoint"
        try:
            buffer = buffer_from_groups({n: g for n, g in tensors.items() if holds_the_buffer(n)})
        except KeyError as error:
            raise CheckpointError(f"{source}/replay.safetensors does not fit the run's config: {error}") from None
        score = document["champion_score"]
        return TrainerState(
            generation=int(document["generation"]),
            champion=ChampionRecord(
                score=-math.inf if score is None else float(score),
                bound=float(document["champion_bound"]),
                generation=int(document["champion_generation"]),
            ),
            population=tensors[POPULATION],
            optimiser_steps={
                name: torch.tensor(float(steps), dtype=torch.float64)
                for name, steps in document["optimiser_steps"].items()
            },
            buffer=buffer,
            streams={name: tensors[STREAMS][name] for name in HOST_STREAMS if name in tensors[STREAMS]},
            gate=tensors.get(GATE),
            source=source,
        )
