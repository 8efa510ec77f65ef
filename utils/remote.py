"""A run's checkpoint in a bucket, seen from a machine that may have lost its disk.

The bucket holds the same layout as a local run folder (``RUN/config.json``, ``RUN/gen-NNNNNN/...``,
``RUN/LATEST``); the uploader moves ``LATEST`` only after a generation's files and manifest are in
place, so ``LATEST`` always names a complete generation.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from utils import checkpoint
from utils.errors import CheckpointError
from utils.gcs import open_storage
from utils.storage import Storage, parse_uri


def latest_in_bucket(storage: Storage, run_key: str) -> int | None:
    """The generation ``RUN/LATEST`` names in the bucket, or None if the run has none."""
    try:
        text = storage.read_bytes(f"{run_key}/{checkpoint.LATEST_NAME}").decode("utf-8", "replace").strip()
    except FileNotFoundError:
        return None
    generation = checkpoint.parse_dirname(text)
    if generation is None:
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


def pull_latest(storage: Storage, run_key: str, local_run_dir: Path, *, generation: int | None = None) -> int | None:
    """Make ``local_run_dir`` hold the bucket's newest complete generation of ``run_key`` (or ``generation``),
    unless the local copy already has it or a newer one; returns the generation now there (None: neither side has
    one). Files are downloaded beside the run folder and verified before the generation appears locally."""
    local_run_dir = Path(local_run_dir)
    remote = generation if generation is not None else latest_in_bucket(storage, run_key)
    local = checkpoint.latest_generation(local_run_dir)
    if remote is None or (local is not None and local >= remote):
        return local
    local_run_dir.mkdir(parents=True, exist_ok=True)
    dirname = checkpoint.generation_dirname(remote)
    prefix = f"{run_key}/{dirname}"
    staging = local_run_dir / f".{dirname}.download-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        if not (local_run_dir / "config.json").exists():
            storage.download_file(f"{run_key}/config.json", local_run_dir / "config.json")
        _download_generation(storage, prefix, staging)
        problems = checkpoint.verify_generation(staging)
        if problems:
            raise CheckpointError(f"{storage.uri}/{prefix} does not verify after download: {problems[0]}")
        final = local_run_dir / dirname
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
    except FileNotFoundError as error:
        raise CheckpointError(f"{storage.uri}/{prefix} is incomplete in the bucket: {error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    checkpoint.write_latest(local_run_dir, remote)
    return remote


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
    storage = open_storage("gs://" + "/".join([bucket, *parts[:-1]]))
    storage.check_access()
    if generation is None:
        generation = latest_in_bucket(storage, run_key)
        if generation is None:
            raise CheckpointError(f"{uri}: no run with a complete generation there (no LATEST)")
    run_dir = Path(scratch) / run_key
    gen_dir = run_dir / checkpoint.generation_dirname(generation)
    gen_dir.mkdir(parents=True)
    try:
        storage.download_file(f"{run_key}/config.json", run_dir / "config.json")
        left = _download_generation(storage, f"{run_key}/{gen_dir.name}", gen_dir, skip=skip)
    except FileNotFoundError as error:
        raise CheckpointError(f"{uri}: not a complete checkpoint in the bucket ({error})") from None
    checkpoint.write_latest(run_dir, generation)
    return gen_dir, tuple(left)
