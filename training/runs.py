"""Runs on disk: start a new one, find the most recent, resume it.

Everything that can be wrong with the input (config, data, checkpoint location) is checked before
anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from config import Config, override
from environment.data import PriceTable, load_prices
from environment.features import build_market
from environment.market import Market
from training.sharding import Ranks, Sharding
from training.sizing import check_memory
from training.state_document import read_state
from training.trainer import Trainer, describe_device, device_change_note
from utils import checkpoint, remote
from utils.errors import CheckpointError, ConfigError
from utils.gcs import open_storage
from utils.storage import Storage, parse_uri
from utils.uploader import CheckpointUploader

RESUMABLE_CHANGES = frozenset({"runtime.generations", "runtime.device", "runtime.progress"})
"""Settings a resumed run may change; anything else would alter shapes, data or the random streams."""


def resolve_device(name: str, ranks: Ranks | None = None) -> torch.device:
    """The training device ``runtime.device`` names; with several processes on a GPU pod, each its own GPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("runtime.device is cuda but no CUDA device is available (use --device cpu or auto)")
    if name == "cuda" and ranks is not None and ranks.distributed:
        if ranks.local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"process {ranks.rank} has local rank {ranks.local_rank} but this node has "
                f"{torch.cuda.device_count()} GPUs: start at most one process per GPU"
            )
        torch.cuda.set_device(ranks.local_rank)
        return torch.device("cuda", ranks.local_rank)
    return torch.device(name)


def load_table(config: Config) -> PriceTable:
    """The price table ``config.data`` selects."""
    data = config.data
    return load_prices(
        data.path or None,
        tickers=data.tickers,
        start=data.start,
        end=data.end,
        max_fill_days=data.max_fill_days,
        max_assets=data.max_assets,
    )


def load_market(config: Config, device: torch.device) -> Market:
    data = config.data
    return build_market(
        load_table(config),
        lookback=config.env.lookback,
        episode_days=config.env.episode_days,
        validation_days=data.validation_days,
        holdout_days=data.holdout_days,
        gap_days=data.gap_days,
        device=device,
    )


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
            self.trainer.finish_checkpoints()
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
    for place in (path, *path.parents):
        if place.exists() or place.is_symlink():
            if not place.is_dir():
                raise ConfigError(f"{flag} {path}: {place} is a file, not a folder; choose a folder for the runs")
            break
    return path


def _attach_uploader(run: Run, storage: Storage | None, log: Callable[[str], None]) -> Run:
    if storage is not None:
        run.uploader = CheckpointUploader(
            storage,
            run.trainer.run_dir,
            run.config.checkpoint.run_name,
            keep_last=run.config.checkpoint.keep_last,
            log=log,
        )
        run.trainer.on_checkpoint = run.uploader.submit
    return run


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
    if run_dir.is_dir() and any(run_dir.iterdir()):
        if _has_checkpoint(run_dir):
            raise ConfigError(f"run folder {run_dir} already exists; use --resume or another --run-name")
        _check_same_settings(_read_config_file(run_dir / "config.json", str(run_dir)), config, str(run_dir))
    if storage is not None and remote.latest_in_bucket(storage, name) is not None:
        raise ConfigError(f"{storage.uri}/{name} already exists in the bucket; use --resume or another --run-name")
    if storage is not None:
        try:
            stored = storage.read_bytes(f"{name}/config.json")
        except FileNotFoundError:
            stored = None
        if stored is not None:
            where = f"{storage.uri}/{name}"
            _check_same_settings(_parse_config(stored, f"{where}/config.json"), config, where)
    return config, run_dir, storage


