"""Where run folders live: checkpoint locations (a local folder or ``gs://BUCKET/PREFIX``) and the small interface
a bucket is used through (``persistence.gcs`` implements it for Google Cloud Storage).

A ``Storage`` holds objects under string keys: "/"-separated paths relative to its root, such as
``"run-1/gen-000003/manifest.json"``. Keys are validated (no empty, ``.`` or ``..`` segments, no leading "/"), so a
key never escapes the root. Writes replace whole objects atomically: a reader sees the old bytes or the new ones.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from utils.errors import ConfigError

_SCHEME_RE = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(.*)", re.DOTALL)
_BUCKET_PART_RE = re.compile(r"[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?")
_BAD_URI_CHARS_RE = re.compile(r"[\x00-\x1f\x7f#?]")
_BAD_KEY_CHARS_RE = re.compile(r"[\x00-\x1f\x7f\\]")


class PreconditionFailed(Exception):  # noqa: N818 (named after the HTTP status it stands for)
    """A conditional write found the object in another state than ``if_version_match`` asked for."""


@dataclass(frozen=True)
class ObjectInfo:
    """What ``Storage.stat`` knows about one object."""

    size: int
    version: int
    """Changes on every write of the object (the bucket calls it the object's generation, which is not a
    training generation); what ``write_bytes(if_version_match=...)`` compares."""
    updated: datetime
    """When it was last written (UTC)."""
    md5: str | None = None
    """Hex MD5 of the content when the backend knows it for free (GCS, except composite objects)."""


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
    """Split a storage location into ``(scheme, bucket, prefix)``: ``"runs"`` gives ``("file", "", "runs")``,
    ``"file:///data/runs"`` gives ``("file", "", "/data/runs")``, ``"gs://bucket/a/b/"`` gives ``("gs", "bucket",
    "a/b")``. A malformed location or another scheme is a ConfigError naming the URI."""
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


class Storage(ABC):
    """Objects under "/"-separated keys relative to a root, ``uri`` (``gs://bucket/prefix``)."""

    uri: str

    @abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError if it does not exist."""

    @abstractmethod
    def write_bytes(self, key: str, data: bytes, *, if_version_match: int | None = None) -> None:
        """Replace the object with ``data``, atomically; ``if_version_match`` makes it a compare-and-swap (0: only
        if the object does not exist; N: only if ``stat(key).version`` is still N).

        Raises:
            PreconditionFailed: The precondition does not hold, and the object does not already hold exactly
                ``data`` (that is how a retried write whose first attempt landed looks, so it counts as done).
        """

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """Size, version, update time (and MD5 where free) of the object, or None if it does not exist."""

    @abstractmethod
    def upload_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        """Stream a local file into the object; ``progress`` gets the bytes read so far (fewer again on a retry)."""

    @abstractmethod
    def copy(self, source: str, key: str) -> None:
        """Copy the object ``source`` to ``key`` inside the storage, without its bytes passing through this machine;
        FileNotFoundError if ``source`` does not exist."""

    @abstractmethod
    def download_file(self, key: str, path: Path) -> None:
        """Copy the object to ``path``: into a temporary name beside it, then ``os.replace``; FileNotFoundError if
        the object does not exist (``path`` is then left as it was)."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """The keys under the folder ``prefix`` (``""``: everything), recursively, sorted: ``list("run-1")`` and
        ``list("run-1/")`` list ``run-1/...``, not ``run-10/...``."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object; an absent object is fine."""

    @abstractmethod
    def check_access(self) -> None:
        """Check, in bounded time, that objects can be listed, written, read and deleted under the root; else a
        one-line StorageError naming the problem and how to fix it."""

    def close(self) -> None:  # noqa: B027 (optional hook, a no-op where nothing is held)
        """Release connections; the storage must not be used afterwards."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"
