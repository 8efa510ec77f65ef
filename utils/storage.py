"""Where run folders live: a local directory or a Google Cloud Storage prefix, behind one small interface.

A ``Storage`` holds objects under string keys: "/"-separated paths relative to its root, such as
``"run-1/gen-000003/manifest.json"``. Keys are validated (no empty, ``.`` or ``..`` segments, no leading "/"), so a
key never escapes the root. Writes replace whole objects atomically: a reader sees the old bytes or the new ones.

``write_bytes(..., if_generation_match=N)`` is a compare-and-swap: 0 means "only if the object does not exist", any
other value "only if the object's generation is still N" (``stat(key).generation``); otherwise ``PreconditionFailed``.
Small pointer objects (``LATEST``, manifests) go through ``write_bytes``; large files through ``upload_file``, which
streams them (on GCS as a resumable upload in ``chunk_size`` pieces, each retried on its own).

``GCSStorage`` retries transient failures (HTTP 408/429/5xx, refused or reset connections, timeouts) with exponential
backoff until a per-operation deadline (``deadline``, 60 s by default); what still fails becomes a one-line
``StorageError`` (an ``InputError``: the command line prints it and exits with status 2) that says how to fix it.
``check_access`` runs the same checks up front, within ``preflight_deadline``, before hours of training are at stake.

With ``STORAGE_EMULATOR_HOST`` set (``http://127.0.0.1:4443``, a fake-gcs-server), the client talks to that endpoint
with anonymous credentials and the dummy project ``erl-emulator``: emulators accept any caller, and no real
credentials are looked up or sent. Without it, credentials come from application default credentials
(``gcloud auth application-default login``, ``GOOGLE_APPLICATION_CREDENTIALS``, or the metadata server of a cloud VM).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import io
import ipaddress
import os
import re
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from utils.errors import ConfigError, StorageError

try:  # POSIX only; elsewhere a process-local lock guards the local compare-and-swap
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
EMULATOR_PROJECT = "erl-emulator"
DEFAULT_DEADLINE = 60.0
DEFAULT_PREFLIGHT_DEADLINE = 15.0
DEFAULT_CHUNK_SIZE = 8 * 1024 * 1024  # a multiple of 256 KiB, as GCS requires for resumable chunks
OBJECT_ADMIN_ROLE = "roles/storage.objectAdmin"

_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
_BUCKET_PART_RE = re.compile(r"[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?")
_BAD_URI_CHARS_RE = re.compile(r"[\x00-\x1f\x7f#?]")
_BAD_KEY_CHARS_RE = re.compile(r"[\x00-\x1f\x7f\\]")
_TMP_MARK = ".storage-tmp-"
_COPY_CHUNK = 1024 * 1024
_MAX_MESSAGE = 240


class _SessionLostError(Exception):
    """A resumable upload's session answered 404."""


class PreconditionFailed(Exception):  # noqa: N818 (named after the HTTP status it stands for)
    """A conditional write found the object in another state than ``if_generation_match`` asked for."""


@dataclass(frozen=True)
class ObjectInfo:
    """What ``Storage.stat`` knows about one object.

    Attributes:
        size: Bytes.
        generation: Changes on every write of the object (GCS: the object generation; local: the modification time
            in nanoseconds, forced to increase on each write through ``LocalStorage``). Pass it to
            ``write_bytes(if_generation_match=...)``.
        updated: When it was last written (UTC).
        md5: Hex MD5 of the content when the backend knows it for free (GCS, except composite objects), else None.
    """

    size: int
    generation: int
    updated: datetime
    md5: str | None = None


# ---------------------------------------------------------------------------------------------------------------------
# URIs and keys


def _check_bucket_name(bucket: str, uri: str) -> None:
    """The main GCS bucket naming rules; ConfigError naming the URI if one is broken."""
    parts = bucket.split(".")
    ok = (
        3 <= len(bucket) <= 222
        and all(_BUCKET_PART_RE.fullmatch(part) for part in parts)
        and (len(parts) > 1 or len(bucket) <= 63)
        and not bucket.startswith("goog")
        and "google" not in bucket
    )
    with contextlib.suppress(ValueError):
        ipaddress.IPv4Address(bucket)
        ok = False
    if not ok:
        raise ConfigError(
            f"bad bucket name {bucket!r} in {uri!r}: bucket names have 3-63 lowercase letters, digits, '-', '_' or "
            "'.', start and end with a letter or digit, and do not start with 'goog'"
        )


