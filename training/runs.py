"""Runs on disk: start a new one, find the most recent, resume it.

Everything that can be wrong with the input (config, data, checkpoint location) is checked before
anything is written.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from config import Config, override
from environment.data import PriceTable, load_prices
from environment.features import build_market
from environment.market import Market
from persistence import checkpoint, remote
from persistence.gcs import open_storage
from persistence.provenance import describe_device, device_change_note
from persistence.state_document import read_state
from persistence.storage import Storage, parse_uri
from persistence.uploader import CheckpointUploader
from training.loop import Trainer
from training.sharding import Ranks, Sharding
from training.sizing import check_memory
from utils.errors import CheckpointError, ConfigError, one_line

RESUMABLE_CHANGES = frozenset(
    {
        "runtime.generations",
        "runtime.device",
        "runtime.progress",
        "runtime.collective_timeout_s",
        "runtime.cuda_graphs",
        "runtime.census_share",
    }
)
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
        run.trainer.checkpoints.on_checkpoint = run.uploader.submit
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
    # A start killed while writing config.json leaves only its temporary: the folder holds nothing yet.
    if run_dir.is_dir() and any(not checkpoint.is_leftover(entry.name) for entry in run_dir.iterdir()):
        if _has_checkpoint(run_dir):
            raise ConfigError(f"run folder {run_dir} already exists; use --resume or another --run-name")
        _refuse_unusable_folders(run_dir)
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
        return {"resume": in_bucket or (run_dir.is_dir() and _has_checkpoint(run_dir))}

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
        (run_dir / "metrics.jsonl").unlink(missing_ok=True)  # rows of an earlier start belong to no checkpoint
        checkpoint.write_file_atomically(run_dir / "config.json", (config.to_json() + "\n").encode())
    trainer = Trainer(config, market, run_dir, log=log, should_stop=should_stop, sharding=sharding)
    name = config.checkpoint.run_name
    where = f"{run_dir} (uploading to {storage.uri}/{name})" if storage else str(run_dir)
    log(f"{verb} {where} | {market.num_assets} assets x {market.num_days} days | device {_describe(device, ranks)}")
    return _attach_uploader(Run(trainer, config), storage, log)


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
    trainer = Trainer(resumed, market, run_dir, log=log, should_stop=should_stop, sharding=sharding)
    with _offering_earlier(run_dir, generation) if ranks.is_leader else contextlib.nullcontext():
        trainer.checkpoints.restore(files)
    log(f"resumed {run_dir} at generation {trainer.generation} | device {_describe(device, ranks)}")
    note = device_change_note(trainer.checkpoints.restored_device, describe_device(device))
    if note is not None:
        log(note)
    run = _attach_uploader(Run(trainer, resumed), storage, log)
    if run.uploader is not None and decided["upload"]:  # the bucket lacks the generation the run continues from
        run.uploader.submit(generation, protect={trainer.champion_generation})
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
    found = _find_generation(run_dir, storage, resume_from)
    if found.generation is None and not found.damaged and resume_from is None:
        # Stopped before its first checkpoint: nothing was lost, so start it again with its own settings.
        saved = _read_config_file(run_dir / "config.json", str(run_dir))
        _check_explicit(saved, explicit, run_dir)
        restarted = override(saved, {k: v for k, v in explicit.items() if k in RESUMABLE_CHANGES})
        log(f"{run_dir} has no complete generation yet: starting it from generation 0")
        return run_dir, storage, None, None, restarted, False
    generation = found.generation
    try:  # every check before anything is set aside or moved
        _refuse_unless_continuable(run_dir, storage, found, resume_from, fall_back)
        with _offering_earlier(run_dir, generation):
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
    _pass_over(run_dir, storage, found, resume_from, log)
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


@dataclasses.dataclass(frozen=True)
class _Damage:
    """A generation folder that cannot be used: ``where`` is its local path or its location in the bucket."""

    generation: int
    where: str
    problem: str
    in_bucket: bool


@dataclasses.dataclass
class _Found:
    """What ``_find_generation`` found: the generation to continue from (None: none), the damaged folders newer than
    it (newest first), the folder the generation was downloaded into (None: it is here) and the bucket's state."""

    generation: int | None = None
    damaged: list[_Damage] = dataclasses.field(default_factory=list)
    staged: Path | None = None
    bucket_latest: int | None = None
    bucket_complete: set[int] = dataclasses.field(default_factory=set)


