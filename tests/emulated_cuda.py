"""A CUDA device emulated on the CPU, as strict as a real one: the CUDA code paths run in the CPU tests.

The first GPU crashed on a bug that every CPU test missed, because they ran the CPU branch, where a device tensor is a
host tensor. Under ``emulate_cuda()`` ``torch.device("cuda")`` exists on a machine without a GPU: tensors on it report
``device == cuda:0`` and hold their values in a CPU tensor, so whole runs compute real numbers (bit for bit those of a
CPU run), while every operation is checked the way a GPU checks it, and more strictly where the project's rules are:

* a host-only read of a device tensor: ``.numpy()`` and ``numpy.asarray`` (a GPU refuses them too), ``.item()``,
  ``float()``, ``int()``, ``bool()``, ``.tolist()``, ``torch.equal``: results come to the host as tensors
  (``training.boundary.to_host``), never as Python values straight off the device, which a GPU allows at the price
  of a synchronisation each;
* a host tensor in device arithmetic, or a device tensor indexing a host one; as on a GPU, a 0-dim host tensor passes
  as a scalar, and host index tensors may index a device tensor;
* a random draw whose generator is on another device than the draw, and a device draw from the global generator
  (every draw of a run comes from its own streams, ``training.streams``);
* a non-blocking copy from the device into pinned host memory lands only when the host synchronises (a stream, an
  event, the device, or a blocking copy back): read before that, the buffer holds NaN (or the integer type's
  largest value);
* an event's elapsed time read before the host has synchronised after it was recorded;
* with ``torch.cuda.set_sync_debug_mode("error")``: any operation that would make the host wait for the GPU (a
  blocking copy either way, host index tensors copied over, ``nonzero``, a host read, a synchronize).

Under ``torch.autocast("cuda")`` the matmul family computes in the autocast dtype, as CUDA's autocast casts them.

CUDA graphs are emulated as a GPU runs them (``torch.cuda.CUDAGraph``): a capture records the device operations
without their effects (every tensor and device generator it changed is put back), and a replay runs the recorded
operations again on the same tensors, with the arguments they had at the capture. So what a GPU bakes into a graph
is baked here: a Python value read at the capture, host work done once at the capture and never replayed, a graph's
outputs overwritten by the next replay. In a capture, an operation that would make the host wait fails, and so does
a draw from a generator not registered with the graph. A graph's memory pool lives as long as a graph captured into
it: capturing into a pool whose graphs have all been destroyed fails, as CUDA's caching allocator asserts.

torch's own ``torch.cuda`` Python runs where the product calls it and only the C bindings under it are emulated
(memory statistics, the current device, the sync debug mode), so what torch's Python does on a GPU (garbage
included) happens here too; events, streams, device names and free memory are stand-ins. A device tensor is a
wrapper whose C++ side is a ``meta`` tensor: ``meta`` is the one device every build supports with autograd, so
backward passes run on the calling thread, under the emulation. Not torch's ``FakeTensorMode``: its tensors carry no
values, so the gate and the record could not run, and on a build without CUDA its ``cuda`` tensors have no backward.
"""

from __future__ import annotations

import contextlib
import itertools
import time
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, return_and_correct_aliasing

CUDA = torch.device("cuda", 0)
CPU = torch.device("cpu")
NAME = "Emulated CUDA device (CPU)"
TOTAL_BYTES = 80 * 2**30
aten = torch.ops.aten


class DeviceMismatchError(RuntimeError):
    """What a GPU raises for operands or a generator on another device."""


class HostReadError(RuntimeError):
    """A device tensor read on the host as Python values or numpy (the project brings results over as tensors)."""


class SyncError(RuntimeError):
    """An operation that makes the host wait for the GPU, under ``set_sync_debug_mode("error")``."""