def resume_or_start(
    config: Config,
    explicit: dict[str, Any],
    *,
    log: Callable[[str], None] = print,
    should_stop: Callable[[], bool] = lambda: False,
    ranks: Ranks | None = None,
) -> Run:
    """Resume the named run if it has a checkpoint, locally or in the bucket; else start it (a pod's start command)."""
    ranks = ranks or Ranks()
    if not config.checkpoint.run_name:
        raise ConfigError("--resume-or-start needs --run-name (the run every start of the pod continues)")

    def decide() -> dict[str, bool]:
        root, storage = open_location(config)
        run_dir = root / config.checkpoint.run_name
        in_bucket = storage is not None and remote.latest_in_bucket(storage, config.checkpoint.run_name) is not None
        return {"resume": in_bucket or (run_dir.is_dir() and _has_checkpoint(run_dir))}

    if ranks.from_leader(decide)["resume"]:
        return resume_run(config, explicit, log=log, should_stop=should_stop, ranks=ranks)
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
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # rows of an earlier start belong to no checkpoint
        (run_dir / "config.json").write_text(config.to_json() + "\n")
    trainer = Trainer(config, market, run_dir, log=log, should_stop=should_stop, sharding=sharding)
    name = config.checkpoint.run_name
    where = f"{run_dir} (uploading to {storage.uri}/{name})" if storage else str(run_dir)
    log(f"{verb} {where} | {market.num_assets} assets x {market.num_days} days | device {_describe(device, ranks)}")
    return _attach_uploader(Run(trainer, config), storage, log)


def _prepare(config: Config, ranks: Ranks) -> tuple[torch.device, Market, Sharding]:
    """This process's device, the market on it, and its share of the population, each checked."""
    device = resolve_device(config.runtime.device, ranks)
    market = load_market(config, device)
    check_memory(config, market, processes=ranks.world_size)  # this machine may have less than the run's first
    return device, market, Sharding(config.evolution.popsize, ranks, device)


def _describe(device: torch.device, ranks: Ranks) -> str:
    if not ranks.distributed:
        return str(device)
    return f"{device.type} x {ranks.world_size} processes (torch.distributed)"


def _has_checkpoint(run_dir: Path) -> bool:
    """A complete generation, or a generation folder with a manifest (a damaged one is reported by --resume)."""
    if checkpoint.complete_generations(run_dir):
        return True
    return any((folder / checkpoint.MANIFEST_NAME).exists() for _, folder in checkpoint.generation_folders(run_dir))


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
    before, after = _flat(stored), _flat(wanted)
    for key in sorted(before):
        if key.startswith("checkpoint.") or key in RESUMABLE_CHANGES:
            continue
        if before[key] != after[key]:
            raise ConfigError(
                f"{where} was started with other settings and has no checkpoint yet: {key} is {before[key]!r} there, "
                f"not {after[key]!r}; start it with the same settings or choose another --run-name"
            )


def _flat(config: Config) -> dict[str, Any]:
    return {f"{section}.{key}": value for section, values in config.to_dict().items() for key, value in values.items()}


def find_run(root: Path, run_name: str = "") -> Path:
    """The named run under ``root``, or the one used last: by its newest complete generation, or by its config
    for a run that never completed one."""
    if run_name:
        run_dir = root / run_name
        if run_dir.is_symlink():
            raise CheckpointError(f"{run_dir} is a symbolic link, not a run folder; runs live only in {root}")
        if not (run_dir / "config.json").is_file():
            raise CheckpointError(f"no run named {run_name!r} under {root}")
        return run_dir
    candidates = []
    for run_dir in root.iterdir() if root.is_dir() else []:
        if run_dir.is_symlink() or not (run_dir / "config.json").is_file():
            continue
        generation = checkpoint.latest_generation(run_dir)
        if generation is not None:
            manifest = run_dir / checkpoint.generation_dirname(generation) / "manifest.json"
            candidates.append((manifest.stat().st_mtime, run_dir))
        else:
            candidates.append(((run_dir / "config.json").stat().st_mtime, run_dir))
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
    ranks: Ranks | None = None,
) -> Run:
    """Continue the most recent (or ``--run-name``) run with its own config.

    Args:
        config: the config the command line asked for (only to find the run and to compare).
        explicit: the dotted settings the user gave on the command line; any outside
            ``RESUMABLE_CHANGES`` that differs from the run's config is an error.
        resume_from: a complete generation to continue from instead of the latest.
        ranks: with several processes, the leader finds the run and reads the checkpoint; each process takes its
            share, whatever the number of processes that wrote it.
    """
    ranks = ranks or Ranks()
    storage: Storage | None = None
    files: checkpoint.GenerationFiles | None = None

    def decide() -> dict[str, Any]:
        nonlocal storage, files
        run_dir, storage, generation, files, resumed = _find_checkpoint(config, explicit, resume_from, log)
        return {"run_dir": str(run_dir), "generation": generation, "config": resumed.to_dict()}

    decided = ranks.from_leader(decide)
    run_dir, generation = Path(decided["run_dir"]), decided["generation"]
    resumed = Config.from_dict(decided["config"])
    if generation is None:  # stopped before its first checkpoint
        return _begin(resumed, run_dir, storage, log=log, should_stop=should_stop, verb="run", ranks=ranks)
    device, market, sharding = _prepare(resumed, ranks)
    trainer = Trainer(resumed, market, run_dir, log=log, should_stop=should_stop, sharding=sharding)
    with _offering_earlier(run_dir, generation) if ranks.is_leader else contextlib.nullcontext():
        trainer.restore(files)
    log(f"resumed {run_dir} at generation {trainer.generation} | device {_describe(device, ranks)}")
    note = device_change_note(trainer.restored_device, describe_device(device))
    if note is not None:
        log(note)
    return _attach_uploader(Run(trainer, resumed), storage, log)


