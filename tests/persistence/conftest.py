"""Fixtures of the storage and uploader tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from persistence.gcs import open_storage
from persistence.storage import Storage
from tests.memory_storage import MemoryStorage


@pytest.fixture(params=["memory", "gcs"])
def storage(request: pytest.FixtureRequest) -> Iterator[Storage]:
    """A bucket in memory, or a fresh one on the session's emulator: the same contract, both backends."""
    if request.param == "memory":
        yield MemoryStorage()
        return
    store = open_storage(request.getfixturevalue("gcs_bucket"), deadline=10.0)
    yield store
    store.close()
