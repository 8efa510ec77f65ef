"""The emulated CUDA device (``tests/emulated_cuda.py``): it computes the CPU's numbers, and refuses what a GPU
refuses (and what the project forbids) where a CPU run lets it pass."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from tests.emulated_cuda import (
    DeviceMismatchError,
    DeviceTensor,
    HostReadError,
    SyncError,
    emulate_cuda,
    host_reads,
)


@pytest.fixture
def mode():
    with emulate_cuda() as emulation:
        yield emulation


def device_randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator(device="cuda").manual_seed(seed), device="cuda")


def test_device_tensors_say_cuda_and_compute_the_cpus_numbers_forward_and_backward(mode):
    def train_step(device: str) -> list[torch.Tensor]:
        generator = torch.Generator(device=device).manual_seed(3)
        layer = torch.nn.Linear(6, 4).to(device)
        with torch.no_grad():
            for parameter in layer.parameters():
                parameter.copy_(torch.rand(parameter.shape, generator=generator, device=device))
        x = torch.randn(5, 6, generator=generator, device=device)
        loss = torch.softmax(layer(x), dim=-1).log().sum()
        loss.backward()
        return [t.detach().cpu() for t in (loss, layer.weight.grad, layer.bias.grad)]

    on_device = train_step("cuda")
    assert all(type(t) is torch.Tensor for t in on_device)  # .cpu() brought plain host tensors back
    with torch.no_grad():
        weight = torch.nn.Linear(6, 4).to("cuda").weight
    assert isinstance(weight, DeviceTensor) and weight.device == torch.device("cuda", 0) and weight.is_cuda
    assert all(torch.equal(a, b) for a, b in zip(on_device, train_step("cpu")))


@pytest.mark.parametrize(
    ("read", "error"),
    [
        (lambda t: t.numpy(), TypeError),
        (lambda t: np.asarray(t), TypeError),
        (lambda t: t.sum().item(), HostReadError),
        (lambda t: float(t.sum()), HostReadError),
        (lambda t: int(t.sum()), HostReadError),
        (lambda t: bool(t.sum() > 0), HostReadError),
        (lambda t: t.tolist(), HostReadError),
        (lambda t: torch.equal(t, t), HostReadError),
    ],
    ids=["numpy", "np.asarray", "item", "float", "int", "bool", "tolist", "torch.equal"],
)
def test_a_device_tensor_read_as_host_values_is_refused(mode, read, error):
    tensor = device_randn(3, 4)
    with pytest.raises(error, match="cuda:0"):
        read(tensor)
    host = tensor.cpu()  # the way over: a host tensor, then any read
    read(host)


@pytest.mark.parametrize(
    "mix",
    [
        lambda d, h: d + h,
        lambda d, h: torch.cat([d, h]),
        lambda d, h: torch.where(h > 0, d, d),
        lambda d, h: d.index_copy_(0, torch.arange(2), d[:2]),
        lambda d, h: h[torch.arange(2, device="cuda")],
        lambda d, h: torch.zeros(3, 4, device="cuda").copy_(d).mul_(h),
    ],
    ids=["add", "cat", "where", "index_copy_ with host index", "host tensor indexed on the device", "in place"],
)
def test_a_host_tensor_in_device_arithmetic_is_refused(mode, mix):
    with pytest.raises(DeviceMismatchError, match="cpu"):
        mix(device_randn(3, 4), torch.ones(3, 4))


def test_what_a_gpu_lets_host_tensors_do_passes(mode):
    device = device_randn(3, 4)
    scalar = torch.tensor(2.0)  # 0-dim host tensors are scalars to a device kernel
    assert isinstance(device * scalar, DeviceTensor)
    picked = device[torch.tensor([0, 2])]  # host indices may index a device tensor
    assert isinstance(picked, DeviceTensor) and picked.shape == (2, 4)
    device[torch.tensor([1])] = 0.0
    assert torch.equal(device.cpu()[1], torch.zeros(4))
    assert isinstance(torch.tensor([1.0, 2.0], device="cuda"), DeviceTensor)  # made on the host, copied over
    assert device.to("cuda") is device and device.cuda() is device  # no copy when nothing changes
    assert type(device.to("cpu")) is torch.Tensor


def test_a_draw_on_the_device_needs_a_generator_of_the_device(mode):
    host, device = torch.Generator(), torch.Generator(device="cuda")
    assert device.device == torch.device("cuda", 0) and host.device.type == "cpu"
    with pytest.raises(DeviceMismatchError, match="Expected a 'cuda' device type for generator but found 'cpu'"):
        torch.randn(3, generator=host, device="cuda")
    with pytest.raises(DeviceMismatchError, match="Expected a 'cpu' device type for generator but found 'cuda'"):
        torch.randn(3, generator=device)
    with pytest.raises(DeviceMismatchError, match="Expected a 'cuda' device type for generator"):
        torch.zeros(3, device="cuda").normal_(generator=host)
    with pytest.raises(DeviceMismatchError, match="global generator"):
        torch.rand(3, device="cuda")
    host.manual_seed(5)
    device.manual_seed(5)
    drawn = torch.randint(7, (4, 3), generator=device, device="cuda")
    assert torch.equal(drawn.cpu(), torch.randint(7, (4, 3), generator=host))  # the CPU's stream, bit for bit


def test_a_non_blocking_copy_into_pinned_memory_lands_when_the_host_synchronises(mode):
    source = device_randn(4, 5)
    expected = source.cpu()
    pinned = torch.empty(4, 5, pin_memory=True)
    assert pinned.is_pinned() and not torch.empty(2).is_pinned()
    pinned.copy_(source, non_blocking=True)
    source.add_(1.0)  # queued after the copy: the copy still takes the values before it
    assert torch.isnan(pinned).all()  # read before the copy landed
    torch.cuda.current_stream().synchronize()
    assert torch.equal(pinned, expected)

    pinned.copy_(source, non_blocking=True)
    source.cpu()  # a blocking copy back waits for everything queued before it
    assert torch.equal(pinned, expected + 1.0)

    pageable = torch.empty(4, 5)
    pageable.copy_(source, non_blocking=True)  # into pageable memory a GPU copies before it returns
    assert torch.equal(pageable, expected + 1.0)


def test_an_events_time_is_read_only_after_the_host_synchronised():
    with emulate_cuda():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        end.record()
        with pytest.raises(RuntimeError, match="must be completed"):
            start.elapsed_time(end)
        end.synchronize()
        assert start.elapsed_time(end) >= 0.0


@pytest.mark.parametrize(
    "wait",
    [
        lambda d: d.cpu(),
        lambda d: torch.nonzero(d > 0),
        lambda d: d.copy_(torch.ones(3, 4)),
        lambda d: torch.tensor([1.0], device="cuda"),
        lambda d: torch.cuda.synchronize(),
        lambda d: d[torch.tensor([0, 2])],
    ],
    ids=["copy back", "nonzero", "blocking copy over", "tensor from host data", "synchronize", "host index"],
)
def test_under_sync_debug_mode_error_every_wait_for_the_device_raises(mode, wait):
    device = device_randn(3, 4)
    pinned = torch.empty(3, 4, pin_memory=True)
    torch.cuda.set_sync_debug_mode("error")
    try:
        torch.softmax(device, dim=-1).mul_(2.0).long().double()  # device work alone never waits
        pinned.copy_(device, non_blocking=True)
        with pytest.raises(SyncError, match="synchronizing"):
            wait(device)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_autocast_on_the_device_runs_matmuls_in_its_dtype(mode):
    a, b = device_randn(3, 4), device_randn(4, 2, seed=1)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        product = a @ b
        summed = product.float() + 1.0
    assert product.dtype == torch.bfloat16 and summed.dtype == torch.float32
    assert torch.equal(product.cpu(), (a.cpu().bfloat16() @ b.cpu().bfloat16()))


def test_torch_cudas_python_runs_on_the_emulated_bindings(mode):
    """torch.cuda.memory_allocated is torch's own code here, reading the emulated allocator, and it leaves its
    garbage as it does on a GPU: a reference cycle per call (why utils.telemetry reads the nested statistics)."""
    tensor = torch.zeros(1000, device="cuda")
    assert torch.cuda.memory_allocated(tensor.device) >= 4000
    gc.collect()
    gc.disable()
    try:
        torch.cuda.memory_allocated(tensor.device)
        assert gc.collect() > 0
    finally:
        gc.enable()


def test_a_graphs_memory_pool_is_freed_with_its_last_graph(mode):
    """As CUDA's caching allocator: a pool lives while a graph captured into it does; a capture into a pool whose
    graphs are all gone fails (the first GPU found it on the update's recapture), with one alive it shares the pool."""
    tensor = torch.zeros(3, device="cuda")
    pool = torch.cuda.graph_pool_handle()

    def captured() -> torch.cuda.CUDAGraph:
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin(pool=pool)
        tensor.add_(1.0)
        graph.capture_end()
        return graph

    first = captured()
    second = captured()  # the first still holds the pool
    assert second.pool() == first.pool() == pool
    del first, second
    with pytest.raises(RuntimeError, match="use_count > 0"):
        captured()
    assert torch.cuda.CUDAGraph().pool() != torch.cuda.graph_pool_handle()  # every handle a pool of its own


def test_device_tensors_are_refused_outside_the_emulation():
    with emulate_cuda() as emulation:
        tensor = device_randn(2)
        with host_reads(emulation):
            assert float(tensor.sum()) == float(tensor.cpu().sum())
    with pytest.raises(RuntimeError, match="outside emulate_cuda"):
        tensor + 1
    assert not torch.cuda.is_available() or torch.cuda.device_count() > 0  # the real state is back