def _find_checkpoint(
    config: Config, explicit: dict[str, Any], resume_from: int | None, log: Callable[[str], None]
) -> tuple[Path, Storage | None, int | None, checkpoint.GenerationFiles | None, Config]:
    """The checks of ``resume_run``: the run folder, the bucket, the generation to load (None for a run with no
    checkpoint yet, started again with its own settings), its files and the config to continue with."""
    root, storage = open_location(config)
    if storage is not None:
        name = config.checkpoint.run_name or remote.most_recent_run(storage)
        if name:  # the bucket is the truth for a pod that may have lost its disk
            remote.pull_latest(storage, name, root / name)
        run_dir = find_run(root, name or "")
    else:
        run_dir = find_run(root, config.checkpoint.run_name)
    if resume_from is None and not _has_checkpoint(run_dir):
        # Stopped before its first checkpoint: nothing was lost, so start it again with its own settings.
        saved = _read_config_file(run_dir / "config.json", str(run_dir))
        _check_explicit(saved, explicit, run_dir)
        restarted = override(saved, {k: v for k, v in explicit.items() if k in RESUMABLE_CHANGES})
        log(f"{run_dir} has no complete generation yet: starting it from generation 0")
        return run_dir, storage, None, None, restarted
    generation = _generation_to_resume(run_dir, resume_from)
    with _offering_earlier(run_dir, generation):
        problems = checkpoint.verify_generation(run_dir / checkpoint.generation_dirname(generation))
        if problems:
            raise CheckpointError(problems[0])
        files = checkpoint.open_generation(run_dir, generation)
        state = read_state(files)
        try:  # the config the run had at this generation (an earlier resume may have extended it)
            saved = Config.from_dict(state["config"])
        except (KeyError, TypeError, ConfigError) as error:
            raise CheckpointError(f"{files.path / 'state.json'}: no usable config ({error})") from None
    _check_explicit(saved, explicit, run_dir)
    resumed = override(saved, {k: v for k, v in explicit.items() if k in RESUMABLE_CHANGES})
    return run_dir, storage, generation, files, resumed


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


def _generation_to_resume(run_dir: Path, wanted: int | None) -> int:
    """``wanted``, or the generation ``LATEST`` names, or a newer folder that carries a manifest but
    does not validate. The writer renames a folder into place only with its manifest inside, so such a
    folder was damaged after the fact: it is reported, not skipped."""
    complete = checkpoint.complete_generations(run_dir)
    if wanted is not None:
        if wanted not in complete:
            raise CheckpointError(f"--resume-from {wanted}: {run_dir} has no complete generation {wanted}")
        return wanted
    latest = checkpoint.latest_generation(run_dir)
    for generation, folder in checkpoint.generation_folders(run_dir):
        if latest is not None and generation <= latest:
            break
        if generation not in complete and (folder / checkpoint.MANIFEST_NAME).exists():
            return generation
    if latest is None:
        raise CheckpointError(f"nothing to resume: {run_dir} has no complete generation")
    return latest


@contextlib.contextmanager
def _offering_earlier(run_dir: Path, generation: int) -> Iterator[None]:
    """A CheckpointError raised inside gains the newest earlier generation whose files all verify."""
    try:
        yield
    except CheckpointError as error:
        earlier = checkpoint.newest_intact(run_dir, before=generation)
        offer = "no earlier generation is intact" if earlier is None else f"generation {earlier} is intact"
        offer += f": add --resume-from {earlier}" if earlier is not None else ""
        raise CheckpointError(f"{error}; {offer}") from None
