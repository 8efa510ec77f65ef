"""The loop's state in a checkpoint: staging it after a generation, writing it in the background, putting it back.

A checkpoint of generation g holds the population (parameters, optimiser moments, exploration scales), the replay
ring, the host random streams, the selection gate's state and the state document (``persistence.state_document``).
Staging copies the live tensors into buffers allocated once (``persistence.staging``) so the loop can go on while
the writer thread commits the files; the metrics row reaches ``metrics.jsonl`` only once its generation is
committed.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from models.replay import holds_the_ring
from persistence import checkpoint, jsonl
from persistence.provenance import describe_device
from persistence.staging import CheckpointWriter, StagingBuffers
from persistence.state_document import build_state
from training.streams import HOST_STREAMS
from utils.errors import CheckpointError

if TYPE_CHECKING:
    from training.loop import Trainer


class LoopCheckpoints:
    """Checkpoints of one trainer: ``save`` after each generation, ``restore`` before the first, ``close`` at the end.

    ``on_checkpoint`` is called with (generation, generations to protect) after each committed checkpoint, e.g. to
    hand it to a background uploader; it must not block. It runs on the writer's thread.
    """

    def __init__(self, trainer: Trainer, on_checkpoint: Any = None) -> None:
        self.trainer = trainer
        self.on_checkpoint = on_checkpoint
        self.staging = StagingBuffers(trainer.device)
        self._writer = CheckpointWriter()
        self._gathered: dict[str, torch.Tensor] | None = None  # the leader's whole-population staging
        self.restored_device: dict[str, Any] | None = None  # what the restored checkpoint recorded, if anything

    def wait(self) -> float:
        """Block until the checkpoint being written, if any, is committed and its row is in ``metrics.jsonl``;
        seconds waited. Raises the error the write failed with."""
        return self._writer.wait()

    def close(self) -> None:
        """Wait for the checkpoint in flight (raising its error) and end the writer thread; a later checkpoint
        starts a new one."""
        self._writer.close()

    def state_document(self, optimiser_steps: dict[str, torch.Tensor]) -> dict[str, Any]:
        """The checkpoint's ``state.json``: the run's scalars, where the data came from, the config and the device.
        ``optimiser_steps``: host copies of the step counts of the ``actor`` and ``critic`` optimisers (``BatchedAdam``
        counts on the device)."""
        trainer = self.trainer
        market = trainer.market
        return build_state(
            generation=trainer.generation,
            champion_score=trainer.champion_score if math.isfinite(trainer.champion_score) else None,
            champion_generation=trainer.champion_generation,
            champion_edge=trainer.champion_edge,
            actor_optim_steps=int(optimiser_steps["actor"]),
            critic_optim_steps=int(optimiser_steps["critic"]),
            replay_pos=trainer.buffer.pos,
            replay_size=trainer.buffer.size,
            market_fingerprint=trainer.fingerprint,
            tickers=list(market.tickers),
            splits={  # first and last day of each range, as dates
                name: [market.dates[days.start], market.dates[days.stop - 1]]
                for name, days in vars(market.splits).items()
                if len(days)
            },
            config=trainer.config.to_dict(),
            device=describe_device(trainer.device),
        )

    def save(self, latest_row: dict[str, Any], *, waited: float = 0.0) -> None:
        """Stage this generation and start writing it on the writer thread; returns once the live tensors are free
        to change again.

        ``latest_row`` is this generation's metrics row. It gains ``checkpoint_s``, what the loop blocked for (the
        wait for the write before, ``waited`` seconds of it spent earlier by the caller, and the staging copy), which
        is added to its ``generation_s``. It reaches ``metrics.jsonl`` once the generation is committed, with the
        write's own duration (``checkpoint_write_s``); the checkpoint's history holds it without that field.
        """
        trainer = self.trainer
        start = time.perf_counter()
        self.wait()  # the staging buffers belong to the write in flight until it is done
        tensors, optimiser_steps = self._staged_tensors()
        state = self.state_document(optimiser_steps)
        latest_row["checkpoint_s"] = waited + time.perf_counter() - start
        latest_row["generation_s"] = latest_row.get("generation_s", 0.0) + latest_row["checkpoint_s"]
        if tensors is None:  # not the leader: its slots are in the leader's checkpoint
            return
        # Everything the writer reads is fixed here: the loop changes the trainer's fields while it writes.
        generation, protect, row = trainer.generation, {trainer.champion_generation}, dict(latest_row)
        run_dir, metrics_path = trainer.run_dir, trainer.metrics_path
        keep_last = trainer.config.checkpoint.keep_last
        on_checkpoint = self.on_checkpoint

        def write() -> None:
            started = time.perf_counter()
            history = [*jsonl.read_rows(metrics_path), jsonl.finite_or_null(row)]
            # Given the retention, unchanged files are linked only to a generation it deletes right after.
            checkpoint.write_generation(
                run_dir,
                generation,
                tensors=tensors,
                documents={"state": state, "history": history},
                keep_last=keep_last,
                protect=protect,
            )
            checkpoint.prune_generations(run_dir, keep_last=keep_last, protect=protect)
            # The row reaches metrics.jsonl only once its generation is committed.
            jsonl.append_row(metrics_path, {**row, "checkpoint_write_s": time.perf_counter() - started})
            if on_checkpoint is not None:
                on_checkpoint(generation, protect)

        self._writer.start(write)

    def _staged_tensors(self) -> tuple[dict[str, dict[str, torch.Tensor]] | None, dict[str, torch.Tensor]]:
        """This generation's tensor groups as the checkpoint holds them, copied out of the live tensors into the
        staging buffers (free only once no write is in flight), and the optimisers' step counts, staged with them.
        With the population sharded, every rank's slots are gathered into the leader's buffers; the other ranks,
        which write nothing, get None for the groups."""
        trainer = self.trainer
        sharding, population, buffer = trainer.sharding, trainer.population, trainer.buffer
        sources = {
            "population": population.state_tensors(),
            "optimiser_steps": {
                "actor": population.actor_optim.step_count,
                "critic": population.critic_optim.step_count,
            },
        }
        if sharding.is_leader:  # the ring is the same on every rank: the leader's is written
            sources["replay"] = buffer.storage
        staged = self.staging.capture(sources, rows={"replay": buffer.size})
        population_tensors = staged["population"]
        if sharding.distributed:
            slot_keys = population.slot_tensors().keys()
            mine = {key: population_tensors[key] for key in slot_keys}
            if sharding.is_leader and self._gathered is None:  # allocated once, like the staging buffers
                popsize = trainer.config.evolution.popsize
                self._gathered = {k: t.new_empty((popsize, *t.shape[1:])) for k, t in mine.items()}
            sharding.gather_to_leader(mine, self._gathered)
            if not sharding.is_leader:
                return None, staged["optimiser_steps"]
            population_tensors = {**population_tensors, **self._gathered}
        groups = {
            "population": population_tensors,
            **buffer.checkpoint_groups(staged["replay"]),  # replay, replay-000, ...
            "rng": {name: trainer.generators[name].get_state() for name in HOST_STREAMS},  # copies already
            **({} if trainer.gate is None else {"selection": trainer.gate.state_tensors()}),  # a copy too
        }
        return groups, staged["optimiser_steps"]

    def restore(self, generation_files: checkpoint.GenerationFiles | None) -> None:
        """Load a complete generation into the trainer's existing storage.

        With the population sharded, the leader reads and verifies the files (the others pass None), every rank
        receives them (``Ranks.share_tensors``) and keeps its slots: a checkpoint of any number of processes
        resumes with any other.
        """
        trainer = self.trainer
        tensors: dict[str, dict[str, torch.Tensor]] | None = None

        def read() -> dict[str, Any]:
            nonlocal tensors
            state = checkpoint.read_document(generation_files, "state")
            if state.get("market_fingerprint") != trainer.fingerprint:
                raise CheckpointError(
                    f"{generation_files.path}: the market data differs from the data this run was trained on"
                )
            suffix = checkpoint.TENSORS_SUFFIX
            ring = [n.removesuffix(suffix) for n in generation_files.manifest["files"] if holds_the_ring(n)]
            groups = ["population", "rng", *ring]
            # A checkpoint of an earlier version has no gate state: its gate starts with no resample crossed.
            if trainer.gate is not None and "selection" + suffix in generation_files.manifest["files"]:
                groups.append("selection")
            tensors = {name: checkpoint.read_tensors(generation_files, name) for name in groups}
            return {"state": state, "history": checkpoint.read_document(generation_files, "history")}

        documents = trainer.sharding.ranks.from_leader(read)
        tensors = trainer.sharding.ranks.share_tensors(tensors)
        state = documents["state"]
        if state.get("market_fingerprint") != trainer.fingerprint:  # a rank that loaded other data
            raise CheckpointError("the market data differs from the data this run was trained on")
        replay = {name: group for name, group in tensors.items() if holds_the_ring(name)}
        gated = "selection" in tensors  # read only when this run has a gate
        loaders = {
            "population": lambda: trainer.population.load_state_tensors(tensors["population"]),
            "replay": lambda: trainer.buffer.load_checkpoint_groups(replay),
            "rng": lambda: _load_generator_states(trainer.generators, tensors["rng"]),
            **({"selection": lambda: trainer.gate.load_state_tensors(tensors["selection"])} if gated else {}),
        }
        where = generation_files.path if generation_files is not None else Path("the checkpoint")
        for name, load in loaders.items():
            try:
                load()
            except (KeyError, ValueError, RuntimeError) as error:
                raise CheckpointError(f"{where / name}.safetensors does not fit the run's config: {error}") from None
        trainer.population.actor_optim.step_count.fill_(int(state["actor_optim_steps"]))
        trainer.population.critic_optim.step_count.fill_(int(state["critic_optim_steps"]))
        trainer.generation = int(state["generation"])
        score = state["champion_score"]
        trainer.champion_score = -math.inf if score is None else float(score)
        trainer.champion_generation = int(state["champion_generation"])
        trainer.champion_edge = float(state["champion_edge"])
        self.restored_device = state.get("device")  # None in checkpoints of earlier versions
        if trainer.sharding.is_leader:
            # The metrics file on disk may hold rows past this checkpoint (a crash after the row, before
            # the commit); the checkpoint's own history is the truth.
            rows = b"".join(jsonl.encode_row(row) for row in documents["history"])
            checkpoint.write_file_atomically(trainer.metrics_path, rows)  # never a half-rebuilt file


def _load_generator_states(generators: dict[str, torch.Generator], states: dict[str, torch.Tensor]) -> None:
    for name in HOST_STREAMS:
        generators[name].set_state(states[name])
