"""Whether a start or a resume may use a run folder, and from which generation: decided, and every input checked,
before anything is written. A gs:// location's copy in the bucket counts as much as the disk: a pod may have lost
its disk, and the bucket is the truth then."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from config import Config, dotted, override
from persistence import checkpoint, committing
from persistence.gcs import open_storage
from persistence.generation_contents import read_state
from persistence.run_folder import bucket, recovery
from persistence.run_folder.names import CONFIG_NAME, config_path, is_run_folder, metrics_path
from persistence.storage import Storage, parse_uri
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
        "runtime.census_fraction",
        "checkpoint.every",
    }
)
"""Settings a resumed run may change; anything else would alter shapes, data or the random streams."""


@dataclasses.dataclass
class Opened:
    """What a start or a resume decided: the run's config and folder, the bucket that mirrors it, and the
    generation it continues from (None: from generation 0) with that generation's files."""

    config: Config
    run_dir: Path
    storage: Storage | None = None
    generation: int | None = None
    files: checkpoint.GenerationFiles | None = None
    upload_first: bool = False
    """The bucket lacks the generation the run continues from: the uploader sends it before any other."""

    def shared(self) -> dict[str, Any]:
        """What the other processes of the run need (the leader alone reads the files and talks to the bucket)."""
        return {
            "config": self.config.to_dict(),
            "run_dir": str(self.run_dir),
            "generation": self.generation,
            "upload_first": self.upload_first,
        }

    def offering_earlier(self) -> contextlib.AbstractContextManager[None]:
        """Around loading the generation: a CheckpointError raised there (files that verify but do not load) gains
        the newest earlier generation whose files all verify."""
        return recovery.offering_earlier(self.run_dir, self.generation)

    @classmethod
    def from_shared(cls, shared: dict[str, Any]) -> Opened:
        return cls(
            Config.from_dict(shared["config"]),
            Path(shared["run_dir"]),
            generation=shared["generation"],
            upload_first=shared["upload_first"],
        )


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


# ---------------------------------------------------------------------------------------------------------- a start


def start(config: Config) -> Opened:
    """A new run: its name (the time, unless given) and folder, checked here and in the bucket.

    A folder of that name that holds no checkpoint (a run stopped before its first generation was written) is
    reused when it was started with the same settings; anything else there is refused.
    """
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
        _check_same_settings(_read_config_file(config_path(run_dir), str(run_dir)), config, str(run_dir))
    if storage is not None and bucket.latest_in_bucket(storage, name) is not None:
        raise ConfigError(f"{storage.uri}/{name} already exists in the bucket; use --resume or another --run-name")
    if storage is not None:
        try:
            stored = storage.read_bytes(f"{name}/{CONFIG_NAME}")
        except FileNotFoundError:
            stored = None
        if stored is not None:
            where = f"{storage.uri}/{name}"
            _check_same_settings(_parse_config(stored, f"{where}/{CONFIG_NAME}"), config, where)
    return Opened(config, run_dir, storage)


def create(opened: Opened) -> None:
    """Write a started run's folder: its config, and no metrics rows (those of an earlier start belong to no
    checkpoint)."""
    opened.run_dir.mkdir(parents=True, exist_ok=True)
    metrics_path(opened.run_dir).unlink(missing_ok=True)
    committing.write_file_atomically(config_path(opened.run_dir), (opened.config.to_json() + "\n").encode())


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


# --------------------------------------------------------------------------------------------------------- a resume


def holds_checkpoint(config: Config) -> bool:
    """Whether the named run has a checkpoint to resume, here or in the bucket (a pod's start command asks)."""
    if not config.checkpoint.run_name:
        raise ConfigError("--resume-or-start needs --run-name (the run every start of the pod continues)")
    root, storage = open_location(config)
    name = config.checkpoint.run_name
    if storage is not None and bucket.latest_in_bucket(storage, name) is not None:
        return True
    run_dir = root / name
    return run_dir.is_dir() and recovery.has_checkpoint(run_dir)


