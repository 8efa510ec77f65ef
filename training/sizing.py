"""What a run needs in memory, per process, checked before anything is allocated.

A value such as ``ddpg.buffer_size=10000000000``, or a universe of 500 assets at GPU-pod widths, would otherwise end
in an allocator traceback (or the kernel's out-of-memory killer) minutes into start-up or in generation 1. Each item
below is computed from the shapes the code allocates (``models.networks``, ``models.population``, ``models.optim``,
``models.replay``, ``models.ddpg``, ``training.rollout``, ``training.evolution``, ``persistence``): the storage a run
allocates once at start (design invariant 1), and the working memory of its largest phase (the phases run one after
the other, so the caching allocator serves each from the memory the one before released).
``tests/training/test_sizing_counts.py`` holds the counts against a real population and buffer, the tensors a real DDPG
update saves for backward, and every allocation the profiler sees it make.

Not counted: the market, which is loaded before the check (the free figure already excludes it, and on CUDA the
context it created), and Python's own objects.
"""

from __future__ import annotations

import psutil
import torch

from config import Config, ModelConfig
from environment.market import Market
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

BUFFER = "replay buffer (ddpg.buffer_size)"
SAMPLES = "sample buffers (evolution.popsize x ddpg.batch_size)"
OBSERVATION_NOISE = "observation noise (ddpg.observation_noise: all of evolution.popsize x ddpg.batch_size)"
WIDTHS = "model.encoder_hidden, .embedding, .head_hidden"
NETWORKS = f"actor, critic, their targets and the champion (evolution.popsize x {WIDTHS})"
OPTIMISER = f"gradients and Adam moments (evolution.popsize x {WIDTHS})"
ENVIRONMENTS = "environments (evolution.popsize x rollout.episodes x env.episode_days, data.validation_days)"
EXCHANGE = "transitions exchanged between processes (evolution.popsize x rollout.episodes)"
PHASES = {
    "rollout": f"rollout's activations (evolution.popsize x rollout.episodes x assets x {WIDTHS})",
    "validation": f"validation's activations (evolution.popsize x assets x {WIDTHS})",
    "evolution": f"evolution's copies and mutation draws (evolution.popsize x {WIDTHS})",
    "update": f"DDPG update's activations (evolution.popsize x ddpg.batch_size x assets x {WIDTHS})",
}
"""The working memory of each phase, by the phase's name in ``working_bytes``."""
CUDA_RUNTIME = "CUDA kernels, cuBLAS workspaces and allocator slack"
BUFFER_COPIES = "replay buffer's checkpoint copies (ddpg.buffer_size): staged and being written"
POPULATION_COPIES = "population's checkpoint copies (evolution.popsize): staged and being written"
GATE = "selection gate's resamples (selection.bootstrap_draws x data.validation_days)"


# ---------------------------------------------------------------------------------------------- the networks


def network_layers(model: ModelConfig, window: int) -> dict[str, list[tuple[int, int]]]:
    """(in, out) of every batched linear layer of one agent's actor and critic, as ``models.networks`` builds them;
    ``window`` is L * K values per asset. Each layer holds an (in, out) weight and an (out,) bias per agent."""
    encoder = [(window, model.encoder_hidden), (model.encoder_hidden, model.embedding)]
    embedding, hidden = model.embedding, model.head_hidden
    return {
        "actor": [*encoder, (2 * embedding + 1, hidden), (hidden, 1), (embedding + 1, hidden), (hidden, 1)],
        "critic": [*encoder, (embedding + 2, hidden), (hidden + 2, hidden), (hidden, 1)],
    }


def agent_tensor_sizes(model: ModelConfig, window: int) -> dict[str, list[int]]:
    """Values per agent of every parameter tensor of the actor and of the critic."""
    layers = network_layers(model, window)
    return {name: [size for a, b in shape for size in (a * b, b)] for name, shape in layers.items()}


