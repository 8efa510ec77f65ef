"""What a run needs in memory, per process, checked before anything is allocated.

A value such as ``learner.buffer_size=10000000000``, or a universe of 500 assets at GPU-pod widths, would otherwise end
in an allocator traceback (or the kernel's out-of-memory killer) minutes into start-up or in generation 1. Each item
below is the storage a run allocates once at start (design invariant 1), or the working memory of its largest phase
(the phases run one after the other, so the caching allocator serves each from the memory the one before released).
What the run holds is read off its parts themselves: ``run.parts.build_phases`` builds them on the meta device, where
tensors have shapes and no memory, and each tensor they reach is counted once (``held_bytes``), whatever the
algorithm, book or environment. The update phase's working memory is measured the same way, by running one update of
those parts (``measure``); the rollout and validation report theirs from their blocks of days (``working_bytes`` of
each: running the days on the meta device would cost about a second a start). Evolution's working memory and the
checkpoint's host copies are counted from the shapes the code allocates (``training.evolution``, ``persistence``).
``tests/run/test_sizing_counts.py`` holds every count against real parts and what the profiler sees each phase
allocate.

Not counted: the market, which is loaded before the check (the free figure already excludes it, and on CUDA the
context it created), and Python's own objects.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import sys
import tempfile
from collections.abc import Iterator
from typing import NamedTuple

import psutil
import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode

from config import Config
from environment.market import Market, Splits
from environment.observation import window_size
from models.learner import Learner
from run.parts import build_phases
from runtime.sharding import Ranks, Sharding
from utils.errors import ConfigError
from utils.telemetry import format_bytes

FLOAT_BYTES = 4
BF16_BYTES = 2
INDEX_BYTES = 8  # int64 positions and days
GIB = 1 << 30

CUDA_RUNTIME_BYTES = GIB
"""What the first generation adds on CUDA outside any tensor: the kernels of torch and cuBLAS, loaded lazily on first
use (cuBLAS's alone several hundred MiB), cuBLAS's workspaces, and the caching allocator's rounding (2 MiB blocks,
20 MiB segments) and fragmentation between phases of different shapes. The context itself (some 500 MiB) exists by
the time of the check, created when the market was loaded, so the free figure already excludes it."""
CUDA_CONTEXT_BYTES = GIB // 2
"""The CUDA context of one process (some 500 MiB): not in the free figure a process sees before it creates its own, as
when a backtest checks, before they start, the worker processes that will share a GPU."""
NCCL_BYTES = GIB
"""NCCL's buffers in each of several processes on CUDA: a 4 MiB buffer (NCCL_BUFFSIZE) per channel, protocol and peer,
for the rings of the all-gathers and broadcasts and the point-to-point connections of evolution's all-to-all; several
hundred MiB on an 8-GPU NVLink node, more with NVLS."""

BUFFER = "replay buffer (learner.buffer_size)"
SAMPLES = "sample buffers (evolution.popsize x learner.batch_size)"
OBSERVATION_NOISE = "observation noise (learner.observation_noise: all of evolution.popsize x learner.batch_size)"
WIDTHS = "model.encoder_hidden, .embedding, .head_hidden"
POPULATION = (
    f"population: actors, critics, their targets, gradients and Adam moments, and the champion (evolution.popsize x "
    f"{WIDTHS})"
)
ENVIRONMENTS = (
    "environments and their blocks' windows (evolution.popsize x rollout.episodes x env.episode_days, "
    "data.validation_days)"
)
EXCHANGE = "transitions exchanged between processes (evolution.popsize x rollout.episodes)"
PHASES = {
    "rollout": f"rollout's activations (evolution.popsize x rollout.episodes x assets x {WIDTHS})",
    "validation": f"validation's activations (evolution.popsize x assets x {WIDTHS})",
    "evolution": f"evolution's copies and mutation draws (evolution.popsize x {WIDTHS})",
    "update": f"learner update's activations (evolution.popsize x learner.batch_size x assets x {WIDTHS})",
}
"""The working memory of each phase, by the phase's name in ``working_bytes``."""
CUDA_RUNTIME = "CUDA kernels, cuBLAS workspaces and allocator slack"
BUFFER_COPIES = "replay buffer's checkpoint copies (learner.buffer_size): staged and being written"
POPULATION_COPIES = "population's checkpoint copies (evolution.popsize): staged and being written"
GATE = "selection gate's resamples (selection.bootstrap_draws x data.validation_days)"


