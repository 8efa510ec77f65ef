"""Run folders in Google Cloud Storage: ``GCSStorage``, the ``persistence.storage.Storage`` interface over
google-cloud-storage.

Retrying is the library's: every call, conditional writes included, is given its ``DEFAULT_RETRY`` policy (408,
429, 5xx, dropped connections, timeouts; exponential backoff) with a per-operation ``deadline``, but for one case: a
connection refused before the endpoint has ever answered this storage is not retried. Nothing listens at that
address (a wrong ``STORAGE_EMULATOR_HOST``, a proxy that is down), and waiting a minute would not change that; a
refusal after an answer is a restarting server, ridden out like any outage. What still fails becomes a one-line
``StorageError`` that says how to fix it; ``check_access`` runs the same checks up front, within
``preflight_deadline``, before hours of training are at stake, and ``check_read_access`` only its first, a listing,
for the offline readers. Uploads carry a checksum that the library and the service verify, so nothing is read back.
What the library cannot know: a retried conditional write may meet its own first attempt, which landed but whose
answer was lost; ``write_bytes`` tells that 412 apart by the object's MD5.

With ``STORAGE_EMULATOR_HOST`` set (a fake-gcs-server), the client uses that endpoint with anonymous credentials;
otherwise application default credentials. The google libraries are imported on first use.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import os
import re
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from persistence.storage import ObjectInfo, PreconditionFailed, Storage, check_key, parse_uri
from utils.errors import ConfigError, StorageError, one_line

EMULATOR_ENV = "STORAGE_EMULATOR_HOST"
EMULATOR_PROJECT = "erl-emulator"
DEFAULT_DEADLINE = 60.0
DEFAULT_PREFLIGHT_DEADLINE = 15.0
CHUNK_SIZE = 8 * 1024 * 1024  # per request of a resumable upload (files over 8 MiB); a multiple of 256 KiB
REQUEST_TIMEOUT = (10.0, 120.0)  # (connect, read) seconds of one HTTP request
PREFLIGHT_TIMEOUT = (5.0, 15.0)
MAX_DELAY = 8.0  # the longest pause between two attempts
CHECKSUM = "auto"  # CRC32C, or MD5 without the library's C extension
OBJECT_ADMIN_ROLE = "roles/storage.objectAdmin"
_CONTENT_TYPE = "application/octet-stream"
_READ_CHUNK = 1024 * 1024


def open_storage(uri: str, *, deadline: float = DEFAULT_DEADLINE) -> GCSStorage:
    """The storage behind a ``gs://BUCKET/PREFIX`` location, with a client of its own (keep one per run), whose
    operations keep retrying transient failures for ``deadline`` seconds; ConfigError for any other location."""
    scheme, bucket, prefix = parse_uri(uri)
    if scheme != "gs":
        raise ConfigError(f"{uri!r} is not a bucket location: expected gs://BUCKET/PREFIX")
    return GCSStorage(bucket, prefix, deadline=deadline)


def _refused(error: BaseException) -> bool:
    """Whether ``error`` comes from a refused TCP connection, however deeply the HTTP libraries wrapped it."""
    seen: set[int] = set()
    pending: list[object] = [error]
    while pending:
        item = pending.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        if isinstance(item, ConnectionRefusedError):
            return True
        seen.add(id(item))
        # requests keeps urllib3's error in args, urllib3 the socket's in ``reason`` and the exception chain.
        pending.extend([item.__cause__, item.__context__, getattr(item, "reason", None), *item.args])
    return False


def _endpoint() -> str:
    return os.environ.get(EMULATOR_ENV) or "https://storage.googleapis.com"


def _hint() -> str:
    return f"check the network and {EMULATOR_ENV}" if os.environ.get(EMULATOR_ENV) else "check the network"


class _ProgressFile(io.BufferedReader):
    """A file opened for reading that reports how far it has been read."""

    def __init__(self, path: Path, progress: Callable[[int], None] | None) -> None:
        super().__init__(io.FileIO(path, "rb"), buffer_size=_READ_CHUNK)
        self._progress = progress

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        if self._progress is not None:
            self._progress(self.tell())
        return data


class GCSStorage(Storage):
    """Objects under ``gs://bucket/prefix`` through one ``google.cloud.storage.Client``, made on first use; an
    operation retries transient failures for ``deadline`` seconds, ``check_access`` for ``preflight_deadline``."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        deadline: float = DEFAULT_DEADLINE,
        preflight_deadline: float = DEFAULT_PREFLIGHT_DEADLINE,
    ) -> None:
        self.bucket_name = bucket
        self.prefix = prefix.strip("/")
        self._root = f"{self.prefix}/" if self.prefix else ""
        self.uri = f"gs://{bucket}/{self.prefix}" if self.prefix else f"gs://{bucket}"
        parse_uri(self.uri)  # validates the bucket name and prefix
        self.deadline = float(deadline)
        self.preflight_deadline = float(preflight_deadline)
        self._client = None
        self._bucket = None
        self._client_lock = threading.Lock()
        self._answered = False  # whether the endpoint has answered a request (then a refusal is a restart)

    # -- plumbing

    def _get_bucket(self):
        with self._client_lock:
            if self._bucket is None:
                self._client = self._make_client()
                self._bucket = self._client.bucket(self.bucket_name)
            return self._bucket

    def _make_client(self):
        import google.auth
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        if os.environ.get(EMULATOR_ENV):
            return storage.Client(project=EMULATOR_PROJECT, credentials=AnonymousCredentials())
        # No credentials found raises DefaultCredentialsError: every caller is inside _errors, which explains it.
        credentials, project = google.auth.default(scopes=storage.Client.SCOPE)
        # Object operations need no project; a user's default credentials often have none.
        client = storage.Client(project=project or "<none>", credentials=credentials)
        if not project:
            client.project = None
        return client

    def _retry(self, deadline: float):
        """The library's retry policy, giving up after ``deadline`` seconds (random pauses, at most 0.25 s at first),
        that does not retry a refused connection until the endpoint has answered (see the module docstring)."""
        from google.cloud.storage.retry import DEFAULT_RETRY, _should_retry  # the predicate DEFAULT_RETRY uses

        def should_retry(error: Exception) -> bool:
            return _should_retry(error) and (self._answered or not _refused(error))

        policy = DEFAULT_RETRY.with_predicate(should_retry).with_timeout(deadline)
        return policy.with_delay(initial=0.25, maximum=MAX_DELAY)

    def _name(self, key: str) -> str:
        return self._root + check_key(key)

    def _blob(self, key: str, **kwargs):
        return self._get_bucket().blob(self._name(key), **kwargs)

    def _names(self, folder: str | None, *, deadline: float, timeout: tuple[float, float], **kwargs) -> list[str]:
        bucket = self._get_bucket()
        blobs = bucket.client.list_blobs(bucket, prefix=folder, retry=self._retry(deadline), timeout=timeout, **kwargs)
        return [blob.name for blob in blobs]

    @contextlib.contextmanager
    def _errors(
        self, action: str, *, missing: Exception | None = None, deadline: float | None = None
    ) -> Iterator[None]:
        """Turn the client's errors into ``missing`` (on 404; by default, the bucket is missing), PreconditionFailed
        or a one-line StorageError that says how to fix the problem; note whether the endpoint answered."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        try:
            try:
                yield
            except api.GoogleAPICallError:  # an HTTP answer, if not the one hoped for
                self._answered = True
                raise
            self._answered = True
        except api.PreconditionFailed as err:
            raise PreconditionFailed(f"{action} {self.uri}: {one_line(err.message)}") from None
        except api.NotFound:
            raise missing or StorageError(
                f"bucket {self.bucket_name!r} of {self.uri} does not exist (or is not visible to these credentials): "
                f"create it (`gcloud storage buckets create gs://{self.bucket_name}`) or fix the checkpoint URI"
            ) from None
        # InvalidOperation: a 401 answered to credentials that cannot refresh. The refresh error's text is the token
        # endpoint's answer: not printed, it is no help and may echo input.
        except (auth.RefreshError, auth.InvalidOperation, api.Unauthorized):
            raise StorageError(
                f"the Google Cloud credentials were rejected while {action} {self.uri} (invalid, expired or revoked): "
                "run `gcloud auth application-default login` again, or set GOOGLE_APPLICATION_CREDENTIALS to a valid "
                "service-account key file"
            ) from None
        except auth.DefaultCredentialsError as err:
            raise StorageError(
                f"no usable Google Cloud credentials to access {self.uri}: run `gcloud auth application-default "
                f"login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file ({one_line(err)})"
            ) from None
        except api.Forbidden as err:
            said = one_line(re.sub(r"^[A-Z]+ \S+: ", "", str(err.message)))  # without the request line
            raise StorageError(
                f"permission denied while {action} {self.uri}: grant these credentials the role {OBJECT_ADMIN_ROLE} "
                f"on bucket {self.bucket_name!r} (server said: {said})"
            ) from None
        except api.RetryError as err:  # the deadline passed on transient failures
            cause = type(err.cause or err).__name__
            raise StorageError(
                f"cannot reach Google Cloud Storage at {_endpoint()} while {action} {self.uri}: still failing after "
                f"{self.deadline if deadline is None else deadline:.0f} s of retries ({cause}); {_hint()}",
                transient=True,
            ) from err
        except Exception as err:
            if not _refused(err):
                raise
            raise StorageError(
                f"cannot reach Google Cloud Storage at {_endpoint()} while {action} {self.uri}: connection refused "
                f"(nothing listens there); {_hint()}",
                transient=True,
            ) from err

    # -- the interface

    def read_bytes(self, key: str) -> bytes:
        with self._errors(f"reading {key} in", missing=FileNotFoundError(f"no object {key!r} in {self.uri}")):
            return self._blob(key).download_as_bytes(retry=self._retry(self.deadline), timeout=REQUEST_TIMEOUT)

    def write_bytes(self, key: str, data: bytes, *, if_version_match: int | None = None) -> None:
        """See ``Storage.write_bytes``. Meant for small objects (up to 8 MiB: one request); larger data goes up as a
        resumable upload, whose precondition fake-gcs-server ignores (GCS itself honours it)."""
        try:
            with self._errors(f"writing {key} in"):
                self._blob(key).upload_from_string(
                    bytes(data),
                    content_type=_CONTENT_TYPE,
                    if_generation_match=if_version_match,
                    checksum=CHECKSUM,
                    retry=self._retry(self.deadline),
                    timeout=REQUEST_TIMEOUT,
                )
        except PreconditionFailed:
            # A retried attempt fails this way when an earlier attempt of ours landed but its answer was lost.
            info = self.stat(key)
            if info is None or info.md5 != hashlib.md5(data).hexdigest():
                raise

    def stat(self, key: str) -> ObjectInfo | None:
        with self._errors(f"reading metadata of {key} in"):
            blob = self._get_bucket().get_blob(
                self._name(key), retry=self._retry(self.deadline), timeout=REQUEST_TIMEOUT
            )
        if blob is None:
            return None
        md5 = base64.b64decode(blob.md5_hash).hex() if blob.md5_hash else None
        return ObjectInfo(size=blob.size, version=blob.generation, updated=blob.updated, md5=md5)

    def upload_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        # A 404 mid-upload: the resumable session is gone (the service restarted) or the bucket is; the uploader's
        # next attempt starts a new session, and check_access names a missing bucket at the start.
        lost = StorageError(f"uploading {key} to {self.uri}: the upload session or the bucket is gone", transient=True)
        with self._errors(f"uploading {key} to", missing=lost), _ProgressFile(Path(path), progress) as f:
            self._blob(key, chunk_size=CHUNK_SIZE).upload_from_file(
                f,
                size=os.fstat(f.fileno()).st_size,
                content_type=_CONTENT_TYPE,
                checksum=CHECKSUM,
                retry=self._retry(self.deadline),
                timeout=REQUEST_TIMEOUT,
            )

    def copy(self, source: str, key: str) -> None:
        with self._errors(f"copying {source} to {key} in", missing=FileNotFoundError(f"no object {source!r}")):
            bucket = self._get_bucket()
            bucket.copy_blob(self._blob(source), bucket, self._name(key), retry=self._retry(self.deadline))

    def download_file(self, key: str, path: Path) -> None:
        dest = Path(path)
        tmp = dest.with_name(f".{dest.name}.download-{os.getpid()}-{secrets.token_hex(4)}")
        missing = FileNotFoundError(f"no object {key!r} in {self.uri}")
        try:
            with self._errors(f"downloading {key} from", missing=missing), open(tmp, "xb") as f:
                self._blob(key).download_to_file(f, retry=self._retry(self.deadline), timeout=REQUEST_TIMEOUT)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, dest)
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[str]:
        folder = self._name(prefix.strip("/")) + "/" if prefix else self._root
        with self._errors(f"listing {prefix or '/'} in"):
            names = self._names(folder or None, deadline=self.deadline, timeout=REQUEST_TIMEOUT)
        # Folder placeholders (names ending in "/", made by some consoles) are not objects.
        return sorted(name[len(self._root) :] for name in names if not name.endswith("/"))

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError), self._errors(f"deleting {key} in", missing=FileNotFoundError()):
            self._blob(key).delete(retry=self._retry(self.deadline), timeout=REQUEST_TIMEOUT)

    def check_read_access(self) -> None:
        """List one object under the root, within ``preflight_deadline`` seconds (at most 5 s to connect and 15 s to
        answer), writing nothing: the bucket answers and these credentials may read it."""
        deadline = self.preflight_deadline
        with self._errors("listing", deadline=deadline):  # one object: the cheapest request that needs the bucket
            self._names(self._root or None, deadline=deadline, timeout=PREFLIGHT_TIMEOUT, max_results=1)

    def check_access(self) -> None:
        """``check_read_access``, then write, read back and delete a probe object under the root, within
        ``preflight_deadline`` seconds (each request at most 5 s to connect and 15 s to answer)."""
        deadline = self.preflight_deadline
        started = time.monotonic()

        def left() -> float:
            return max(0.5, deadline - (time.monotonic() - started))

        self.check_read_access()
        probe = self._blob(f".access-check-{secrets.token_hex(6)}")
        with self._errors("writing to", deadline=deadline):
            probe.upload_from_string(b"ok", if_generation_match=0, retry=self._retry(left()), timeout=PREFLIGHT_TIMEOUT)
        try:
            with self._errors("reading from", deadline=deadline):
                probe.download_as_bytes(retry=self._retry(left()), timeout=PREFLIGHT_TIMEOUT)
        except BaseException:
            with contextlib.suppress(Exception):  # best effort; the read's error is the one to report
                probe.delete(retry=None, timeout=PREFLIGHT_TIMEOUT)
            raise
        # Deleting is checked too: retention in the bucket needs it.
        deleting = self._errors("deleting in", missing=FileNotFoundError(), deadline=deadline)
        with contextlib.suppress(FileNotFoundError), deleting:
            probe.delete(retry=self._retry(left()), timeout=PREFLIGHT_TIMEOUT)

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
            self._client = None
            self._bucket = None
