"""What crosses between processes, checked on the CPU without NCCL (tests/sharded_checked.py).

* The champion's decision steers a collective (which rank broadcasts it), so ranks must never take different ones:
  with one rank's edges one ulp off, under a crowning rule that turns on the last bit, the job neither hangs nor
  diverges, and trains the run one process trains.
* Every collective runs on the group its data belongs to: the device group (NCCL on CUDA; here a gloo group of its
  own) for tensors on the training device, the host group (gloo) for host tensors, and nothing else issues any.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from persistence import checkpoint
from tests.run_checks import deterministic, finish, rows, state_digest
from tests.training.test_sharded import launch as sharded_launch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "tests" / "sharded_checked.py")
GENERATIONS = 3
DEVICE_METHODS = {"gather", "broadcast_", "fetch_rows"}
"""Sharding's collectives over tensors on the training device."""
HOST_METHODS = {"any", "leader_choice", "broadcast_bytes", "broadcast_tensors", "gather_to_leader"}
"""Ranks' and Sharding's collectives over host tensors."""


def launch(root: Path, name: str, *, processes: int, env: dict[str, str]) -> subprocess.Popen:
    return sharded_launch(root, name, "--generations", str(GENERATIONS), processes=processes, env=env, script=SCRIPT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The last-bit rule in one process (the reference) and in two, rank 1's edges one ulp off, collectives
    recorded."""
    root = tmp_path_factory.mktemp("checked") / "runs"
    root.mkdir()
    log = root.parent / "collectives"
    log.mkdir()
    finish(launch(root, "one", processes=1, env={}))
    finish(launch(root, "two", processes=2, env={"CHECKED_PERTURB_RANK": "1", "CHECKED_LOG": str(log)}), timeout=600)
    return {"one": root / "one", "two": root / "two", "log": log}


def test_one_rank_one_ulp_off_neither_hangs_nor_diverges(runs):
    assert checkpoint.latest_generation(runs["two"]) == GENERATIONS
    crowned = [row["champion_generation"] for row in rows(runs["one"])]
    assert crowned == list(range(1, GENERATIONS + 1))  # the rule crowns every generation: each is a decision
    assert [deterministic(r) for r in rows(runs["two"])] == [deterministic(r) for r in rows(runs["one"])]
    assert state_digest(runs["two"]) == state_digest(runs["one"])


def test_the_perturbation_flips_the_rule_so_the_test_can_fail():
    """Without the leader's decision the perturbed rank would crown another slot: the rule sees the last bit."""
    import torch

    sys.path.insert(0, str(REPO / "tests"))
    from tests.sharded_checked import last_bit_rule

    edges = torch.tensor([0.1, 0.3, 0.2], dtype=torch.float64)
    flipped = torch.nextafter(edges, torch.full_like(edges, float("inf")))
    assert last_bit_rule(edges) != last_bit_rule(flipped)


def collectives(log: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(log.glob("collectives-*.jsonl")) for line in path.open()]


def test_every_collective_runs_on_the_group_of_its_data(runs):
    calls = collectives(runs["log"])
    assert {path.name for path in runs["log"].iterdir()} == {"collectives-0.jsonl", "collectives-1.jsonl"}
    wrong = [
        call
        for call in calls
        if not (
            (call["caller"] in DEVICE_METHODS and call["group"] == "device")
            or (call["caller"] in HOST_METHODS and call["group"] == "host" and call["devices"] in ([], ["cpu"]))
        )
    ]
    assert not wrong, wrong[:5]
    # The device group's tensors live on the training device (the CPU here; a GPU's on a pod).
    assert {d for call in calls if call["group"] == "device" for d in call["devices"]} == {"cpu"}
    # Every kind of exchange a sharded generation makes was seen, so the check covered them.
    assert {call["caller"] for call in calls} >= {"gather", "broadcast_", "fetch_rows", "any", "leader_choice"}


def test_ranks_issue_the_same_collectives_in_the_same_order(runs):
    """Ranks that disagree on what to exchange next wait on each other until the timeout."""
    by_rank = [
        [(c["op"], c["caller"], c["group"]) for c in map(json.loads, path.open())]
        for path in sorted(runs["log"].glob("collectives-*.jsonl"))
    ]
    assert by_rank[0] == by_rank[1]
