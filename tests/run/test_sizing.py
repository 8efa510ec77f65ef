"""The memory check before anything is allocated (run/sizing.py)."""

from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch

from config import override, preset
from environment.loading import load_market
from run import sizing
from utils.errors import ConfigError

GIB = 1 << 30


def _shape(market, processes: int = 1) -> sizing.RunShape:
    return sizing.RunShape.of(market, processes=processes)


def test_on_the_cpu_the_checkpoint_copies_count_in_the_memory_check(monkeypatch):
    config = override(preset("default"), {"learner.buffer_size": 1_000_000})
    market = load_market(config, torch.device("cpu"))
    needs = sizing.process_bytes(config, _shape(market))
    host = sizing.host_bytes(config, _shape(market))
    assert host[sizing.BUFFER_COPIES] == 2 * needs[sizing.BUFFER]  # staged, and encoded by the writer
    total = sum(needs.values()) + sum(host.values())
    monkeypatch.setattr(sizing, "available_bytes", lambda device: total - 1)
    with pytest.raises(ConfigError, match="replay buffer"):
        sizing.check_memory(config, market)
    monkeypatch.setattr(sizing, "available_bytes", lambda device: total)
    sizing.check_memory(config, market)


def test_a_process_of_several_needs_room_for_its_share_of_the_agents_and_the_whole_ring(monkeypatch):
    config = override(
        preset("default"), {"evolution.popsize": 64, "learner.batch_size": 1024, "learner.observation_noise": 0.1}
    )
    market = load_market(config, torch.device("cpu"))
    whole, half = sizing.process_bytes(config, _shape(market)), sizing.process_bytes(config, _shape(market, 2))
    for shared in (sizing.BUFFER, sizing.OBSERVATION_NOISE):  # every process holds the buffer and draws for all P
        assert half[shared] == whole[shared]
    # Each process holds its own agents' (and once the champion, and the ring's position).
    for per_agent in (sizing.SAMPLES, sizing.POPULATION):
        assert whole[per_agent] / 2 <= half[per_agent] < whole[per_agent] / 2 + 2**20
    update = sizing.PHASES["update"]
    assert whole[update] / 2 < half[update] < whole[update]  # the positions drawn for all P stay whole
    host = sum(sizing.host_bytes(config, _shape(market, 2)).values())
    monkeypatch.setattr(sizing, "available_bytes", lambda device: sum(half.values()) + host)
    sizing.check_memory(config, market, processes=2)
    with pytest.raises(ConfigError, match="this config needs at least"):  # one process holding every agent
        sizing.check_memory(config, market)


def _on_cuda(monkeypatch, *, device_free: int, host_free: int = 64 * GIB) -> None:
    """A CUDA device with ``device_free`` bytes free, and a host with ``host_free``."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (device_free, 80 * GIB))
    memory = namedtuple("memory", "available")
    monkeypatch.setattr(sizing.psutil, "virtual_memory", lambda: memory(host_free))


def _gpu_market(num_assets: int) -> SimpleNamespace:
    return SimpleNamespace(
        device=torch.device("cuda"), num_assets=num_assets, num_features=6, tradable=None, splits=None
    )


def test_on_cuda_a_wide_universe_is_refused_for_the_activations_its_stored_tensors_leave_out(monkeypatch):
    paper = preset("paper")
    _on_cuda(monkeypatch, device_free=20 * GIB)
    sizing.check_memory(paper, _gpu_market(20))  # the bundled universe fits

    wide = _gpu_market(500)
    needs = sizing.process_bytes(paper, sizing.RunShape(500, 6, device=wide.device))
    stored = (sizing.BUFFER, sizing.SAMPLES, sizing.POPULATION, sizing.ENVIRONMENTS)
    assert sum(needs[name] for name in stored) < 20 * GIB / 3  # what the stored tensors alone would have let pass
    with pytest.raises(ConfigError) as refused:
        sizing.check_memory(paper, wide)
    message = str(refused.value)
    assert "\n" not in message
    for phrase in ("needs at least", "learner update's activations", "cuda has 21.5 GB free"):
        assert phrase in message
    sizing.check_memory(paper, wide, processes=8)  # an eighth of the agents each, NCCL's buffers included


def test_on_cuda_the_runtime_and_with_several_processes_nccl_count(monkeypatch):
    config = preset("smoke")
    market = _gpu_market(6)
    alone = sizing.process_bytes(config, sizing.RunShape(6, 6, device=market.device))
    shared = sizing.process_bytes(config, sizing.RunShape(6, 6, processes=2, device=market.device))
    assert alone[sizing.CUDA_RUNTIME] == shared[sizing.CUDA_RUNTIME] == sizing.CUDA_RUNTIME_BYTES
    assert shared["NCCL buffers of 2 processes"] == sizing.NCCL_BYTES
    assert sum(shared.values()) > sum(alone.values())  # half the agents, but NCCL's buffers
    _on_cuda(monkeypatch, device_free=sum(alone.values()))
    sizing.check_memory(config, market)
    with pytest.raises(ConfigError, match=r"this config needs at least 2\.2 GB"):
        sizing.check_memory(config, market, processes=2)


def test_on_cuda_the_staging_buffers_are_checked_against_host_memory_pinned_and_rounded(monkeypatch):
    config = preset("paper")
    market = _gpu_market(20)
    pinned = sizing.host_bytes(config, sizing.RunShape(20, 6, device="cuda"))
    plain = sizing.host_bytes(config, sizing.RunShape(20, 6))
    assert pinned[sizing.BUFFER_COPIES] > plain[sizing.BUFFER_COPIES]  # the pinned allocator's powers of two
    _on_cuda(monkeypatch, device_free=80 * GIB, host_free=sum(pinned.values()) - 1)
    with pytest.raises(ConfigError, match=r"replay buffer.s checkpoint copies .* but cpu has"):
        sizing.check_memory(config, market)
    _on_cuda(monkeypatch, device_free=80 * GIB, host_free=sum(pinned.values()))
    sizing.check_memory(config, market)


def test_the_blocks_of_days_are_sized_for_the_device_the_run_trains_on():
    """The parts are built on the meta device, but their blocks of days as on the run's device: on CUDA a block is
    longer (a default episode is one block), and so are the windows the environments gather for it."""
    config = preset("default")
    on_cpu = sizing.held_bytes(config, sizing.RunShape(20, 6, device="cpu"))
    on_cuda = sizing.held_bytes(config, sizing.RunShape(20, 6, device="cuda"))
    assert on_cuda[sizing.ENVIRONMENTS] > on_cpu[sizing.ENVIRONMENTS]
    for item in (sizing.BUFFER, sizing.SAMPLES, sizing.POPULATION):
        assert on_cuda[item] == on_cpu[item]
