"""The memory check before anything is allocated (training/sizing.py)."""

import pytest
import torch

from config import override, preset
from training import sizing
from training.runs import load_market
from utils.errors import ConfigError


def test_on_the_cpu_the_checkpoint_staging_copy_counts_in_the_memory_check(monkeypatch):

    config = override(preset("default"), {"ddpg.buffer_size": 1_000_000})
    market = load_market(config, torch.device("cpu"))
    needs = sizing.storage_bytes(config, num_assets=market.num_assets, num_features=market.num_features)
    once = sum(needs.values())
    staged = sum(size for name, size in needs.items() if name.startswith(sizing.STAGED))
    monkeypatch.setattr(sizing, "available_bytes", lambda device: once + staged - 1)
    with pytest.raises(ConfigError, match="replay ring"):
        sizing.check_memory(config, market)
    monkeypatch.setattr(sizing, "available_bytes", lambda device: once + staged)
    sizing.check_memory(config, market)


def test_a_process_of_several_needs_room_for_its_share_of_the_agents_and_the_whole_ring(monkeypatch):
    config = override(preset("default"), {"evolution.popsize": 64, "ddpg.batch_size": 1024})
    market = load_market(config, torch.device("cpu"))
    sizes = {"num_assets": market.num_assets, "num_features": market.num_features}
    whole, half = sizing.storage_bytes(config, **sizes), sizing.storage_bytes(config, **sizes, processes=2)
    ring = "replay ring (ddpg.buffer_size)"
    assert half[ring] == whole[ring]  # every process holds the whole ring
    assert all(half[name] * 2 == whole[name] for name in whole if name != ring)
    staged = sum(size for name, size in whole.items() if name.startswith(sizing.STAGED))
    monkeypatch.setattr(sizing, "available_bytes", lambda device: sum(half.values()) + staged)
    sizing.check_memory(config, market, processes=2)
    with pytest.raises(ConfigError, match="this config needs at least"):  # one process holding every agent
        sizing.check_memory(config, market)