class RunShape(NamedTuple):
    """What a process's memory depends on besides the config: the market's shape, the processes the population is
    shared by (each holds P / W agents, ``runtime.sharding``), and the training device's type."""

    num_assets: int
    num_features: int
    processes: int = 1
    device: torch.device | str = "cpu"
    tradable_mask: bool = False
    """The market's assets do not all trade every day (``Market.tradable``)."""
    splits: Splits | None = None
    """The market's day ranges, where it is loaded: else ranges just long enough for the config."""

    @classmethod
    def of(cls, market: Market, *, processes: int = 1) -> RunShape:
        tradable_mask = market.tradable is not None
        return cls(market.num_assets, market.num_features, processes, market.device, tradable_mask, market.splits)

    @property
    def on_cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    def agents(self, popsize: int) -> int:
        """The agents one process holds."""
        return popsize // self.processes

    def window(self, config: Config) -> int:
        """An observation window's values per asset (``environment.observation.window_size``)."""
        return window_size(config.env.lookback, self.num_features)


# ---------------------------------------------------------------------------------------------- the learner


class LearnerValues(NamedTuple):
    """Values per agent of the learner's tensors (``models.learner``), each stacked by agent."""

    networks: int
    """Every network's parameters: the actor, the critics and all their targets."""
    trained: int
    """The parameters the optimisers train (each with a gradient and two moments): the actor and the critics."""
    actor: int
    """The actor's parameters (the champion's, and validation's rows, are one more actor each)."""
    largest_actor_tensor: int
    """The actor's largest parameter tensor (evolution works one tensor at a time)."""
    tensors: tuple[int, ...]
    """Each tensor a checkpoint holds per agent (``Learner.agent_tensors``: networks and moments)."""
    actor_tensors: tuple[int, ...]
    """Each of the actor's parameter tensors (the champion holds one of each)."""

    @classmethod
    def of(cls, learner: Learner) -> LearnerValues:
        def per_agent(tensors) -> list[int]:
            return [tensor.shape[1:].numel() for tensor in tensors]

        trained = per_agent(p for module in learner.trained_networks for p in module.parameters())
        actor = per_agent(learner.actor.parameters())
        networks = sum(per_agent(learner.network_tensors().values()))
        tensors = tuple(per_agent(learner.agent_tensors().values()))
        return cls(networks, sum(trained), sum(actor), max(actor), tensors, tuple(actor))


# ---------------------------------------------------------------------------------------------- the parts


class Measured(NamedTuple):
    """What one process's parts hold, and what its phases allocate at once, read off them (``measure``)."""

    held: tuple[tuple[str, int], ...]
    """Bytes by item, each tensor counted once, in the first item that reaches it."""
    learner: LearnerValues
    """The learner's tensors, per agent."""
    buffer_tensors: tuple[int, ...]
    """Bytes of each of the replay buffer's storage tensors (its checkpoint copies are staged one by one)."""
    update: int
    """The most bytes one update of the update phase allocates at once on top of what the parts hold: its batch's
    draw and gather, the observation noise, the learner's losses, backward passes, clips, Adam steps and averages."""
    days: tuple[tuple[str, int], ...]
    """The most bytes the rollout and validation allocate at once, by phase, as each reports it from its blocks of
    days (``working_bytes``)."""


