"""What a config needs in memory, checked before anything is allocated.

A value such as ``ddpg.buffer_size=10000000000`` would otherwise end in an allocator traceback (or the kernel's
out-of-memory killer) minutes into start-up. The figures are lower bounds of the storage the trainer allocates
once at start (design invariant 1), so a config that is refused could never have run; one that passes may still
need more (activations, the allocator's slack).
"""

from __future__ import annotations

import psutil
import torch

from config import Config
from environment.market import Market
from utils.errors import ConfigError
from utils.telemetry import format_bytes

FLOAT_BYTES = 4


def storage_bytes(config: Config, *, num_assets: int, num_features: int, processes: int = 1) -> dict[str, int]:
    """Bytes of the largest allocations of a run, by what they hold (each named by the keys that size it), in one of
    ``processes`` that share the population (``training.sharding``: each holds its slots and the whole ring)."""
    popsize, episodes = config.evolution.popsize // processes, config.rollout.episodes
    n1 = num_assets + 1
    window = config.env.lookback * num_features  # L * K values per asset
    batch = popsize * config.ddpg.batch_size
    return {
        # day index, three weight vectors, reward, two flags per transition
        "replay ring (ddpg.buffer_size)": config.ddpg.buffer_size * (4 + 3 * n1 * FLOAT_BYTES + FLOAT_BYTES + 2),
        # observation and next observation windows of every sampled transition
        "sample buffers (evolution.popsize x ddpg.batch_size)": 2 * batch * num_assets * window * FLOAT_BYTES,
        # the first encoder layer of actor, critic and both targets: a part of each agent's parameters
        "population (evolution.popsize x model.encoder_hidden)": 4
        * popsize
        * window
        * config.model.encoder_hidden
        * FLOAT_BYTES,
        # portfolio weights and the reward and turnover histories of every agent and episode
        "environments (evolution.popsize x rollout.episodes x env.episode_days)": popsize
        * episodes
        * (n1 + 2 * config.env.episode_days)
        * FLOAT_BYTES,
    }


def available_bytes(device: torch.device) -> int:
    """Memory free for this run on ``device`` now."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


STAGED = ("replay ring", "population")
"""The allocations ``persistence.staging`` copies into host staging buffers of the same size."""


def check_memory(config: Config, market: Market, *, processes: int = 1) -> None:
    """A one-line ConfigError when the storage of one of ``processes`` cannot fit in the memory of the market's
    device, or the checkpoint staging buffers (the whole population's, as the leader gathers them) in the host's."""
    sizes = {"num_assets": market.num_assets, "num_features": market.num_features}
    needs = storage_bytes(config, **sizes, processes=processes)
    whole = storage_bytes(config, **sizes)
    staged = {f"{name}, staged for checkpoints": size for name, size in whole.items() if name.startswith(STAGED)}
    if market.device.type == "cpu":  # one memory for both: every staged allocation counts again
        needs = {name: size + (staged.get(f"{name}, staged for checkpoints", 0)) for name, size in needs.items()}
    else:
        _require_fits(staged, torch.device("cpu"))
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
