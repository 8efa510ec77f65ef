"""``main.py`` under checks of what crosses between processes (tests/runtime/test_collectives.py).

Run by the tests, directly or under ``torchrun``:

* every process crowns by a rule that turns on the last bit of the best edge (the argmax when it is even, the
  argmin when odd): a decision as fragile as a champion's can be when ranks round differently;
* with ``$CHECKED_PERTURB_RANK`` set, that rank's edges are one ulp larger than the others' (what another GPU
  model, driver or library could make of the same numbers), which flips its answer under that rule;
* with ``$CHECKED_LOG`` a folder, the device group is a gloo group of its own (as NCCL's would be on CUDA) and
  every collective is recorded in ``collectives-<RANK>.jsonl``: the operation, the method of
  ``runtime.sharding`` that issued it, the group it ran on (``device`` or ``host``) and its tensors' devices.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def last_bit_rule(edges, *_, **__) -> int:
    best = float(edges.max())
    odd = struct.unpack("<q", struct.pack("<d", best))[0] & 1
    return int(edges.argmin()) if odd else int(edges.argmax())


def perturb(edge_bounds):
    import torch

    def one_ulp_larger(*args, **kwargs):
        edges = edge_bounds(*args, **kwargs)
        return torch.nextafter(edges, torch.full_like(edges, float("inf")))

    return one_ulp_larger


def record_collectives(log: Path, rank: str) -> None:
    import inspect

    import torch
    import torch.distributed as dist

    from runtime import sharding

    init = sharding.Sharding.__init__

    def with_a_device_group(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self.distributed and self._device_group is None:  # on CUDA it is NCCL's; here a gloo group of its own
            self._device_group = dist.new_group(backend="gloo")
        sharding_groups.append(self._device_group)

    sharding_groups: list = []
    sharding.Sharding.__init__ = with_a_device_group
    source = str(Path(sharding.__file__).resolve())

    def tensors_of(args, kwargs) -> list:
        found = []
        for value in [*args, *kwargs.values()]:
            if isinstance(value, torch.Tensor):
                found.append(value)
            elif isinstance(value, (list, tuple)):
                found.extend(v for v in value if isinstance(v, torch.Tensor))
        return found

    def recorded(name, collective):
        def call(*args, **kwargs):
            caller = next(
                (f.function for f in inspect.stack()[1:] if str(Path(f.filename).resolve()) == source),
                "(outside runtime.sharding)",
            )
            group = kwargs.get("group")
            where = "device" if group is not None and any(group is g for g in sharding_groups) else "host"
            entry = {
                "op": name,
                "caller": caller,
                "group": where,
                "devices": sorted({str(t.device) for t in tensors_of(args, kwargs)}),
            }
            with open(log / f"collectives-{rank}.jsonl", "a") as f:
                f.write(json.dumps(entry) + "\n")
            return collective(*args, **kwargs)

        return call

    for name in ("all_reduce", "broadcast", "gather", "all_to_all_single", "all_gather_into_tensor", "barrier"):
        setattr(dist, name, recorded(name, getattr(dist, name)))
    sharding._ALL_GATHER = recorded("all_gather", sharding._ALL_GATHER)


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    import main
    from training import loop

    rank = os.environ.get("RANK", "0")
    loop.choose_champion = last_bit_rule
    if os.environ.get("CHECKED_PERTURB_RANK") == rank:
        loop.edge_bounds = perturb(loop.edge_bounds)
    if os.environ.get("CHECKED_LOG"):
        record_collectives(Path(os.environ["CHECKED_LOG"]), rank)
    main.exit_process(main.main(sys.argv[1:]))
