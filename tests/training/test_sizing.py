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