@functools.lru_cache(maxsize=8)
def measure(config: Config, shape: RunShape) -> Measured:
    """What one process's parts hold from a run's start to its end (design invariant 1), read off the parts
    themselves (``run.parts.build_phases``): built on the meta device for a market of ``shape``, their blocks of days
    sized for ``shape.device``; and what one update of the update phase allocates at once, run on them.

    With ``model.bf16_encoder`` the parts are built in float32: they hold the same tensors, and autocast, which has no
    meta device, is left out of the update (an upper bound; its weights' bf16 copies are counted apart)."""
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, bf16_encoder=False))
    market = shaped_market(config, shape)
    sharding = Sharding(config.evolution.popsize, Ranks(world_size=shape.processes), device="meta")
    with _no_cache_left_behind():
        parts = build_phases(config, market, sharding, block_device=torch.device(shape.device))
    counted: set[StorageWeakRef] = set()
    _storage_bytes(market, counted)  # loaded before the check
    held = {
        BUFFER: _storage_bytes(parts.buffer.storage, counted),
        SAMPLES: _storage_bytes(parts.buffer, counted),
        POPULATION: _storage_bytes(parts.population, counted),
    }
    if parts.update_phase.noise is not None:
        held[OBSERVATION_NOISE] = _storage_bytes(parts.update_phase.noise, counted)
    if shape.processes > 1:
        held[EXCHANGE] = _storage_bytes(parts.rollouts.exchange, counted)
    held[ENVIRONMENTS] = _storage_bytes([parts.rollouts, parts.validation, parts.update_phase], counted)
    buffer_tensors = tuple(tensor.nbytes for tensor in parts.buffer.storage.values())
    buffer = parts.buffer
    # Transitions from a day a rollout starts on: the meta device holds no values, but a device that backs it with
    # memory (the tests' emulated CUDA) then gathers windows that exist.
    buffer.storage["days"].fill_(int(parts.rollouts.episode_starts.learning[0]))
    with _no_cache_left_behind(), PeakBytes() as update:
        # The batch's positions as a sample draws them, for all P, on the device: drawn from the host's stream, a
        # meta build's would take host memory of that size.
        drawn = torch.zeros(buffer.sample_shape, dtype=torch.long, device="meta")
        parts.update_phase.update_on(buffer.gather(buffer.share.mine(drawn)))  # the learner's update with every part
    days = (("rollout", parts.rollouts.working_bytes()), ("validation", parts.validation.working_bytes()))
    return Measured(tuple(held.items()), LearnerValues.of(parts.population.learner), buffer_tensors, update.peak, days)


def held_bytes(config: Config, shape: RunShape) -> dict[str, int]:
    """What one process's parts hold, by item (``measure``)."""
    return dict(measure(config, shape).held)


def shaped_market(config: Config, shape: RunShape) -> Market:
    """A market of ``shape`` on the meta device, with its day ranges, or else training days enough for the config's
    episodes and fitness blocks and its validation range: what the parts hold does not depend on the market's
    values or on its other days."""
    if shape.splits is not None:
        splits = shape.splits
    else:
        env, rollout = config.env, config.rollout
        block = env.episode_days + 2 * rollout.fitness_embargo_days + 1
        train = range(env.lookback + env.execution_delay + 2 + (rollout.fitness_block_every + 2) * block)
        validation = range(train.stop, train.stop + config.data.validation_days)
        splits = Splits(train=train, validation=validation, holdout=range(validation.stop, validation.stop + 1))
    days = max(split.stop for split in (splits.train, splits.validation, splits.holdout, splits.gap, splits.embargo))

    def empty(*size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device="meta")

    return Market(
        dates=("",) * days,
        tickers=("",) * shape.num_assets,
        feature_names=("",) * shape.num_features,
        features=empty(days, shape.num_assets, shape.num_features),
        relatives=empty(days, shape.num_assets),
        splits=splits,
        tradable=empty(days, shape.num_assets, dtype=torch.bool) if shape.tradable_mask else None,
    )


def _storage_bytes(root: object, counted: set[StorageWeakRef]) -> int:
    """Bytes of the tensor storages reachable from ``root`` through this project's objects, torch's modules and
    optimisers, containers and partial functions (a phase's buffers are bound to its graphed call), and each
    parameter's gradient; a storage in ``counted`` is passed over, and each one found is added to it."""
    total, seen, stack = 0, set(), [root]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, torch.Tensor):
            for tensor in (item,) if item.grad is None else (item, item.grad):
                storage = StorageWeakRef(tensor.untyped_storage())
                if storage not in counted:
                    counted.add(storage)
                    total += tensor.untyped_storage().nbytes()
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(item)
        elif isinstance(item, functools.partial):
            stack.extend([*item.args, *item.keywords.values()])
        elif isinstance(item, (torch.nn.Module, torch.optim.Optimizer)) or _is_ours(item):
            stack.extend(vars(item).values())
    return total


