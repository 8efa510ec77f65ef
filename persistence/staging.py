"""Checkpoints off the training loop's critical path.

A generation's checkpoint is hundreds of megabytes at the ``paper`` preset. Serialising, hashing, writing and
fsyncing that inline leaves the accelerator idle, so the loop only copies the tensors into staging buffers
(``StagingBuffers``: allocated once, pinned on CUDA) and hands the rest to a writer thread (``CheckpointWriter``).
Training of the next generation then changes the live tensors, never the staged copies, so the files hold the
generation exactly as it was when it was staged, and bit-exact resume is unchanged.

At most one write is in flight: the next checkpoint, the end of the run, a stop and anything else that needs the
files waits for it first, and an error it raised comes out there, in the training thread.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable

import torch


class StagingBuffers:
    """Host copies of a checkpoint's tensors, allocated at the first ``capture`` with the full shape of each source
    and reused by every later one.

    On CUDA they are pinned, so the device-to-host copies run asynchronously and the loop waits for them once.

    Args:
        device: the training device the sources live on.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.pinned = self.device.type == "cuda"
        self._buffers: dict[str, dict[str, torch.Tensor]] = {}

    @property
    def nbytes(self) -> int:
        """Bytes of staging memory allocated so far."""
        return sum(t.numel() * t.element_size() for group in self._buffers.values() for t in group.values())

    @torch.no_grad()
    def capture(
        self, groups: dict[str, dict[str, torch.Tensor]], *, rows: dict[str, int] | None = None
    ) -> dict[str, dict[str, torch.Tensor]]:
        """Copy every tensor of ``groups`` into its staging buffer; returns the staged copies, complete.

        Args:
            groups: group name -> key -> source tensor; the same names, shapes and dtypes at every call.
            rows: for a group named here, only the first ``rows[group]`` rows of each tensor are copied and
                returned (the filled part of a ring whose buffers have its full capacity).

        The staged copies stay valid until the next ``capture``.
        """
        rows = rows or {}
        staged: dict[str, dict[str, torch.Tensor]] = {}
        for name, group in groups.items():
            buffers = self._buffers.setdefault(name, {})
            count = rows.get(name)
            staged[name] = {}
            for key, source in group.items():
                buffer = buffers.get(key)
                if buffer is None:
                    buffer = torch.empty(source.shape, dtype=source.dtype, pin_memory=self.pinned)
                    buffers[key] = buffer
                elif buffer.shape != source.shape or buffer.dtype != source.dtype:
                    raise ValueError(
                        f"{name}.{key} is {source.dtype} {tuple(source.shape)}, its staging buffer "
                        f"{buffer.dtype} {tuple(buffer.shape)}: checkpointed tensors must keep their shapes"
                    )
                if count is not None:
                    buffer, source = buffer[:count], source[:count]
                buffer.copy_(source, non_blocking=self.pinned)
                staged[name][key] = buffer
        if self.pinned:  # the one wait: every copy above was queued on this stream
            torch.cuda.current_stream(self.device).synchronize()
        return staged


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
