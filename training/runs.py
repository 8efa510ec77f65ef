"""Runs on disk: start a new one, find the most recent, resume it, or either (a pod's start command).

Everything that can be wrong with the input (config, data, checkpoint location) is checked before anything is
written. Which generation a resumed run continues from, past damaged ones, is ``persistence.recovery``'s to say; the
run's device and market come from ``training.setup``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from config import Config, dotted, override
from environment.market import Market
from persistence import checkpoint, recovery, remote, run_folder
from persistence.gcs import open_storage
from persistence.provenance import describe_device, device_change_note
from persistence.state_document import read_state
from persistence.storage import Storage, parse_uri
from persistence.uploader import CheckpointUploader
from runtime.device import resolve_device
from runtime.sharding import Ranks, Sharding
from training.loop import Trainer
from training.setup import load_market
from training.sizing import check_memory
from utils.errors import CheckpointError, ConfigError
from utils.paths import file_in_the_way

RESUMABLE_CHANGES = frozenset(
    {
        "runtime.generations",
        "runtime.device",
        "runtime.progress",
        "runtime.collective_timeout_s",
        "runtime.cuda_graphs",
        "runtime.torch_compile",
        "runtime.census_share",
    }
)
"""Settings a resumed run may change; anything else would alter shapes, data or the random streams."""


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


def open_location(config: Config) -> tuple[Path, Storage | None]:
    """The local folder that holds run folders, and the bucket behind it for gs:// locations.

    A bucket is checked (exists, credentials, permission) before anything is written.
    """
    scheme, _, path = parse_uri(config.checkpoint.uri)
    if scheme != "gs":
        return _local_folder(Path(path), "--checkpoint-uri"), None
    root = _local_folder(Path(config.checkpoint.local_dir), "--local-dir")
    storage = open_storage(config.checkpoint.uri)
    storage.check_access()
    return root, storage


def _local_folder(path: Path, flag: str) -> Path:
    """``path`` when it is, or can become, a folder: it and every existing parent are folders."""
    place = file_in_the_way(path)
    if place is not None:
        raise ConfigError(f"{flag} {path}: {place} is a file, not a folder; choose a folder for the runs")
    return path


def _run(
    config: Config,
    market: Market,
    run_dir: Path,
    storage: Storage | None,
    sharding: Sharding,
    *,
    log: Callable[[str], None],
    should_stop: Callable[[], bool],
) -> Run:
    """The trainer of a run and, for a bucket, the uploader its checkpoints go to as they are committed."""
    uploader = None
    if storage is not None:
        uploader = CheckpointUploader(
            storage, run_dir, config.checkpoint.run_name, keep_last=config.checkpoint.keep_last, log=log
        )
    trainer = Trainer(
        config,
        market,
        run_dir,
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
    """Check the location and the data, then create the run folder and write its config.

    A folder of that name that holds no checkpoint (a run stopped before its first generation was written) is
    reused when it was started with the same settings; anything else there is refused. With several processes,
    the leader checks and decides, and every process builds its trainer.
    """
    ranks = ranks or Ranks()
    storage: Storage | None = None

    def decide() -> dict[str, Any]:
        nonlocal storage
        named, run_dir, storage = _new_run(config)
        return {"config": named.to_dict(), "run_dir": str(run_dir)}

    decided = ranks.from_leader(decide)
    named = Config.from_dict(decided["config"])
    return _begin(named, Path(decided["run_dir"]), storage, log=log, should_stop=should_stop, verb="run", ranks=ranks)


def _new_run(config: Config) -> tuple[Config, Path, Storage | None]:
    """The checks of ``start_run``; the config with its run name, the run folder and the bucket."""
    root, storage = open_location(config)
    name = config.checkpoint.run_name or datetime.datetime.now().strftime("run-%Y%m%d-%H%M%S")
    config = dataclasses.replace(config, checkpoint=dataclasses.replace(config.checkpoint, run_name=name))
    run_dir = root / name
    if run_dir.is_symlink() or (run_dir.exists() and not run_dir.is_dir()):
        raise ConfigError(f"{run_dir} is not a run folder (a file or a link); choose another --run-name")
    # A start killed while writing config.json leaves only its temporary: the folder holds nothing yet.
    if run_dir.is_dir() and any(not checkpoint.is_leftover(entry.name) for entry in run_dir.iterdir()):
        if recovery.has_checkpoint(run_dir):
            raise ConfigError(f"run folder {run_dir} already exists; use --resume or another --run-name")
        recovery.refuse_unusable_folders(run_dir)
        _check_same_settings(_read_config_file(run_folder.config_path(run_dir), str(run_dir)), config, str(run_dir))
    if storage is not None and remote.latest_in_bucket(storage, name) is not None:
        raise ConfigError(f"{storage.uri}/{name} already exists in the bucket; use --resume or another --run-name")
    if storage is not None:
        try:
            stored = storage.read_bytes(f"{name}/{run_folder.CONFIG_NAME}")
        except FileNotFoundError:
            stored = None
        if stored is not None:
            where = f"{storage.uri}/{name}"
            _check_same_settings(_parse_config(stored, f"{where}/{run_folder.CONFIG_NAME}"), config, where)
    return config, run_dir, storage


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
    if not config.checkpoint.run_name:
        raise ConfigError("--resume-or-start needs --run-name (the run every start of the pod continues)")

    def decide() -> dict[str, bool]:
        root, storage = open_location(config)
        run_dir = root / config.checkpoint.run_name
        in_bucket = storage is not None and remote.latest_in_bucket(storage, config.checkpoint.run_name) is not None
        return {"resume": in_bucket or (run_dir.is_dir() and recovery.has_checkpoint(run_dir))}

    if ranks.from_leader(decide)["resume"]:
        return resume_run(config, explicit, log=log, should_stop=should_stop, fall_back=fall_back, ranks=ranks)
    return start_run(config, log=log, should_stop=should_stop, ranks=ranks)


def _begin(
    config: Config,
    run_dir: Path,
    storage: Storage | None,
    *,
    log: Callable[[str], None],
    should_stop: Callable[[], bool],
    verb: str,
    ranks: Ranks,
) -> Run:
    """Load the data, then (the leader) write the run folder's config, and build the trainer at generation 0."""
    device, market, sharding = _prepare(config, ranks)
    if ranks.is_leader:
        run_dir.mkdir(parents=True, exist_ok=True)
        run_folder.metrics_path(run_dir).unlink(missing_ok=True)  # rows of an earlier start belong to no checkpoint
        checkpoint.write_file_atomically(run_folder.config_path(run_dir), (config.to_json() + "\n").encode())
    run = _run(config, market, run_dir, storage, sharding, log=log, should_stop=should_stop)
    name = config.checkpoint.run_name
    where = f"{run_dir} (uploading to {storage.uri}/{name})" if storage else str(run_dir)
    log(f"{verb} {where} | {market.num_assets} assets x {market.num_days} days | device {_describe(device, ranks)}")
    return run


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


