"""CUDA graphs around the generation's device work: one replay where Python launched hundreds of kernels.

A learner update, a day of the rollout and a day of validation are each dozens to hundreds of small kernels, and on a
GPU their launches from Python cost more than the arithmetic (BENCHMARKS.md, GPU). ``GraphedCall`` wraps such a call
from outside, as LeanRL wraps CleanRL's update, leaving the algorithm's code as it reads: it runs the call eagerly a
few times (a warm-up, which lets cuBLAS and the caching allocator settle), then captures one call as a CUDA graph and
replays it for every call after, each replay the same kernels on the same memory.

What a call must be for that (the rollout's and validation's days and the update are written so):

* device work only: no host synchronisation and no Python decision on a device value (``.item()``, ``if t:``), and
  nothing the host counts (the buffer's size, a day number) changed inside; the host's part goes around the call;
* every tensor it reads or writes outlives the graph (parameters, optimiser states, the buffer, the environments'
  state and histories, the loss sums); what it allocates lives in the graph's memory pool and is overwritten by the
  next replay;
* every Python value it reads (a shape, a config constant, the buffer's size a draw is bounded by) is baked into the
  graph: a call whose such value changes is ``invalidate``d and captured again, into the same memory pool (the graph
  it replaces lives until then: a pool is freed with its last graph, and CUDA's allocator cannot capture into a
  freed one). The call after ``invalidate`` runs eagerly once more before the capture: a compiled function
  (``runtime.compiled``) that meets the new value compiles then, never inside a capture, where compiling fails;
* its random draws come from the run's device generators, registered with the graph, so each replay draws what the
  eager call would have drawn, and reseeding a generator between replays is seen.

On the CPU, and with ``runtime.cuda_graphs`` off, a graphed call is the eager call itself: the numbers are the same,
bit for bit, either way (``tests/runtime/test_graphs.py``, on the emulated CUDA device that replays graphs as a GPU
does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import torch


class GraphedCall:
    """``work()``, run eagerly or replayed from a CUDA graph.

    Args:
        work: the device work, a function of no arguments (see the module docstring for what it may do).
        device: the training device; graphs only on CUDA.
        enabled: capture at all (``runtime.cuda_graphs``); False runs the work eagerly until ``graph_calls`` enables
            it.
        generators: the device generators the work draws from, registered with each graph.
        warmup: eager calls before the first capture.
    """

    def __init__(
        self,
        work: Callable[[], None],
        *,
        device: torch.device,
        enabled: bool = False,
        generators: Sequence[torch.Generator] = (),
        warmup: int = 2,
    ) -> None:
        self.work = work
        self.enabled = False
        self.device = device
        self.generators = list(generators)
        self.warmup = warmup
        self.captures = 0
        """Graphs captured so far (a recapture after ``invalidate`` counts)."""
        self._warmed = 0
        self._graph: torch.cuda.CUDAGraph | None = None
        self._stale = False  # ``_graph`` baked in a Python value that has changed since
        self._stream: torch.cuda.Stream | None = None  # captures must not run on the default stream
        self._pool = None  # one pool for this call's graphs
        if enabled:
            self.enable()

    def enable(self) -> None:
        """Replay the work from a CUDA graph from now on (on CUDA; elsewhere it stays the eager call)."""
        if self.enabled or self.device.type != "cuda":
            return
        self.enabled = True
        self._stream = torch.cuda.Stream(self.device)
        self._pool = torch.cuda.graph_pool_handle()

    def __call__(self) -> None:
        if not self.enabled:
            self.work()
            return
        if self._graph is None or self._stale:
            if self._warmed < self.warmup:
                self._on_side_stream(self.work)
                self._warmed += 1
                return
            self._capture()
        self._graph.replay()

    def invalidate(self) -> None:
        """A Python value the work reads has changed: the next call runs eagerly (whatever it compiles, it compiles
        there) and the one after captures the work again."""
        self._stale = True
        self._warmed = min(self._warmed, self.warmup - 1)

    def _capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            graph.register_generator_state(generator)

        def capture() -> None:
            graph.capture_begin(pool=self._pool)
            try:
                self.work()
            finally:
                graph.capture_end()

        self._on_side_stream(capture)  # the graph it replaces, if any, keeps the pool alive until this one holds it
        self._graph, self._stale = graph, False
        self.captures += 1

    def _on_side_stream(self, work: Callable[[], None]) -> None:
        current = torch.cuda.current_stream(self.device)
        self._stream.wait_stream(current)
        with torch.cuda.stream(self._stream):
            work()
        current.wait_stream(self._stream)


def graph_calls(calls: Iterable[GraphedCall], *, enabled: bool) -> None:
    """Replay each of ``calls`` from a CUDA graph if ``enabled`` (``runtime.cuda_graphs``, on CUDA, in one process): the
    one place a run's device work is graphed, beside their compilation (``run.parts``)."""
    if enabled:
        for call in calls:
            call.enable()