def parse_uri(uri: str) -> tuple[str, str, str]:
    """Split a storage location into ``(scheme, bucket, prefix)``.

    ``"runs"`` and ``"/data/runs"`` give ``("file", "", path)``, ``"file:///data/runs"`` gives
    ``("file", "", "/data/runs")``, and ``"gs://bucket/a/b/"`` gives ``("gs", "bucket", "a/b")`` (the prefix
    without leading or trailing slashes; ``""`` for the bucket's root).

    Raises:
        ConfigError: Naming the URI: empty, ``gs://`` without a bucket or with a bad bucket name, an empty, ``.`` or
            ``..`` segment or a control, ``#`` or ``?`` character in the prefix, or another scheme (``s3://``).
    """
    if not isinstance(uri, str) or not uri.strip():
        raise ConfigError(f"empty checkpoint location {uri!r}: give a local folder or gs://BUCKET/PREFIX")
    match = _SCHEME_RE.fullmatch(uri)
    if match is None:
        return ("file", "", uri)
    scheme, rest = match.group(1).lower(), match.group(2)
    if scheme == "file":
        if not rest.startswith("/"):
            raise ConfigError(f"bad file URI {uri!r}: use file:///absolute/path or a plain path")
        return ("file", "", rest)
    if scheme != "gs":
        raise ConfigError(
            f"unsupported checkpoint location {uri!r}: only local folders and gs://BUCKET/PREFIX are supported"
        )
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ConfigError(f"bad GCS location {uri!r}: no bucket name (expected gs://BUCKET/PREFIX)")
    _check_bucket_name(bucket, uri)
    prefix = prefix.strip("/")
    if prefix:
        if _BAD_URI_CHARS_RE.search(prefix):
            raise ConfigError(f"bad GCS location {uri!r}: control characters, '#' and '?' are not allowed")
        if any(part in ("", ".", "..") for part in prefix.split("/")):
            raise ConfigError(f"bad GCS location {uri!r}: empty, '.' or '..' path segments are not allowed")
    return ("gs", bucket, prefix)


def check_key(key: str) -> str:
    """``key`` if it is a valid relative key (see the module docstring), else ValueError."""
    if (
        not isinstance(key, str)
        or not key
        or _BAD_KEY_CHARS_RE.search(key)
        or any(part in ("", ".", "..") for part in key.split("/"))
    ):
        raise ValueError(f"bad storage key {key!r}: use '/'-separated names without empty, '.' or '..' segments")
    return key


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= _MAX_MESSAGE else text[: _MAX_MESSAGE - 3] + "..."


# ---------------------------------------------------------------------------------------------------------------------
# The interface


