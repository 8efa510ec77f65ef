"""A run's checkpoint in a bucket, seen from a machine that may have lost its disk.

The bucket holds the same layout as a local run folder (``RUN/config.json``, ``RUN/gen-NNNNNN/...``,
``RUN/LATEST``); the uploader moves ``LATEST`` only after a generation's files and manifest are in
place, so ``LATEST`` always names a complete generation. Only a resume that passes over damaged generations
moves it back (``set_aside_in_bucket``), before anything is uploaded again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from persistence import checkpoint, committing
from persistence.gcs import open_storage
from persistence.run_folder.names import CONFIG_NAME
from persistence.storage import PreconditionFailed, Storage, parse_uri
from utils.errors import CheckpointError


def latest_in_bucket(storage: Storage, run_key: str) -> int | None:
    """The generation ``RUN/LATEST`` names in the bucket, or None if the run has none."""
    try:
        data = storage.read_bytes(f"{run_key}/{checkpoint.LATEST_NAME}")
    except FileNotFoundError:
        return None
    generation = checkpoint.parse_latest(data)
    if generation is None:
        text = data.decode("utf-8", "replace").strip()
        raise CheckpointError(f"{storage.uri}/{run_key}/LATEST does not name a generation: {text[:40]!r}")
    return generation


def most_recent_run(storage: Storage) -> str | None:
    """The run whose ``LATEST`` pointer moved last, or None if the bucket holds no run."""
    pointers = [key for key in storage.list("") if key.count("/") == 1 and key.endswith("/" + checkpoint.LATEST_NAME)]
    dated = []
    for key in pointers:
        info = storage.stat(key)
        if info is not None:
            dated.append((info.updated, key.split("/")[0]))
    return max(dated)[1] if dated else None


def _download_generation(
    storage: Storage, prefix: str, gen_dir: Path, *, skip: Callable[[str], bool] | None = None
) -> list:
    """Download a generation's manifest into ``gen_dir``, then every file it names but those ``skip`` picks (whose
    size in the bucket is checked instead); a file missing in the bucket is left for the verification to report."""
    storage.download_file(f"{prefix}/{checkpoint.MANIFEST_NAME}", gen_dir / checkpoint.MANIFEST_NAME)
    files = checkpoint.read_manifest(gen_dir).manifest["files"]  # validates the names before any download
    for name, entry in files.items():
        if skip is not None and skip(name):
            info = storage.stat(f"{prefix}/{name}")
            if info is None or info.size != entry["size"]:
                raise CheckpointError(f"{storage.uri}/{prefix}: {name} in the bucket does not match its manifest size")
            continue
        with contextlib.suppress(FileNotFoundError):
            storage.download_file(f"{prefix}/{name}", gen_dir / name)
    return [name for name in files if skip is not None and skip(name)]


def pull_config(storage: Storage, run_key: str, local_run_dir: Path) -> None:
    """Download the run's ``config.json`` into ``local_run_dir`` unless it is there already (atomically: a reader
    sees no file or the whole file)."""
    local_run_dir = Path(local_run_dir)
    if (local_run_dir / CONFIG_NAME).exists():
        return
    local_run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):  # a run whose first generation never reached the bucket
        storage.download_file(f"{run_key}/{CONFIG_NAME}", local_run_dir / CONFIG_NAME)


def generation_folders(storage: Storage, run_key: str) -> dict[int, set[str]]:
    """Each canonical ``gen-NNNNNN`` folder of the run in the bucket, with the names of the files in it."""
    folders: dict[int, set[str]] = {}
    for key in storage.list(run_key):
        dirname, _, name = key[len(run_key) + 1 :].partition("/")
        generation = checkpoint.parse_dirname(dirname)
        if generation is not None and name:
            folders.setdefault(generation, set()).add(name)
    return folders


def download_generation(storage: Storage, run_key: str, generation: int, local_run_dir: Path) -> Path:
    """Download one generation into a hidden staging folder beside the run's local folders and verify every hash;
    returns the staging folder, for the caller to rename into place. CheckpointError (nothing left behind) when the
    generation is incomplete in the bucket or does not verify."""
    dirname = checkpoint.generation_dirname(generation)
    prefix = f"{run_key}/{dirname}"
    staging = Path(local_run_dir) / f".{dirname}.download-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        _download_generation(storage, prefix, staging)
        problems = checkpoint.verify_generation(staging)
        if problems:
            raise CheckpointError(f"{storage.uri}/{prefix} does not verify after download: {problems[0]}")
    except FileNotFoundError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise CheckpointError(f"{storage.uri}/{prefix} is incomplete in the bucket: {error}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return staging


def set_aside_in_bucket(
    storage: Storage, run_key: str, damaged: list[int], stamp: str, *, latest: int | None
) -> list[str]:
    """Set the ``damaged`` generations of the bucket aside as ``gen-NNNNNN.damaged-STAMP`` and point ``LATEST`` at
    ``latest`` (when given); returns the new folders' locations.

    A bucket cannot rename: each folder is copied (inside the bucket), then ``LATEST`` is moved, then the originals
    are deleted, the manifest first. A crash part way leaves either ``LATEST`` on the damaged generation (the next
    start sets it aside again) or on ``latest`` with what remains of the originals beyond it, which the uploads of
    the generations written again replace. Retention never reads the new names, so they stay until deleted by hand.
    """
    folders = generation_folders(storage, run_key) if damaged else {}
    moved = []
    for generation in damaged:
        dirname = checkpoint.generation_dirname(generation)
        aside = f"{run_key}/{dirname}.damaged-{stamp}"
        for name in sorted(folders.get(generation, ())):
            storage.copy(f"{run_key}/{dirname}/{name}", f"{aside}/{name}")
        moved.append(f"{storage.uri}/{aside}")
    if latest is not None:
        move_latest_back(storage, run_key, latest)
    for generation in damaged:
        dirname = checkpoint.generation_dirname(generation)
        for name in sorted(folders.get(generation, ()), key=lambda n: n != checkpoint.MANIFEST_NAME):
            storage.delete(f"{run_key}/{dirname}/{name}")
    return moved


def move_latest_back(storage: Storage, run_key: str, generation: int) -> None:
    """Point the bucket's ``LATEST`` at an older ``generation`` (the uploader only ever moves it forward): a
    compare-and-swap, so a pointer another process moved meanwhile is left alone and reported."""
    key = f"{run_key}/{checkpoint.LATEST_NAME}"
    info = storage.stat(key)
    try:
        storage.write_bytes(
            key,
            checkpoint.latest_bytes(generation),
            if_version_match=0 if info is None else info.version,
        )
    except PreconditionFailed:
        raise CheckpointError(
            f"{storage.uri}/{key} changed while this start moved it back: is another process running this run?"
        ) from None


def check_readable(uri: str) -> None:
    """The first request of a reader of the gs:// location ``uri``: list one object under it (``check_read_access``),
    writing nothing. A one-line StorageError naming ``uri`` comes at once for a refused connection, within the
    preflight deadline (15 s) for other failures to reach the bucket, and for a missing bucket or no permission."""
    storage = open_storage(uri)
    try:
        storage.check_read_access()
    finally:
        storage.close()


def fetch_generation(
    uri: str, scratch: Path, *, skip: Callable[[str], bool] | None = None
) -> tuple[Path, tuple[str, ...]]:
    """Mirror ``gs://.../RUN`` (its LATEST generation) or ``gs://.../RUN/gen-NNNNNN`` into ``scratch`` for a
    reader: the run's config.json and the generation but the files ``skip`` picks. Returns the local generation
    folder and the names left in the bucket."""
    _, bucket, prefix = parse_uri(uri)
    parts = [part for part in prefix.split("/") if part]
    generation = checkpoint.parse_dirname(parts[-1]) if parts else None
    if generation is not None:
        parts.pop()
    if not parts:
        raise CheckpointError(f"{uri}: expected gs://BUCKET/.../RUN or gs://BUCKET/.../RUN/gen-NNNNNN")
    run_key = parts[-1]
    check_readable(uri)
    storage = open_storage("gs://" + "/".join([bucket, *parts[:-1]]))
    if generation is None:
        generation = latest_in_bucket(storage, run_key)
        if generation is None:
            raise CheckpointError(f"{uri}: no run with a complete generation there (no LATEST)")
    run_dir = Path(scratch) / run_key
    gen_dir = run_dir / checkpoint.generation_dirname(generation)
    gen_dir.mkdir(parents=True)
    try:
        storage.download_file(f"{run_key}/{CONFIG_NAME}", run_dir / CONFIG_NAME)
        left = _download_generation(storage, f"{run_key}/{gen_dir.name}", gen_dir, skip=skip)
    except FileNotFoundError as error:
        raise CheckpointError(f"{uri}: not a complete checkpoint in the bucket ({error})") from None
    committing.write_latest(run_dir, generation)
    return gen_dir, tuple(left)