HOST_READS = frozenset(
    {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default, aten.allclose.default}
)
"""Operations that hand a device value to Python."""
INDEX_OPS = frozenset(
    {aten.index.Tensor, aten.index_put_.default, aten.index_put.default, aten._index_put_impl_.default}
)
"""Operations whose host index tensors may index a device tensor (a GPU copies them over)."""
COPIES = frozenset({aten.copy_.default, aten._to_copy.default, aten.copy.default, aten.lift_fresh.default})
"""Operations that move values between devices."""
DATA_DEPENDENT = frozenset({aten.nonzero.default, aten.masked_select.default, aten.unique_consecutive.default})
"""Device operations whose result's shape the host must wait for."""
AUTOCAST_TO_LOWER = frozenset(
    {torch.matmul, torch.mm, torch.bmm, torch.baddbmm, torch.addmm, torch.addbmm, torch.nn.functional.linear}
    | {getattr(torch.Tensor, name) for name in ("__matmul__", "__rmatmul__", "matmul", "mm", "bmm", "baddbmm", "addmm")}
)
"""The matmul family, which CUDA's autocast runs in its lower precision."""


class DeviceTensor(torch.Tensor):
    """A tensor on the emulated CUDA device; its values are the CPU tensor ``host``."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor) -> DeviceTensor:
        return torch.Tensor._make_wrapper_subclass(
            cls,
            host.size(),
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            layout=host.layout,
            device="meta",
            requires_grad=False,
        )

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host
        _live.add(self)

    device = property(lambda self: CUDA)  # type: ignore[assignment]
    is_cuda = property(lambda self: True)  # type: ignore[assignment]
    is_meta = property(lambda self: False)  # type: ignore[assignment]
    is_cpu = property(lambda self: False)  # type: ignore[assignment]

    def get_device(self) -> int:
        return 0

    def data_ptr(self) -> int:  # an address to compare, as a GPU's is
        return self.host.data_ptr()

    def numpy(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError(
            "can't convert cuda:0 device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        return self.numpy()

    def tolist(self) -> Any:
        raise HostReadError(f"tolist() of a tensor on {CUDA}: bring it to the host as a tensor first")

    def cuda(self, *args: Any, **kwargs: Any) -> DeviceTensor:
        return self

    def to(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        return _to(self, *args, **kwargs)

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"DeviceTensor({CUDA}, {self.host!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func}: a tensor of the emulated CUDA device used outside emulate_cuda()")


_live: weakref.WeakSet[DeviceTensor] = weakref.WeakSet()
_pinned: dict[int, weakref.ref] = {}  # data_ptr of a pinned host storage -> a tensor that holds it
_device_generators: dict[int, Any] = {}  # id of the generator object the dispatcher sees -> that object
_tensor_to = torch.Tensor.to


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``Tensor.to`` that knows the emulated device (C++ would ask for a CUDA runtime before dispatching)."""
    copy = kwargs.pop("copy", False)
    if len(args) > 2 and isinstance(args[-1], bool) and isinstance(args[-2], bool):  # to(device, dtype, nb, copy)
        args, copy = args[:-1], args[-1]
    other = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    if other is not None:
        device, dtype = (CUDA if isinstance(other, DeviceTensor) else other.device), other.dtype
    if device is None and isinstance(self, DeviceTensor):
        device = CUDA
    if device is None or torch.device(device).type != "cuda":
        return _tensor_to(self, *args, copy=copy, **kwargs)
    dtype = dtype or self.dtype
    keep_format = memory_format in (None, torch.preserve_format)
    if isinstance(self, DeviceTensor) and dtype == self.dtype and keep_format and not copy:
        return self  # as on a GPU: no copy when nothing changes
    return torch.ops.aten._to_copy(
        self, dtype=dtype, device=CUDA, non_blocking=non_blocking, memory_format=memory_format or torch.preserve_format
    )


def _map(function: Any, value: Any) -> Any:
    """``function`` of every leaf of an operation's arguments or results (lists, tuples and dicts of leaves).
    Not torch's pytree, whose recursive closures are reference cycles: garbage on every call, which the leak tests
    would blame on the code under test."""
    if isinstance(value, (list, tuple)):
        return type(value)(_map(function, item) for item in value)
    if isinstance(value, dict):
        return {key: _map(function, item) for key, item in value.items()}
    return function(value)


