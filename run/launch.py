"""Runs on disk: start a new one, resume the most recent, or either (a pod's start command).

Which folder, config and generation a run uses is ``persistence.run_folder``'s to decide, with every input checked
before anything is written; here the trainer is built from that decision, on every process of the run, with its
device, market and share of the population (``environment.loading``, ``runtime``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from config import Config, conventions, describe_conventions
from environment.features import WARMUP_DAYS
from environment.loading import load_market
from environment.market import Market
from persistence.provenance import describe_device, device_change_note
from persistence.run_folder import opening
from persistence.run_folder.uploader import CheckpointUploader
from run.sizing import check_memory
from run.trainer import Trainer
from runtime.device import resolve_device
from runtime.sharding import Ranks, Sharding


@dataclasses.dataclass
class Run:
    """A trainer and, for a gs:// location, the background uploader that mirrors its run folder."""

    trainer: Trainer
    config: Config
    uploader: CheckpointUploader | None = None

    def finish(self, *, timeout: float | None = None, progress: bool = True) -> str:
        """Wait for the last checkpoint write, then for the last uploads (at most ``timeout`` seconds), and say what
        reached the bucket. A failed write is raised after the uploads of the generations before it."""
        try:
            self.trainer.checkpoints.close()
        finally:
            summary = self._finish_uploads(timeout=timeout, progress=progress)
        return summary

    def _finish_uploads(self, *, timeout: float | None, progress: bool) -> str:
        if self.uploader is None:
            return ""
        summary = self.uploader.flush(timeout=timeout, progress=progress)
        self.uploader.close()
        return str(summary)


def _run(
    opened: opening.Opened,
    market: Market,
    sharding: Sharding,
    *,
    log: Callable[[str], None],
    should_stop: Callable[[], bool],
) -> Run:
    """The trainer of a run and, for a bucket, the uploader its checkpoints go to as they are committed."""
    config, storage = opened.config, opened.storage
    uploader = None
    if storage is not None:
        uploader = CheckpointUploader(
            storage, opened.run_dir, config.checkpoint.run_name, keep_last=config.checkpoint.keep_last, log=log
        )
    trainer = Trainer(
        config,
        market,
        opened.run_dir,
        log=log,
        should_stop=should_stop,
        on_checkpoint=None if uploader is None else uploader.submit,
        sharding=sharding,
    )
    return Run(trainer, config, uploader)


def start_run(
    config: Config,
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    ranks: Ranks | None = None,
) -> Run:
    """Start a new run (``persistence.run_folder.opening.start`` checks the location and the folder), then create
    its folder and build its trainer. With several processes, the leader checks and decides, and every process
    builds its trainer."""
    ranks = ranks or Ranks()
    opened: opening.Opened | None = None

    def decide() -> dict[str, Any]:
        nonlocal opened
        opened = opening.start(config)
        return opened.shared()

    shared = ranks.from_leader(decide)
    return _begin(opened or opening.Opened.from_shared(shared), log=log, should_stop=should_stop, ranks=ranks)


def resume_or_start(
    config: Config,
    explicit: dict[str, Any],
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    fall_back: bool = False,
    ranks: Ranks | None = None,
) -> Run:
    """Resume the named run if it has a checkpoint, locally or in the bucket; else start it (a pod's start command).
    ``fall_back`` as for ``resume_run``."""
    ranks = ranks or Ranks()
    if ranks.from_leader(lambda: {"resume": opening.holds_checkpoint(config)})["resume"]:
        return resume_run(config, explicit, log=log, should_stop=should_stop, fall_back=fall_back, ranks=ranks)
    return start_run(config, log=log, should_stop=should_stop, ranks=ranks)


