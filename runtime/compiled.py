"""``torch.compile`` around the device arithmetic, applied in one place (``runtime.torch_compile``).

Once the launches are graphed (``runtime.graphs``), a large update is bound by the bytes its unfused kernels move:
each bias add, activation, optimiser pass and Polyak average reads and writes its tensors again. Compiling fuses
them. As LeanRL wraps CleanRL's update, the algorithm's code is left as it reads and its functions are replaced here,
on the objects that own them, by compiled versions: the methods the learner names as compilable
(``Learner.compilable``: its losses, which take in the networks and the portfolio step, and the targets' average),
its optimisers' steps, and each acting actor's two parts (``features`` and ``decide``, ``models.networks``). What is
drawn at random (the replay batch, the exploration and smoothing noise) and what the host decides stay outside, so a
compiled function is device arithmetic on fixed shapes:

* ``fullgraph=True``: a graph break is an error, not a silent fall-back to Python;
* ``dynamic=False``: each function compiles once for each shape it meets (a few, all in the first generations);
  afterwards nothing recompiles (the buffer filling, evolution's copies, the frozen elites' learning-rate scale and
  a resume change values, never shapes or Python constants: ``tests/runtime/test_compiled.py``);
* inside a CUDA graph: the first calls, which compile, run before the capture (``GraphedCall``'s warm-up).

The compiled kernels are cached on disk (``TORCHINDUCTOR_CACHE_DIR``, by default ``.torch-compile-cache`` in the
folder that holds the runs), so a restarted process (a resumed pod with the same volume) loads them instead of
compiling again. The time spent compiling is measured and reported once (``Compilation.report``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from models.learner import Learner
from models.networks import Actor

CACHE_FOLDER = ".torch-compile-cache"
"""The compiled kernels' cache, in the folder that holds the runs (unless ``TORCHINDUCTOR_CACHE_DIR`` names one)."""


def compile_totals() -> tuple[int, float]:
    """Graphs compiled in this process so far and the seconds spent compiling them, forward and backward (torch's own
    counts: a backward graph compiles at its first backward pass, outside any compiled call)."""
    from torch._dynamo import utils

    metrics = utils.compilation_time_metrics
    seconds = sum(sum(metrics.get(key, ())) for key in ("_compile.compile_inner", "backward._backward_impl"))
    return int(utils.counters["stats"]["unique_graphs"]), float(seconds)


class Compilation:
    """The run's compilation: which functions are compiled, and how long compiling took.

    Args:
        enabled: compile at all (``runtime.torch_compile``); False leaves every function as it is.
        cache: the folder for the compiled kernels, used unless ``TORCHINDUCTOR_CACHE_DIR`` is set (needed if enabled).
    """

    def __init__(self, *, enabled: bool, cache: Path | None = None) -> None:
        self.enabled = enabled
        if enabled:
            self.cache = Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path(cache).resolve())))
        self._reported = compile_totals() if enabled else (0, 0.0)  # torch._dynamo is not imported unless used

    def function(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` compiled whole, for static shapes; ``fn`` itself when compilation is off."""
        return torch.compile(fn, fullgraph=True, dynamic=False) if self.enabled else fn

    def learner_(self, learner: Learner) -> None:
        """Compile what the learner names compilable (``Learner.compilable``) and its optimisers' steps, in place."""
        for name in learner.compilable:
            setattr(learner, name, self.function(getattr(learner, name)))
        for optim in learner.optimisers.values():
            optim.step = self.function(optim.step)

    def actor_(self, actor: Actor, *, decide: bool = True) -> None:
        """Compile an acting actor's windows' part and, with ``decide``, its decision, in place (each site an actor of
        its own). A site whose whole day is compiled (``day_``) leaves the decision to it."""
        actor.features = self.function(actor.features)
        if decide:
            actor.decide = self.function(actor.decide)

    def day_(self, phase: Any) -> None:
        """Compile a phase's whole day step (``phase.day``: the decision, its softmax, the trade, the reward and the
        writes, ``training.rollout``) into one function, in place: what were ~40 kernels a day become a few fused
        ones."""
        phase.day = self.function(phase.day)

    def report(self) -> str | None:
        """One line on what was compiled since the last report, once something was; None otherwise."""
        if not self.enabled:
            return None
        (graphs, seconds), (before, spent) = compile_totals(), self._reported
        if graphs == before:
            return None
        self._reported = (graphs, seconds)
        return (
            f"torch.compile: {graphs - before} graphs compiled in {seconds - spent:.1f} s "
            f"(kernels cached in {self.cache})"
        )
