"""The leak tests' training run, in a process of its own, with the leaks the tests inject into it.

A leak test judges one process's memory, so the process must be its own: inside the test suite, memory that
earlier tests freed is reused by a leak and RSS stays flat. ``run_in_own_process`` trains in a child forked
from a fork server that has only imported the project (cheap to start, and the same state for every run),
applies the named injection there, and returns the metrics rows.

The run crowns a new champion every generation (``crown_every_generation``), so a leak on a rare event, such
as a champion being replaced, is exercised as often as the per-step and per-generation paths.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import gc
import itertools
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from config import override, preset
from environment.vector_env import VectorPortfolioEnv
from models.learner import Learner, build_learner
from models.population import Population
from models.replay import ReplayBuffer
from run import trainer as trainer_module
from run.launch import start_run
from tests.emulated_cuda import emulate_cuda
from tests.run_checks import rows
from training import loop as loop_module
from training import rollout as rollout_module
from training import update as update_module
from utils import telemetry

GENERATIONS = 12
WARM_FROM = 4  # the 400-transition ring fills in generation 2; judge from generation 4 on
PRELOAD = ["torch", "numpy", "pandas", "matplotlib", "tests.training.leak_run"]

Injection = Callable[[pytest.MonkeyPatch, list], None]
INJECTIONS: dict[str, Injection] = {}
"""Each patches one place of the trainer the way a leak would, keeping what it leaks in ``kept``."""


def injection(function: Injection) -> Injection:
    INJECTIONS[function.__name__] = function
    return function


def wrap(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, before=None, after=None) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if before is not None:
            before(*args, **kwargs)
        result = original(*args, **kwargs)
        if after is not None:
            after(result, *args, **kwargs)
        return result

    monkeypatch.setattr(owner, name, wrapper)


def crown_every_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the trainer crown a different slot each generation, whichever way it decides crowning."""
    calls = itertools.count()
    if hasattr(loop_module, "choose_champion"):  # a selection rule that returns the slot to crown, or None
        monkeypatch.setattr(loop_module, "choose_champion", lambda edges, *a, **kw: next(calls) % len(edges))
        return

    def winning(daily, validation):  # one agent's validation days beat the champion's
        call = next(calls)
        daily[call % validation.population.popsize] += 1e3 + call

    wrap(monkeypatch, rollout_module.Validation, "run", after=winning)


def _train(root: str, leak: str | None, generations: int, device: str, emulated: bool) -> dict[str, Any]:
    """Runs in the child: inject, train, return the rows from ``WARM_FROM`` on and the console lines."""
    # One intra-op thread: which thread allocates, and so which malloc arena grows, then no longer depends on
    # how the cores are shared with other work, and RSS is as reproducible as the object counts.
    torch.set_num_threads(1)
    kept: list = []
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as monkeypatch, emulate_cuda() if emulated else contextlib.nullcontext():
        if leak is not None:
            INJECTIONS[leak](monkeypatch, kept)
        crown_every_generation(monkeypatch)
        config = override(
            preset("smoke"),
            {
                "data.tickers": ("AAPL", "JNJ", "KO", "MSFT", "XOM", "WMT"),
                "learner.buffer_size": 400,
                "checkpoint.uri": root,
                "checkpoint.keep_last": 1,
                "runtime.generations": generations,
                "runtime.progress": False,
                "runtime.device": device,
                "runtime.census_fraction": 1.0,  # the object counts every generation
            },
        )
        run = start_run(config, log=lines.append)
        run.trainer.run(until=generations)
        measured = [row for row in rows(run.trainer.run_dir) if row["generation"] >= WARM_FROM]
    return {"rows": measured, "lines": lines, "kept": len(kept)}


def _garbage(root: str, device: str, emulated: bool, before: bool, generations: int) -> list[int]:
    """Runs in the child: objects the collector finds in reference cycles after each generation, with the collector
    off while it trains (``before``: the telemetry of before reads CUDA's memory through ``torch.cuda``)."""
    torch.set_num_threads(1)
    counts = []
    with pytest.MonkeyPatch.context() as monkeypatch, emulate_cuda() if emulated else contextlib.nullcontext():
        if before:
            monkeypatch.setattr(telemetry, "memory_snapshot", _memory_snapshot_through_torch_cuda)
        config = override(
            preset("smoke"),
            {
                "checkpoint.uri": root,
                "runtime.generations": generations,
                "runtime.progress": False,
                "runtime.device": device,
            },
        )
        trainer = start_run(config, log=lambda line: None).trainer
        try:
            for _ in range(generations):
                gc.collect()
                gc.disable()
                trainer.run_generation()
                trainer.checkpoints.wait()
                gc.set_debug(gc.DEBUG_SAVEALL)
                gc.collect()
                counts.append(len(gc.garbage))
                gc.set_debug(0)
                gc.garbage.clear()
                gc.enable()
        finally:
            trainer.checkpoints.close()
    return counts


def _memory_snapshot_through_torch_cuda(device: torch.device) -> dict[str, int]:
    cuda = device.type == "cuda"
    return {
        "rss_bytes": 0,
        "peak_rss_bytes": 0,
        "cuda_allocated_bytes": torch.cuda.memory_allocated(device) if cuda else 0,
        "cuda_reserved_bytes": torch.cuda.memory_reserved(device) if cuda else 0,
    }