def population_bytes(model: ModelConfig, window: int, *, agents: int) -> dict[str, int]:
    """The population's tensors in a process holding ``agents`` slots: parameters of actor, critic and both targets
    for each agent, the champion's actor and the exploration stdevs; the gradients (allocated once, ``models.optim``)
    and Adam's two moments of actor and critic."""
    sizes = agent_tensor_sizes(model, window)
    actor, critic = sum(sizes["actor"]), sum(sizes["critic"])
    return {
        NETWORKS: FLOAT_BYTES * (agents * (2 * actor + 2 * critic + 1) + actor),
        OPTIMISER: FLOAT_BYTES * 3 * agents * (actor + critic),
    }


# ---------------------------------------------------------------------------------------------- activations


def forward_peak_bytes(model: ModelConfig, *, rows: int, window: int, shared_windows: bool) -> int:
    """Most bytes alive at once in a forward without gradients of an actor (a critic's is smaller) over ``rows``
    (agent, observation, asset) rows. ``shared_windows``: every agent reads the same windows (rollout, validation),
    so the first layer is a broadcast matmul plus the bias out of place (float32 under bf16 autocast, by promotion)."""
    hidden, embedding, bf16 = model.encoder_hidden, model.embedding, model.bf16_encoder
    encoded = BF16_BYTES if bf16 else FLOAT_BYTES
    if shared_windows:  # the matmul's output and its sum with the bias; then that sum beside the second layer's
        first = hidden * (encoded + FLOAT_BYTES)
        second = hidden * (FLOAT_BYTES + (BF16_BYTES if bf16 else 0)) + embedding * encoded
    else:  # the output (after autocast's bf16 copy of the windows); then beside the second layer's
        first = hidden * encoded + (window * BF16_BYTES if bf16 else 0)
        second = (hidden + embedding) * encoded
    second += embedding * FLOAT_BYTES if bf16 else 0  # the embedding back in float32
    # the embedding, the asset head's input [embedding, context, weight] and its hidden layer
    heads = FLOAT_BYTES * (embedding + 2 * embedding + 1 + model.head_hidden + 1)
    return rows * max(first, second, heads)


def ddpg_saved_bytes(config: Config, *, agents: int, num_assets: int, window: int) -> int:
    """Bytes saved for backward at the peak of one batched DDPG update (``models.ddpg.ddpg_update``) of ``agents``
    agents, besides the parameters and the batch: the critic's graph, or the actor's (the critic's is freed by its
    backward before the actor's forward), whichever is larger."""
    model, ddpg = config.model, config.ddpg
    hidden, embedding, head = model.encoder_hidden, model.embedding, model.head_hidden
    pairs = agents * ddpg.batch_size  # (agent, transition)
    rows = pairs * num_assets  # (agent, transition, asset)
    n1 = num_assets + 1
    # Each layer's ReLU output, which the next layer's weight gradient reads too; the first layer's input is the
    # batch's windows, except under autocast, which saves their bf16 copy and the second layer's bf16 weight.
    if model.bf16_encoder:
        encoder = rows * (window + hidden + embedding) * BF16_BYTES + agents * hidden * embedding * BF16_BYTES
    else:
        encoder = rows * (hidden + embedding) * FLOAT_BYTES
    # per asset: [embedding, weight, action] in, hidden out; per transition: [pooled, cash weight, cash action] in,
    # hidden out, Q; the squared TD error's base
    critic = encoder + FLOAT_BYTES * (rows * (embedding + 2 + head) + pairs * (2 * head + 2 + 2))
    # per asset: [embedding, context, weight] in, hidden out; per transition: the cash head's in and hidden, softmax
    actor = encoder + FLOAT_BYTES * (rows * (2 * embedding + 1 + head) + pairs * (embedding + 1 + head + n1))
    # a frozen critic differentiated through its action input: its heads' ReLU outputs
    critic_through_action = FLOAT_BYTES * (rows * head + pairs * (head + 1))
    if ddpg.actor_objective == "model":
        # portfolio_step: |target - weights| (assets), target * relatives, growth and costs
        step = FLOAT_BYTES * pairs * (num_assets + n1 + 3)
        actor_phase = actor + step
        if ddpg.gamma > 0:  # the actor again on the next day's windows, and the critic's value of them
            actor_phase += actor + critic_through_action + FLOAT_BYTES * pairs
    else:
        actor_phase = actor + critic_through_action
    if ddpg.tilt_penalty > 0:
        actor_phase += FLOAT_BYTES * pairs * n1
    return max(critic, actor_phase)