def _find_generation(run_dir: Path, storage: Storage | None, wanted: int | None) -> _Found:
    """The generation to continue from: ``wanted``, or the newest of those ``LATEST`` names here and in the bucket,
    else the next older one, until one verifies; each is looked for here first, then downloaded from the bucket.

    Every generation folder newer than it that does not verify is damaged: a manifest its files no longer match, or
    no manifest at all (the writer renames a folder into place only with its manifest inside, so it was damaged
    after the fact or copied in part). An intact folder newer than ``LATEST`` (a crash before ``LATEST`` moved) is
    no damage; it is written again. Nothing is changed: a download waits in a staging folder for ``_pass_over``.
    """
    found = _Found()
    local = dict(checkpoint.generation_folders(run_dir))
    if storage is not None:
        found.bucket_latest = remote.latest_in_bucket(storage, run_dir.name)
    if found.bucket_latest is not None:  # folders past the bucket's LATEST are uploads in progress, not candidates
        found.bucket_complete = {
            g
            for g, names in remote.generation_folders(storage, run_dir.name).items()
            if g <= found.bucket_latest and checkpoint.MANIFEST_NAME in names
        }
    pointers = [g for g in (checkpoint.latest_generation(run_dir), found.bucket_latest) if g is not None]
    newest = max(pointers, default=-1)

    def damaged_here(generation: int) -> bool:
        problems = checkpoint.verify_generation(local[generation])
        if problems:
            found.damaged.append(_Damage(generation, str(local[generation]), problems[0], in_bucket=False))
        return bool(problems)

    for generation in sorted((g for g in local if g > newest and g != wanted), reverse=True):
        damaged_here(generation)
    candidates = {g for g in local if g <= newest or g == wanted} | found.bucket_complete
    if found.bucket_latest is not None:
        candidates.add(found.bucket_latest)
    for generation in sorted(candidates, reverse=True):
        if wanted is not None and generation != wanted:
            if generation > wanted and generation in local:
                damaged_here(generation)
            continue
        if generation in local and not damaged_here(generation):
            found.generation = generation
            return found
        if generation in found.bucket_complete or generation == found.bucket_latest:
            try:
                found.staged = remote.download_generation(storage, run_dir.name, generation, run_dir)
            except CheckpointError as error:
                where = f"{storage.uri}/{run_dir.name}/{checkpoint.generation_dirname(generation)}"
                found.damaged.append(_Damage(generation, where, str(error), in_bucket=True))
                found.bucket_complete.discard(generation)
            else:
                found.generation = generation
                return found
    return found


def _refuse_unless_continuable(
    run_dir: Path, storage: Storage | None, found: _Found, wanted: int | None, fall_back: bool
) -> None:
    """A CheckpointError saying what to do when ``found`` names no generation, or passes over damaged folders that
    neither ``--fall-back`` nor ``--resume-from`` allows it to set aside."""
    damaged = found.damaged
    if found.generation is None:
        if wanted is not None:
            if damaged and damaged[-1].generation == wanted:
                earlier = checkpoint.newest_intact(run_dir, before=wanted)
                raise CheckpointError(f"{damaged[-1].problem}; {_offer(earlier)}")
            raise CheckpointError(f"--resume-from {wanted}: {run_dir} has no complete generation {wanted}")
        raise _nothing_intact(run_dir, damaged[0].problem, storage)
    if damaged and wanted is None and not fall_back:
        located = " (in the bucket)" if found.staged is not None else ""
        raise CheckpointError(
            f"{damaged[0].problem}; generation {found.generation} is intact{located}: add --fall-back to continue "
            f"from it with the {len(damaged)} damaged folder(s) set aside (by hand: --resume --resume-from "
            f"{found.generation})"
        )