def _begin(opened: opening.Opened, *, log: Callable[[str], None], should_stop: Callable[[], bool], ranks: Ranks) -> Run:
    """Load the data, then (the leader) create the run folder, and build the trainer at generation 0."""
    device, market, sharding = _prepare(opened.config, ranks)
    if ranks.is_leader:
        opening.create(opened)
    run = _run(opened, market, sharding, log=log, should_stop=should_stop)
    storage, name = opened.storage, opened.config.checkpoint.run_name
    where = f"{opened.run_dir} (uploading to {storage.uri}/{name})" if storage else str(opened.run_dir)
    log(f"run {where} | {coverage(market)} | device {_describe(device, ranks)}")
    for note in market.notes:  # what the panel became: tickers left out, listing late, delisting, halting
        log(note if note.startswith("universe:") else f"data: {note}")
    log(f"trading: {describe_conventions(conventions(opened.config))}")
    return run


def coverage(market: Market) -> str:
    """The universe a run trades: its assets, days and the fraction of asset-days on which an asset has a price, and
    the dates they span after the features' warm-up."""
    return (
        f"{market.num_assets} assets x {market.num_days} days, {market.tradable_fraction:.1%} of asset-days tradable, "
        f"{market.dates[0]} to {market.dates[-1]} after {WARMUP_DAYS} warm-up days"
    )


def _prepare(config: Config, ranks: Ranks) -> tuple[torch.device, Market, Sharding]:
    """This process's device, the market on it, and its share of the population, each checked."""
    ranks.set_timeout(config.runtime.collective_timeout_s)  # a resumed run's own, if it kept another
    device = resolve_device(config.runtime.device, ranks)
    market = load_market(config, device)
    check_memory(config, market, processes=ranks.world_size)  # this machine may have less than the run's first
    return device, market, Sharding(config.evolution.popsize, ranks, device)


def _describe(device: torch.device, ranks: Ranks) -> str:
    if not ranks.distributed:
        return str(device)
    return f"{device.type} x {ranks.world_size} processes (torch.distributed)"


def resume_run(
    config: Config,
    explicit: dict[str, Any],
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    resume_from: int | None = None,
    fall_back: bool = False,
    ranks: Ranks | None = None,
) -> Run:
    """Continue the most recent (or ``--run-name``) run with its own config, from the generation
    ``persistence.run_folder.opening.resume`` decides (``explicit``, ``resume_from`` and ``fall_back`` as there).

    With several processes, the leader finds the run and reads the checkpoint; each process takes its share,
    whatever the number of processes that wrote it.
    """
    ranks = ranks or Ranks()
    opened: opening.Opened | None = None

    def decide() -> dict[str, Any]:
        nonlocal opened
        opened = opening.resume(config, explicit, resume_from=resume_from, fall_back=fall_back, log=log)
        return opened.shared()

    shared = ranks.from_leader(decide)
    opened = opened or opening.Opened.from_shared(shared)
    if opened.generation is None:  # stopped before its first checkpoint
        return _begin(opened, log=log, should_stop=should_stop, ranks=ranks)
    device, market, sharding = _prepare(opened.config, ranks)
    run = _run(opened, market, sharding, log=log, should_stop=should_stop)
    trainer = run.trainer
    with opened.offering_earlier() if ranks.is_leader else contextlib.nullcontext():
        trainer.load_state_(trainer.checkpoints.restore(opened.files, gated=trainer.gate is not None))
    described = _describe(device, ranks)
    log(f"resumed {opened.run_dir} at generation {trainer.generation} | {coverage(market)} | device {described}")
    log(f"trading: {describe_conventions(conventions(opened.config))}")
    note = device_change_note(trainer.checkpoints.restored_device, describe_device(device))
    if note is not None:
        log(note)
    if run.uploader is not None and opened.upload_first:
        run.uploader.submit(opened.generation, protect={trainer.champion.generation})
    return run


def train_to_end(
    config: Config,
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    on_generation: Callable[[dict[str, Any]], None] | None = None,
) -> Trainer:
    """Train the run ``config.checkpoint.uri / run_name`` to ``runtime.generations``: resume it from its last
    complete generation, or start it (``run.launch.resume_or_start``, as a pod's start command does)."""
    run = resume_or_start(config, {}, log=log, should_stop=should_stop)
    run.trainer.run(until=config.runtime.generations, on_generation=on_generation)
    run.finish()
    return run.trainer