def _leaves(value: Any, out: list) -> list:
    if isinstance(value, (list, tuple)):
        for item in value:
            _leaves(item, out)
    elif isinstance(value, dict):
        for item in value.values():
            _leaves(item, out)
    else:
        out.append(value)
    return out


def _host(value: Any) -> Any:
    return value.host if isinstance(value, DeviceTensor) else value


def _wrap(value: Any) -> Any:
    return DeviceTensor(value) if type(value) is torch.Tensor else value


def _is_host(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and not isinstance(value, DeviceTensor)


def is_pinned(tensor: torch.Tensor) -> bool:
    """Whether ``tensor``'s host storage was allocated pinned under the emulation."""
    holder = _pinned.get(tensor.untyped_storage().data_ptr())
    return holder is not None and holder() is not None


def _pin(tensor: torch.Tensor) -> None:
    _pinned[tensor.untyped_storage().data_ptr()] = weakref.ref(tensor)


def _poison(tensor: torch.Tensor) -> None:
    """What a buffer holds while a copy into it is in flight, for a test to see: NaN, or the type's largest value."""
    if tensor.dtype.is_floating_point:
        tensor.fill_(float("nan"))
    elif tensor.dtype is torch.bool:
        tensor.fill_(True)
    else:
        tensor.fill_(torch.iinfo(tensor.dtype).max)


def _written(func, args, kwargs) -> list[torch.Tensor]:
    """The tensors an operation writes, by its schema (in place, ``out=``)."""
    written = []
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = args[index] if index < len(args) else kwargs.get(argument.name)
            written.extend(t for t in _leaves(value, []) if isinstance(t, torch.Tensor))
    return written


def _fresh(func) -> bool:
    """Whether an operation's results are new tensors (not views of, or writes into, its arguments)."""
    return all(result.alias_info is None for result in func._schema.returns)


class _Graph:
    """``torch.cuda.CUDAGraph`` on the emulated device (see the module docstring)."""

    def __init__(self, mode: EmulatedCuda) -> None:
        self.mode = mode
        self.operations: list[tuple[Any, tuple, dict, Any]] = []
        self.generators: set[int] = set()
        self._pool: tuple[int, int] | None = None

    def register_generator_state(self, generator: torch.Generator) -> None:
        self.generators.add(id(generator.dispatched))

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        self._pool = new_pool() if pool is None else tuple(pool)
        self.mode.join_pool(self, self._pool)
        self.operations.clear()
        self.mode.begin_capture(self)

    def capture_end(self) -> None:
        self.mode.end_capture()

    def replay(self) -> None:
        if self.mode.capturing is not None:
            raise RuntimeError("a graph replayed during a capture")
        self.mode.replay(self)

    def reset(self) -> None:
        self.operations.clear()

    def pool(self) -> tuple[int, int]:
        if self._pool is None:
            self._pool = new_pool()
        return self._pool


_pool_ids = itertools.count(1)


def new_pool() -> tuple[int, int]:
    """A memory pool's handle, as ``torch.cuda.graph_pool_handle`` gives one: no pool exists until a capture uses it."""
    return (0, next(_pool_ids))


class EmulatedCuda(TorchDispatchMode):
    """Runs every operation on the host values and checks it the way a GPU does (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.sync_debug = 0  # torch.cuda.set_sync_debug_mode: 0 default, 1 warn, 2 error
        self.host_reads_allowed = 0
        self.syncs = 0  # host synchronisations so far; an event is complete once one followed its record
        self.in_flight: list[tuple[torch.Tensor, torch.Tensor]] = []  # (pinned destination, values it will get)
        self.capturing: _Graph | None = None
        self._saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}  # storages a capture changed
        self._saved_generators: list[tuple[Any, torch.Tensor]] = []
        self.pool_users: dict[tuple[int, int], int] = {}  # live graphs captured into each pool

    def synchronize(self) -> None:
        """The host waits for the device: copies in flight land."""
        self.check_sync("a synchronize")
        self.syncs += 1
        for destination, values in self.in_flight:
            destination.copy_(values)
        self.in_flight.clear()

    def check_sync(self, what: Any) -> None:
        if self.capturing is not None:
            raise SyncError(f"operation not permitted when stream is capturing: {what}")
        if self.sync_debug >= 2:
            raise SyncError(f"called a synchronizing CUDA operation: {what}")

    # ------------------------------------------------------------------ CUDA graphs

    def join_pool(self, graph: _Graph, pool: tuple[int, int]) -> None:
        """``graph`` is captured into ``pool``. A pool is freed with the last graph that used it, after which the
        caching allocator asserts on a capture into it (so a graph replaced by a new capture must outlive it)."""
        if self.pool_users.get(pool) == 0:
            raise RuntimeError(
                "it->second->use_count > 0 INTERNAL ASSERT FAILED at CUDACachingAllocator.cpp: a capture into the "
                f"memory pool {pool}, freed with the last graph captured into it"
            )
        self.pool_users[pool] = self.pool_users.get(pool, 0) + 1
        weakref.finalize(graph, self._leave_pool, pool)

    def _leave_pool(self, pool: tuple[int, int]) -> None:
        self.pool_users[pool] -= 1

    def begin_capture(self, graph: _Graph) -> None:
        if self.capturing is not None:
            raise RuntimeError("a capture is under way already")
        self.capturing = graph
        self._saved_generators = [(g, g.get_state()) for g in _device_generators.values()]

    def end_capture(self) -> None:
        """The capture ran the operations to learn their shapes; undo what they changed, as a capture runs nothing."""
        for storage, saved in self._saved.values():
            storage.copy_(saved)
        for generator, state in self._saved_generators:
            generator.set_state(state)
        self._saved.clear()
        self._saved_generators = []
        self.capturing = None

    def replay(self, graph: _Graph) -> None:
        """The recorded operations again, on the same tensors, with the arguments of the capture."""
        with torch.utils._python_dispatch._disable_current_modes():
            for func, args, kwargs, out in graph.operations:
                result = func(*_map(_host, args), **_map(_host, kwargs))
                if _fresh(func):  # into the tensors the capture handed out: a graph's memory is its own
                    for recorded, value in zip(_leaves(out, []), _leaves(result, [])):
                        if isinstance(recorded, torch.Tensor):
                            _host(recorded).copy_(value)

    def _record(self, func, args, kwargs) -> None:
        """Before a captured operation runs: keep what it will change, to put it back at the capture's end."""
        for tensor in _written(func, args, kwargs):
            storage = _host(tensor).untyped_storage()
            if storage.data_ptr() not in self._saved:
                self._saved[storage.data_ptr()] = (storage, storage.clone())
        generator = kwargs.get("generator")
        if generator is not None and id(generator) not in self.capturing.generators:
            raise RuntimeError(f"{func}: a draw in a CUDA graph's capture from a generator not registered with it")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        tensors = [x for x in _leaves((args, kwargs), []) if isinstance(x, torch.Tensor)]
        on_device = any(isinstance(t, DeviceTensor) for t in tensors)
        target = kwargs.get("device")
        # meta is a device tensor's device as C++ sees it (new_empty and friends pass it on)
        to_device = target is not None and torch.device(target).type in ("cuda", "meta")
        if to_device:
            kwargs["device"] = CPU
        pinned = bool(kwargs.get("pin_memory"))
        if pinned:
            kwargs["pin_memory"] = False

        if func in HOST_READS and on_device and not self.host_reads_allowed:
            raise HostReadError(
                f"{func} reads a value of a tensor on {CUDA} on the host (.item(), float(), int(), bool(), "
                "torch.equal): bring results to the host as tensors first"
            )
        if func is aten.is_pinned.default:
            return not isinstance(args[0], DeviceTensor) and is_pinned(args[0])
        if func is aten._pin_memory.default:
            out = args[0].clone()
            _pin(out)
            return out
        result_on_device = self._result_on_device(func, args, kwargs, tensors, on_device, to_device)
        self._check_generator(func, kwargs, result_on_device)
        if func in COPIES:
            landed = self._copy(func, args, kwargs, to_device)
            if landed is not None:
                return landed
        elif on_device and (func in HOST_READS or func in DATA_DEPENDENT):
            self.synchronize()

        captured = self.capturing is not None and (on_device or result_on_device)
        if captured:
            self._record(func, args, kwargs)
        out = func(*_map(_host, args), **_map(_host, kwargs))
        if pinned:
            _pin(out)
        if result_on_device:
            out = _map(_wrap, out)
        out = return_and_correct_aliasing(func, args, kwargs, out)
        if captured:
            self.capturing.operations.append((func, args, kwargs, out))
        return out

    # ------------------------------------------------------------------ the checks

    def _result_on_device(self, func, args, kwargs, tensors, on_device, to_device) -> bool:
        """Whether the result lives on the device; raises what a GPU raises for operands on different devices."""
        if func in COPIES:
            if func is aten._to_copy.default:
                return to_device or (on_device and kwargs.get("device") is None)
            if func is aten.copy_.default:
                return isinstance(args[0], DeviceTensor)
            return on_device
        if to_device:  # a factory on the device, or an operation told to put its result there
            host = [t for t in tensors if _is_host(t) and t.dim() > 0]
            if host:
                raise DeviceMismatchError(
                    f"{func}: a host tensor of shape {tuple(host[0].shape)} given to an operation on {CUDA}"
                )
            return True
        if not on_device:
            return False
        if func in INDEX_OPS and isinstance(args[0], DeviceTensor):
            values = [args[2]] if func is not aten.index.Tensor and len(args) > 2 else []
            host = [t for t in values if _is_host(t) and t.dim() > 0]
            if host:
                raise DeviceMismatchError(
                    f"{func}: host values of shape {tuple(host[0].shape)} put into a tensor on {CUDA}"
                )
            if any(_is_host(index) for index in _leaves(args[1], [])):  # a GPU copies them over, and waits
                self.check_sync(f"{func}, host index tensors copied to the device")
            return True
        host = [t for t in tensors if _is_host(t) and t.dim() > 0]
        if host:
            raise DeviceMismatchError(
                f"Expected all tensors to be on the same device, but found at least two devices, {CUDA} and cpu! "
                f"({func}: a host tensor of shape {tuple(host[0].shape)} among its operands)"
            )
        return True

    def _check_generator(self, func, kwargs, result_on_device: bool) -> None:
        if torch.Tag.nondeterministic_seeded not in func.tags:
            return
        generator = kwargs.get("generator")
        if generator is None:
            if result_on_device:
                raise DeviceMismatchError(
                    f"{func}: a draw on {CUDA} from the global generator (a run draws from its own streams only)"
                )
            return
        if (id(generator) in _device_generators) != result_on_device:
            expected, found = ("cuda", "cpu") if result_on_device else ("cpu", "cuda")
            raise DeviceMismatchError(f"{func}: Expected a '{expected}' device type for generator but found '{found}'")

    def _copy(self, func, args, kwargs, to_device) -> torch.Tensor | None:
        """A copy between host and device: the host waits for blocking ones; a non-blocking copy from the device
        into pinned memory is left in flight (returned: the destination, for now poisoned)."""
        if func is aten.copy_.default:
            destination, source = args[0], args[1]
            non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
            to_device = isinstance(destination, DeviceTensor)
        elif func is aten._to_copy.default:
            destination, source = None, args[0]
            non_blocking = bool(kwargs.get("non_blocking", False))
            if kwargs.get("device") is None and not to_device:  # a change of dtype or layout where it is
                return None
        else:
            return None
        from_device = isinstance(source, DeviceTensor)
        if from_device == to_device:
            return None
        if from_device and not non_blocking:
            self.synchronize()  # a blocking copy back waits for everything queued before it
        elif not from_device and not non_blocking:
            self.check_sync(f"{func}, a blocking copy from the host")
        if from_device and non_blocking and destination is not None and is_pinned(destination):
            self.in_flight.append((destination, source.host.clone()))  # stream order: the values at enqueue time
            _poison(destination)
            return destination
        return None


class _Host(TorchFunctionMode):
    """What C++ does with the dispatch modes off, done above them: ``torch.tensor(data, device="cuda")`` and friends
    are built on the host and moved over, as a GPU copies them over; and CUDA's autocast of the matmul family."""

    CONSTRUCTORS = frozenset({torch.tensor, torch.as_tensor, torch.asarray, torch.scalar_tensor})

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        device = kwargs.get("device")
        if func in self.CONSTRUCTORS and device is not None and torch.device(device).type == "cuda":
            data = args[0] if args else None
            if isinstance(data, DeviceTensor) and func is not torch.tensor:
                return _to(data, CUDA, dtype=kwargs.get("dtype") or data.dtype)
            kwargs["device"] = CPU
            return _to(func(*args, **kwargs), CUDA)
        if func in AUTOCAST_TO_LOWER and torch.is_autocast_enabled("cuda"):
            lower = torch.get_autocast_dtype("cuda")

            def cast(value: Any) -> Any:
                floating = isinstance(value, DeviceTensor) and value.dtype.is_floating_point
                return value.to(lower) if floating else value

            with torch.autocast("cuda", enabled=False):
                return func(*_map(cast, args), **_map(cast, kwargs))
        return func(*args, **kwargs)


# ---------------------------------------------------------------------- stand-ins for torch.cuda


def allocated_bytes() -> int:
    """Bytes of the distinct host storages behind the live device tensors."""
    storages = {}
    for tensor in list(_live):
        storage = tensor.host.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _memory_stats(device: Any = None) -> dict[str, Any]:
    """``torch._C._cuda_memoryStats``: the allocator's nested statistics, shaped as the real binding shapes them."""
    allocated = allocated_bytes()

    def pools(current: int) -> dict[str, dict[str, int]]:
        figures = {"current": current, "peak": current, "allocated": current, "freed": 0}
        return {"all": dict(figures), "large_pool": dict(figures), "small_pool": dict.fromkeys(figures, 0)}

    counted = ("allocated", "segment", "active", "inactive_split")
    sized = ("allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
    stats: dict[str, Any] = {name: pools(len(_live)) for name in counted}
    stats |= {name: pools(allocated) for name in sized}
    stats |= {"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0, "max_split_size": -1}
    return stats


def _events(mode: EmulatedCuda) -> type:
    class Event:
        """``torch.cuda.Event``: complete once the host has synchronised after its record."""

        def __init__(self, enable_timing: bool = False, **_: Any) -> None:
            self.time: float | None = None
            self.recorded_at = -1

        def record(self, stream: Any = None) -> None:
            self.time, self.recorded_at = time.perf_counter(), mode.syncs

        def query(self) -> bool:
            return 0 <= self.recorded_at < mode.syncs

        def synchronize(self) -> None:
            mode.synchronize()

        def wait(self, stream: Any = None) -> None:
            pass

        def elapsed_time(self, end: Event) -> float:
            if not (self.query() and end.query()):
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            return (end.time - self.time) * 1000.0

    return Event


def _streams(mode: EmulatedCuda, event: type) -> type:
    class Stream:
        """``torch.cuda.Stream``: one queue, the device's."""

        device = CUDA

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def synchronize(self) -> None:
            mode.synchronize()

        def query(self) -> bool:
            return not mode.in_flight

        def wait_stream(self, other: Any) -> None:
            pass

        def wait_event(self, other: Any) -> None:
            pass

        def record_event(self, recorded: Any = None) -> Any:
            recorded = recorded or event()
            recorded.record()
            return recorded

    return Stream


def _generator_class(original: type) -> type:
    class Generator(original):  # type: ignore[misc, valid-type]
        """``torch.Generator(device="cuda")``: a CPU generator the checks know as the device's."""

        def __new__(cls, device: Any = "cpu") -> Any:
            on_device = torch.device(device).type == "cuda"
            generator = original.__new__(cls, device="cpu")
            generator.emulated_device = CUDA if on_device else CPU
            generator.dispatched = _as_dispatched(generator)
            if on_device:
                _device_generators[id(generator.dispatched)] = generator.dispatched
            return generator

        def __init__(self, device: Any = "cpu") -> None:
            pass

        @property
        def device(self) -> torch.device:
            return self.emulated_device

    return Generator


def _as_dispatched(generator: torch.Generator) -> Any:
    """The object the dispatcher hands to operations for ``generator``: made at its first draw, the same after."""
    seen = []

    class Catch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if (kwargs or {}).get("generator") is not None:
                seen.append(kwargs["generator"])
            return func(*args, **(kwargs or {}))

    state = generator.get_state()
    with Catch():
        torch.empty(0).uniform_(generator=generator)
    generator.set_state(state)
    return seen[0]


@contextlib.contextmanager
def emulate_cuda() -> Iterator[EmulatedCuda]:
    """``torch.device("cuda")`` on this machine, for the body of the ``with`` (see the module docstring)."""
    mode = EmulatedCuda()
    cuda = torch.cuda
    event = _events(mode)
    stream = _streams(mode, event)
    properties = SimpleNamespace(name=NAME, major=0, minor=0, total_memory=TOTAL_BYTES, multi_processor_count=1)
    bindings = {  # the C bindings torch.cuda's Python calls
        "_cuda_memoryStats": _memory_stats,
        "_cuda_getDevice": lambda: 0,
        "_cuda_synchronize": mode.synchronize,
        "_cuda_set_sync_debug_mode": lambda level: setattr(mode, "sync_debug", int(level)),
        "_cuda_get_sync_debug_mode": lambda: mode.sync_debug,
        "_cuda_resetPeakMemoryStats": lambda device=None: None,
        "_cuda_resetAccumulatedMemoryStats": lambda device=None: None,
        "_cuda_emptyCache": lambda: None,
    }
    patches = {
        (cuda, "_initialized"): True,
        (cuda, "_exchange_device"): lambda device: 0,  # torch.cuda.device(...), one device
        (cuda, "_maybe_exchange_device"): lambda device: 0,
        (cuda, "is_available"): lambda: True,
        (cuda, "device_count"): lambda: 1,
        (cuda, "set_device"): lambda device: None,
        (cuda, "get_device_properties"): lambda device=None: properties,
        (cuda, "get_device_name"): lambda device=None: NAME,
        (cuda, "get_device_capability"): lambda device=None: (0, 0),
        (cuda, "is_bf16_supported"): lambda including_emulation=True: True,
        (cuda, "mem_get_info"): lambda device=None: (TOTAL_BYTES - allocated_bytes(), TOTAL_BYTES),
        (cuda, "Event"): event,
        (cuda, "Stream"): stream,
        (cuda, "current_stream"): lambda device=None: stream(),
        (cuda, "stream"): lambda stream=None: contextlib.nullcontext(),
        (cuda, "CUDAGraph"): lambda keep_graph=False: _Graph(mode),
        (cuda, "graph_pool_handle"): new_pool,
        (torch.version, "cuda"): "emulated",
        (torch, "Generator"): _generator_class(torch.Generator),
        (torch.Tensor, "to"): _to,
        (torch.Tensor, "cuda"): lambda self, device=None, non_blocking=False, **_: _to(
            self, CUDA, non_blocking=non_blocking
        ),
        **{(torch._C, name): binding for name, binding in bindings.items()},
    }
    missing = object()
    saved = {key: getattr(*key, missing) for key in patches}
    try:
        for (owner, name), value in patches.items():
            setattr(owner, name, value)
        with _Host(), mode:
            yield mode
    finally:
        for (owner, name), value in saved.items():
            if value is missing:
                delattr(owner, name)
            else:
                setattr(owner, name, value)
        _device_generators.clear()
        mode.in_flight.clear()


@contextlib.contextmanager
def host_reads(mode: EmulatedCuda) -> Iterator[None]:
    """Let a test read device values as Python values (its own comparisons)."""
    mode.host_reads_allowed += 1
    try:
        yield
    finally:
        mode.host_reads_allowed -= 1
