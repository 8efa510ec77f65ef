"""Recovering a run from damaged checkpoints: which generation it continues from, locally or in the bucket, and
the damaged generation folders it passes over, set aside (``gen-NNNNNN.damaged-STAMP``) and never deleted.

A pod can die in the middle of any write, and a disk or a bucket can damage a file after the fact. Every generation
folder holds a manifest with each file's size and SHA-256, so a folder either verifies or is damaged; ``--resume``
refuses a damaged newest generation with what to do, and ``--fall-back`` (or ``--resume-from``) continues from the
newest intact one, here or downloaded from the bucket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
from collections.abc import Callable, Iterator
from pathlib import Path

from persistence import checkpoint, committing
from persistence.run_folder import bucket
from persistence.storage import Storage
from utils.errors import CheckpointError, one_line


@dataclasses.dataclass(frozen=True)
class Damage:
    """A generation folder that cannot be used: ``where`` is its local path or its location in the bucket."""

    generation: int
    where: str
    problem: str
    in_bucket: bool


@dataclasses.dataclass
class Found:
    """What ``find_generation`` found: the generation to continue from (None: none), the damaged folders newer than
    it (newest first), the folder the generation was downloaded into (None: it is here) and the bucket's state."""

    generation: int | None = None
    damaged: list[Damage] = dataclasses.field(default_factory=list)
    staged: Path | None = None
    bucket_latest: int | None = None
    bucket_complete: set[int] = dataclasses.field(default_factory=set)


def find_generation(run_dir: Path, storage: Storage | None, wanted: int | None) -> Found:
    """The generation to continue from: ``wanted``, or the newest of those ``LATEST`` names here and in the bucket,
    else the next older one, until one verifies; each is looked for here first, then downloaded from the bucket.

    Every generation folder newer than it that does not verify is damaged: a manifest its files no longer match, or
    no manifest at all (the writer renames a folder into place only with its manifest inside, so it was damaged
    after the fact or copied in part). An intact folder newer than ``LATEST`` (a crash before ``LATEST`` moved) is
    no damage; it is written again. Nothing is changed: a download waits in a staging folder for ``pass_over``.
    """
    found = Found()
    local = dict(checkpoint.generation_folders(run_dir))
    if storage is not None:
        found.bucket_latest = bucket.latest_in_bucket(storage, run_dir.name)
    if found.bucket_latest is not None:  # folders past the bucket's LATEST are uploads in progress, not candidates
        found.bucket_complete = {
            g
            for g, names in bucket.generation_folders(storage, run_dir.name).items()
            if g <= found.bucket_latest and checkpoint.MANIFEST_NAME in names
        }
    pointers = [g for g in (checkpoint.latest_generation(run_dir), found.bucket_latest) if g is not None]
    newest = max(pointers, default=-1)

    def damaged_here(generation: int) -> bool:
        problems = checkpoint.verify_generation(local[generation])
        if problems:
            found.damaged.append(Damage(generation, str(local[generation]), problems[0], in_bucket=False))
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
                found.staged = bucket.download_generation(storage, run_dir.name, generation, run_dir)
            except CheckpointError as error:
                where = f"{storage.uri}/{run_dir.name}/{checkpoint.generation_dirname(generation)}"
                found.damaged.append(Damage(generation, where, str(error), in_bucket=True))
                found.bucket_complete.discard(generation)
            else:
                found.generation = generation
                return found
    return found


def refuse_unless_continuable(
    run_dir: Path, storage: Storage | None, found: Found, wanted: int | None, fall_back: bool
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
        raise nothing_intact(run_dir, damaged[0].problem, storage)
    if damaged and wanted is None and not fall_back:
        located = " (in the bucket)" if found.staged is not None else ""
        raise CheckpointError(
            f"{damaged[0].problem}; generation {found.generation} is intact{located}: add --fall-back to continue "
            f"from it with the {len(damaged)} damaged folder(s) set aside (by hand: --resume --resume-from "
            f"{found.generation})"
        )


def pass_over(
    run_dir: Path, storage: Storage | None, found: Found, wanted: int | None, log: Callable[[str], None]
) -> None:
    """Set aside the damaged folders ``found`` passes over (here and in the bucket), put a generation downloaded from
    the bucket in place, and point ``LATEST`` at the generation the run continues from (in the bucket: at the newest
    it holds up to that one, when it named a newer one); one line says what was set aside."""
    damaged = found.damaged
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    passed = [
        f"{damage.where} as {committing.set_aside(run_dir, damage.generation, stamp).name} "
        f"({one_line(damage.problem, 160)})"
        for damage in damaged
        if not damage.in_bucket
    ]
    if found.staged is not None:
        found.staged.rename(run_dir / checkpoint.generation_dirname(found.generation))
    if _pointer(run_dir) != found.generation:
        committing.write_latest(run_dir, found.generation)
    if found.bucket_latest is not None and found.bucket_latest > found.generation:
        # The generations written again are uploaded under a LATEST that names none of them: the newest the bucket
        # holds up to the one the run continues from (which resume_run uploads first when the bucket lacks it).
        kept = [g for g in found.bucket_complete if g <= found.generation]
        in_bucket = [damage for damage in damaged if damage.in_bucket]
        moved = bucket.set_aside_in_bucket(
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
    return checkpoint.read_latest(run_dir)


def _offer(earlier: int | None) -> str:
    if earlier is None:
        return "no earlier generation is intact"
    return f"generation {earlier} is intact: continue from it with --resume --resume-from {earlier}"


def refuse_unusable_folders(run_dir: Path) -> None:
    """A start never writes over a generation folder: in a run folder without a checkpoint, any it finds lost its
    manifest (a partial copy, a wiped disk that kept some files)."""
    folders = checkpoint.generation_folders(run_dir)
    if folders:
        _, oldest = folders[-1]  # the first a start would write over
        raise nothing_intact(run_dir, (checkpoint.verify_generation(oldest) or [f"{oldest} cannot be used"])[0])


def nothing_intact(run_dir: Path, problem: str, storage: Storage | None = None) -> CheckpointError:
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
def offering_earlier(run_dir: Path, generation: int) -> Iterator[None]:
    """A CheckpointError raised inside (a checkpoint whose files verify but do not load) gains the newest earlier
    generation whose files all verify."""
    try:
        yield
    except CheckpointError as error:
        raise CheckpointError(f"{error}; {_offer(checkpoint.newest_intact(run_dir, before=generation))}") from None


def has_checkpoint(run_dir: Path) -> bool:
    """A complete generation, or a generation folder with a manifest (a damaged one is reported by --resume)."""
    if checkpoint.complete_generations(run_dir):
        return True
    return any((folder / checkpoint.MANIFEST_NAME).exists() for _, folder in checkpoint.generation_folders(run_dir))
