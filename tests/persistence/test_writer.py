"""The checkpoint writer: one thread that runs writes one at a time, raises a failed write's error once in the caller,
and ends when its writer is closed or dropped."""

from __future__ import annotations

import threading

import pytest

from persistence.writer import CheckpointWriter


def test_the_writer_runs_one_write_at_a_time_and_raises_its_error_once_in_the_caller(writer_threads):
    writer = CheckpointWriter()
    order: list[str] = []
    release = threading.Event()

    def slow() -> None:
        release.wait(timeout=30)
        order.append("first")

    writer.start(slow)
    assert len(writer_threads()) == 1
    threading.Timer(0.2, release.set).start()
    writer.start(lambda: order.append("second"))
    assert order[:1] == ["first"]  # start returned only once the first write was done
    writer.wait()
    assert order == ["first", "second"] and len(writer_threads()) == 1  # one thread serves every write

    def fails() -> None:
        raise OSError("no space left on device")

    writer.start(fails)
    with pytest.raises(OSError, match="no space left"):
        writer.start(lambda: order.append("never"))
    assert writer.wait() == 0.0  # raised once; the writer is idle again
    assert "never" not in order
    writer.start(lambda: order.append("after the error"))
    writer.close()
    assert order[-1] == "after the error" and not writer_threads()


def test_a_writer_dropped_without_close_ends_its_thread(writer_threads):
    writer = CheckpointWriter()
    writer.start(lambda: None)
    writer.wait()
    (thread,) = writer_threads()
    del writer  # no cycle holds it: collected at once, and its finaliser ends the thread
    thread.join(timeout=10)
    assert not thread.is_alive()
