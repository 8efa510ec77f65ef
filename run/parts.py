"""What a run's generation loop is made of, built once from the config and the market (allocate once): the random
streams, the population, the replay buffer, the rollouts, validation, the update phase and the selection gate."""

from __future__ import annotations

from pathlib import Path

import torch

from config import Config
from environment.market import Market
from environment.observation import window_size
from models.learner import build_learner
from models.population import Population
from models.replay import ReplayBuffer
from models.share import Share
from persistence.storage import parse_uri
from run.streams import gate_generator, make_generators
from runtime.boundary import to_host
from runtime.compiled import CACHE_FOLDER, Compilation
from runtime.device import keep_freed_host_memory, set_matmul_precision
from runtime.graphs import graph_calls
from runtime.sharding import Sharding
from training.loop import Parts
from training.rollout import Rollouts, Validation
from training.selection import SequentialGate, validation_block_length
from training.update import UpdatePhase


def build_population(
    config: Config,
    window_size: int,
    *,
    device: torch.device,
    generators: dict[str, torch.Generator],
    share: Share | None = None,
) -> Population:
    """The run's population as its seed initialises it (``generators``: ``run.streams.make_generators``): a
    run's start, and the untrained baseline ``evaluate`` and the backtest score."""
    popsize = config.evolution.popsize
    learner = build_learner(
        config,
        window_size,
        agents=share.agents if share is not None else popsize,
        device=device,
        generator=generators["init"],
        share=share,
        noise_generator=generators["replay"],
    )
    return Population(popsize, learner, generator=generators["init"])


def build_parts(config: Config, market: Market, sharding: Sharding | None = None) -> Parts:
    """The parts of a run's loop on ``market``'s device (``build_phases``), made fast as the config asks, with the
    run's selection gate; ``sharding``: the slots this process holds (all by default)."""
    set_matmul_precision(config, market.device)
    keep_freed_host_memory()  # a step's freed activations are reused, not mapped again (runtime.device)
    parts = build_phases(config, market, sharding)
    # Made fast in one block, as LeanRL does, the phases' code left as the algorithm reads: compiled with
    # ``runtime.torch_compile``, replayed as CUDA graphs with ``runtime.cuda_graphs``. A day whose transitions are
    # exchanged between processes holds a collective: its decision is compiled alone, and nothing is graphed.
    rollouts, validation = parts.rollouts, parts.validation
    whole_days = not parts.sharding.distributed
    compilation = Compilation(enabled=config.runtime.torch_compile, cache=runs_folder(config) / CACHE_FOLDER)
    compilation.learner_(parts.population.learner)
    for phase, acting in ((rollouts, parts.population.actor), (validation, validation.acting)):
        compilation.actor_(acting, decide=not whole_days)
        if whole_days:
            compilation.day_(phase)
    calls = [rollouts.graphed, validation.graphed, *parts.update_phase.graphed.values()]
    graph_calls(calls, enabled=config.runtime.cuda_graphs and whole_days)
    return parts._replace(gate=make_gate(config, market), compilation=compilation)


def build_phases(
    config: Config, market: Market, sharding: Sharding | None = None, *, block_device: torch.device | None = None
) -> Parts:
    """The loop's parts as the algorithm reads them: the random streams, the population, the replay buffer, the
    rollouts, validation and the update phase, eager and without a selection gate (``build_parts`` adds both).

    On the meta device they have shapes and no memory: ``run.sizing`` reads what a run holds off them, their blocks
    of days sized for ``block_device``, the device they stand for (by default the market's)."""
    device = market.device
    settings, popsize = config.learner, config.evolution.popsize
    sharding = sharding or Sharding(popsize, device=device)
    generators = make_generators(config.runtime.seed, device)
    size = window_size(config.env.lookback, market.num_features)
    population = build_population(config, size, device=device, generators=generators, share=sharding.share)
    buffer = ReplayBuffer(
        settings.buffer_size,
        market,
        lookback=config.env.lookback,
        execution_delay=config.env.execution_delay,
        held_days=config.env.rebalance_every,
        sample_shape=(popsize, settings.batch_size),
        share=sharding.share,
        next_obs=population.learner.reads_next_obs,  # gathered only for a learner that reads them
    )
    validation = Validation(config, market, population, sharding=sharding, block_device=block_device)
    rollouts = Rollouts(
        config, market, population, buffer, generators=generators, sharding=sharding, block_device=block_device
    )
    return Parts(
        sharding=sharding,
        generators=generators,
        population=population,
        buffer=buffer,
        rollouts=rollouts,
        validation=validation,
        update_phase=UpdatePhase(config, population.learner, buffer, generator=generators["replay"], sharding=sharding),
        gate=None,
        compilation=Compilation(enabled=False),
    )


def runs_folder(config: Config) -> Path:
    """The local folder that holds the runs: the checkpoint location, or for a bucket its local copy."""
    scheme, _, path = parse_uri(config.checkpoint.uri)
    return Path(config.checkpoint.local_dir if scheme == "gs" else path)


def make_gate(config: Config, market: Market) -> SequentialGate | None:
    """The run's selection gate (``training.selection``); None with ``selection.method=bonferroni``. Its resamples
    come from a stream of their own, drawn once from the seed: every look and every resume sees the same ones. With
    ``method=final`` the looks before the run's last spend ``selection.early_fraction`` of alpha, the last the rest."""
    selection = config.selection
    if selection.method == "bonferroni":
        return None
    validation = market.splits.validation
    relatives = to_host(market.relatives[validation.start : validation.stop])  # (D, N)
    mean_block = selection.block_days or validation_block_length(relatives)
    return SequentialGate(
        len(validation),
        alpha=selection.alpha,
        draws=selection.bootstrap_draws,
        mean_block=mean_block,
        half_spent_at=selection.half_spent_at,
        generator=gate_generator(config.runtime.seed),
        early_fraction=selection.early_fraction if selection.method == "final" else None,
        device=market.device,
    )