def _is_ours(item: object) -> bool:
    return type(item).__module__.split(".")[0] in _PACKAGES and hasattr(item, "__dict__")


_PACKAGES = frozenset({"environment", "models", "runtime", "training"})


# ---------------------------------------------------------------------------------------------- activations


class PeakBytes(TorchDispatchMode):
    """The most bytes of tensors created under it that were alive at once (their storages, each counted once)."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0
        self._live: dict[StorageWeakRef, int] = {}
        self._bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for ref in [ref for ref in self._live if ref.expired()]:
            self._bytes -= self._live.pop(ref)
        # An output that shares an input's storage (in place, or a view) allocated nothing.
        inputs = {StorageWeakRef(t.untyped_storage()) for t in _tensors((args, kwargs))}
        for tensor in _tensors(out):
            ref = StorageWeakRef(tensor.untyped_storage())
            if ref not in self._live and ref not in inputs:
                self._live[ref] = tensor.untyped_storage().nbytes()
                self._bytes += self._live[ref]
        self.peak = max(self.peak, self._bytes)
        return out


def _tensors(value) -> list[torch.Tensor]:
    """The tensors in a nest of tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


@contextlib.contextmanager
def _no_cache_left_behind() -> Iterator[None]:
    """Around the meta device's arithmetic: many of its kernels are Python references that import ``torch._dynamo``
    on first use, and that import creates inductor's cache folder (``torchinductor_<user>`` in the temporary
    directory). The check runs before a config is refused, and bad input writes nothing: the folder goes to a scratch
    directory removed afterwards, unless a folder was chosen (``TORCHINDUCTOR_CACHE_DIR``) or the import was made
    already. A compiled run sets its own folder later (``runtime.compiled``)."""
    if "torch._dynamo" in sys.modules or "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    with tempfile.TemporaryDirectory(prefix="erl-sizing-") as scratch:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = scratch
        try:
            yield
        finally:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def working_bytes(config: Config, shape: RunShape) -> dict[str, int]:
    """The memory each phase of a generation allocates and releases, in one of ``shape.processes`` (by ``PHASES`` key)
    on a device of ``shape.device``'s type (its blocks of days are sized by it, ``training.rollout.BLOCK_BYTES``).
    Random draws are made for the whole population on every process (``runtime.sharding``), so they count all P."""
    model, popsize, processes = config.model, config.evolution.popsize, shape.processes
    agents = shape.agents(popsize)
    window = shape.window(config)
    measured = measure(config, shape)
    values = measured.learner
    actor, others = values.actor, values.networks - values.actor + 2 * values.trained  # a parent's other tensors
    # bf16 copies of an encoder's weights, cached by autocast for one forward
    weight_casts = agents * (window + model.embedding) * model.encoder_hidden * BF16_BYTES if model.bf16_encoder else 0

    # The days' phases as each reports itself from its blocks (training.rollout), and with a bf16 encoder its weights'
    # copies.
    days = dict(measured.days)
    rollout_bytes, validation_bytes = days["rollout"] + weight_casts, days["validation"] + weight_casts

    # Offspring rows gathered, blended and mutated one tensor at a time; mutation draws normal and uniform values
    # for all P. Several processes first fetch the donors' rows that others hold and concatenate them to their own:
    # all tensors but the actor's (critic, its target, both Adams' moments) for parents, then actors for parents
    # and mates; about one foreign donor per slot held, each a row sent, received and concatenated.
    offspring = min(agents, popsize - config.evolution.elites)
    evolution = FLOAT_BYTES * values.largest_actor_tensor * max(4 * offspring, popsize + 3 * agents)
    if processes > 1:
        parents, actors = min(agents, popsize - agents), min(2 * agents, popsize - agents)
        evolution = max(
            FLOAT_BYTES * (agents + 3 * parents) * (actor + others),
            FLOAT_BYTES * (agents + 3 * actors) * actor + evolution,
        )

    # One update of the update phase, measured on the parts (``measure``), and with a bf16 encoder its weights' copies.
    update = measured.update + weight_casts
    return {"rollout": rollout_bytes, "validation": validation_bytes, "evolution": evolution, "update": update}