def working_bytes(config: Config, *, num_assets: int, num_features: int, processes: int = 1) -> dict[str, int]:
    """The memory each phase of a generation allocates and releases, in one of ``processes`` (by ``PHASES`` key).
    Random draws are made for the whole population on every process (``training.sharding``), so they count all P."""
    model, ddpg, rollout = config.model, config.ddpg, config.rollout
    popsize = config.evolution.popsize
    agents = popsize // processes
    episodes, n1 = rollout.episodes, num_assets + 1
    window = config.env.lookback * num_features
    sizes = agent_tensor_sizes(model, window)
    actor, critic = sum(sizes["actor"]), sum(sizes["critic"])
    largest_actor_tensor = max(sizes["actor"])
    # bf16 copies of an encoder's weights, cached by autocast for one forward
    weight_casts = agents * (window + model.embedding) * model.encoder_hidden * BF16_BYTES if model.bf16_encoder else 0

    # A step: the actors' forward over every episode, exploration noise drawn for all P (rows kept), scaled, the
    # logits, their sum and softmax, and the environment's step (target * relatives, next weights, a weights clone).
    step_vectors = FLOAT_BYTES * n1 * episodes * (popsize + 8 * agents)
    rollout_bytes = (
        forward_peak_bytes(model, rows=agents * episodes * num_assets, window=window, shared_windows=True)
        + step_vectors
        + weight_casts
    )
    validation_bytes = (
        forward_peak_bytes(model, rows=agents * num_assets, window=window, shared_windows=True)
        + FLOAT_BYTES * n1 * 8 * (agents + 2)
        + weight_casts
    )

    # Offspring rows gathered, blended and mutated one tensor at a time; mutation draws normal and uniform values
    # for all P. Several processes first fetch the donors' rows that others hold and concatenate them to their own:
    # all tensors but the actor's (critic, its target, both Adams' moments) for parents, then actors for parents
    # and mates; about one foreign donor per slot held, each a row sent, received and concatenated.
    offspring = min(agents, popsize - config.evolution.elites)
    evolution = FLOAT_BYTES * largest_actor_tensor * max(4 * offspring, popsize + 3 * agents)
    if processes > 1:
        parents, actors = min(agents, popsize - agents), min(2 * agents, popsize - agents)
        evolution = max(
            FLOAT_BYTES * (agents + 3 * parents) * (2 * actor + 4 * critic),
            FLOAT_BYTES * (agents + 3 * actors) * actor + evolution,
        )

    # The batch's gathered vectors (weights, actions, next weights, the day's relatives with and without cash),
    # rewards and flags, the days and positions (drawn for all P); then the larger of the target networks' forward,
    # the graph saved for backward with the gradients in flight, and an Adam step's square roots of the moments.
    pairs = agents * ddpg.batch_size
    rows = pairs * num_assets
    batch = FLOAT_BYTES * pairs * (4 * n1 + num_assets + 3) + INDEX_BYTES * (2 * pairs + popsize * ddpg.batch_size)
    saved = ddpg_saved_bytes(config, agents=agents, num_assets=num_assets, window=window)
    # a layer's output gradient, its ReLU-masked copy and the gradient of its input
    in_flight = FLOAT_BYTES * rows * (2 * max(model.encoder_hidden, model.head_hidden) + 2 * model.embedding + 2)
    update = batch + max(
        forward_peak_bytes(model, rows=rows, window=window, shared_windows=False) + weight_casts,
        saved + in_flight + weight_casts,
        FLOAT_BYTES * agents * max(actor, critic),
    )
    return {"rollout": rollout_bytes, "validation": validation_bytes, "evolution": evolution, "update": update}


# ---------------------------------------------------------------------------------------------- a process


def buffer_tensor_bytes(config: Config, *, num_assets: int) -> list[int]:
    """Bytes of each of the buffer's tensors (``models.replay``): int32 days, three weight vectors, reward, flags."""
    capacity, n1 = config.ddpg.buffer_size, num_assets + 1
    return [capacity * 4, *[capacity * n1 * FLOAT_BYTES] * 3, capacity * FLOAT_BYTES, capacity, capacity]


