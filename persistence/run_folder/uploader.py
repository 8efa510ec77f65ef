"""Checkpoints reach the bucket in the background: the trainer writes each generation locally, hands it over, moves on.

Two places, not a list: at most one generation uploading and one waiting; ``submit`` replaces the waiting one (the
bucket wants the latest state, not every state). A failed upload is retried with backoff (``retry_delay`` doubling
up to ``max_retry_delay``) until a newer generation waits, then abandoned for it. After each upload, retention keeps
in the bucket the newest ``keep_last`` complete generations (at least one), the one ``LATEST`` names and the
protected ones (the champion's); it deletes the rest older than ``LATEST``, leftovers of abandoned uploads included.
One daemon thread does the uploads; the trainer waits on the network only in ``flush``.

A generation reaches the bucket in the order that keeps the bucket consistent at every moment::

    RUN/config.json                  once per uploader, if the bucket's copy differs
    RUN/gen-NNNNNN/<files>           each checked against the local manifest first; skipped if the bucket already
                                     has it with the same size and MD5, copied inside the bucket if the generation
                                     uploaded before has the same bytes, else sent
    RUN/gen-NNNNNN/manifest.json     the bytes read at the start, so it always describes the files uploaded
    RUN/metrics.jsonl                its committed lines
    RUN/LATEST                       "gen-NNNNNN\\n", a compare-and-swap, never moved backwards

so ``LATEST`` never names a generation whose files are not all there; retention deletes a manifest before its files.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from persistence.checkpoint import (
    LATEST_NAME,
    MANIFEST_NAME,
    file_digests,
    generation_dirname,
    latest_bytes,
    parse_dirname,
    parse_latest,
    parse_manifest,
)
from persistence.committing import generations_to_delete
from persistence.jsonl import committed_length
from persistence.run_folder.names import CONFIG_NAME, METRICS_NAME
from persistence.storage import PreconditionFailed, Storage, check_key
from utils.errors import CheckpointError, one_line

_LATEST_ATTEMPTS = 8


def _describe(err: BaseException) -> str:
    text = one_line(err, 200)
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


@dataclass(frozen=True)
class UploadSummary:
    """What the uploader has done since it was made.

    ``last_uploaded`` is the newest generation completed in the bucket, ``pending`` the newest one submitted but not
    there yet when ``flush`` returned (it timed out). ``generations_abandoned`` counts those replaced while waiting,
    given up after a failure for a newer one, or whose local folder vanished; ``files_skipped`` those already in the
    bucket with the same size and MD5; ``files_copied`` those copied inside the bucket from the generation uploaded
    before, whose file has the same bytes (the replay buffer's unchanged segments); ``failures`` the failed attempts;
    ``generations_deleted`` retention's work.
    """

    last_uploaded: int | None
    pending: int | None
    generations_uploaded: int
    generations_abandoned: int
    files_uploaded: int
    files_skipped: int
    files_copied: int
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
            f"{self.bytes_uploaded / 1e6:.1f} MB, {self.files_copied} copied in the bucket; {self.failures} failed "
            "attempts)"
        )
        if self.pending is not None:
            line += f"; {generation_dirname(self.pending)} not uploaded yet"
        return line


_COUNTERS = [field.name for field in fields(UploadSummary)][2:]  # after last_uploaded and pending


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
        run_key: The run's folder in ``storage`` (``"run-20261122-043012"``).
        log: Receives one line per event (failed, recovered, abandoned); called from the upload thread.
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
        # The whole queue: one generation uploading, one waiting; then the upload's progress and fixed counters.
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
        """Queue a generation whose local folder is complete; returns at once. Retention will keep ``protect``."""
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

        Failures keep being retried meanwhile; the summary's ``pending`` names what is left if the wait timed out.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        bar: tqdm | None = None
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
                desc = f"uploading {generation_dirname(uploading)}"
                if bar is None or bar.desc != desc:
                    if bar is not None:
                        bar.close()
                    bar = tqdm(desc=desc, unit="B", unit_scale=True, leave=False, dynamic_ncols=True, file=sys.stderr)
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
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._waiting is not None or self._closed)
                if self._closed:
                    return
                job, self._waiting = self._waiting, None
                self._uploading, self._bytes_total, self._bytes_done = job.generation, 0, 0
            try:
                self._upload_until_done_or_replaced(job)
            finally:
                with self._cond:
                    self._uploading = None
                    self._cond.notify_all()

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
        try:
            deleted = self._retain(job)
        except Exception as err:  # left to the next generation's pass
            self._count(failures=1)
            self._log(f"upload: retention in {self.storage.uri}/{self.run_key} failed ({_describe(err)})")
        else:
            self._count(generations_deleted=len(deleted))  # in the summary, not logged: retention is routine

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

    def _set_done(self, done: int) -> None:
        self._bytes_done = done  # a plain int store; readers take the lock only for a consistent snapshot

    def _local_md5(self, gen_dir: Path, manifest: bytes, name: str, size: int, sha256: str) -> str:
        """The MD5 of a local file, after checking its size and SHA-256 against the manifest read at the start."""
        with contextlib.suppress(FileNotFoundError):
            found_size, (found_sha256, md5) = file_digests(gen_dir / name, "sha256", "md5")
            if (found_size, found_sha256) == (size, sha256):
                return md5
        try:
            current = (gen_dir / MANIFEST_NAME).read_bytes()
        except FileNotFoundError:
            raise _ObsoleteError("its local folder or manifest is gone") from None
        if current == manifest:
            raise _ObsoleteError(f"local file {gen_dir / name} does not match its manifest (damaged)")
        raise RuntimeError(f"local folder {gen_dir} was rewritten during the upload")

    def _upload(self, job: _Job) -> tuple[int, int]:
        """Upload one generation and move ``LATEST``; returns the numbers of files sent and found unchanged."""
        dirname = generation_dirname(job.generation)
        gen_dir = self.local_run_dir / dirname
        folder = f"{self.run_key}/{dirname}"
        try:
            manifest = (gen_dir / MANIFEST_NAME).read_bytes()
            files = parse_manifest(manifest, gen_dir / MANIFEST_NAME, expected_generation=job.generation)["files"]
        except FileNotFoundError:
            raise _ObsoleteError("its local folder or manifest is gone") from None
        except CheckpointError as err:
            raise _ObsoleteError(f"its local manifest is damaged ({err})") from None
        with self._cond:
            self._bytes_total = sum(entry["size"] for entry in files.values()) + len(manifest)
            self._bytes_done = 0
        self._send_config()

        sent = unchanged = done = 0
        for name, entry in sorted(files.items()):
            if self._closed:
                raise _ClosedError
            md5 = self._local_md5(gen_dir, manifest, name, entry["size"], entry["sha256"])
            key = f"{folder}/{name}"
            remote = self.storage.stat(key)
            if remote is not None and remote.size == entry["size"] and remote.md5 == md5:
                unchanged += 1
                self._count(files_skipped=1)
            elif earlier := self._same_file_uploaded_before(job.generation, name, entry["size"], md5):
                self.storage.copy(earlier, key)  # the generation before's bytes: copied, a separate object
                self._count(files_copied=1)
            else:
                base = done
                # No read-back: the storage verifies each upload's checksum (persistence.gcs).
                self.storage.upload_file(key, gen_dir / name, progress=lambda n, base=base: self._set_done(base + n))
                sent += 1
                self._count(files_uploaded=1, bytes_uploaded=entry["size"])
            done += entry["size"]
            self._set_done(done)

        if self._closed:
            raise _ClosedError
        self.storage.write_bytes(f"{folder}/{MANIFEST_NAME}", manifest)
        self._set_done(done + len(manifest))
        self._send_metrics()
        self._move_latest(job.generation)
        return sent, unchanged

    def _same_file_uploaded_before(self, generation: int, name: str, size: int, md5: str) -> str | None:
        """The key of the same file, byte for byte, in the generation this uploader last completed, if any.

        Copying it is safe where a local hard link is not: the service's copy is an object of its own, and objects
        are never changed in place (a write makes a new one), so damage to either never reaches the other."""
        if self._last_uploaded is None or self._last_uploaded >= generation:
            return None
        key = f"{self.run_key}/{generation_dirname(self._last_uploaded)}/{name}"
        info = self.storage.stat(key)
        return key if info is not None and info.size == size and info.md5 == md5 else None

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
        """Upload a snapshot of the committed lines of ``metrics.jsonl`` (a trailing partial line is being written)."""
        path = self.local_run_dir / METRICS_NAME
        if not path.is_file():
            return
        with open(path, "rb") as f, tempfile.NamedTemporaryFile(prefix="metrics-", suffix=".jsonl") as snapshot:
            committed = committed_length(f, os.fstat(f.fileno()).st_size)
            f.seek(0)
            shutil.copyfileobj(f, snapshot)
            snapshot.truncate(committed)
            snapshot.flush()
            if committed:
                self.storage.upload_file(f"{self.run_key}/{METRICS_NAME}", Path(snapshot.name))

    def _bucket_latest(self) -> int | None:
        """The generation the bucket's LATEST names; None if it is missing or malformed."""
        try:
            return parse_latest(self.storage.read_bytes(f"{self.run_key}/{LATEST_NAME}"))
        except FileNotFoundError:
            return None

    def _move_latest(self, generation: int) -> None:
        """Point the bucket's LATEST at ``generation`` unless it names a newer one."""
        key = f"{self.run_key}/{LATEST_NAME}"
        for _ in range(_LATEST_ATTEMPTS):
            info = self.storage.stat(key)
            current = None if info is None else self._bucket_latest()
            if current is not None and current >= generation:
                if current > generation:
                    self._log(
                        f"upload: the bucket's LATEST names {generation_dirname(current)}, newer than "
                        f"{generation_dirname(generation)}; left as it is"
                    )
                return
            try:
                expected = 0 if info is None else info.version
                self.storage.write_bytes(key, latest_bytes(generation), if_version_match=expected)
                return
            except PreconditionFailed:
                continue  # moved (or deleted) between our read and write: look again
        raise RuntimeError(f"{self.storage.uri}/{key} kept changing during {_LATEST_ATTEMPTS} attempts to move it")

    # -----------------------------------------------------------------------------------------------------------------
    # Retention

    def _retain(self, job: _Job) -> list[int]:
        """Delete old generations from the bucket; returns those deleted."""
        latest = self._bucket_latest()
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
        for generation in doomed:
            folder = f"{self.run_key}/{generation_dirname(generation)}"
            # The manifest first: from then on the folder is incomplete, never half-deleted and "complete".
            for name in sorted(folders[generation], key=lambda n: n != MANIFEST_NAME):
                self.storage.delete(f"{folder}/{name}")
        return doomed

    def _complete_in_bucket(self, generation: int, names: set[str]) -> bool:
        if MANIFEST_NAME not in names:
            return False
        key = f"{self.run_key}/{generation_dirname(generation)}/{MANIFEST_NAME}"
        try:
            manifest = parse_manifest(self.storage.read_bytes(key), key, expected_generation=generation)
        except (FileNotFoundError, CheckpointError):
            return False
        return set(manifest["files"]) <= names