def _pass_over(
    run_dir: Path, storage: Storage | None, found: _Found, wanted: int | None, log: Callable[[str], None]
) -> None:
    """Set aside the damaged folders ``found`` passes over (here and in the bucket), put a generation downloaded from
    the bucket in place, and point ``LATEST`` at the generation the run continues from (in the bucket: at the newest
    it holds up to that one, when it named a newer one); one line says what was set aside."""
    damaged = found.damaged
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    passed = [
        f"{damage.where} as {checkpoint.set_aside(run_dir, damage.generation, stamp).name} "
        f"({one_line(damage.problem, 160)})"
        for damage in damaged
        if not damage.in_bucket
    ]
    if found.staged is not None:
        found.staged.rename(run_dir / checkpoint.generation_dirname(found.generation))
    if _pointer(run_dir) != found.generation:
        checkpoint.write_latest(run_dir, found.generation)
    if found.bucket_latest is not None and found.bucket_latest > found.generation:
        # The generations written again are uploaded under a LATEST that names none of them: the newest the bucket
        # holds up to the one the run continues from (which resume_run uploads first when the bucket lacks it).
        kept = [g for g in found.bucket_complete if g <= found.generation]
        in_bucket = [damage for damage in damaged if damage.in_bucket]
        moved = remote.set_aside_in_bucket(
            storage,
            run_dir.name,
            [damage.generation for damage in in_bucket],
            stamp,
            latest=max(kept or [found.generation]),
        )
        passed += [
            f"{damage.where} as {aside.rsplit('/', 1)[1]} ({one_line(damage.problem, 160)})"
            for damage, aside in zip(in_bucket, moved)
        ]
    if passed:
        flag = "--resume-from" if wanted is not None else "--fall-back"
        source = " (downloaded from the bucket)" if found.staged is not None else ""
        log(
            f"{flag}: set aside damaged {'; '.join(passed)}; continuing from generation {found.generation}{source}, "
            "the generations after it are written again"
        )


def _pointer(run_dir: Path) -> int | None:
    """The generation the ``LATEST`` file names, complete or not (None: no file, or not a generation)."""
    try:
        return checkpoint.parse_dirname((run_dir / checkpoint.LATEST_NAME).read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        return None


def _offer(earlier: int | None) -> str:
    if earlier is None:
        return "no earlier generation is intact"
    return f"generation {earlier} is intact: continue from it with --resume --resume-from {earlier}"


def _refuse_unusable_folders(run_dir: Path) -> None:
    """A start never writes over a generation folder: in a run folder without a checkpoint, any it finds lost its
    manifest (a partial copy, a wiped disk that kept some files)."""
    folders = checkpoint.generation_folders(run_dir)
    if folders:
        _, oldest = folders[-1]  # the first a start would write over
        raise _nothing_intact(run_dir, (checkpoint.verify_generation(oldest) or [f"{oldest} cannot be used"])[0])


def _nothing_intact(run_dir: Path, problem: str, storage: Storage | None = None) -> CheckpointError:
    if storage is not None:
        return CheckpointError(
            f"{problem}; no generation of the run is intact, here or in {storage.uri}/{run_dir.name}: restore them, "
            "or move the run's gen-* folders out of both places to start it again from generation 0"
        )
    count = len(checkpoint.generation_folders(run_dir))
    return CheckpointError(
        f"{problem}; none of the {count} generation folders of {run_dir} is intact, and a start would write over "
        f"them: restore them, or move them out of {run_dir} to start the run again from generation 0"
    )


@contextlib.contextmanager
def _offering_earlier(run_dir: Path, generation: int) -> Iterator[None]:
    """A CheckpointError raised inside (a checkpoint whose files verify but do not load) gains the newest earlier
    generation whose files all verify."""
    try:
        yield
    except CheckpointError as error:
        raise CheckpointError(f"{error}; {_offer(checkpoint.newest_intact(run_dir, before=generation))}") from None
