"""The checkpoint writer: one thread that writes checkpoints one at a time, off the training loop's critical path.

At most one write is in flight: the next checkpoint, the end of the run, a stop and anything else that needs the
files waits for it first, and an error it raised comes out there, in the training thread.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable


class CheckpointWriter:
    """Runs checkpoint writes one at a time on one thread that lives until ``close``.

    ``start`` first waits for the write before it, so at most one is in flight and the staging buffers it reads
    are free again once ``start`` returns. One long-lived thread, not one per write: the allocator then keeps
    serving the writes from the same memory, and the process's resident size stays flat from one generation to
    the next (a thread per write made it step now and then). Every end of a run waits for the write in flight and
    ends the thread (``Trainer.run``, ``Run.finish``). The thread is a daemon, so a process never hangs on it at
    exit, and it holds nothing of the writer: a writer dropped without ``close`` ends its thread when collected.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._idle = threading.Event()
        self._idle.set()
        self._errors: list[BaseException] = []  # at most one: the failed write's, until wait() raises it
        self._thread: threading.Thread | None = None

    def start(self, write: Callable[[], None]) -> None:
        """Wait for the write in flight (raising its error), then run ``write`` on the writer thread."""
        self.wait()
        if self._thread is None:
            self._thread = threading.Thread(
                target=_serve, args=(self._jobs, self._idle, self._errors), name="checkpoint-writer", daemon=True
            )
            self._thread.start()
            weakref.finalize(self, self._jobs.put, None)
        self._idle.clear()
        self._jobs.put(write)

    def wait(self) -> float:
        """Block until the write in flight, if any, has finished; seconds waited.

        Raises:
            The exception the write raised, if it failed (once: the writer is idle and usable again after).
        """
        waited = 0.0
        if not self._idle.is_set():
            start = time.perf_counter()
            self._idle.wait()
            waited = time.perf_counter() - start
        if self._errors:
            raise self._errors.pop()
        return waited

    def close(self) -> None:
        """Wait for the write in flight, then end the thread (a later ``start`` begins a new one)."""
        try:
            self.wait()
        finally:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread.join()
                self._thread = None


def _serve(jobs: queue.SimpleQueue, idle: threading.Event, errors: list[BaseException]) -> None:
    """The writer thread: run each job as it comes, until ``None``."""
    while (write := jobs.get()) is not None:
        try:
            write()
        except BaseException as error:  # handed to the training thread by wait(), never dropped
            errors.append(error)
        finally:
            write = None  # the job's closure holds the staged tensors: keep nothing between jobs
            idle.set()