def _read_config_file(path: Path, where: str) -> Config:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where} exists but holds no run (no config.json); choose another --run-name") from None
    except OSError as error:
        raise ConfigError(f"{where}: cannot read config.json ({error.strerror})") from None
    return _parse_config(data, str(path))


def _parse_config(data: bytes, where: str) -> Config:
    try:
        return Config.from_dict(json.loads(data))
    except (ValueError, ConfigError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{where}: not a usable run config ({str(error)[:200]})") from None


def _check_same_settings(stored: Config, wanted: Config, where: str) -> None:
    """A run folder without a checkpoint is reused only by a start with the settings it was created with."""
    before, after = dotted(stored.to_dict()), dotted(wanted.to_dict())
    for key in sorted(before):
        if key.startswith("checkpoint.") or key in RESUMABLE_CHANGES:
            continue
        if before[key] != after[key]:
            raise ConfigError(
                f"{where} was started with other settings and has no checkpoint yet: {key} is {before[key]!r} there, "
                f"not {after[key]!r}; start it with the same settings or choose another --run-name"
            )


def find_run(root: Path, run_name: str = "") -> Path:
    """The named run under ``root``, or the one used last: by its newest complete generation, or by its config
    for a run that never completed one."""
    if run_name:
        run_dir = root / run_name
        if run_dir.is_symlink():
            raise CheckpointError(f"{run_dir} is a symbolic link, not a run folder; runs live only in {root}")
        if not run_folder.is_run_folder(run_dir):
            raise CheckpointError(f"no run named {run_name!r} under {root}")
        return run_dir
    candidates = []
    for run_dir in root.iterdir() if root.is_dir() else []:
        if run_dir.is_symlink() or not run_folder.is_run_folder(run_dir):
            continue
        generation = checkpoint.latest_generation(run_dir)
        if generation is not None:
            manifest = run_dir / checkpoint.generation_dirname(generation) / "manifest.json"
            candidates.append((manifest.stat().st_mtime, run_dir))
        else:
            candidates.append((run_folder.config_path(run_dir).stat().st_mtime, run_dir))
    if not candidates:
        raise CheckpointError(f"nothing to resume: no run under {root}")
    return max(candidates)[1]


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
    """Continue the most recent (or ``--run-name``) run with its own config.

    Args:
        config: the config the command line asked for (only to find the run and to compare).
        explicit: the dotted settings the user gave on the command line; any outside
            ``RESUMABLE_CHANGES`` that differs from the run's config is an error.
        resume_from: a complete generation to continue from instead of the latest.
        fall_back: when the newest generation is damaged, continue from the newest intact one instead of refusing.
            Either way, every damaged generation folder newer than the one the run continues from is set aside
            (``gen-NNNNNN.damaged-STAMP``, locally and in the bucket), never deleted or written over, and one line
            says which: the generations after it are written again.
        ranks: with several processes, the leader finds the run and reads the checkpoint; each process takes its
            share, whatever the number of processes that wrote it.
    """
    ranks = ranks or Ranks()
    storage: Storage | None = None
    files: checkpoint.GenerationFiles | None = None

    def decide() -> dict[str, Any]:
        nonlocal storage, files
        run_dir, storage, generation, files, resumed, upload = _find_checkpoint(
            config, explicit, resume_from, fall_back, log
        )
        return {"run_dir": str(run_dir), "generation": generation, "config": resumed.to_dict(), "upload": upload}

    decided = ranks.from_leader(decide)
    run_dir, generation = Path(decided["run_dir"]), decided["generation"]
    resumed = Config.from_dict(decided["config"])
    if generation is None:  # stopped before its first checkpoint
        return _begin(resumed, run_dir, storage, log=log, should_stop=should_stop, verb="run", ranks=ranks)
    device, market, sharding = _prepare(resumed, ranks)
    run = _run(resumed, market, run_dir, storage, sharding, log=log, should_stop=should_stop)
    trainer = run.trainer
    with recovery.offering_earlier(run_dir, generation) if ranks.is_leader else contextlib.nullcontext():
        trainer.load_state_(trainer.checkpoints.restore(files, gated=trainer.gate is not None))
    log(f"resumed {run_dir} at generation {trainer.generation} | device {_describe(device, ranks)}")
    note = device_change_note(trainer.checkpoints.restored_device, describe_device(device))
    if note is not None:
        log(note)
    if run.uploader is not None and decided["upload"]:  # the bucket lacks the generation the run continues from
        run.uploader.submit(generation, protect={trainer.champion.generation})
    return run


def _find_checkpoint(
    config: Config, explicit: dict[str, Any], resume_from: int | None, fall_back: bool, log: Callable[[str], None]
) -> tuple[Path, Storage | None, int | None, checkpoint.GenerationFiles | None, Config, bool]:
    """The checks of ``resume_run``: the run folder, the bucket, the generation to load (None for a run with no
    checkpoint yet, started again with its own settings), its files, the config to continue with, and whether the
    bucket lacks that generation."""
    root, storage = open_location(config)
    name = config.checkpoint.run_name
    if storage is not None:
        name = name or remote.most_recent_run(storage) or ""
        if name:  # the bucket is the truth for a pod that may have lost its disk
            remote.pull_config(storage, name, root / name)
    run_dir = find_run(root, name)
    found = recovery.find_generation(run_dir, storage, resume_from)
    if found.generation is None and not found.damaged and resume_from is None:
        # Stopped before its first checkpoint: nothing was lost, so start it again with its own settings.
        saved = _read_config_file(run_folder.config_path(run_dir), str(run_dir))
        _check_explicit(saved, explicit, run_dir)
        restarted = override(saved, {k: v for k, v in explicit.items() if k in RESUMABLE_CHANGES})
        log(f"{run_dir} has no complete generation yet: starting it from generation 0")
        return run_dir, storage, None, None, restarted, False
    generation = found.generation
    try:  # every check before anything is set aside or moved
        recovery.refuse_unless_continuable(run_dir, storage, found, resume_from, fall_back)
        with recovery.offering_earlier(run_dir, generation):
            files = checkpoint.open_generation(found.staged or run_dir / checkpoint.generation_dirname(generation))
            state = read_state(files)
            try:  # the config the run had at this generation (an earlier resume may have extended it)
                saved = Config.from_dict(state["config"])
            except (KeyError, TypeError, ConfigError) as error:
                raise CheckpointError(f"{files.path / 'state.json'}: no usable config ({error})") from None
        _check_explicit(saved, explicit, run_dir)
    except BaseException:
        if found.staged is not None:
            shutil.rmtree(found.staged, ignore_errors=True)
        raise
    recovery.pass_over(run_dir, storage, found, resume_from, log)
    files = checkpoint.open_generation(run_dir, generation)  # in its place now
    resumed = override(saved, {k: v for k, v in explicit.items() if k in RESUMABLE_CHANGES})
    return run_dir, storage, generation, files, resumed, storage is not None and generation not in found.bucket_complete


def _check_explicit(saved: Config, explicit: dict[str, Any], run_dir: Path) -> None:
    """Settings the user named must agree with the run's, except those a resumed run may change."""
    for key, value in explicit.items():
        section, _, name = key.partition(".")
        if section == "checkpoint" or key in RESUMABLE_CHANGES:
            continue
        before = getattr(getattr(saved, section), name)
        if before != value:
            raise ConfigError(
                f"--resume keeps the run's settings: {key} is {before!r} in {run_dir.name}, not {value!r}"
            )


def train_to_end(
    config: Config,
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    on_generation: Callable[[dict[str, Any]], None] | None = None,
) -> Trainer:
    """Train the run ``config.checkpoint.uri / run_name`` to ``runtime.generations``: resume it from its last
    complete generation, or start it (``training.runs.resume_or_start``, as a pod's start command does)."""
    run = resume_or_start(config, {}, log=log, should_stop=should_stop)
    run.trainer.run(until=config.runtime.generations, on_generation=on_generation)
    run.finish()
    return run.trainer
