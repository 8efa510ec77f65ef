"""The learner update (DDPG by default) against the machine: its FLOP/s and bytes/s beside the device's peaks, and
its kernel launches.

    python benchmarks/update_roofline.py                                   # default preset, the training device
    python benchmarks/update_roofline.py --preset paper --set runtime.device=cuda --set runtime.cuda_graphs=true
    python benchmarks/update_roofline.py --json
    python benchmarks/update_roofline.py --preset paper --set runtime.device=cpu --check-profiler

One batched update of every agent (``UpdatePhase.update``: the buffer's sample, both losses and backward passes, the
per-agent clip, both Adams, Polyak averaging), timed over ``--updates`` calls after the buffer is filled by rollouts
and the first calls are left out; with ``runtime.cuda_graphs`` on CUDA, as the loop runs it (``runtime.graphs``).
The counts below are of one eager call: the same on every device.

* FLOP per update: counted by ``torch.utils.flop_counter`` (matmuls; elementwise work is not counted).
* Kernel launches per update: the operations dispatched that launch work (``launches``): a view or any other change
  of metadata alone launches nothing (the operation's schema says so: ``is_view``, the ``inplace_view`` tag), nor
  does an allocation alone (``ALLOCATE_ONLY``: its schema looks like a kernel's, a fresh result) or a question about
  shapes and types (``result_type``); an in-place operation on a view counts once. A CUDA graph replays them as one
  launch. ``--check-profiler`` counts the same update with ``torch.profiler`` too: on CUDA the kernels the GPU ran
  (a ``_foreach_`` over many tensors or a sort may launch more than one), on the CPU the aten operations it records
  at the level the dispatcher hands them over, not views (a proxy that checks what the dispatch mode sees, not what
  a kernel is).
* Bytes per update, two ways: what it must move at least (parameters, gradients, Adam moments and target networks
  read and written once, the activations saved for backward written and read once, measured with
  ``saved_tensors_hooks``), and what its kernels read and write as launched (``moved_bytes``: every operand read and
  every result written once, as laid out, a broadcast dimension once; an in-place result is its input's memory,
  read first only if the kernel reads it; a gather reads from its source only the rows it writes out, an in-place
  scatter touches its tensor only where its values go; no cache could save more than that).
* Peaks: measured in the same run (a large matmul in the run's precision, a large copy), and the maker's figures
  for known GPUs. An update far below both peaks with many launches is launch-bound.

The counting takes any function of no arguments (``count_kernels``, ``profiler_check``): only ``measure`` knows the
trainer.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from config import override, parse_assignments, preset
from environment.loading import load_market
from run.trainer import Trainer
from runtime.device import resolve_device

SPEC_PEAKS = {
    # name fragment: (dense float32 FLOP/s, dense TF32 FLOP/s, memory bytes/s), the makers' data sheets
    "H100 80GB HBM3": (67e12, 494.7e12, 3.35e12),  # SXM
    "H100 PCIe": (51e12, 378e12, 2.0e12),
    "H100 NVL": (60e12, 417.5e12, 3.9e12),
    "H200": (67e12, 494.7e12, 4.8e12),
    "A100-SXM4-80GB": (19.5e12, 156e12, 2.039e12),
    "A100-SXM4-40GB": (19.5e12, 156e12, 1.555e12),
    "A100-PCIE-40GB": (19.5e12, 156e12, 1.555e12),
    "L4": (30.3e12, 60e12, 0.3e12),
}
"""Published peaks of a few GPUs; a GPU not listed is compared with the measured peaks only."""
aten = torch.ops.aten


ALLOCATE_ONLY = frozenset(
    {
        aten.empty.memory_format,
        aten.empty_strided.default,
        aten.empty_like.default,
        aten.new_empty.default,
        aten.new_empty_strided.default,
        aten.empty_permuted.default,
    }
)
"""Operations that only take memory from the caching allocator: no kernel runs and no byte moves (their schemas say
nothing of it: a fresh result, like any kernel's, so they are named here)."""
DOES_NOT_READ_ITS_DESTINATION = frozenset(
    {
        aten.copy_.default,
        aten.fill_.Scalar,
        aten.fill_.Tensor,
        aten.zero_.default,
        aten.normal_.default,
        aten.uniform_.default,
        aten.random_.default,
        getattr(aten.random_, "from"),
        aten.random_.to,
        aten.bernoulli_.float,
        aten.exponential_.default,
        aten._foreach_zero_.default,
        aten._foreach_copy_.default,
    }
)
"""In-place operations that write their tensor without reading it."""
GATHERS = {
    aten.index.Tensor: "self",
    aten.index_select.default: "self",
    aten.index_select.out: "self",
    aten.gather.default: "self",
    aten.take.default: "self",
    aten.embedding.default: "weight",
}
"""Operations that read from the named argument only the elements they write out."""


def _indexed_elements(named: dict[str, Any]) -> int:
    """Elements ``self[indices]`` has (what ``index_put_`` writes): the indexed dimensions' broadcast index shape,
    a boolean mask counted by its true elements, times the dimensions not indexed."""
    destination, shapes, elements, dim = named["self"], [], 1, 0
    for index in named["indices"]:
        if index is None:
            elements *= destination.shape[dim]
            dim += 1
        elif index.dtype in (torch.bool, torch.uint8):
            shapes.append((int(index.count_nonzero()),))
            dim += index.dim()
        else:
            shapes.append(tuple(index.shape))
            dim += 1
    return elements * math.prod(torch.broadcast_shapes(*shapes)) * math.prod(destination.shape[dim:])


SCATTERS: dict[Any, Callable[[dict[str, Any]], int]] = {
    aten.index_put_.default: _indexed_elements,
    aten._index_put_impl_.default: _indexed_elements,
    aten.index_copy_.default: lambda named: named["source"].numel(),
    aten.index_add_.default: lambda named: named["source"].numel(),
    aten.index_reduce_.default: lambda named: named["source"].numel(),
    aten.index_fill_.int_Scalar: lambda named: (
        named["index"].numel() * named["self"].numel() // named["self"].shape[named["dim"]]
    ),
    aten.index_fill_.int_Tensor: lambda named: (
        named["index"].numel() * named["self"].numel() // named["self"].shape[named["dim"]]
    ),
    aten.scatter_.src: lambda named: named["index"].numel(),
    aten.scatter_.value: lambda named: named["index"].numel(),
    aten.scatter_add_.default: lambda named: named["index"].numel(),
    aten.scatter_reduce_.two: lambda named: named["index"].numel(),
    aten.put_.default: lambda named: named["index"].numel(),
}
"""In-place operations that write into their tensor only where an index says: how many elements (they read those
too when they accumulate)."""
ACCUMULATING = frozenset(
    {aten.index_add_.default, aten.scatter_add_.default, aten.scatter_reduce_.two, aten.index_reduce_.default}
)


READ_BACK = frozenset(
    {aten._local_scalar_dense.default, aten.equal.default, aten.is_nonzero.default, aten.allclose.default}
)
"""Operations that return a Python value read from the tensors: a copy to the host (and a kernel first, for some)."""


def launches(func: Any) -> bool:
    """Whether an operation launches a kernel: not a view or any other change of metadata alone (its schema says so:
    ``is_view``, the ``inplace_view`` tag; ``_unsafe_view``, a view its schema does not mark), not an allocation
    alone (``ALLOCATE_ONLY``), and not a question about shapes or types (no tensor in, out or written, such as
    ``result_type``) unless it reads values back (``READ_BACK``)."""
    metadata = func.is_view or torch.Tag.inplace_view in func.tags or func is aten._unsafe_view.default
    schema = func._schema
    writes = any(argument.alias_info is not None and argument.alias_info.is_write for argument in schema.arguments)
    no_tensor = not writes and not any("Tensor" in str(result.type) for result in schema.returns)
    return not (metadata or func in ALLOCATE_ONLY or (no_tensor and func not in READ_BACK))


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor (or a view) covers: a broadcast dimension (stride 0) reads one."""
    if tensor.numel() == 0:
        return 0
    return tensor.element_size() * math.prod(n for n, stride in zip(tensor.shape, tensor.stride()) if stride != 0)


def _tensors(value: Any) -> list[torch.Tensor]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [t for t in items if isinstance(t, torch.Tensor) and t.device.type != "meta"]


def moved_bytes(func: Any, args: tuple, kwargs: dict, out: Any) -> int:
    """What an operation that launches a kernel must read and write: each tensor argument it reads, each tensor it
    writes (an argument written in place or as ``out=`` is the same memory, written once, and read first only if the
    kernel reads it), and each new result; a gather reads from its source only what it writes out, and an in-place
    scatter touches its tensor only where its values go. Bytes as each operand is laid out (``tensor_bytes``);
    the same operand given twice is read once."""
    schema = func._schema.arguments
    named = {argument.name: value for argument, value in zip(schema, args)} | kwargs
    written = {argument.name for argument in schema if argument.alias_info is not None and argument.alias_info.is_write}
    total, seen = 0, set()
    for argument in schema:
        for tensor in _tensors(named.get(argument.name)):
            key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape, tensor.stride())
            if argument.name in written:
                if func in SCATTERS:
                    size = SCATTERS[func](named) * tensor.element_size()
                    accumulate = func in ACCUMULATING or bool(named.get("accumulate", False))
                    total += size * (2 if accumulate else 1)
                    continue
                reads = argument.name == "self" and func not in DOES_NOT_READ_ITS_DESTINATION
                total += tensor_bytes(tensor) * (2 if reads else 1)
                if reads:
                    seen.add(key)
            elif key not in seen:
                seen.add(key)
                total += tensor_bytes(tensor) if GATHERS.get(func) != argument.name else 0
    if all(result.alias_info is None for result in func._schema.returns):
        written_out = sum(tensor_bytes(t) for t in _tensors(out))
        total += written_out * (2 if func in GATHERS else 1)  # a gather reads what it writes
    elif func in GATHERS:  # out=: written above, read from the source here
        total += sum(tensor_bytes(t) for t in _tensors(named.get("out")))
    return total


class KernelCount(TorchDispatchMode):
    """Kernel launches and the bytes their kernels move, counted by operation as it is dispatched (``launches``,
    ``moved_bytes``): one launch an operation, though a few launch more than one (a ``_foreach_`` over many
    tensors, a sort), which the profiler's count shows (``profiler_check``)."""

    def __init__(self) -> None:
        super().__init__()
        self.operations: Counter[str] = Counter()
        self.bytes = 0

    @property
    def kernels(self) -> int:
        return sum(self.operations.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if launches(func):
            self.operations[str(func)] += 1
            self.bytes += moved_bytes(func, args, kwargs, out)
        return out


def count_kernels(work: Callable[[], object]) -> KernelCount:
    """One call of ``work`` (any function of no arguments), its kernel launches and bytes counted."""
    with KernelCount() as kernels:
        work()
    return kernels


def _is_tensor_op(op: Any) -> bool:
    """Whether ``op`` is a dispatcher operation on tensors (not one of TorchScript's list, string or twin overloads)."""
    schema = op._schema
    if not any("Tensor" in str(item.type) for item in (*schema.arguments, *schema.returns)):
        return False
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CPU")
    except RuntimeError:
        return False
    return True


def _overloads(name: str) -> list[Any]:
    """The tensor operations of the dispatcher an aten name stands for."""
    packet = getattr(aten, name.removeprefix("aten::"), None)
    overloads = [getattr(packet, overload) for overload in packet.overloads()] if packet is not None else []
    return [op for op in overloads if _is_tensor_op(op)]


def _decomposes(op: Any) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "CompositeImplicitAutograd")


def _profiled_operations(event: Any) -> int:
    """The operations under a profiler event that launch work, at the level the dispatcher hands operations to a
    dispatch mode: an aten operation that decomposes (a ``CompositeImplicitAutograd`` one, such as ``linear``) and
    anything else the profiler records (autograd's nodes, Python's) count what they contain; any other aten operation
    counts once, if it launches work (``launches``; the profiler gives a name, without its overload, so a name one of
    whose overloads is a view or an allocation launches nothing), and what it calls inside is its own."""
    overloads = _overloads(event.name) if event.name.startswith("aten::") else []
    if overloads and not (event.cpu_children and any(_decomposes(op) for op in overloads)):
        return int(all(launches(op) for op in overloads))
    return sum(_profiled_operations(child) for child in event.cpu_children)


def profiler_check(work: Callable[[], object], device: torch.device) -> dict[str, Any]:
    """The dispatch mode's kernel count of one call of ``work`` beside the profiler's count of the same call: on
    CUDA the kernels the GPU ran (events of ``DeviceType.CUDA``: kernels, memcpys and memsets), on the CPU the aten
    operations the profiler records that launch work (the lowest ones that are not views or allocations), a proxy."""
    work()  # the first call may allocate state, initialise libraries
    synchronize(device)
    counted = count_kernels(work).kernels
    synchronize(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as profiled:
        work()
        synchronize(device)
    events = profiled.events()
    if device.type == "cuda":
        recorded, kind = sum(e.device_type == DeviceType.CUDA for e in events), "CUDA kernel events"
    else:
        recorded = sum(_profiled_operations(e) for e in events if e.cpu_parent is None)
        kind = "aten operations that launch work (the CPU's proxy)"
    return {"dispatched": counted, "profiled": recorded, "profiled_kind": kind, "ratio": counted / recorded}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(work, device: torch.device, repeats: int, *, warmup: int = 1) -> float:
    """Seconds per call of ``work``, after ``warmup`` calls."""
    for _ in range(warmup):
        work()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    synchronize(device)
    return (time.perf_counter() - start) / repeats


def measured_peaks(device: torch.device, *, size: int) -> dict[str, float]:
    """A large matmul's FLOP/s (in the precision set) and a large copy's bytes/s (read and write) on ``device``."""
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, generator=generator, device=device)
    b = torch.randn(size, size, generator=generator, device=device)
    out = torch.empty_like(a)
    matmul_s = timed(lambda: torch.mm(a, b, out=out), device, repeats=5)
    big = torch.empty(2**26, device=device)  # 256 MB: past any cache
    copy = torch.empty_like(big)
    copy_s = timed(lambda: copy.copy_(big), device, repeats=10)
    return {"matmul_flops_per_s": 2 * size**3 / matmul_s, "copy_bytes_per_s": 2 * big.nbytes / copy_s}


def compulsory_bytes(trainer: Trainer) -> int:
    """Bytes an update must move at least: the trained parameters read twice (forward, backward) and written once by
    Adam, gradients written and read, both Adam moments read and written, the targets it reads read and written by
    Polyak averaging, and the activations saved for backward written and read once."""
    learner = trainer.population.learner
    trained = [learner.actor, *(learner.critics if learner.trains_critic else [])]
    parameters = sum(p.numel() * p.element_size() for m in trained for p in m.parameters())
    read_targets = [target for _, target in learner.trained_pairs()] if learner.reads_targets else []
    targets = sum(p.numel() * p.element_size() for m in read_targets for p in m.parameters())
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainer.update_phase.update()
    return 3 * parameters + 2 * parameters + 4 * parameters + 2 * targets + 2 * saved[0]


def measure(config: Any, *, updates: int, check_profiler: bool = False) -> dict[str, Any]:
    device = resolve_device(config.runtime.device)
    with tempfile.TemporaryDirectory() as folder:
        trainer = Trainer(config, load_market(config, device), Path(folder), log=lambda line: None)
        while len(trainer.buffer) < max(config.learner.learning_starts, config.learner.batch_size):
            trainer.rollouts.run(trainer.rollouts.sample_starts())
        update = trainer.update_phase.update  # one batched update, eager: what is counted
        with FlopCounterMode(display=False) as flops:
            update()
        kernels = count_kernels(update)
        checked = profiler_check(update, device) if check_profiler else None
        compulsory = compulsory_bytes(trainer)
        # The loop's update, as the update phase calls it: graphed with runtime.cuda_graphs on CUDA.
        trainer.update_phase.begin(frozen=torch.zeros(trainer.sharding.share.agents, dtype=torch.bool))
        graphed = trainer.update_phase.graphed[True]
        seconds = timed(
            lambda: trainer.update_phase(0), device, repeats=updates, warmup=graphed.warmup + 2
        )  # past capture
        precision = torch.get_float32_matmul_precision()
        peaks = measured_peaks(device, size=8192 if device.type == "cuda" else 1024)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        spec = next((figures for fragment, figures in SPEC_PEAKS.items() if fragment in name), None)
        result = {
            "device": name,
            "preset_shape": {
                "popsize": config.evolution.popsize,
                "batch_size": config.learner.batch_size,
                "num_assets": trainer.market.num_assets,
                "widths": [config.model.encoder_hidden, config.model.embedding, config.model.head_hidden],
            },
            "cuda_graphs": graphed.enabled,
            "matmul_precision": precision,
            "update_s": seconds,
            "flop_per_update": flops.get_total_flops(),
            "compulsory_bytes_per_update": compulsory,
            "launched_bytes_per_update": kernels.bytes,
            "kernels_per_update": kernels.kernels,
            "profiler_check": checked,
            "measured_peaks": peaks,
            "spec_peaks": None
            if spec is None
            else {"float32_flops_per_s": spec[0], "tf32_flops_per_s": spec[1], "memory_bytes_per_s": spec[2]},
        }
    result["flops_per_s"] = result["flop_per_update"] / seconds
    result["compulsory_bytes_per_s"] = compulsory / seconds
    result["launched_bytes_per_s"] = result["launched_bytes_per_update"] / seconds
    return result


def report(r: dict[str, Any]) -> str:
    shape = r["preset_shape"]
    peaks, spec = r["measured_peaks"], r["spec_peaks"]
    graphs = "on" if r["cuda_graphs"] else "off"
    lines = [
        f"{r['device']} | P={shape['popsize']} B={shape['batch_size']} N={shape['num_assets']} widths "
        f"{shape['widths']} | matmul precision {r['matmul_precision']} | CUDA graphs {graphs}",
        f"update: {r['update_s'] * 1000:.2f} ms, {r['kernels_per_update']} kernels "
        f"({r['update_s'] * 1e6 / r['kernels_per_update']:.1f} us a kernel)",
        f"FLOP: {r['flop_per_update'] / 1e9:.2f} GFLOP an update -> {r['flops_per_s'] / 1e12:.3f} TFLOP/s; "
        f"measured matmul peak {peaks['matmul_flops_per_s'] / 1e12:.2f} TFLOP/s "
        f"({100 * r['flops_per_s'] / peaks['matmul_flops_per_s']:.1f} %)",
        f"bytes: at least {r['compulsory_bytes_per_update'] / 1e9:.3f} GB an update "
        f"({r['compulsory_bytes_per_s'] / 1e9:.1f} GB/s), as launched {r['launched_bytes_per_update'] / 1e9:.3f} GB "
        f"({r['launched_bytes_per_s'] / 1e9:.1f} GB/s); measured copy peak {peaks['copy_bytes_per_s'] / 1e9:.1f} GB/s "
        f"({100 * r['launched_bytes_per_s'] / peaks['copy_bytes_per_s']:.1f} % as launched)",
    ]
    if r["profiler_check"] is not None:
        check = r["profiler_check"]
        lines.append(
            f"profiler: {check['profiled']} {check['profiled_kind']} against {check['dispatched']} kernels "
            f"counted (ratio {check['ratio']:.3f})"
        )
    if spec is not None:
        flop_peak = spec["tf32_flops_per_s"] if r["matmul_precision"] != "highest" else spec["float32_flops_per_s"]
        bandwidth = spec["memory_bytes_per_s"]
        floor_ms = 1000 * max(r["flop_per_update"] / flop_peak, r["compulsory_bytes_per_update"] / bandwidth)
        lines.append(
            f"data sheet: {flop_peak / 1e12:.0f} TFLOP/s ({100 * r['flops_per_s'] / flop_peak:.2f} %), "
            f"{bandwidth / 1e12:.2f} TB/s ({100 * r['launched_bytes_per_s'] / bandwidth:.2f} % as launched); "
            f"at those peaks an update could take {floor_ms:.3f} ms"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--updates", type=int, default=20, help="updates timed (default 20)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--check-profiler",
        action="store_true",
        help="count an update's kernels with torch.profiler too (CUDA kernels on a GPU, aten operations on the CPU)",
    )
    args = parser.parse_args(argv)
    config = override(preset(args.preset), {"runtime.progress": False, **parse_assignments(args.set)})
    result = measure(config, updates=args.updates, check_profiler=args.check_profiler)
    print(json.dumps(result, indent=2) if args.json else report(result))


if __name__ == "__main__":
    main()