class Storage(ABC):
    """Objects under "/"-separated keys relative to a root; see the module docstring.

    Attributes:
        uri: The root, as given to ``open_storage`` (a path, or ``gs://bucket/prefix``).
    """

    uri: str

    @abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""

    @abstractmethod
    def write_bytes(self, key: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        """Replace the object with ``data``, atomically.

        Args:
            if_generation_match: 0: only if the object does not exist; N: only if its generation is N; None: always.

        Raises:
            PreconditionFailed: The precondition does not hold.
        """

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """Size, generation, update time (and MD5 where free) of the object, or None if it does not exist."""

    @abstractmethod
    def upload_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        """Stream a local file into the object (replacing it atomically).

        Args:
            progress: Called with the number of bytes of the file read so far (it may go back on a retry).
        """

    @abstractmethod
    def download_file(self, key: str, path: Path) -> None:
        """Copy the object to ``path``: into a temporary name beside it, then ``os.replace``; FileNotFoundError if
        the object does not exist (``path`` is then left as it was)."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """The keys under the folder ``prefix`` (``""``: everything), recursively, sorted.

        ``list("run-1")`` and ``list("run-1/")`` list ``run-1/...``, not ``run-10/...``.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object; an absent object is fine."""

    @abstractmethod
    def check_access(self) -> None:
        """Check, in bounded time, that objects can be listed, written, read and deleted under the root.

        Raises:
            StorageError: One line naming the problem and how to fix it.
        """

    def close(self) -> None:  # noqa: B027 (optional hook, a no-op where nothing is held)
        """Release connections; the storage must not be used afterwards."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


def open_storage(uri: str, *, deadline: float = DEFAULT_DEADLINE) -> Storage:
    """The storage for a location (see ``parse_uri``); a GCS location gets its own client.

    Keep one per run: every call makes a new client with its own connection pool.

    Args:
        deadline: GCS only: how long one operation keeps retrying transient failures, in seconds.
    """
    scheme, bucket, prefix = parse_uri(uri)
    if scheme == "file":
        return LocalStorage(Path(prefix))
    return GCSStorage(bucket, prefix, deadline=deadline)


def _temp_beside(path: Path, what: str) -> Path:
    return path.with_name(f".{path.name}{_TMP_MARK}{what}-{os.getpid()}-{secrets.token_hex(4)}")


# ---------------------------------------------------------------------------------------------------------------------
# Local directory


_local_lock = threading.Lock()


class LocalStorage(Storage):
    """Objects as files under a directory; writes go to a temporary sibling and are renamed into place.

    Generations are modification times in nanoseconds; every write through this class sets one larger than the
    previous, under a lock (a thread lock plus ``flock`` on the parent directory), so conditional writes are exact
    among writers that use this class, in any process.
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.uri = str(root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    @contextlib.contextmanager
    def _locked(self, directory: Path) -> Iterator[None]:
        with _local_lock:
            if fcntl is None:  # pragma: no cover
                yield
                return
            fd = os.open(directory, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing releases the flock

    @staticmethod
    def _generation(path: Path) -> int | None:
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        return st.st_mtime_ns

    def _commit(self, tmp: Path, target: Path, if_generation_match: int | None) -> None:
        """Rename ``tmp`` over ``target`` under the lock, after checking the precondition and stamping a newer
        generation on it."""
        with self._locked(target.parent):
            current = self._generation(target)
            if if_generation_match is not None and (
                (if_generation_match == 0 and current is not None)
                or (if_generation_match != 0 and current != if_generation_match)
            ):
                raise PreconditionFailed(
                    f"{self.uri}/{target.relative_to(self.root).as_posix()}: generation is {current or 0}, "
                    f"expected {if_generation_match}"
                )
            floor = current or 0
            stamp = max(time.time_ns(), floor + 1)
            step = 1
            while True:  # coarse filesystem clocks round the stamp down; step up until it is strictly newer
                os.utime(tmp, ns=(stamp, stamp))
                if tmp.stat().st_mtime_ns > floor:
                    break
                step *= 1000
                stamp = floor + step
            os.replace(tmp, target)
            _fsync_dir(target.parent)

    def read_bytes(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except IsADirectoryError:
            raise FileNotFoundError(f"{self.uri}/{key} is a folder, not an object") from None

    def write_bytes(self, key: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_beside(target, "w")
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            self._commit(tmp, target, if_generation_match)
        finally:
            tmp.unlink(missing_ok=True)

    def stat(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not path.is_file():
            return None
        updated = datetime.fromtimestamp(st.st_mtime_ns / 1e9, tz=timezone.utc)
        return ObjectInfo(size=st.st_size, generation=st.st_mtime_ns, updated=updated)

    def upload_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        target = self._path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_beside(target, "u")
        try:
            _copy_file(Path(path), tmp, progress)
            self._commit(tmp, target, None)
        finally:
            tmp.unlink(missing_ok=True)

    def download_file(self, key: str, path: Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise FileNotFoundError(f"no object {key!r} in {self.uri}")
        dest = Path(path)
        tmp = _temp_beside(dest, "d")
        try:
            _copy_file(source, tmp, None)
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        prefix = prefix.strip("/")
        top = self._path(prefix) if prefix else self.root
        if not top.is_dir():
            return []
        keys = []
        for dirpath, dirnames, filenames in os.walk(top):
            dirnames.sort()
            base = Path(dirpath).relative_to(self.root).as_posix()
            for name in filenames:
                if _TMP_MARK in name and name.startswith("."):
                    continue  # a write of ours in progress (or a crashed one's leftover)
                if os.path.isfile(os.path.join(dirpath, name)):
                    keys.append(name if base == "." else f"{base}/{name}")
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            path.unlink()
        # Objects have no folders: drop the ones this left empty, up to the root.
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def check_access(self) -> None:
        root = self.root
        existing = root
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise StorageError(f"checkpoint location {self.uri} is not usable: {existing} is not a folder")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise StorageError(f"cannot write to checkpoint location {self.uri}: {existing} is not writable")
        if existing == root:
            probe = f".access-check-{secrets.token_hex(6)}"
            try:
                self.write_bytes(probe, b"ok")
                self.delete(probe)
            except OSError as err:
                raise StorageError(f"cannot write to checkpoint location {self.uri}: {err.strerror or err}") from None


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # not every filesystem fsyncs a directory; the rename is atomic anyway
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _copy_file(source: Path, dest: Path, progress: Callable[[int], None] | None) -> None:
    done = 0
    with open(source, "rb") as src, open(dest, "xb") as dst:
        while chunk := src.read(_COPY_CHUNK):
            dst.write(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done)
        dst.flush()
        os.fsync(dst.fileno())


# ---------------------------------------------------------------------------------------------------------------------
# Google Cloud Storage

_TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def is_transient(err: BaseException) -> bool:
    """Whether retrying ``err`` may succeed: HTTP 408/429/5xx, refused or reset connections, timeouts."""
    import requests
    import urllib3
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from google.cloud.storage.exceptions import InvalidResponse

    if isinstance(
        err,
        (
            ConnectionError,
            TimeoutError,
            requests.exceptions.ConnectionError,
            requests.exceptions.Timeout,
            requests.exceptions.ChunkedEncodingError,
            urllib3.exceptions.ProtocolError,
            urllib3.exceptions.TimeoutError,
            urllib3.exceptions.PoolError,
        ),
    ):
        return True
    if isinstance(err, api_exceptions.GoogleAPICallError):
        return err.code in _TRANSIENT_STATUS
    if isinstance(err, InvalidResponse):
        return getattr(err.response, "status_code", None) in _TRANSIENT_STATUS
    if isinstance(err, auth_exceptions.TransportError):  # the token endpoint unreachable
        return True
    return isinstance(err, (http.client.IncompleteRead, http.client.BadStatusLine, http.client.ResponseNotReady))


def _server_message(err) -> str:
    """The service's own words from an API error, without the request line the client puts in front."""
    return _one_line(re.sub(r"^[A-Z]+ \S+: ", "", str(err.message)))


def _b64_to_hex(value: str | None) -> str | None:
    return base64.b64decode(value).hex() if value else None


class _ProgressFile(io.BufferedReader):
    """A file opened for reading that reports how far it has been read."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None) -> None:
        super().__init__(io.FileIO(path, "rb"), buffer_size=_COPY_CHUNK)
        self._progress = progress

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if self._progress is not None:
            self._progress(self.tell())
        return data


class GCSStorage(Storage):
    """Objects under ``gs://bucket/prefix``, through one ``google.cloud.storage.Client`` made on first use.

    Args:
        bucket: The bucket name.
        prefix: Object-name prefix without leading or trailing slashes (``""``: the bucket's root).
        deadline: Seconds one operation keeps retrying transient failures (exponential backoff from 0.25 s, doubling,
            at most ``max_delay`` apart). Conditional writes are retried too: ``if_generation_match`` makes a repeat
            of a write that already landed fail rather than overwrite, and ``write_bytes`` recognises its own write.
        max_delay: The longest pause between two attempts.
        request_timeout: (connect, read) timeout of one HTTP request, in seconds.
        chunk_size: Bytes per request of a resumable upload (files over 8 MiB); a multiple of 256 KiB.
        preflight_deadline: The time ``check_access`` may take, at most (plus credential discovery).
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        deadline: float = DEFAULT_DEADLINE,
        max_delay: float = 8.0,
        request_timeout: tuple[float, float] = (10.0, 120.0),
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        preflight_deadline: float = DEFAULT_PREFLIGHT_DEADLINE,
    ) -> None:
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        parse_uri(self.uri)  # validates the bucket name and prefix
        if chunk_size <= 0 or chunk_size % (256 * 1024):
            raise ValueError(f"chunk_size must be a positive multiple of 256 KiB, got {chunk_size}")
        self.deadline = float(deadline)
        self.max_delay = float(max_delay)
        self.request_timeout = request_timeout
        self.chunk_size = chunk_size
        self.preflight_deadline = float(preflight_deadline)
        self._client = None
        self._bucket = None
        self._client_lock = threading.Lock()

    # -- plumbing

    @property
    def endpoint(self) -> str:
        """The service this storage talks to (the emulator's URL when ``STORAGE_EMULATOR_HOST`` is set)."""
        return os.environ.get(EMULATOR_ENV) or "https://storage.googleapis.com"

    def _get_bucket(self):
        with self._client_lock:
            if self._bucket is None:
                self._client = self._make_client()
                self._bucket = self._client.bucket(self.bucket_name)
            return self._bucket

    def _make_client(self):
        import google.auth
        from google.auth.credentials import AnonymousCredentials
        from google.auth.exceptions import DefaultCredentialsError
        from google.cloud import storage

        if os.environ.get(EMULATOR_ENV):
            return storage.Client(project=EMULATOR_PROJECT, credentials=AnonymousCredentials())
        try:
            credentials, project = google.auth.default(scopes=storage.Client.SCOPE)
        except DefaultCredentialsError as err:
            raise StorageError(
                f"no Google Cloud credentials to access {self.uri}: run `gcloud auth application-default login`, "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file "
                f"(google-auth said: {_one_line(err)})"
            ) from None
        # Object operations need no project; a user's default credentials often have none.
        client = storage.Client(project=project or "<none>", credentials=credentials)
        if not project:
            client.project = None
        return client

    def _name(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _retry(self, deadline: float | None = None, on_error: Callable[[Exception], None] | None = None):
        from google.api_core.retry import Retry

        return Retry(
            predicate=is_transient,
            initial=0.25,
            maximum=self.max_delay,
            multiplier=2.0,
            timeout=self.deadline if deadline is None else deadline,
            on_error=on_error,
        )

    def _bucket_missing(self) -> StorageError:
        return StorageError(
            f"bucket {self.bucket_name!r} of {self.uri} does not exist (or is not visible to these credentials): "
            f"create it (`gcloud storage buckets create gs://{self.bucket_name}`) or fix the checkpoint URI"
        )

    def _storage_error(self, err: BaseException, action: str, deadline: float) -> StorageError | None:
        """The one-line StorageError that ``err`` stands for, or None if it is not a storage-setup problem."""
        from google.api_core import exceptions as api_exceptions
        from google.auth import exceptions as auth_exceptions

        if isinstance(err, StorageError):
            return err
        if isinstance(err, auth_exceptions.InvalidOperation):  # a 401 answered to credentials that cannot refresh
            err = api_exceptions.Unauthorized(str(err))
        if isinstance(err, auth_exceptions.DefaultCredentialsError):
            return StorageError(
                f"no usable Google Cloud credentials to access {self.uri}: run `gcloud auth application-default "
                f"login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file ({_one_line(err)})"
            )
        if isinstance(err, (auth_exceptions.RefreshError, api_exceptions.Unauthorized)):
            # The refresh error's text is the token endpoint's answer: not printed, it is no help and may echo input.
            return StorageError(
                f"the Google Cloud credentials were rejected while {action} {self.uri} (invalid, expired or revoked): "
                "run `gcloud auth application-default login` again, or set GOOGLE_APPLICATION_CREDENTIALS to a valid "
                "service-account key file"
            )
        if isinstance(err, api_exceptions.Forbidden):
            return StorageError(
                f"permission denied while {action} {self.uri}: grant these credentials the role {OBJECT_ADMIN_ROLE} "
                f"on bucket {self.bucket_name!r} (server said: {_server_message(err)})"
            )
        if isinstance(err, api_exceptions.RetryError) or is_transient(err):
            cause = err.cause if isinstance(err, api_exceptions.RetryError) and err.cause is not None else err
            hint = f"check the network and {EMULATOR_ENV}" if os.environ.get(EMULATOR_ENV) else "check the network"
            return StorageError(
                f"cannot reach Google Cloud Storage at {self.endpoint} while {action} {self.uri}: still failing after "
                f"{deadline:.0f} s of retries ({type(cause).__name__}); {hint}",
                transient=True,
            )
        return None

    def _call(self, action: str, fn: Callable[[], object], *, missing: Exception | None = None, deadline=None):
        """Run one client call, turning its errors into FileNotFoundError / PreconditionFailed / StorageError."""
        from google.api_core import exceptions as api_exceptions

        try:
            return fn()
        except api_exceptions.PreconditionFailed as err:
            raise PreconditionFailed(f"{action} {self.uri}: {_one_line(err.message)}") from None
        except api_exceptions.NotFound:
            raise (missing if missing is not None else self._bucket_missing()) from None
        except api_exceptions.GoogleAPICallError as err:
            if err.code == 410 and missing is not None:  # an expired resumable upload session
                raise missing from None
            mapped = self._storage_error(err, action, self.deadline if deadline is None else deadline)
            if mapped is None:
                raise
            raise mapped from err
        except Exception as err:
            mapped = self._storage_error(err, action, self.deadline if deadline is None else deadline)
            if mapped is None or mapped is err:
                raise
            raise mapped from err

    # -- the interface

    def read_bytes(self, key: str) -> bytes:
        name = self._name(key)
        missing = FileNotFoundError(f"no object {key!r} in {self.uri}")
        bucket = self._call(f"reading {key} in", self._get_bucket)
        return self._call(
            f"reading {key} in",
            lambda: bucket.blob(name).download_as_bytes(retry=self._retry(), timeout=self.request_timeout),
            missing=missing,
        )

    def write_bytes(self, key: str, data: bytes, *, if_generation_match: int | None = None) -> None:
        """See ``Storage.write_bytes``. Meant for small objects (up to 8 MiB: one request); larger data goes up as a
        resumable upload, whose precondition fake-gcs-server ignores (GCS itself honours it)."""
        name = self._name(key)
        bucket = self._call(f"writing {key} in", self._get_bucket)
        retried = False

        def note_retry(_: Exception) -> None:
            nonlocal retried
            retried = True

        try:
            self._call(
                f"writing {key} in",
                lambda: bucket.blob(name).upload_from_string(
                    bytes(data),
                    content_type="application/octet-stream",
                    if_generation_match=if_generation_match,
                    retry=self._retry(on_error=note_retry),
                    timeout=self.request_timeout,
                ),
            )
        except PreconditionFailed:
            # A retried attempt may fail only because an earlier attempt of ours landed (its answer was lost).
            if retried:
                info = self.stat(key)
                if info is not None and info.md5 == hashlib.md5(data).hexdigest():
                    return
            raise

    def stat(self, key: str) -> ObjectInfo | None:
        name = self._name(key)
        bucket = self._call(f"reading {key} in", self._get_bucket)
        blob = self._call(
            f"reading metadata of {key} in",
            lambda: bucket.get_blob(name, retry=self._retry(), timeout=self.request_timeout),
            missing=None,
        )
        if blob is None:
            return None
        return ObjectInfo(
            size=blob.size, generation=blob.generation, updated=blob.updated, md5=_b64_to_hex(blob.md5_hash)
        )

    def upload_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        name = self._name(key)
        action = f"uploading {key} to"
        bucket = self._call(action, self._get_bucket)
        started = time.monotonic()
        delay = 0.25
        while True:
            remaining = max(0.5, self.deadline - (time.monotonic() - started))
            try:
                self._upload_once(
                    bucket.blob(name, chunk_size=self.chunk_size), Path(path), progress, remaining, action
                )
                return
            except _SessionLostError:
                pass
            # 404 on a resumable upload: the bucket is gone, or the session is (a server restart, an expired
            # session). Tell the two apart with a listing, then start the upload over.
            self._list_one()
            if time.monotonic() - started + delay > self.deadline:
                raise StorageError(
                    f"{action} {self.uri}: the upload session kept vanishing for {self.deadline:.0f} s", transient=True
                )
            time.sleep(delay)
            delay = min(2 * delay, self.max_delay)

    def _upload_once(
        self, blob, path: Path, progress: Callable[[int], None] | None, deadline: float, action: str
    ) -> None:
        with _ProgressFile(path, progress) as f:
            size = os.fstat(f.fileno()).st_size
            self._call(
                action,
                lambda: blob.upload_from_file(
                    f,
                    size=size,
                    content_type="application/octet-stream",
                    retry=self._retry(deadline),
                    timeout=self.request_timeout,
                ),
                missing=_SessionLostError(),
                deadline=deadline,
            )

    def _list_one(self) -> None:
        """List at most one object under the root: StorageError if the bucket is missing or unreachable."""
        bucket = self._call("listing", self._get_bucket)
        folder = f"{self.prefix}/" if self.prefix else None
        self._call(
            "listing",
            lambda: list(
                bucket.client.list_blobs(
                    bucket, prefix=folder, max_results=1, retry=self._retry(), timeout=self.request_timeout
                )
            ),
        )

    def download_file(self, key: str, path: Path) -> None:
        name = self._name(key)
        bucket = self._call(f"downloading {key} from", self._get_bucket)
        dest = Path(path)
        tmp = _temp_beside(dest, "d")
        try:
            with open(tmp, "xb") as f:
                self._call(
                    f"downloading {key} from",
                    lambda: bucket.blob(name).download_to_file(f, retry=self._retry(), timeout=self.request_timeout),
                    missing=FileNotFoundError(f"no object {key!r} in {self.uri}"),
                )
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        root = f"{self.prefix}/" if self.prefix else ""
        folder = self._name(prefix.strip("/")) + "/" if prefix else root
        bucket = self._call(f"listing {prefix or '/'} in", self._get_bucket)

        def run() -> list[str]:
            blobs = bucket.client.list_blobs(
                bucket, prefix=folder or None, retry=self._retry(), timeout=self.request_timeout
            )
            return [blob.name for blob in blobs]

        names = self._call(f"listing {prefix or '/'} in", run)
        # Folder placeholders (names ending in "/", made by some consoles) are not objects.
        return sorted(name[len(root) :] for name in names if not name.endswith("/"))

    def delete(self, key: str) -> None:
        name = self._name(key)
        bucket = self._call(f"deleting {key} in", self._get_bucket)
        with contextlib.suppress(FileNotFoundError):
            self._call(
                f"deleting {key} in",
                lambda: bucket.blob(name).delete(retry=self._retry(), timeout=self.request_timeout),
                missing=FileNotFoundError(key),
            )

    def check_access(self) -> None:
        """List one object, then write, read back and delete a probe object under the root, within
        ``preflight_deadline`` seconds (each request at most 5 s to connect and 15 s to answer)."""
        deadline = self.preflight_deadline
        timeout = (min(5.0, self.request_timeout[0]), min(15.0, self.request_timeout[1]))
        bucket = self._call("accessing", self._get_bucket, deadline=deadline)
        started = time.monotonic()

        def remaining() -> float:
            return max(0.5, deadline - (time.monotonic() - started))

        folder = f"{self.prefix}/" if self.prefix else None
        self._call(
            "listing",
            lambda: list(
                bucket.client.list_blobs(
                    bucket, prefix=folder, max_results=1, retry=self._retry(remaining()), timeout=timeout
                )
            ),
            deadline=deadline,
        )
        probe = bucket.blob(self._name(f".access-check-{secrets.token_hex(6)}"))
        self._call(
            "writing to",
            lambda: probe.upload_from_string(
                b"ok", if_generation_match=0, retry=self._retry(remaining()), timeout=timeout
            ),
            deadline=deadline,
        )
        try:
            self._call(
                "reading from",
                lambda: probe.download_as_bytes(retry=self._retry(remaining()), timeout=timeout),
                deadline=deadline,
            )
        except BaseException:
            with contextlib.suppress(Exception):  # best effort; the read's error is the one to report
                probe.delete(retry=None, timeout=timeout)
            raise
        # Deleting is checked too: retention in the bucket needs it.
        with contextlib.suppress(FileNotFoundError):
            self._call(
                "deleting in",
                lambda: probe.delete(retry=self._retry(remaining()), timeout=timeout),
                missing=FileNotFoundError(),
                deadline=deadline,
            )

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
            self._client = None
            self._bucket = None