def process_bytes(
    config: Config,
    *,
    num_assets: int,
    num_features: int,
    processes: int = 1,
    device: torch.device | str = "cpu",
) -> dict[str, int]:
    """Bytes one of ``processes`` needs on its training ``device``, by item (each named by the keys that size it):
    what it allocates once, its slots of the population (P / W, ``training.sharding``) and the whole buffer, and the
    working memory of its largest phase."""
    popsize, episodes = config.evolution.popsize, config.rollout.episodes
    agents = popsize // processes
    n1 = num_assets + 1
    window = config.env.lookback * num_features
    batch = config.ddpg.batch_size
    needs = {
        BUFFER: sum(buffer_tensor_bytes(config, num_assets=num_assets)),
        # observation and next observation windows of every sampled transition
        SAMPLES: 2 * agents * batch * num_assets * window * FLOAT_BYTES,
        **population_bytes(config.model, window, agents=agents),
        # training: E windows, P / W x E weights, reward and turnover histories; validation: one episode of
        # P / W + 2 (the champion and equal weight) over the whole range
        ENVIRONMENTS: FLOAT_BYTES
        * (
            (episodes + 1) * num_assets * window
            + agents * episodes * (n1 + 2 * config.env.episode_days)
            + (agents + 2) * (n1 + 2 * config.data.validation_days)
        ),
    }
    if config.ddpg.observation_noise > 0:  # kept from the first update on, drawn for all P on every process
        needs[OBSERVATION_NOISE] = popsize * batch * num_assets * window * FLOAT_BYTES
    if processes > 1:  # this process's transitions of a step and every process's (training.rollout.SharedSteps)
        needs[EXCHANGE] = (agents + popsize) * episodes * (3 * n1 + 1) * FLOAT_BYTES
    phases = working_bytes(config, num_assets=num_assets, num_features=num_features, processes=processes)
    largest = max(phases, key=phases.__getitem__)
    needs[PHASES[largest]] = phases[largest]
    if torch.device(device).type == "cuda":
        needs[CUDA_RUNTIME] = CUDA_RUNTIME_BYTES
        if processes > 1:
            needs[f"NCCL buffers of {processes} processes"] = NCCL_BYTES
    return needs


def host_bytes(
    config: Config, *, num_assets: int, num_features: int, processes: int = 1, pinned: bool = False
) -> dict[str, int]:
    """Bytes the processes of one machine need in host memory besides the training device's: a checkpoint's staging
    buffers (``persistence.staging``; each process stages its slots, the leader the buffer, and with several processes
    the leader gathers the whole population into buffers of its own), the checkpoint the writer thread holds as bytes
    while it writes (``persistence.checkpoint.encode_tensor_group``), and the selection gate's resamples.
    ``pinned``: staging buffers on CUDA are pinned, and the pinned allocator rounds each up to a power of two."""
    popsize = config.evolution.popsize
    agents = popsize // processes
    window = config.env.lookback * num_features

    def staged(size: int) -> int:
        return 1 << (size - 1).bit_length() if pinned and size > 0 else size

    stored = buffer_tensor_bytes(config, num_assets=num_assets)
    sizes = agent_tensor_sizes(config.model, window)
    # per agent: actor, critic, both targets, both Adams' two moments, the exploration stdev; and the champion
    slot_tensors = [*sizes["actor"] * 4, *sizes["critic"] * 4, 1]
    champion = sum(sizes["actor"]) * FLOAT_BYTES
    whole = popsize * sum(slot_tensors) * FLOAT_BYTES + champion
    population = processes * sum(
        staged(rows * size * FLOAT_BYTES)
        for rows, tensors in ((agents, slot_tensors), (1, sizes["actor"]))
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
    sizes = {"num_assets": market.num_assets, "num_features": market.num_features, "processes": processes}
    needs = process_bytes(config, **sizes, device=market.device)
    host = host_bytes(config, **sizes, pinned=market.device.type == "cuda")
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
