"""A bucket in memory, for tests that need a ``Storage`` but no server.

It keeps the contract of ``persistence.storage.Storage`` (tests/persistence/test_storage.py runs the same contract
tests on it and on GCS), so what the uploader does with it, it does with a bucket.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from persistence.storage import ObjectInfo, PreconditionFailed, Storage, check_key


class MemoryStorage(Storage):
    """Objects in a dict, each with a version drawn from one counter (so every write gets a new one)."""

    def __init__(self, uri: str = "memory://bucket") -> None:
        self.uri = uri
        self._objects: dict[str, tuple[bytes, ObjectInfo]] = {}
        self._versions = itertools.count(1)
        self._lock = threading.Lock()

    def read_bytes(self, key: str) -> bytes:
        with self._lock:
            if check_key(key) not in self._objects:
                raise FileNotFoundError(f"no object {key!r} in {self.uri}")
            return self._objects[key][0]

    def write_bytes(self, key: str, data: bytes, *, if_version_match: int | None = None) -> None:
        data = bytes(data)
        with self._lock:
            current = self._objects.get(check_key(key))
            version = current[1].version if current else 0
            if if_version_match is not None and if_version_match != version:
                if current is not None and current[0] == data:
                    return  # the bytes are already there: done, as on GCS
                raise PreconditionFailed(f"{self.uri}/{key}: version is {version}, expected {if_version_match}")
            info = ObjectInfo(
                len(data), next(self._versions), datetime.now(timezone.utc), hashlib.md5(data).hexdigest()
            )
            self._objects[key] = (data, info)

    def stat(self, key: str) -> ObjectInfo | None:
        with self._lock:
            current = self._objects.get(check_key(key))
            return current[1] if current else None

    def upload_file(self, key: str, path: Path, *, progress: Callable[[int], None] | None = None) -> None:
        chunks = []
        with open(path, "rb") as f:
            while chunk := f.read(1024 * 1024):
                chunks.append(chunk)
                if progress is not None:
                    progress(f.tell())
        self.write_bytes(key, b"".join(chunks))

    def copy(self, source: str, key: str) -> None:
        self.write_bytes(key, self.read_bytes(source))

    def download_file(self, key: str, path: Path) -> None:
        data = self.read_bytes(key)
        tmp = Path(path).with_name(f".{Path(path).name}.download-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def list(self, prefix: str = "") -> list[str]:
        folder = check_key(prefix.strip("/")) + "/" if prefix else ""
        with self._lock:
            return sorted(key for key in self._objects if key.startswith(folder))

    def delete(self, key: str) -> None:
        with self._lock:
            self._objects.pop(check_key(key), None)

    def check_access(self) -> None:
        pass