def garbage_in_own_process(
    root: Path, *, device: str = "cpu", emulated: bool = False, before: bool = False, generations: int = 4
) -> list[int]:
    """Objects left in reference cycles by each of ``generations`` generations, trained in a fresh child process."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_garbage, str(root), device, emulated, before, generations).result()


def run_in_own_process(
    root: Path, leak: str | None = None, *, generations: int = GENERATIONS, device: str = "cpu", emulated: bool = False
) -> dict[str, Any]:
    """Train in a fresh child process with the named injection; its rows, console lines and count of kept items.
    ``emulated``: on the CUDA device of ``tests.emulated_cuda`` (``device`` "cuda" on a machine without a GPU)."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # takes effect when the server starts, once per test session
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_train, str(root), leak, generations, device, emulated).result()


# --------------------------------------------------------------------------- the injections


@injection
def loss_tensors_kept_with_their_graphs(mp, kept):
    wrap(mp, Learner, "actor_loss", after=lambda loss, *a, **kw: kept.append(loss))  # each with its graph


@injection
def per_step_histories_never_cleared(mp, kept):
    # Each step's transitions (validation's days make none: ``apply(..., transition=False)``).
    wrap(mp, VectorPortfolioEnv, "apply", after=lambda result, env, actions, **_: result is None or kept.append(result))


@injection
def a_new_environment_per_episode(mp, kept):
    def fresh(rollouts, start_days):  # an environment built for every rollout and kept referenced
        env = rollouts.env
        kept.append(
            VectorPortfolioEnv(
                env.market,
                num_agents=env.num_agents,
                num_episodes=env.num_episodes,
                episode_days=env.episode_days,
                lookback=env.gatherer.lookback,
                cost_rate=env.cost_rate,
                execution_delay=env.execution_delay,
            )
        )

    wrap(mp, rollout_module.Rollouts, "run", before=fresh)


@injection
def a_new_population_each_generation(mp, kept):
    def build(trainer):
        cfg = trainer.config
        kept.append(
            Population(
                cfg.evolution.popsize,
                build_learner(
                    cfg,
                    trainer.rollouts.env.gatherer.window_size,
                    agents=cfg.evolution.popsize,
                    device="cpu",
                    generator=torch.Generator().manual_seed(0),
                ),
                generator=torch.Generator().manual_seed(0),
            )
        )

    wrap(mp, trainer_module.Trainer, "run_generation", before=build)


@injection
def deepcopy_clones(mp, kept):
    def clone(population, plan, **kwargs):
        kept.append(copy.deepcopy(population.actor))

    wrap(mp, loop_module, "evolve_", before=clone)


@injection
def a_replaced_best_agent_never_released(mp, kept):
    # Every comparison with the champion keeps the outgoing best alive, as the replaced system did on replacement.
    wrap(
        mp,
        rollout_module.Validation,
        "run",
        before=lambda validation: kept.append(copy.deepcopy(validation.population.champion)),
    )


@injection
def the_outgoing_champion_kept_on_each_crowning(mp, kept):
    # A rare event: only a crowning keeps something (the champion's parameters before they are overwritten).
    wrap(mp, Population, "crown", before=lambda population, index: kept.append(population.champion.state_dict()))


@injection
def an_unbounded_loss_history(mp, kept):
    # Every update's per-agent losses appended to a history that is never trimmed.
    wrap(mp, update_module.UpdatePhase, "update", after=lambda result, *a, **kw: kept.append(result["actor"].tolist()))


@injection
def a_few_python_floats_per_generation(mp, kept):
    # Untracked by the collector and a few blocks each: 16 floats a generation at the test's scale.
    wrap(mp, update_module.UpdatePhase, "update", after=lambda result, *a, **kw: kept.extend(result["actor"].tolist()))


@injection
def a_few_small_numpy_arrays_per_generation(mp, kept):
    # One 1-element array per agent and episode: 16 a generation at the test's scale.
    def keep(result, rewards):
        kept.extend(np.array([value]) for value in result.flatten().tolist())

    wrap(mp, rollout_module, "episode_returns", after=keep)


@injection
def pyplot_figures_never_closed(mp, kept):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    def plot(trainer):
        figure = plt.figure()
        plt.plot([1, 2, 3])
        kept.append(figure.number)  # pyplot's registry holds the figure itself

    wrap(mp, trainer_module.Trainer, "run_generation", before=plot)


@injection
def a_growing_list_of_upload_futures(mp, kept):
    original_init = trainer_module.Trainer.__init__

    def init(self, *args, **kwargs):  # an uploader whose queue keeps every future it ever made
        kwargs["on_checkpoint"] = lambda generation, protect: kept.append(concurrent.futures.Future())
        original_init(self, *args, **kwargs)

    mp.setattr(trainer_module.Trainer, "__init__", init)


@injection
def per_step_numpy_allocations_kept(mp, kept):
    # Each step's weights and actions copied to numpy and kept, a list per step, as history-keeping code does.
    def keep(result, env, actions, **_):
        if result is not None:  # validation's days make no transition
            kept.append([result.weights.numpy().copy(), result.actions.numpy().copy()])

    wrap(mp, VectorPortfolioEnv, "apply", after=keep)


@injection
def per_step_numpy_arrays_of_the_rewards(mp, kept):
    # A small numpy copy of every step's rewards: freed memory of earlier tests would hide it from RSS.
    def keep(result, env, actions, **_):
        if result is not None:  # validation's days make no transition
            kept.append(result.rewards.numpy().copy())

    wrap(mp, VectorPortfolioEnv, "apply", after=keep)


@injection
def a_replay_buffer_storing_observation_windows(mp, kept):
    # The replaced system's real cause: full observation windows stored with every transition.
    def store_windows(buffer, **transition):
        kept.append(buffer.gatherer.gather(transition["days"]).clone())

    wrap(mp, ReplayBuffer, "write", before=store_windows)
