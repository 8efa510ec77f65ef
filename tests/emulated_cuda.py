"""A CUDA device emulated on the CPU, as strict as a real one: the CUDA code paths run in the CPU tests.

The first GPU crashed on a bug that every CPU test missed, because they ran the CPU branch, where a device tensor is a
host tensor. Under ``emulate_cuda()`` ``torch.device("cuda")`` exists on a machine without a GPU: tensors on it report
``device == cuda:0`` and hold their values in a CPU tensor, so whole runs compute real numbers (bit for bit those of a
CPU run), while every operation is checked the way a GPU checks it, and more strictly where the project's rules are:

* a host-only read of a device tensor: ``.numpy()`` and ``numpy.asarray`` (a GPU refuses them too), ``.item()``,
  ``float()``, ``int()``, ``bool()``, ``.tolist()``, ``torch.equal``: results come to the host as tensors
  (``runtime.boundary.to_host``), never as Python values straight off the device, which a GPU allows at the price
  of a synchronisation each;
* a host tensor in device arithmetic, or a device tensor indexing a host one; as on a GPU, a 0-dim host tensor passes
  as a scalar, and host index tensors may index a device tensor;
* a random draw whose generator is on another device than the draw, and a device draw from the global generator
  (every draw of a run comes from its own streams, ``run.streams``);
* a copy between host and device, whichever torch call spells it (``Tensor.to``, ``.cuda``, ``.type``, ``copy_``,
  ``torch._foreach_copy_``, a pytree map of them: each reaches ``aten._to_copy``, ``aten.copy_`` or
  ``aten._foreach_copy_``, where the checks are):

  - a non-blocking copy from the device into pinned memory lands only when the host has synchronised with the stream
    it was queued on (that stream, an event recorded after it, the device, or a blocking copy back on that stream);
    read before that, the buffer holds NaN (or the integer type's largest value). Pinned memory is what
    ``pin_memory=True`` (``torch.empty``, ``zeros``, ``full``, ``empty_like``, ``new_empty``, ...) or
    ``.pin_memory()`` made, any slice of it, and what ``.to("cpu", non_blocking=True)`` returns (CUDA's
    ``_to_copy`` pins its result and fills it asynchronously). Into pageable memory a GPU finishes the copy before it
    returns, and so does the emulation;
  - a non-blocking copy to the device from pinned memory reads its source when the stream gets to it: a host write
    into the bytes it reads before the host has synchronised with that stream raises ``RaceError``, at the write, or
    at the synchronisation for a write the dispatcher does not see (through numpy);

* an event's elapsed time read before the host has synchronised after it was recorded;
* streams: each ``torch.cuda.Stream`` is a queue of its own, ordered after another only by ``wait_stream``, an
  event's ``wait`` or a host synchronisation. Work that reads a storage another stream wrote (or allocated), or writes
  one another stream read or wrote, without being ordered after that, raises ``RaceError``; a replayed graph reads and
  writes what its operations do, on the stream it is replayed on. A storage is one unit: two streams writing disjoint
  parts of it without a wait are refused too;
* with ``torch.cuda.set_sync_debug_mode("error")``, and inside a graph's capture, any operation that makes the host
  wait for the GPU (``"warn"`` warns): a blocking copy either way, host index tensors copied over, a host read, a
  synchronize, and every operation whose result's shape depends on device values: ``nonzero``, ``masked_select``,
  ``unique``, indexing with a boolean mask, ``index_put_`` with one unless CUDA makes it a ``masked_fill_`` (one
  mask, one host value), ``repeat_interleave`` without ``output_size``, ``bincount``, ``histc`` without a range
  (the operations torch tags ``dynamic_output_shape``, and these; ``one_hot`` without ``num_classes`` is a host read);
* operations CUDA computes in an unspecified order (atomics; the project promises the same bits on the same GPU
  kind, so where the order changes the result they raise ``NondeterministicError``): ``index_add_``, ``index_copy_``,
  ``index_put_`` accumulating or not, ``put_``, ``scatter_``, ``scatter_add_``, ``scatter_reduce_``,
  ``index_reduce_``, ``bincount`` with weights, and the backward passes made of them (of ``index_select``, ``gather``
  and indexing), checked by running the duplicate destinations in the opposite order and comparing the bits; and,
  always, the operations CUDA has no deterministic kernel for whose bits depend on the order (``cumsum`` of floats,
  ``median`` with indices, ``nll_loss``, some pooling, padding and interpolation backward passes). Under
  ``torch.use_deterministic_algorithms(True)`` the first kind gives CUDA's deterministic result (the CPU's) and the
  second raises torch's error (a warning with ``warn_only``), as on a GPU; so does a cuBLAS matmul then, unless
  ``CUBLAS_WORKSPACE_CONFIG`` is ``:4096:8`` or ``:16:8`` (cuBLAS is deterministic only with such a workspace).

Under ``torch.autocast("cuda")`` the matmul family computes in the autocast dtype, as CUDA's autocast casts them.

CUDA graphs are emulated as a GPU runs them (``torch.cuda.CUDAGraph``): a capture records the device operations
without their effects (every tensor and device generator it changed is put back), and a replay runs the recorded
operations again on the same tensors, with the arguments they had at the capture. So what a GPU bakes into a graph
is baked here: a Python value read at the capture, a host scalar tensor's value at the capture, host work done once
at the capture and never replayed, a graph's outputs overwritten by the next replay. In a capture, an operation that
would make the host wait fails, and so does a draw from a generator not registered with the graph. A graph's memory
pool lives as long as a graph captured into it: capturing into a pool whose graphs have all been destroyed fails, as
CUDA's caching allocator asserts.

Not emulated, so not caught here (a GPU run, ``benchmarks/gpu_smoke.sh``, is the check):

* the caching allocator's reuse of freed memory: a tensor freed while another stream still uses it, without
  ``record_stream`` (``record_stream`` is accepted and does nothing). Pinned host memory is no such class: the
  caching host allocator keeps a block until the copies recorded on it are done;
* numbers: the emulated device computes the CPU's (its device draws are the CPU generator's, its matmuls are not
  TF32, its reductions keep the CPU's order), so a CPU-to-GPU equality, or a tolerance, is not tested here;
* ``t[mask] = value`` with a one-element device ``value``: CUDA waits for the mask's count there (it makes a
  ``masked_fill_`` of a host value only), the emulation lets it pass, as it cannot tell it from ``t[mask] = 0.0``;
* an out-of-range index, which a GPU reports as a device-side assert at a later synchronisation (the CPU raises at
  once: the bug fails either way), and the card's limits: its memory, its time.

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
import os
import time
import warnings
import weakref
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any, NamedTuple

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


class RaceError(RuntimeError):
    """Work that a GPU could run in either order with other work: a stream reading or writing what another stream
    touched without waiting for it, or a host write into a pinned buffer a copy to the device may still be reading."""


class NondeterministicError(RuntimeError):
    """An operation whose result on a GPU depends on the order its atomics happen to run in."""


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
MASK_TYPES = (torch.bool, torch.uint8)
CUBLAS = frozenset(
    {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default, aten.addbmm.default}
    | {aten.mv.default, aten.addmv.default, aten.dot.default, aten.vdot.default, aten._addmm_activation.default}
)
"""Operations CUDA hands to cuBLAS, which is deterministic only with a fixed workspace (``CUBLAS_WORKSPACE_CONFIG``)."""


def _op(name: str, overload: str = "default") -> Any:
    """``aten.name.overload``, or None where this build has no such operation."""
    packet = getattr(aten, name, None)
    return getattr(packet, overload, None) if packet is not None else None


UNORDERED = {
    op: deterministic_when_asked
    for names, deterministic_when_asked in (
        (("index_add", "index_add_", "index_copy", "index_copy_", "scatter_add", "scatter_add_"), True),
        (("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put"), True),
        (("put", "put_", "bincount", "histc"), False),
        (("index_reduce", "index_reduce_"), False),
    )
    for name in names
    for op in [_op(name)]
    if op is not None
} | {
    op: True
    for name in ("scatter", "scatter_")
    for overload in ("src", "reduce")
    for op in [_op(name, overload)]
    if op is not None
}
"""Operations that write values into positions given by an index, each position by whichever write or atomic
addition comes last on a GPU (the order of their contributions is unspecified there); each mapped to whether CUDA
runs it deterministically under ``torch.use_deterministic_algorithms(True)`` (torch's list). ``scatter_reduce``
is added by its reduction below."""
UNORDERED_REDUCE = frozenset(op for op in (_op("scatter_reduce", "two"), _op("scatter_reduce_", "two")) if op)
"""``scatter_reduce``: deterministic when asked for sum and mean, not for prod (amax and amin need no order)."""
NO_DETERMINISTIC_KERNEL = {
    op: name
    for name, (op_name, overload) in {
        "cumsum_cuda_kernel": ("cumsum", "default"),
        "median CUDA with indices output": ("median", "dim"),
        "nll_loss2d_forward_out_cuda_template": ("nll_loss2d_forward", "default"),
        "nll_loss_forward_out_cuda_template": ("nll_loss_forward", "default"),
        "avg_pool3d_backward_cuda": ("avg_pool3d_backward", "default"),
        "adaptive_avg_pool2d_backward_cuda": ("_adaptive_avg_pool2d_backward", "default"),
        "adaptive_avg_pool3d_backward_cuda": ("_adaptive_avg_pool3d_backward", "default"),
        "adaptive_max_pool2d_backward_cuda": ("adaptive_max_pool2d_backward", "default"),
        "fractional_max_pool2d_backward_cuda": ("fractional_max_pool2d_backward", "default"),
        "fractional_max_pool3d_backward_cuda": ("fractional_max_pool3d_backward", "default"),
        "max_unpooling2d_forward_out": ("max_unpool2d", "default"),
        "max_unpooling3d_forward_out": ("max_unpool3d", "default"),
        "upsample_linear1d_backward_out_cuda": ("upsample_linear1d_backward", "default"),
        "upsample_bilinear2d_backward_out_cuda": ("upsample_bilinear2d_backward", "default"),
        "upsample_bicubic2d_backward_out_cuda": ("upsample_bicubic2d_backward", "default"),
        "upsample_trilinear3d_backward_out_cuda": ("upsample_trilinear3d_backward", "default"),
        "reflection_pad1d_backward_out_cuda": ("reflection_pad1d_backward", "default"),
        "reflection_pad2d_backward_cuda": ("reflection_pad2d_backward", "default"),
        "reflection_pad3d_backward_out_cuda": ("reflection_pad3d_backward", "default"),
        "ctc_loss_backward_gpu": ("_ctc_loss_backward", "default"),
        "grid_sampler_2d_backward_cuda": ("grid_sampler_2d_backward", "default"),
        "grid_sampler_3d_backward_cuda": ("grid_sampler_3d_backward", "default"),
    }.items()
    for op in [_op(op_name, overload)]
    if op is not None
}
"""Operations CUDA has no deterministic kernel for (torch's list, ``torch.use_deterministic_algorithms``), by the
name torch's error gives, whose bits depend on the order; ``put_``, ``bincount`` with weights, ``histc`` (whose
counts are the same in any order) and ``scatter_reduce`` with prod are among them too, in ``UNORDERED``."""
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


def _metadata_only(func) -> bool:
    """Whether an operation only makes a view or changes a tensor's shape: no kernel reads or writes memory."""
    return func.is_view or torch.Tag.inplace_view in func.tags or func is aten._unsafe_view.default


def _storage(tensor: torch.Tensor) -> int:
    """The address of the host storage behind a tensor: one key for all its views."""
    return _host(tensor).untyped_storage().data_ptr()


def _span(tensor: torch.Tensor) -> tuple[int, int, int]:
    """(storage, first byte, byte past the last) of the bytes a host tensor's elements occupy."""
    size = tensor.element_size()
    first = tensor.storage_offset() * size
    extent = sum((n - 1) * abs(stride) for n, stride in zip(tensor.shape, tensor.stride())) if tensor.numel() else -1
    return tensor.untyped_storage().data_ptr(), first, first + (extent + 1) * size


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit equality (NaN equals the same NaN, -0.0 differs from 0.0)."""
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ---------------------------------------------------------------------- operations CUDA runs in an unspecified order


def _positions(tensor: torch.Tensor) -> torch.Tensor:
    """Each element's flat position in ``tensor``, shaped as it."""
    return torch.arange(tensor.numel()).view(tensor.shape)


def _contributions(func, args, kwargs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str | None, bool] | None:
    """What an operation of ``UNORDERED`` writes, on host values: (the tensor written, the flat position of each
    contribution, its value, the reduction or None where the last write wins, whether the reduction includes the
    tensor's own value), contributions in the order the CPU kernel takes them; None where nothing can collide."""
    schema = [argument.name for argument in func._schema.arguments]
    values = dict(zip(schema, args)) | kwargs
    name = func._schema.name.removeprefix("aten::").rstrip("_")
    target = values.get("self")
    if name in ("index_add", "index_copy", "index_reduce"):
        positions = _positions(target).index_select(values["dim"], values["index"])
        source = values["source"]
        if name == "index_add":
            alpha = values.get("alpha", 1)
            return target, positions, source * alpha if alpha != 1 else source, "sum", True
        if name == "index_copy":
            return target, positions, source, None, True
        return target, positions, source, values["reduce"], values.get("include_self", True)
    if name in ("scatter_add", "scatter", "scatter_reduce"):
        index = values["index"]
        positions = _positions(target).gather(values["dim"], index)
        source = values["src"][tuple(slice(0, n) for n in index.shape)]
        reduce = {"scatter_add": "sum", "scatter": None}.get(name, values.get("reduce"))
        reduce = {"add": "sum", "multiply": "prod"}.get(reduce, reduce)
        return target, positions, source, reduce, values.get("include_self", True)
    if name in ("index_put", "_index_put_impl", "_unsafe_index_put"):
        positions = aten.index.Tensor(_positions(target), values["indices"])
        reduce = "sum" if values.get("accumulate", False) else None
        return target, positions, values["values"].expand(positions.shape), reduce, True
    if name == "put":
        reduce = "sum" if values.get("accumulate", False) else None
        return target, values["index"].reshape(-1) % max(target.numel(), 1), values["source"], reduce, True
    if name == "histc":
        return None  # counts: integers, the same in any order
    if name == "bincount":
        weights = values.get("weights")
        if weights is None or not weights.is_floating_point() or values["self"].numel() == 0:
            return None  # counts: integers, the same in any order
        length = max(values.get("minlength", 0), int(values["self"].max()) + 1)
        return torch.zeros(length, dtype=weights.dtype), values["self"], weights, "sum", True
    return None


def _order_matters(func, args, kwargs) -> bool:
    """Whether an operation of ``UNORDERED`` gives other bits with its colliding contributions taken in the
    opposite order (a GPU takes them in any)."""
    found = _contributions(func, args, kwargs)
    if found is None:
        return False
    target, positions, values, reduce, include_self = found
    positions, values = positions.reshape(-1), values.reshape(-1).to(target.dtype)
    if positions.numel() < 2 or torch.unique(positions).numel() == positions.numel():
        return False

    def written(order: torch.Tensor) -> torch.Tensor:
        out = target.reshape(-1).clone()
        where, what = positions[order], values[order]
        if reduce is None:  # the last write of each position wins
            rank = torch.full_like(out, -1, dtype=torch.long).scatter_reduce_(
                0, where, torch.arange(where.numel()), "amax"
            )
            hit = rank >= 0
            out[hit] = what[rank[hit]]
            return out
        return out.scatter_reduce_(0, where, what, reduce, include_self=include_self)

    forward = torch.arange(positions.numel())
    return not _same_bits(written(forward), written(forward.flip(0)))


def _check_order(func, args, kwargs) -> None:
    """Raise what a GPU run would show as bits that change from run to run (see the module docstring); ``args`` and
    ``kwargs`` on the host."""
    deterministic = torch.are_deterministic_algorithms_enabled()
    if deterministic and func in CUBLAS and os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in (":4096:8", ":16:8"):
        _nondeterministic(func, f"{func} through cuBLAS without CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8)", True)
    if func in NO_DETERMINISTIC_KERNEL:
        if func is aten.cumsum.default and not (args[0].is_floating_point() or args[0].is_complex()):
            return
        _nondeterministic(func, NO_DETERMINISTIC_KERNEL[func], deterministic)
        return
    if func in UNORDERED_REDUCE:
        reduce = args[4] if len(args) > 4 else kwargs["reduce"]
        asked = reduce in ("sum", "mean")
    elif func in UNORDERED:
        asked = UNORDERED[func]
        if func in (aten.bincount.default,) and (args[1] if len(args) > 1 else kwargs.get("weights")) is None:
            return
    else:
        return
    if deterministic and asked:
        return  # CUDA switches to a deterministic kernel
    if deterministic:
        _nondeterministic(func, str(func), deterministic)
    elif _order_matters(func, args, kwargs):
        raise NondeterministicError(
            f"{func} on {CUDA} writes some positions more than once and its result depends on their order, which "
            "CUDA's atomics leave unspecified: the bits would change from run to run (the project promises the same "
            "bits on the same GPU kind)"
        )


def _nondeterministic(func, name: str, deterministic: bool) -> None:
    if not deterministic:
        raise NondeterministicError(
            f"{func} on {CUDA}: CUDA has no deterministic kernel for it ({name}), its bits change from run to run"
        )
    message = (  # the words torch's error begins with, so that what matches it on a GPU matches here
        f"{name} does not have a deterministic implementation, and torch.use_deterministic_algorithms(True) is on "
        "(with warn_only=True it warns instead)"
    )
    if torch.is_deterministic_algorithms_warn_only_enabled():
        warnings.warn(message, UserWarning, stacklevel=2)
    else:
        raise RuntimeError(message)


# ---------------------------------------------------------------------- operations the host waits for


def _waits_for_shape(func, args, kwargs) -> bool:
    """Whether a device operation's result's shape depends on device values, which the host must wait for."""
    if func in INDEX_OPS:
        indices = [i for i in _leaves(args[1], []) if isinstance(i, torch.Tensor)]
        masks = [i for i in indices if isinstance(i, DeviceTensor) and i.dtype in MASK_TYPES]
        if not masks:
            return False
        if func is aten.index.Tensor:
            return True
        value = args[2] if len(args) > 2 else kwargs["values"]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        # CUDA turns one mask and a one-element host value into masked_fill_, which needs no count
        # (``t[mask] = 0.0`` makes its value on the host on CUDA, on the device here: a 0-dim value passes)
        one_value = value.numel() == 1 and (_is_host(value) or value.dim() == 0)
        return accumulate or len(indices) > 1 or not one_value
    if func is aten.repeat_interleave.Tensor:
        return kwargs.get("output_size") is None
    if func is aten.histc.default:
        low = args[2] if len(args) > 2 else kwargs.get("min", 0)
        high = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return low == high
    return torch.Tag.dynamic_output_shape in func.tags


# ---------------------------------------------------------------------- streams


class StreamOrder:
    """The order a GPU guarantees between streams, and what each stream last did to each storage.

    Each stream counts the work queued on it. ``after[s][t]`` is how much of stream t's work stream s's next work is
    ordered after (by ``wait_stream``, or an event's ``wait``), ``host[t]`` how much of t the host has seen complete
    (everything queued after a synchronisation is ordered after what it saw). ``touched`` keeps, per storage, the
    stream that last wrote it (or allocated it: memory from a stream's pool is that stream's until others wait for
    it) with its count, and the streams that read it since."""

    DEFAULT = 0

    def __init__(self) -> None:
        self.queued: dict[int, int] = {self.DEFAULT: 0}
        self.after: dict[int, dict[int, int]] = {self.DEFAULT: {}}
        self.host: dict[int, int] = {}
        self.current = self.DEFAULT
        self.touched: dict[int, tuple[int, int, dict[int, int]]] = {}

    def new_stream(self) -> int:
        stream = len(self.queued)
        self.queued[stream], self.after[stream] = 0, {}
        return stream

    def ordered(self, stream: int, other: int, count: int) -> bool:
        """Whether work queued now on ``stream`` runs after the first ``count`` of ``other``'s."""
        return other == stream or self.after[stream].get(other, 0) >= count or self.host.get(other, 0) >= count

    def wait(self, stream: int, other: int, count: int, other_after: dict[int, int]) -> None:
        """``stream``'s next work waits for the first ``count`` of ``other``'s (and what that waited for)."""
        after = self.after[stream]
        for source, seen in (*other_after.items(), (other, count)):
            if source != stream and seen > after.get(source, 0):
                after[source] = seen

    def host_saw(self, stream: int, count: int, stream_after: dict[int, int]) -> None:
        """The host waited for the first ``count`` of ``stream``'s work (and what that waited for)."""
        for source, seen in (*stream_after.items(), (stream, count)):
            if seen > self.host.get(source, 0):
                self.host[source] = seen
        self.touched = {
            key: record
            for key, record in self.touched.items()
            if self.host.get(record[0], 0) < record[1] or any(self.host.get(r, 0) < c for r, c in record[2].items())
        }

    def host_saw_all(self) -> None:
        self.host = dict(self.queued)
        self.touched = {}

    def access(self, what: Any, reads: set[int], writes: set[int]) -> int:
        """Work queued on the current stream that reads ``reads`` and writes ``writes`` (storages); raises
        ``RaceError`` where another stream's work on them is not ordered before it. Returns its count."""
        stream = self.current
        for key in reads | writes:
            record = self.touched.get(key)
            if record is None:
                continue
            writer, written_at, readers = record
            if not self.ordered(stream, writer, written_at):
                raise RaceError(
                    f"{what} on {self.name(stream)} uses a tensor that {self.name(writer)} wrote, without waiting for "
                    "it (wait_stream, or an event's wait): on a GPU it may run first"
                )
            if key in writes:
                for reader, read_at in readers.items():
                    if not self.ordered(stream, reader, read_at):
                        raise RaceError(
                            f"{what} on {self.name(stream)} writes a tensor that {self.name(reader)} reads, without "
                            "waiting for it (wait_stream, or an event's wait): on a GPU the read may see the new values"
                        )
        count = self.queued[stream] = self.queued[stream] + 1
        for key in reads - writes:
            record = self.touched.get(key)
            if record is not None:
                record[2][stream] = count
        for key in writes:
            self.touched[key] = (stream, count, {})
        return count

    def allocated(self, made: set[int]) -> None:
        """New storages from the current stream's pool, by the work it queued last."""
        for key in made:
            self.touched[key] = (self.current, self.queued[self.current], {})

    def name(self, stream: int) -> str:
        return "the default stream" if stream == self.DEFAULT else f"stream {stream}"


# ---------------------------------------------------------------------- graphs


class _Graph:
    """``torch.cuda.CUDAGraph`` on the emulated device (see the module docstring)."""

    def __init__(self, mode: EmulatedCuda) -> None:
        self.mode = mode
        self.operations: list[tuple[Any, tuple, dict, Any]] = []
        self.generators: set[int] = set()
        self.reads: set[int] = set()
        self.writes: set[int] = set()
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
        self.reads, self.writes = set(), set()
        for func, args, kwargs, out in self.operations:
            written = {id(t) for t in _written(func, args, kwargs)}
            for tensor in _leaves((args, kwargs), []):
                if isinstance(tensor, DeviceTensor):
                    (self.writes if id(tensor) in written else self.reads).add(_storage(tensor))
            if _fresh(func):
                self.writes.update(_storage(t) for t in _leaves(out, []) if isinstance(t, DeviceTensor))

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


# ---------------------------------------------------------------------- the device


class _Transfer(NamedTuple):
    """A copy between host and device."""

    destination: torch.Tensor | None
    """The tensor written (None for ``_to_copy``, whose result is new)."""
    source: torch.Tensor
    non_blocking: bool
    to_device: bool


def _transfer(func, args, kwargs, to_device: bool) -> _Transfer | None:
    """The copy between host and device an operation of ``COPIES`` makes, if it makes one."""
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
    if isinstance(source, DeviceTensor) == to_device:
        return None
    return _Transfer(destination, source, non_blocking, to_device)


class EmulatedCuda(TorchDispatchMode):
    """Runs every operation on the host values and checks it the way a GPU does (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.sync_debug = 0  # torch.cuda.set_sync_debug_mode: 0 default, 1 warn, 2 error
        self.host_reads_allowed = 0
        self.order = StreamOrder()
        # copies from the device into pinned memory: (destination, the values it will get, stream, count)
        self.in_flight: list[tuple[torch.Tensor, torch.Tensor, int, int]] = []
        # copies to the device from pinned memory: (source, its values when queued, its bytes, stream, count)
        self.uploads: list[tuple[torch.Tensor, torch.Tensor, tuple[int, int, int], int, int]] = []
        self.capturing: _Graph | None = None
        self._saved: dict[int, tuple[torch.UntypedStorage, torch.UntypedStorage]] = {}  # storages a capture changed
        self._saved_generators: list[tuple[Any, torch.Tensor]] = []
        self.pool_users: dict[tuple[int, int], int] = {}  # live graphs captured into each pool

    # ------------------------------------------------------------------ the host waits

    def synchronize(self) -> None:
        """The host waits for the whole device: every copy in flight lands."""
        self.check_sync("a synchronize")
        self.order.host_saw_all()
        self._landed()

    def synchronize_stream(
        self, stream: int | None = None, count: int | None = None, after: Any = None, *, what: Any = "a synchronize"
    ) -> None:
        """The host waits for ``stream`` (the current one by default) up to ``count`` (all queued so far)."""
        stream = self.order.current if stream is None else stream
        count = self.order.queued[stream] if count is None else count
        self.check_sync(what)
        self.order.host_saw(stream, count, self.order.after[stream] if after is None else after)
        self._landed()

    def check_sync(self, what: Any) -> None:
        if self.capturing is not None:
            raise SyncError(f"operation not permitted when stream is capturing: {what}")
        if self.sync_debug >= 2:
            raise SyncError(f"called a synchronizing CUDA operation: {what}")
        if self.sync_debug == 1:
            warnings.warn(f"called a synchronizing CUDA operation: {what}", UserWarning, stacklevel=2)

    def _landed(self) -> None:
        """The copies the host has now waited for: values into pinned buffers, sources that must not have changed."""
        done = self.order.host
        waiting = []
        for destination, values, stream, count in self.in_flight:
            if done.get(stream, 0) >= count:
                destination.copy_(values)
            else:
                waiting.append((destination, values, stream, count))
        self.in_flight = waiting
        uploads = []
        for upload in self.uploads:
            source, values, _, stream, count = upload
            if done.get(stream, 0) < count:
                uploads.append(upload)
            elif not _same_bits(source, values):
                self.uploads = []
                raise RaceError(
                    f"a pinned host buffer changed while a non-blocking copy of it to {CUDA} was in flight (written "
                    "where the emulation could not see it, e.g. through numpy): on a GPU the device may get the new "
                    "values; synchronise with the copy's stream before writing the buffer again"
                )
        self.uploads = uploads

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
        """The recorded operations again, on the same tensors, with the arguments of the capture, as one piece of work
        on the current stream."""
        count = self.order.access("a graph's replay", graph.reads, graph.writes)
        with torch.utils._python_dispatch._disable_current_modes():
            for func, args, kwargs, out in graph.operations:
                host_args, host_kwargs = _map(_host, args), _map(_host, kwargs)
                _check_order(func, host_args, host_kwargs)
                result = func(*host_args, **host_kwargs)
                if _fresh(func):  # into the tensors the capture handed out: a graph's memory is its own
                    for recorded, value in zip(_leaves(out, []), _leaves(result, [])):
                        if isinstance(recorded, torch.Tensor):
                            _host(recorded).copy_(value)
                if func in COPIES:
                    self._replayed_copy(func, args, kwargs, out, count)

    def _replayed_copy(self, func, args, kwargs, out: Any, count: int) -> None:
        """A replayed copy between host and device: it lands, or reads its pinned source, when the stream gets there."""
        transfer = _transfer(func, args, kwargs, isinstance(out, DeviceTensor))
        if transfer is None or not transfer.non_blocking:
            return
        destination = out if transfer.destination is None else transfer.destination
        if not transfer.to_device and is_pinned(destination):
            self.in_flight.append((destination, destination.clone(), self.order.current, count))
            _poison(destination)
        elif transfer.to_device and is_pinned(transfer.source):
            self._upload(transfer.source, count)

    def _record(self, func, args, kwargs) -> None:
        """Before a captured operation runs: keep what it will change, to put it back at the capture's end."""
        for tensor in _written(func, args, kwargs):
            storage = _host(tensor).untyped_storage()
            if storage.data_ptr() not in self._saved:
                self._saved[storage.data_ptr()] = (storage, storage.clone())
        generator = kwargs.get("generator")
        if generator is not None and id(generator) not in self.capturing.generators:
            raise RuntimeError(f"{func}: a draw in a CUDA graph's capture from a generator not registered with it")

    # ------------------------------------------------------------------ every operation

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

        if self.uploads:
            self._check_upload_sources(func, args, kwargs)
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
        if func is aten._foreach_copy_.default:  # one copy_ per pair, each checked as one
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            for destination, source in zip(args[0], args[1]):
                self.__torch_dispatch__(aten.copy_.default, types, (destination, source, non_blocking))
            return None
        if func is aten.record_stream.default:  # the caching allocator's reuse is not emulated
            return None
        result_on_device = self._result_on_device(func, args, kwargs, tensors, on_device, to_device)
        self._check_generator(func, kwargs, result_on_device)
        if on_device:
            _check_order(func, _map(_host, args), _map(_host, kwargs))
        captured = self.capturing is not None and (on_device or result_on_device)
        queued = (on_device or result_on_device) and not captured and not _metadata_only(func)
        count = 0
        if queued:  # work on the current stream (a capture runs nothing, a view launches nothing)
            written = _written(func, args, kwargs)
            writes = {_storage(t) for t in written if isinstance(t, DeviceTensor)}
            reads = {_storage(t) for t in tensors if isinstance(t, DeviceTensor)} - writes
            count = self.order.access(func, reads, writes)
        if func in COPIES:
            landed = self._copy(func, args, kwargs, to_device, count)
            if landed is not None:
                return landed
        elif on_device and (func in HOST_READS or _waits_for_shape(func, args, kwargs)):
            self.synchronize_stream(what=func)

        if captured:
            self._record(func, args, kwargs)
        out = func(*_map(_host, args), **_map(_host, kwargs))
        if pinned:
            _pin(out)
        if result_on_device:
            out = _map(_wrap, out)
            if queued and _fresh(func):  # new memory from the current stream's pool
                self.order.allocated({_storage(t) for t in _leaves(out, []) if isinstance(t, DeviceTensor)})
        out = return_and_correct_aliasing(func, args, kwargs, out)
        if captured:  # a host scalar tensor is a kernel argument: its value at the capture is baked in
            baked = _map(lambda v: v.clone() if _is_host(v) else v, (args, kwargs)) if func not in COPIES else None
            self.capturing.operations.append((func, *(baked or (args, kwargs)), out))
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

    def _copy(self, func, args, kwargs, to_device: bool, count: int) -> torch.Tensor | None:
        """A copy between host and device: the host waits for blocking ones; a non-blocking copy from the device into
        pinned memory is left in flight (returned: the destination, for now poisoned), one to the device from pinned
        memory leaves its source in use until the host synchronises."""
        transfer = _transfer(func, args, kwargs, to_device)
        if transfer is None:
            return None
        if not transfer.non_blocking:
            if transfer.to_device:
                self.check_sync(f"{func}, a blocking copy from the host")
            else:
                self.synchronize_stream(what=f"{func}, a blocking copy to the host")  # after all queued before
            return None
        if transfer.to_device:
            if is_pinned(transfer.source):
                self._upload(transfer.source, count)
            return None
        stream = self.order.current
        if transfer.destination is None:  # CUDA's _to_copy pins its result and fills it asynchronously
            out = func(*_map(_host, args), **_map(_host, kwargs))
            _pin(out)
            self.in_flight.append((out, out.clone(), stream, count))
            _poison(out)
            return out
        if is_pinned(transfer.destination):  # stream order: the values at enqueue time
            self.in_flight.append((transfer.destination, transfer.source.host.clone(), stream, count))
            _poison(transfer.destination)
            return transfer.destination
        return None  # into pageable memory a GPU finishes the copy before it returns

    def _upload(self, source: torch.Tensor, count: int) -> None:
        """A copy to the device from pinned ``source``, queued now: the host must not write it before it lands."""
        self.uploads.append((source, source.clone(), _span(source), self.order.current, count))

    def _check_upload_sources(self, func, args, kwargs) -> None:
        for tensor in _written(func, args, kwargs):
            if not _is_host(tensor):
                continue
            storage, first, last = _span(tensor)
            for _, _, (source_storage, source_first, source_last), stream, _ in self.uploads:
                if storage == source_storage and first < source_last and source_first < last:
                    raise RaceError(
                        f"{func} writes a pinned host buffer that a non-blocking copy to {CUDA} queued on "
                        f"{self.order.name(stream)} may still be reading: on a GPU the device may get the new values; "
                        "synchronise with that stream (or an event recorded after the copy) first"
                    )


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
    order = mode.order

    class Event:
        """``torch.cuda.Event``: a point in a stream's queue, complete once the host has synchronised with it."""

        def __init__(self, enable_timing: bool = False, **_: Any) -> None:
            self.time: float | None = None
            self.stream, self.count, self.after = -1, 0, {}

        def record(self, stream: Any = None) -> None:
            self.stream = order.current if stream is None else stream.stream_id
            order.queued[self.stream] += 1  # the record is work on the stream: complete after what came before
            self.count, self.after = order.queued[self.stream], dict(order.after[self.stream])
            self.time = time.perf_counter()

        def query(self) -> bool:
            return self.stream >= 0 and order.host.get(self.stream, 0) >= self.count

        def synchronize(self) -> None:
            if self.stream >= 0:
                mode.synchronize_stream(self.stream, self.count, self.after)

        def wait(self, stream: Any = None) -> None:
            if self.stream >= 0:
                waiting = order.current if stream is None else stream.stream_id
                order.wait(waiting, self.stream, self.count, self.after)

        def elapsed_time(self, end: Event) -> float:
            if not (self.query() and end.query()):
                raise RuntimeError("Both events must be completed before calculating elapsed time.")
            return (end.time - self.time) * 1000.0

    return Event


def _streams(mode: EmulatedCuda, event: type) -> type:
    order = mode.order

    class Stream:
        """``torch.cuda.Stream``: a queue of its own (see the module docstring)."""

        device = CUDA

        def __init__(self, device: Any = None, priority: int = 0, *, stream_id: int | None = None, **_: Any) -> None:
            self.stream_id = order.new_stream() if stream_id is None else stream_id

        def synchronize(self) -> None:
            mode.synchronize_stream(self.stream_id)

        def query(self) -> bool:
            return order.host.get(self.stream_id, 0) >= order.queued[self.stream_id]

        def wait_stream(self, other: Any) -> None:
            order.wait(self.stream_id, other.stream_id, order.queued[other.stream_id], order.after[other.stream_id])

        def wait_event(self, recorded: Any) -> None:
            recorded.wait(self)

        def record_event(self, recorded: Any = None) -> Any:
            recorded = recorded or event()
            recorded.record(self)
            return recorded

        def __eq__(self, other: object) -> bool:
            return getattr(other, "stream_id", None) == self.stream_id

        def __hash__(self) -> int:
            return hash(self.stream_id)

        def __repr__(self) -> str:
            return f"<emulated torch.cuda.Stream {order.name(self.stream_id)}>"

    return Stream


@contextlib.contextmanager
def _on_stream(mode: EmulatedCuda, stream: Any) -> Iterator[None]:
    """``torch.cuda.stream(stream)``: work queued in the body goes to ``stream``."""
    if stream is None:
        yield
        return
    previous, mode.order.current = mode.order.current, stream.stream_id
    try:
        yield
    finally:
        mode.order.current = previous


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
        (cuda, "current_stream"): lambda device=None: stream(stream_id=mode.order.current),
        (cuda, "default_stream"): lambda device=None: stream(stream_id=StreamOrder.DEFAULT),
        (cuda, "stream"): lambda chosen=None: _on_stream(mode, chosen),
        (cuda, "set_stream"): lambda chosen: setattr(mode.order, "current", chosen.stream_id),
        (cuda, "CUDAGraph"): lambda keep_graph=False: _Graph(mode),
        (cuda, "graph_pool_handle"): new_pool,
        (cuda, "is_current_stream_capturing"): lambda: mode.capturing is not None,  # as torch.compile asks
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
        mode.uploads.clear()


@contextlib.contextmanager
def host_reads(mode: EmulatedCuda) -> Iterator[None]:
    """Let a test read device values as Python values (its own comparisons)."""
    mode.host_reads_allowed += 1
    try:
        yield
    finally:
        mode.host_reads_allowed -= 1
