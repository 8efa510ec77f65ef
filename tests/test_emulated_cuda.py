"""The emulated CUDA device (``tests/emulated_cuda.py``): it computes the CPU's numbers, and refuses what a GPU
refuses (and what the project forbids) where a CPU run lets it pass."""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests.emulated_cuda import (
    DeviceMismatchError,
    DeviceTensor,
    HostReadError,
    NondeterministicError,
    RaceError,
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


def pinned_copy(make: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[torch.Tensor], torch.Tensor]:
    """A spelling that copies ``device`` into pinned memory made by ``make(a host tensor of its shape)``."""
    return lambda device: make(torch.empty(device.shape)).copy_(device, non_blocking=True)


def pytree_to_host(device: torch.Tensor) -> torch.Tensor:
    moved = torch.utils._pytree.tree_map(lambda t: t.to("cpu", non_blocking=True), {"x": [device]})
    return moved["x"][0]


def foreach_copy(device: torch.Tensor) -> torch.Tensor:
    pinned = torch.empty(device.shape, pin_memory=True)
    torch._foreach_copy_([pinned], [device], non_blocking=True)
    return pinned


NON_BLOCKING_TO_HOST = {
    "to('cpu')": lambda d: d.to("cpu", non_blocking=True),
    "to(torch.device)": lambda d: d.to(torch.device("cpu"), non_blocking=True),
    "to(a host tensor)": lambda d: d.to(torch.empty(0, dtype=torch.float64), non_blocking=True),
    "to(dtype=, device=)": lambda d: d.to(dtype=torch.float64, device="cpu", non_blocking=True),
    "to(device, dtype, True)": lambda d: d.to("cpu", torch.float64, True),
    "to(device=, copy=True)": lambda d: d.to(device="cpu", non_blocking=True, copy=True),
    "type(a host type)": lambda d: d.type(torch.DoubleTensor, non_blocking=True),
    "copy_ into torch.empty(pin_memory=True)": pinned_copy(lambda h: torch.empty(h.shape, pin_memory=True)),
    "copy_ into .pin_memory()": pinned_copy(lambda h: h.pin_memory()),
    "copy_ into torch.zeros(pin_memory=True)": pinned_copy(lambda h: torch.zeros(h.shape, pin_memory=True)),
    "copy_ into torch.full(pin_memory=True)": pinned_copy(lambda h: torch.full(h.shape, 2.0, pin_memory=True)),
    "copy_ into empty_like(pin_memory=True)": pinned_copy(lambda h: torch.empty_like(h, pin_memory=True)),
    "copy_ into new_empty(pin_memory=True)": pinned_copy(lambda h: h.new_empty(h.shape, pin_memory=True)),
    "copy_ into empty_strided(pin_memory=True)": pinned_copy(
        lambda h: torch.empty_strided(h.shape, h.stride(), pin_memory=True)
    ),
    "copy_ into a slice of a pinned buffer": pinned_copy(
        lambda h: torch.empty(2 * h.shape[0], *h.shape[1:], pin_memory=True)[h.shape[0] :]
    ),
    "torch._foreach_copy_": foreach_copy,
    "pytree tree_map of to('cpu')": pytree_to_host,
}
"""Every torch spelling of a non-blocking copy from the device to the host: each reduces to ``aten._to_copy``,
``aten.copy_`` or ``aten._foreach_copy_`` with ``non_blocking`` into pinned memory (``_to_copy`` pins its result,
as CUDA's does)."""


@pytest.mark.parametrize("spelling", NON_BLOCKING_TO_HOST)
def test_a_non_blocking_copy_to_the_host_is_poisoned_until_the_host_synchronises(mode, spelling):
    source = device_randn(4, 5)
    expected = source.cpu()
    landed = NON_BLOCKING_TO_HOST[spelling](source)
    assert type(landed) is torch.Tensor and landed.is_pinned()  # a GPU's non-blocking copies go to pinned memory
    source.add_(1.0)  # queued after the copy: the copy still takes the values before it
    assert torch.isnan(landed).all(), "read before the copy landed, the buffer must not hold the values"
    torch.cuda.synchronize()
    assert torch.equal(landed, expected.to(landed.dtype))


def test_the_blocking_ways_to_the_host_land_at_once(mode):
    source = device_randn(4, 5)
    for landed in (source.cpu(), source.to("cpu"), source.to("cpu", non_blocking=False), source.double().cpu()):
        assert torch.equal(landed, source.cpu().to(landed.dtype)) and not landed.is_pinned()
    with pytest.raises(TypeError):
        source.cpu(non_blocking=True)  # no such argument: .cpu() always waits


def upload_by_foreach(pinned: torch.Tensor) -> torch.Tensor:
    device = torch.zeros(pinned.shape, device="cuda")
    torch._foreach_copy_([device], [pinned], non_blocking=True)
    return device


NON_BLOCKING_TO_DEVICE = {
    "copy_": lambda pinned: torch.zeros(pinned.shape, device="cuda").copy_(pinned, non_blocking=True),
    "to('cuda')": lambda pinned: pinned.to("cuda", non_blocking=True),
    "to(torch.device, dtype)": lambda pinned: pinned.to(torch.device("cuda"), torch.float64, non_blocking=True),
    "cuda()": lambda pinned: pinned.cuda(non_blocking=True),
    "torch._foreach_copy_": upload_by_foreach,
}


@pytest.mark.parametrize("spelling", NON_BLOCKING_TO_DEVICE)
def test_a_pinned_source_written_before_its_copy_to_the_device_landed_is_a_race(mode, spelling):
    staging = torch.zeros(2, 3, pin_memory=True)
    uploaded = NON_BLOCKING_TO_DEVICE[spelling](staging[0])
    staging[1].fill_(5.0)  # bytes the copy does not read
    with pytest.raises(RaceError, match="may still be reading"):
        staging[0].fill_(1.0)  # on a GPU the device may get the 1s
    torch.cuda.current_stream().synchronize()
    staging[0].fill_(1.0)  # landed: the buffer is the host's again
    assert torch.equal(uploaded.cpu(), torch.zeros(3, dtype=uploaded.dtype))


def test_a_pageable_source_is_copied_before_the_copy_returns(mode):
    source = torch.zeros(3)
    uploaded = source.to("cuda", non_blocking=True)
    source.fill_(1.0)
    assert torch.equal(uploaded.cpu(), torch.zeros(3))


def test_a_pinned_source_changed_where_the_dispatcher_cannot_see_fails_at_the_synchronisation(mode):
    pinned = torch.zeros(3, pin_memory=True)
    pinned.to("cuda", non_blocking=True)
    pinned.numpy()[0] = 1.0
    with pytest.raises(RaceError, match="changed while a non-blocking copy"):
        torch.cuda.synchronize()


WAITS_FOR_SHAPE = {
    "nonzero": lambda d: torch.nonzero(d > 0),
    "argwhere": lambda d: torch.argwhere(d > 0),
    "where(condition)": lambda d: torch.where(d > 0),
    "masked_select": lambda d: torch.masked_select(d, d > 0),
    "a boolean mask index": lambda d: d[d > 0],
    "index_put_ of device values with a mask": lambda d: d.index_put_((d > 0,), torch.ones(1, device="cuda")),
    "unique": lambda d: torch.unique(d),
    "unique(dim=0)": lambda d: torch.unique(d, dim=0),
    "unique_consecutive": lambda d: torch.unique_consecutive(d),
    "repeat_interleave without output_size": lambda d: d.repeat_interleave((d[:, 0] > 0).long() + 1, dim=0),
    "bincount": lambda d: torch.bincount((d > 0).long().flatten()),
    "histc without a range": lambda d: torch.histc(d),
}
"""Device operations whose result's shape depends on device values: CUDA copies a count back and the host waits."""
NEED_NO_WAIT = {
    "masked_fill": lambda d: d.masked_fill(d > 0, 0.0),
    "a mask set to a python scalar (masked_fill_ on CUDA)": lambda d: d.__setitem__(d > 0, 0.0),
    "where(condition, a, b)": lambda d: torch.where(d > 0, d, 0.0),
    "repeat_interleave with output_size": lambda d: d.repeat_interleave(
        torch.ones(3, dtype=torch.long, device="cuda"), dim=0, output_size=3
    ),
    "one_hot with num_classes": lambda d: torch.nn.functional.one_hot((d > 0).long(), num_classes=2),
    "histc with a range": lambda d: torch.histc(d, bins=4, min=-3.0, max=3.0),
    "nonzero_static": lambda d: torch.nonzero_static(d > 0, size=4),
}


def captured(work: Callable[[], Any]) -> None:
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin()
    try:
        work()
    finally:
        graph.capture_end()


@pytest.mark.parametrize("operation", WAITS_FOR_SHAPE)
def test_an_operation_whose_shape_depends_on_device_values_waits_for_the_device(mode, operation):
    device = device_randn(3, 4)
    with pytest.raises(SyncError, match="not permitted when stream is capturing"):
        captured(lambda: WAITS_FOR_SHAPE[operation](device))
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(SyncError, match="synchronizing"):
            WAITS_FOR_SHAPE[operation](device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    WAITS_FOR_SHAPE[operation](device)  # outside both, it runs (and waits)


def test_what_needs_no_count_runs_in_a_capture_and_under_sync_debug_mode(mode):
    device = device_randn(3, 4)
    for operation in NEED_NO_WAIT.values():
        captured(lambda operation=operation: operation(device))
    torch.cuda.set_sync_debug_mode("error")
    try:
        for operation in NEED_NO_WAIT.values():
            operation(device)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with pytest.warns(UserWarning, match="synchronizing"):
            torch.nonzero(device)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def index_backward(select: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable:
    """The backward pass of ``select(weights, index)``: it adds the gradient rows of repeated indices together."""

    def backward(target: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
        weights = target.clone().requires_grad_()
        (select(weights, index) * values).sum().backward()

    return backward


def along(index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    return index[:, None].expand_as(values)


UNORDERED_OPERATIONS = {
    "index_add_": lambda t, i, v: t.index_add_(0, i, v),
    "index_copy_": lambda t, i, v: t.index_copy_(0, i, v),
    "index_put_": lambda t, i, v: t.index_put_((i,), v),
    "index_put_(accumulate=True)": lambda t, i, v: t.index_put_((i,), v, accumulate=True),
    "t[i] = v": lambda t, i, v: t.__setitem__(i, v),
    "put_": lambda t, i, v: t.put_(i, v[:, 0]),
    "put_(accumulate=True)": lambda t, i, v: t.put_(i, v[:, 0], accumulate=True),
    "scatter_": lambda t, i, v: t.scatter_(0, along(i, v), v),
    "scatter_add_": lambda t, i, v: t.scatter_add_(0, along(i, v), v),
    "scatter_reduce_ sum": lambda t, i, v: t.scatter_reduce_(0, along(i, v), v, "sum"),
    "scatter_reduce_ prod": lambda t, i, v: t.scatter_reduce_(0, along(i, v), v, "prod"),
    "index_reduce_ prod": lambda t, i, v: t.index_reduce_(0, i, v, "prod"),
    "bincount with weights": lambda t, i, v: torch.bincount(i, weights=v[:, 0]),
    "backward of index_select": index_backward(lambda w, i: w.index_select(0, i)),
    "backward of gather": index_backward(lambda w, i: w.gather(0, i[:, None].expand(-1, w.shape[1]))),
    "backward of indexing": index_backward(lambda w, i: w[i]),
}
"""Operations CUDA computes with atomics, in an unspecified order, when positions repeat."""
DETERMINISTIC_WHEN_ASKED = {
    "index_add_",
    "index_copy_",
    "index_put_",
    "index_put_(accumulate=True)",
    "t[i] = v",
    "scatter_",
    "scatter_add_",
    "scatter_reduce_ sum",
    "backward of index_select",
    "backward of gather",
    "backward of indexing",
}
"""The ones CUDA switches to a deterministic kernel for under ``torch.use_deterministic_algorithms(True)``."""


def unordered_operands(index: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    target = device_randn(4, 3)
    values = device_randn(len(index), 3, seed=1) * 100.0
    return target, torch.tensor(index, device="cuda"), values


@pytest.fixture
def deterministic_algorithms():
    def use(warn_only: bool = False) -> None:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)

    yield use
    torch.use_deterministic_algorithms(False)


@pytest.mark.filterwarnings("ignore:index_reduce\\(\\) is in beta")
@pytest.mark.parametrize("operation", UNORDERED_OPERATIONS)
def test_an_operation_whose_result_depends_on_its_atomics_order_fails(mode, operation, deterministic_algorithms):
    run = UNORDERED_OPERATIONS[operation]
    run(*unordered_operands([0, 1, 2, 3]))  # every position once: one order
    with pytest.raises(NondeterministicError):
        run(*unordered_operands([1] * 20 + [0, 3]))  # the bits of row 1 depend on the order
    deterministic_algorithms()
    if operation in DETERMINISTIC_WHEN_ASKED:
        run(*unordered_operands([1] * 20 + [0, 3]))  # CUDA's deterministic kernel: the CPU's numbers
    else:
        with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
            run(*unordered_operands([1] * 20 + [0, 3]))


def test_repeated_positions_that_cannot_change_the_bits_pass(mode):
    target, index, values = unordered_operands([1, 1, 2])
    target.index_copy_(0, index, torch.ones(3, 3, device="cuda"))  # the same values, whichever lands last
    torch.zeros(4, 3, device="cuda").index_add_(0, index, values)  # two additions into 0: a + b == b + a
    counts = torch.zeros(4, dtype=torch.long, device="cuda")
    counts.index_add_(0, torch.tensor([1] * 20, device="cuda"), torch.arange(20, device="cuda"))  # integers
    torch.bincount(torch.tensor([1] * 20, device="cuda"))  # counts


def test_operations_cuda_has_no_deterministic_kernel_for_fail(mode, deterministic_algorithms):
    device = device_randn(3, 4)
    torch.cumsum(device.long(), dim=1)  # integers: any order gives the same sums
    torch.histc(device, 4, -3.0, 3.0)  # counts, the same in any order
    for operation in (lambda: torch.cumsum(device, dim=1), lambda: torch.median(device, dim=1)):
        with pytest.raises(NondeterministicError, match="no deterministic kernel"):
            operation()
    deterministic_algorithms(warn_only=True)
    for operation in (lambda: torch.cumsum(device, dim=1), lambda: torch.histc(device, 4, -3.0, 3.0)):
        with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
            operation()


def test_a_deterministic_run_needs_a_fixed_cublas_workspace_for_its_matmuls(
    mode, deterministic_algorithms, monkeypatch
):
    a, b = device_randn(3, 4), device_randn(4, 2, seed=1)
    a @ b  # no determinism asked for: cuBLAS as it comes
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    deterministic_algorithms()
    with pytest.raises(RuntimeError, match="CUBLAS_WORKSPACE_CONFIG"):
        a @ b
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert torch.equal((a @ b).cpu(), a.cpu() @ b.cpu())


def test_work_on_a_stream_is_ordered_after_another_only_by_a_wait(mode):
    default, side = torch.cuda.current_stream(), torch.cuda.Stream()
    written = device_randn(3)  # written on the default stream
    with torch.cuda.stream(side), pytest.raises(RaceError, match="without waiting"):
        written * 2.0
    side.wait_stream(default)
    with torch.cuda.stream(side):
        doubled = written * 2.0  # read after the wait, and allocated and written on the side stream
    with pytest.raises(RaceError, match="stream 1 wrote"):
        doubled + 1.0
    with pytest.raises(RaceError, match="reads, without waiting"):
        written.add_(1.0)  # the side stream may not have read it yet
    event = side.record_event()
    default.wait_event(event)
    doubled + 1.0
    written.add_(1.0)

    with torch.cuda.stream(side), pytest.raises(RaceError):
        written * 2.0  # written on the default stream again since the side stream's wait
    torch.cuda.synchronize()  # everything queued before is done: every stream may use it
    with torch.cuda.stream(side):
        written * 2.0
    made = torch.zeros(3, device="cuda")  # memory from the default stream's pool
    with torch.cuda.stream(side), pytest.raises(RaceError):
        made.fill_(1.0)


def test_a_copy_lands_when_the_host_waits_for_its_own_stream(mode):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    source = device_randn(3)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        landed = source.to("cpu", non_blocking=True)
    torch.cuda.current_stream().synchronize()
    assert torch.isnan(landed).all()  # the default stream's work is done, the side stream's not known to be
    assert not side.query()
    side.synchronize()
    assert torch.equal(landed, source.cpu()) and side.query()


def test_a_graph_replayed_on_a_stream_uses_what_its_operations_use(mode):
    side = torch.cuda.Stream()
    total = torch.zeros(3, device="cuda")
    graph = torch.cuda.CUDAGraph()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        graph.capture_begin()
        total.add_(1.0)
        graph.capture_end()
        graph.replay()  # after the side stream's wait
    with pytest.raises(RaceError):
        graph.replay()  # on the default stream, which has not waited for the side stream's replay
    torch.cuda.current_stream().wait_stream(side)
    graph.replay()
    assert torch.equal(total.cpu(), torch.full((3,), 2.0))


def test_a_host_scalar_tensor_is_baked_into_a_graph_at_its_capture(mode):
    scale = torch.tensor(2.0)
    total = torch.zeros(3, device="cuda")
    ones = torch.ones(3, device="cuda")
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin()
    total.add_(ones * scale)  # a GPU passes the host scalar's value to the kernel at the capture
    graph.capture_end()
    graph.replay()
    scale.fill_(10.0)
    graph.replay()
    assert torch.equal(total.cpu(), torch.full((3,), 4.0))


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