def find_run(root: Path, run_name: str = "") -> Path:
    """The named run under ``root``, or the one used last: by its newest complete generation, or by its config
    for a run that never completed one."""
    if run_name:
        run_dir = root / run_name
        if run_dir.is_symlink():
            raise CheckpointError(f"{run_dir} is a symbolic link, not a run folder; runs live only in {root}")
        if not is_run_folder(run_dir):
            raise CheckpointError(f"no run named {run_name!r} under {root}")
        return run_dir
    candidates = []
    for run_dir in root.iterdir() if root.is_dir() else []:
        if run_dir.is_symlink() or not is_run_folder(run_dir):
            continue
        generation = checkpoint.latest_generation(run_dir)
        if generation is not None:
            manifest = run_dir / checkpoint.generation_dirname(generation) / checkpoint.MANIFEST_NAME
            candidates.append((manifest.stat().st_mtime, run_dir))
        else:
            candidates.append((config_path(run_dir).stat().st_mtime, run_dir))
    if not candidates:
        raise CheckpointError(f"nothing to resume: no run under {root}")
    return max(candidates)[1]


def resume(
    config: Config,
    explicit: dict[str, Any],
    *,
    resume_from: int | None = None,
    fall_back: bool = False,
    log: Callable[[str], None] = print,
) -> Opened:
    """The most recent (or ``--run-name``) run, with its own config, at the generation it continues from.

    Args:
        config: the config the command line asked for (only to find the run and to compare).
        explicit: the dotted settings the user gave on the command line; any outside
            ``RESUMABLE_CHANGES`` that differs from the run's config is an error.
        resume_from: a complete generation to continue from instead of the latest.
        fall_back: when the newest generation is damaged, continue from the newest intact one instead of refusing.
            Either way, every damaged generation folder newer than the one the run continues from is set aside
            (``gen-NNNNNN.damaged-STAMP``, locally and in the bucket), never deleted or written over, and one line
            says which: the generations after it are written again.

    A run stopped before its first checkpoint is started again with its own settings (``generation`` None).
    Every check comes before anything is set aside or moved.
    """
    root, storage = open_location(config)
    name = config.checkpoint.run_name
    if storage is not None:
        name = name or bucket.most_recent_run(storage) or ""
        if name:  # the bucket is the truth for a pod that may have lost its disk
            bucket.pull_config(storage, name, root / name)
    run_dir = find_run(root, name)
    found = recovery.find_generation(run_dir, storage, resume_from)
    if found.generation is None and not found.damaged and resume_from is None:
        # Stopped before its first checkpoint: nothing was lost, so start it again with its own settings.
        saved = _read_config_file(config_path(run_dir), str(run_dir))
        _check_explicit(saved, explicit, run_dir)
        log(f"{run_dir} has no complete generation yet: starting it from generation 0")
        return Opened(_resumed(saved, explicit), run_dir, storage)
    generation = found.generation
    try:
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
    upload_first = storage is not None and generation not in found.bucket_complete
    return Opened(_resumed(saved, explicit), run_dir, storage, generation, files, upload_first)


def _resumed(saved: Config, explicit: dict[str, Any]) -> Config:
    """The run's own config with the changes a resume may make."""
    return override(saved, {key: value for key, value in explicit.items() if key in RESUMABLE_CHANGES})


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


# ------------------------------------------------------------------------------------------------------ its config


def _read_config_file(path: Path, where: str) -> Config:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{where} exists but holds no run (no {CONFIG_NAME}); choose another --run-name") from None
    except OSError as error:
        raise ConfigError(f"{where}: cannot read {CONFIG_NAME} ({error.strerror})") from None
    return _parse_config(data, str(path))


def _parse_config(data: bytes, where: str) -> Config:
    try:
        return Config.from_dict(json.loads(data))
    except (ValueError, ConfigError) as error:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise CheckpointError(f"{where}: not a usable run config ({str(error)[:200]})") from None
