"""Checkpoints reach the bucket in the background: the trainer writes each generation locally, hands it over, moves on.

The rule, for a trainer that may finish generations faster than they upload:

* two slots, not a list: at most one generation uploading and one waiting. ``submit`` puts a generation in the
  waiting slot and abandons the one it replaces (newest wins: the bucket wants the latest state, not every state).
* a failed upload is retried with backoff (``retry_delay`` doubling up to ``max_retry_delay``) until a newer
  generation waits; then it is abandoned for that one. A generation whose local folder has gone is skipped.
* after each upload, retention keeps in the bucket the newest ``keep_last`` complete generations (at least one), the
  one ``LATEST`` names and those ``submit`` was told to protect (the champion's); the rest older than ``LATEST`` go,
  with the incomplete leftovers of abandoned uploads.

One daemon thread does the uploads; the trainer waits on the network only in ``flush``.

One generation reaches the bucket in the order that keeps the bucket consistent at every moment::

    RUN/config.json                  once per uploader, if the bucket's copy differs
    RUN/gen-NNNNNN/<files>           each hashed first (SHA-256 against the local manifest); skipped if the bucket
                                     already has it with the same size and MD5
    RUN/gen-NNNNNN/manifest.json     the bytes read at the start, so it always describes the files uploaded
    RUN/metrics.jsonl                its committed lines
    RUN/LATEST                       "gen-NNNNNN\\n", a compare-and-swap on the object generation read just before;
                                     never moved backwards (a LATEST naming a newer generation is left alone)

so ``LATEST`` never names a generation whose files are not all there; retention deletes a manifest before its files.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from utils.checkpoint import (
    LATEST_NAME,
    MANIFEST_NAME,
    generation_dirname,
    generations_to_delete,
    parse_dirname,
    parse_manifest,
)
from utils.errors import CheckpointError
from utils.jsonl import committed_length
from utils.storage import PreconditionFailed, Storage, check_key

CONFIG_NAME = "config.json"
METRICS_NAME = "metrics.jsonl"

_HASH_CHUNK = 1024 * 1024
_SMALL_OBJECT = 8 * 1024 * 1024  # up to this, metrics go up from memory in one request
_LATEST_ATTEMPTS = 8
_MAX_ERROR_TEXT = 200
_COUNTERS = (
    "generations_uploaded",
    "generations_abandoned",
    "files_uploaded",
    "files_skipped",
    "bytes_uploaded",
    "failures",
    "generations_deleted",
)


def _describe(err: BaseException) -> str:
    text = " ".join(str(err).split())
    if len(text) > _MAX_ERROR_TEXT:
        text = text[: _MAX_ERROR_TEXT - 3] + "..."
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


@dataclass(frozen=True)
class UploadSummary:
    """What the uploader has done since it was made (counters only).

    Attributes:
        last_uploaded: The newest generation this uploader completed in the bucket (files, manifest, ``LATEST``
            considered), or None.
        pending: The newest generation submitted but not yet in the bucket when ``flush`` returned (it timed out),
            else None.
        generations_uploaded: Generations completed.
        generations_abandoned: Generations given up: replaced in the waiting slot, abandoned after a failure for a
            newer one, or obsolete (their local folder vanished).
        files_uploaded: Files sent.
        files_skipped: Files already in the bucket with the same size and MD5.
        bytes_uploaded: Bytes of the files sent.
        failures: Failed attempts (each retried or abandoned).
        generations_deleted: Generation folders removed from the bucket by retention.
    """

    last_uploaded: int | None
    pending: int | None
    generations_uploaded: int
    generations_abandoned: int
    files_uploaded: int
    files_skipped: int
    bytes_uploaded: int
    failures: int
    generations_deleted: int

    @property
    def complete(self) -> bool:
        """Whether everything submitted had reached the bucket (or been given up) when ``flush`` returned."""
        return self.pending is None

    def __str__(self) -> str:
        newest = "nothing" if self.last_uploaded is None else generation_dirname(self.last_uploaded)
        line = (
            f"uploaded up to {newest} ({self.generations_uploaded} generations, {self.files_uploaded} files, "
            f"{self.bytes_uploaded / 1e6:.1f} MB; {self.failures} failed attempts)"
        )
        if self.pending is not None:
            line += f"; {generation_dirname(self.pending)} not uploaded yet"
        return line


class _Job(NamedTuple):
    generation: int
    protect: frozenset[int]


class _ObsoleteError(Exception):
    """The local generation cannot be uploaded any more (gone or damaged); skip it."""


class _ClosedError(Exception):
    """``close`` was called: stop at the next file boundary."""


class CheckpointUploader:
    """Copies finished local generations of one run to a storage, in a background thread (see the module docstring).

    Args:
        storage: Where the run goes (usually a ``GCSStorage``); keep one per run.
        local_run_dir: The local run directory written by ``utils.checkpoint``.
        run_key: The run's folder in ``storage`` (``"run-20261122-043012"``).
        keep_last: How many complete generations retention keeps in the bucket (at least the newest complete one is
            always kept).
        log: Receives one line per event (uploaded, failed, abandoned); called from the upload thread.
        retry_delay: The first pause after a failed attempt, in seconds; it doubles up to ``max_retry_delay``.
        max_retry_delay: The longest pause between attempts.
    """

    def __init__(
        self,
        storage: Storage,
        local_run_dir: Path,
        run_key: str,
        *,
        keep_last: int,
        log: Callable[[str], None] = print,
        retry_delay: float = 1.0,
        max_retry_delay: float = 60.0,
    ) -> None:
        if type(keep_last) is not int or keep_last < 0:
            raise ValueError(f"keep_last must be a non-negative int, got {keep_last!r}")
        if retry_delay <= 0 or max_retry_delay < retry_delay:
            raise ValueError(f"need 0 < retry_delay <= max_retry_delay, got {retry_delay}, {max_retry_delay}")
        self.storage = storage
        self.local_run_dir = Path(local_run_dir)
        self.run_key = check_key(run_key.strip("/"))
        self.keep_last = keep_last
        self.retry_delay = float(retry_delay)
        self.max_retry_delay = float(max_retry_delay)
        self._log_line = log

        self._cond = threading.Condition()
        # The whole queue: one slot uploading, one waiting; then the upload's progress and fixed counters.
        self._waiting: _Job | None = None
        self._uploading: int | None = None
        self._closed = False
        self._config_sent = False
        self._bytes_total = 0
        self._bytes_done = 0
        self._last_uploaded: int | None = None
        self._counts = dict.fromkeys(_COUNTERS, 0)

        self._thread = threading.Thread(target=self._run, name="checkpoint-uploader", daemon=True)
        self._thread.start()

    # -----------------------------------------------------------------------------------------------------------------
    # The trainer's side

    def submit(self, generation: int, protect: Iterable[int] = ()) -> None:
        """Queue a finished local generation for upload; returns at once.

        Args:
            generation: A generation whose folder ``write_generation`` has completed.
            protect: Generations retention must keep in the bucket after this one is uploaded (the champion's, say).
        """
        generation_dirname(generation)  # validates
        with self._cond:
            if self._closed:
                raise RuntimeError("the checkpoint uploader is closed")
            replaced, self._waiting = self._waiting, _Job(generation, frozenset(protect))
            if replaced is not None:
                self._counts["generations_abandoned"] += 1
            self._cond.notify_all()
        if replaced is not None:
            self._log(
                f"upload: {generation_dirname(replaced.generation)} skipped, "
                f"{generation_dirname(generation)} replaces it in the queue"
            )

    def flush(self, *, timeout: float | None = None, progress: bool = True) -> UploadSummary:
        """Wait until nothing is uploading or waiting (or ``timeout`` seconds pass), with a progress bar over bytes.

        Failures keep being retried meanwhile; with ``timeout=None`` this waits for as long as that takes.

        Returns:
            The summary; its ``pending`` names the generation still on its way if the wait timed out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar: tqdm | None = None
        bar_generation: int | None = None
        try:
            while True:
                with self._cond:
                    busy = self._waiting is not None or self._uploading is not None
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if not busy or (remaining is not None and remaining <= 0) or not self._thread.is_alive():
                        break
                    self._cond.wait(timeout=0.1 if remaining is None else min(0.1, remaining))
                    uploading, total, done = self._uploading, self._bytes_total, self._bytes_done
                if not progress or uploading is None:
                    continue
                if bar is None or bar_generation != uploading:
                    if bar is not None:
                        bar.close()
                    bar = tqdm(
                        total=total,
                        unit="B",
                        unit_scale=True,
                        desc=f"uploading {generation_dirname(uploading)}",
                        leave=False,
                        dynamic_ncols=True,
                        file=sys.stderr,
                    )
                    bar_generation = uploading
                bar.total = max(total, done)
                bar.n = done
                bar.refresh()
        finally:
            if bar is not None:
                bar.close()
        return self.summary()

    def summary(self) -> UploadSummary:
        """The counters now (``pending``: the newest generation waiting or uploading)."""
        with self._cond:
            pending = self._waiting.generation if self._waiting is not None else self._uploading
            return UploadSummary(last_uploaded=self._last_uploaded, pending=pending, **self._counts)

    @property
    def state(self) -> dict[str, int | None]:
        """A flat snapshot for telemetry: generation uploading / waiting / last uploaded, bytes, failures."""
        with self._cond:
            uploading = self._uploading is not None
            return {
                "uploading_generation": self._uploading,
                "waiting_generation": self._waiting.generation if self._waiting is not None else None,
                "last_uploaded_generation": self._last_uploaded,
                "uploading_bytes_done": self._bytes_done if uploading else 0,
                "uploading_bytes_total": self._bytes_total if uploading else 0,
                "generations_uploaded": self._counts["generations_uploaded"],
                "generations_abandoned": self._counts["generations_abandoned"],
                "failures": self._counts["failures"],
            }

    def close(self) -> None:
        """Stop: drop the waiting generation, stop the upload in progress at its next file boundary.

        Call ``flush`` first to finish the uploads. This waits at most a second for the thread; a transfer still
        running after that ends with the process (the thread is a daemon), and the bucket stays consistent.
        """
        with self._cond:
            self._closed = True
            if self._waiting is not None:
                self._counts["generations_abandoned"] += 1
                self._waiting = None
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)

    def __enter__(self) -> CheckpointUploader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -----------------------------------------------------------------------------------------------------------------
    # The upload thread

    def _run(self) -> None:
        while (job := self._take_waiting()) is not None:
            try:
                self._upload_until_done_or_replaced(job)
            finally:
                with self._cond:
                    self._uploading = None
                    self._cond.notify_all()

    def _take_waiting(self) -> _Job | None:
        """Wait for a generation in the waiting slot and move it to the uploading one; None once closed."""
        with self._cond:
            self._cond.wait_for(lambda: self._waiting is not None or self._closed)
            if self._closed:
                return None
            job, self._waiting = self._waiting, None
            self._uploading, self._bytes_total, self._bytes_done = job.generation, 0, 0
            return job

    def _upload_until_done_or_replaced(self, job: _Job) -> None:
        """Upload ``job``, retrying with backoff after failures until a newer generation waits; then retention."""
        name = generation_dirname(job.generation)
        delay = self.retry_delay
        for attempt in itertools.count(1):
            started = time.monotonic()
            try:
                sent, unchanged = self._upload(job)
                break
            except _ClosedError:
                return
            except _ObsoleteError as err:
                self._count(generations_abandoned=1)
                self._log(f"upload: {name} skipped: {err}")
                return
            except Exception as err:  # the network, the service, a local folder rewritten: all worth retrying
                self._count(failures=1)
                self._log(
                    f"upload: {name} failed (attempt {attempt}: {_describe(err)}); "
                    f"retrying in {delay:.1f} s unless a newer generation waits"
                )
                if self._replaced_within(delay, name):
                    return
                delay = min(2 * delay, self.max_retry_delay)
        with self._cond:
            self._last_uploaded = job.generation
            self._counts["generations_uploaded"] += 1
        if attempt > 1:  # routine successes show in the final summary; a recovery is news
            self._log(
                f"upload: {name} reached {self.storage.uri}/{self.run_key} after {attempt - 1} failed attempt(s) "
                f"({sent} files sent, {unchanged} unchanged, {time.monotonic() - started:.1f} s)"
            )
        self._apply_retention(job)

    def _replaced_within(self, seconds: float, name: str) -> bool:
        """Wait up to ``seconds`` for a newer generation or ``close``: True if the failed upload gives way to them."""
        with self._cond:
            self._cond.wait_for(lambda: self._waiting is not None or self._closed, timeout=seconds)
            if self._closed:
                return True
            if self._waiting is None:
                return False
            self._counts["generations_abandoned"] += 1
            newer = self._waiting.generation
        self._log(f"upload: {name} abandoned for {generation_dirname(newer)}")
        return True

    def _count(self, **increments: int) -> None:
        with self._cond:
            for counter, n in increments.items():
                self._counts[counter] += n

    def _log(self, line: str) -> None:
        with contextlib.suppress(Exception):  # a broken log sink must not stop the uploads
            self._log_line(line)

    def _check_closed(self) -> None:
        if self._closed:
            raise _ClosedError

    def _set_done(self, done: int) -> None:
        self._bytes_done = done  # a plain int store; readers take the lock only for a consistent snapshot

    def _read_local_manifest(self, gen_dir: Path) -> tuple[bytes, dict[str, tuple[int, str]]]:
        """The manifest's bytes and ``name -> (size, sha256)``; _ObsoleteError if the folder is gone or damaged."""
        try:
            data = (gen_dir / MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            why = "its local folder no longer exists" if not gen_dir.is_dir() else "its local manifest is missing"
            raise _ObsoleteError(why) from None
        try:
            manifest = parse_manifest(data, gen_dir / MANIFEST_NAME, expected_generation=parse_dirname(gen_dir.name))
        except CheckpointError as err:
            raise _ObsoleteError(f"its local manifest is damaged ({err})") from None
        return data, {name: (entry["size"], entry["sha256"]) for name, entry in manifest["files"].items()}

    def _hash_local(self, gen_dir: Path, manifest: bytes, name: str, size: int, sha256: str) -> str:
        """The MD5 of a local file after checking its size and SHA-256 against the manifest."""
        path = gen_dir / name
        sha, md5, length = hashlib.sha256(), hashlib.md5(), 0
        try:
            with open(path, "rb") as f:
                while chunk := f.read(_HASH_CHUNK):
                    sha.update(chunk)
                    md5.update(chunk)
                    length += len(chunk)
        except FileNotFoundError:
            if not gen_dir.is_dir():
                raise _ObsoleteError("its local folder no longer exists") from None
            raise
        if length != size or sha.hexdigest() != sha256:
            try:
                current = (gen_dir / MANIFEST_NAME).read_bytes()
            except FileNotFoundError:
                current = None
            if current is None and not gen_dir.is_dir():
                raise _ObsoleteError("its local folder no longer exists")
            if current == manifest:
                raise _ObsoleteError(f"local file {path} does not match its manifest (damaged)")
            raise RuntimeError(f"local folder {gen_dir} was rewritten during the upload")
        return md5.hexdigest()

    def _upload(self, job: _Job) -> tuple[int, int]:
        """Upload one generation and move ``LATEST``; returns the numbers of files sent and found unchanged."""
        dirname = generation_dirname(job.generation)
        gen_dir = self.local_run_dir / dirname
        folder = f"{self.run_key}/{dirname}"
        manifest, files = self._read_local_manifest(gen_dir)
        with self._cond:
            self._bytes_total = sum(size for size, _ in files.values()) + len(manifest)
            self._bytes_done = 0
        self._send_config()

        sent = unchanged = 0
        done = 0
        for name, (size, sha256) in sorted(files.items()):
            self._check_closed()
            md5 = self._hash_local(gen_dir, manifest, name, size, sha256)
            key = f"{folder}/{name}"
            remote = self.storage.stat(key)
            if remote is not None and remote.size == size and remote.md5 == md5:
                unchanged += 1
                self._count(files_skipped=1)
            else:
                base = done
                # No read-back: the storage verifies each upload's checksum (utils.gcs).
                self.storage.upload_file(key, gen_dir / name, progress=lambda n, base=base: self._set_done(base + n))
                sent += 1
                self._count(files_uploaded=1, bytes_uploaded=size)
            done += size
            self._set_done(done)

        self._check_closed()
        self.storage.write_bytes(f"{folder}/{MANIFEST_NAME}", manifest)
        self._set_done(done + len(manifest))
        self._send_metrics()
        self._move_latest(job.generation)
        return sent, unchanged

    def _send_config(self) -> None:
        if self._config_sent:
            return
        try:
            data = (self.local_run_dir / CONFIG_NAME).read_bytes()
        except FileNotFoundError:
            return
        key = f"{self.run_key}/{CONFIG_NAME}"
        remote = self.storage.stat(key)
        if remote is None or remote.size != len(data) or remote.md5 != hashlib.md5(data).hexdigest():
            self.storage.write_bytes(key, data)
        self._config_sent = True

    def _send_metrics(self) -> None:
        """Upload the committed lines of ``metrics.jsonl`` (a trailing partial line is being written)."""
        path = self.local_run_dir / METRICS_NAME
        key = f"{self.run_key}/{METRICS_NAME}"
        if not path.is_file():
            return
        with open(path, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            if end <= _SMALL_OBJECT:
                data = f.read(end)
                data = data[: data.rfind(b"\n") + 1]
                if data:
                    self.storage.write_bytes(key, data)
                return
            committed = committed_length(f, end)
            f.seek(0)
            with tempfile.NamedTemporaryFile(prefix="metrics-", suffix=".jsonl") as snapshot:
                left = committed
                while left:
                    chunk = f.read(min(_HASH_CHUNK, left))
                    if not chunk:
                        break
                    snapshot.write(chunk)
                    left -= len(chunk)
                snapshot.flush()
                self.storage.upload_file(key, Path(snapshot.name))

    def _move_latest(self, generation: int) -> int:
        """Point the bucket's LATEST at ``generation`` unless it names a newer one; returns what it names after."""
        key = f"{self.run_key}/{LATEST_NAME}"
        content = f"{generation_dirname(generation)}\n".encode()
        for _ in range(_LATEST_ATTEMPTS):
            info = self.storage.stat(key)
            if info is None:
                expected = 0
            else:
                try:
                    current = parse_dirname(self.storage.read_bytes(key).decode("utf-8", "replace").strip())
                except FileNotFoundError:
                    continue
                if current is not None and current >= generation:
                    if current > generation:
                        self._log(
                            f"upload: the bucket's LATEST names {generation_dirname(current)}, newer than "
                            f"{generation_dirname(generation)}; left as it is"
                        )
                    return current
                expected = info.generation
            try:
                self.storage.write_bytes(key, content, if_generation_match=expected)
            except PreconditionFailed:
                continue  # someone moved it between our read and write: look again
            return generation
        raise RuntimeError(f"{self.storage.uri}/{key} kept changing during {_LATEST_ATTEMPTS} attempts to move it")

    # -----------------------------------------------------------------------------------------------------------------
    # Retention

    def _apply_retention(self, job: _Job) -> None:
        """Delete old generations from the bucket; a failure is logged and left to the next generation's pass."""
        try:
            deleted = self._retain(job)
        except Exception as err:
            self._count(failures=1)
            self._log(f"upload: retention in {self.storage.uri}/{self.run_key} failed ({_describe(err)})")
            return
        self._count(generations_deleted=len(deleted))  # in the summary, not logged: retention is routine

    def _retain(self, job: _Job) -> list[int]:
        try:
            latest = parse_dirname(self.storage.read_bytes(f"{self.run_key}/{LATEST_NAME}").decode().strip())
        except (FileNotFoundError, UnicodeDecodeError):
            latest = None
        if latest is None:
            return []
        folders: dict[int, set[str]] = {}
        for key in self.storage.list(self.run_key):
            dirname, _, name = key[len(self.run_key) + 1 :].partition("/")
            generation = parse_dirname(dirname)
            if generation is not None and name:
                folders.setdefault(generation, set()).add(name)

        # The rule needs only the newest complete generations it may keep: read no more manifests than that.
        newest_complete: list[int] = []
        for generation in sorted((g for g in folders if g <= latest), reverse=True):
            if len(newest_complete) == max(self.keep_last, 1):
                break
            if self._complete_in_bucket(generation, folders[generation]):
                newest_complete.append(generation)
        doomed = generations_to_delete(
            folders, newest_complete, keep_last=self.keep_last, protect={*job.protect, job.generation}, latest=latest
        )

        deleted = []
        for generation in doomed:
            names = folders[generation]
            folder = f"{self.run_key}/{generation_dirname(generation)}"
            # The manifest first: from then on the folder is incomplete, never half-deleted and "complete".
            for name in sorted(names, key=lambda n: n != MANIFEST_NAME):
                self.storage.delete(f"{folder}/{name}")
            deleted.append(generation)
        return deleted

    def _complete_in_bucket(self, generation: int, names: set[str]) -> bool:
        if MANIFEST_NAME not in names:
            return False
        key = f"{self.run_key}/{generation_dirname(generation)}/{MANIFEST_NAME}"
        try:
            manifest = parse_manifest(self.storage.read_bytes(key), key, expected_generation=generation)
        except (FileNotFoundError, CheckpointError):
            return False
        return set(manifest["files"]) <= names