# ---------------------------------------------------------------------------------------------- a process


def process_bytes(config: Config, shape: RunShape) -> dict[str, int]:
    """Bytes one of ``shape.processes`` needs on its training device, by item (each named by the keys that size it):
    what its parts hold (``held_bytes``: its slots of the population, P / W, and the whole buffer), the working
    memory of its largest phase, and on CUDA the runtime's own."""
    processes = shape.processes
    with _no_cache_left_behind():  # around all its meta-device work: the folder may be made after the import
        needs = held_bytes(config, shape)
        phases = working_bytes(config, shape)
    largest = max(phases, key=phases.__getitem__)
    needs[PHASES[largest]] = phases[largest]
    if shape.on_cuda:
        needs[CUDA_RUNTIME] = CUDA_RUNTIME_BYTES
        if processes > 1:
            needs[f"NCCL buffers of {processes} processes"] = NCCL_BYTES
    return needs


def host_bytes(config: Config, shape: RunShape) -> dict[str, int]:
    """Bytes the processes of one machine need in host memory besides the training device's: a checkpoint's staging
    buffers (``persistence.staging``; each process stages its slots, the leader the buffer, and with several processes
    the leader gathers the whole population into buffers of its own), the checkpoint the writer thread holds as bytes
    while it writes (``persistence.committing.encode_tensor_group``), and the selection gate's resamples.
    Staging buffers for a CUDA device are pinned, and the pinned allocator rounds each up to a power of two."""
    popsize, processes = config.evolution.popsize, shape.processes
    agents = shape.agents(popsize)

    def staged(size: int) -> int:
        return 1 << (size - 1).bit_length() if shape.on_cuda and size > 0 else size

    measured = measure(config, shape)
    stored, values = measured.buffer_tensors, measured.learner
    # per agent: the learner's networks and moments, the exploration stdev; and the champion
    slot_tensors = [*values.tensors, 1]
    champion = values.actor * FLOAT_BYTES
    whole = popsize * sum(slot_tensors) * FLOAT_BYTES + champion
    population = processes * sum(
        staged(rows * size * FLOAT_BYTES)
        for rows, tensors in ((agents, slot_tensors), (1, values.actor_tensors))
        for size in tensors
    )
    if processes > 1:
        population += whole - champion
    needs = {
        BUFFER_COPIES: sum(staged(size) for size in stored) + sum(stored),
        POPULATION_COPIES: population + whole,
    }
    if config.selection.method == "bootstrap":
        needs[GATE] = config.selection.bootstrap_draws * config.data.validation_days * INDEX_BYTES
    return needs


# ---------------------------------------------------------------------------------------------- the check


def available_bytes(device: torch.device) -> int:
    """Memory free for this run on ``device`` now."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


def check_memory(config: Config, market: Market, *, processes: int = 1) -> None:
    """A one-line ConfigError when one of ``processes`` cannot fit in the memory of the market's device, or the
    checkpoint's host copies in the host's (on the CPU, one memory holds both)."""
    shape = RunShape.of(market, processes=processes)
    needs, host = process_bytes(config, shape), host_bytes(config, shape)
    if market.device.type == "cpu":
        needs.update(host)
    else:
        _require_fits(host, torch.device("cpu"))
    _require_fits(needs, market.device)


def _require_fits(needs: dict[str, int], device: torch.device) -> None:
    total = sum(needs.values())
    free = available_bytes(device)
    if total > free:
        largest = max(needs, key=needs.__getitem__)
        raise ConfigError(
            f"this config needs at least {format_bytes(total)} of memory, {format_bytes(needs[largest])} of it for "
            f"the {largest}, but {device.type} has {format_bytes(free)} free; lower those settings"
        )
