"""The population sharded over processes (torchrun, gloo on the CPU) trains the run one process trains: the same
evolution decisions, champion, metrics rows and parameters bit for bit, on one node or two; checkpoints of either
resume with the other; a killed or stopped rank leaves the last checkpoint intact, and a lost node ends the others
within the collective timeout; a node whose ranks would advertise a loopback address to the others is refused."""

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import config as config_module
from models.population import Population
from models.replay import ReplayBuffer
from models.share import Share
from persistence import checkpoint
from persistence.run_folder.opening import RESUMABLE_CHANGES
from runtime.sharding import Ranks, Sharding, check_node_address, slots_to_fetch
from tests import hold_points, loopback_only
from tests.gcs_server import emulator_binary
from tests.run_checks import deterministic, finish, rows, state_digest, wait_for
from tests.synthetic import make_market, make_population
from training.evolution import plan_generation
from utils.errors import ConfigError

pytestmark = pytest.mark.slow  # each test runs torchrun with several processes

REPO = Path(__file__).resolve().parents[2]
SCRIPT = str(REPO / "tests" / "sharded_main.py")
GENERATIONS = 4
OUR_FRAME = re.compile(rf'File "{re.escape(str(REPO))}/(?!\.?venv)')
"""A traceback line in the project's own code (torchrun's report of a failed or stopped job is not one)."""
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
"""One thread a process (the runs are then equal bit for bit whatever W), gloo on the loopback."""
TRAIN = ["--preset", "smoke", "--seed", "1", "--no-progress", "--device", "cpu"]


def namespaced(command: list[str]) -> list[str]:
    """``command`` in a network namespace of its own (tests/loopback_only.py), or a skip where none can be made."""
    if not loopback_only.available():
        pytest.skip("no network namespace can be made here (unshare --net); torchrun's stores listen everywhere")
    return loopback_only.command(command)


def launch(
    root: Path,
    name: str,
    *extra: str,
    processes: int,
    env: dict[str, str] | None = None,
    script: str = SCRIPT,
) -> subprocess.Popen:
    """One process with plain python (no torchrun), or ``processes`` under torchrun, in a network namespace of its
    own (only loopback there), running ``script`` (a ``main.py`` with the tests' hooks)."""
    if processes == 1:
        command = [sys.executable, script]
    else:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
        command = namespaced([*torchrun, script])
    return subprocess.Popen(
        [*command, *TRAIN, "--checkpoint-uri", str(root), "--run-name", name, *extra],
        cwd=root.parent,
        env={**ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """GENERATIONS generations in one process, without torchrun."""
    root = tmp_path_factory.mktemp("reference") / "runs"
    root.mkdir()
    finish(launch(root, "ref", "--generations", str(GENERATIONS), processes=1))
    return root / "ref"


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert checkpoint.latest_generation(run_dir) == GENERATIONS
    assert [deterministic(r) for r in rows(run_dir)] == [deterministic(r) for r in rows(reference)]
    assert state_digest(run_dir) == state_digest(reference)


def test_two_processes_train_the_run_one_process_trains(tmp_path, reference):
    root, log = tmp_path / "runs", tmp_path / "log"
    log.mkdir()
    env = {"SHARDED_LOG": str(log)}
    output = finish(launch(root, "r", "--generations", str(GENERATIONS), "--tensorboard", processes=2, env=env))
    assert "x 2 processes (torch.distributed)" in output
    assert output.count(f"gen    {GENERATIONS}/{GENERATIONS}") == 1  # one process speaks
    assert len(list((root / "r" / "tensorboard").glob("events.out.tfevents.*"))) == 1  # and logs
    assert_same_run(root / "r", reference)
    # What the equality covers: offspring whose donors lived on the other rank, and champions crowned on each rank
    # and broadcast from there.
    for rank in (0, 1):
        fetched = [int(n) for n in (log / f"fetched-{rank}").read_text().split()]
        assert len(fetched) == 2 * GENERATIONS and sum(fetched) > 0  # parents' tensors, then actors with mates'
        assert all(parents <= actors for parents, actors in zip(fetched[::2], fetched[1::2]))
    sources = {int(src) for src in (log / "champion-0").read_text().split()}
    assert sources == {0, 1}


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_checkpoint_of_one_process_count_resumes_with_another(tmp_path, reference, before, after):
    root = tmp_path / "runs"
    finish(launch(root, "r", "--generations", "2", processes=before))
    output = finish(launch(root, "r", "--resume", "--generations", str(GENERATIONS), processes=after))
    assert "resumed" in output and "at generation 2" in output
    assert_same_run(root / "r", reference)


def test_one_rank_uploads_and_a_new_pod_resumes_from_the_bucket(tmp_path, reference):
    if emulator_binary() is None:
        pytest.skip("fake-gcs-server has no bundled binary for this platform")
    script = [sys.executable, str(REPO / "tests" / "sharded_pod.py"), str(tmp_path), str(GENERATIONS), *TRAIN]
    done = subprocess.run(namespaced(script), cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (tmp_path / "pod-1").exists()
    assert_same_run(tmp_path / "pod-2" / "r", reference)


def _pid(pids: Path, rank: int) -> int:
    wait_for(lambda: (pids / f"rank-{rank}.pid").exists())
    return int((pids / f"rank-{rank}.pid").read_text())


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_a_rank_killed_mid_generation_leaves_no_partial_generation_and_the_run_resumes(tmp_path, reference):
    root, pids, marks = tmp_path / "runs", tmp_path / "pids", tmp_path / "marks"
    pids.mkdir()
    # Every rank held in generation 3, its updates about to run (tests/hold_points.py), generation 2 written.
    env = {"SHARDED_PIDS": str(pids), **hold_points.environment(marks, "updating@3")}
    process = launch(root, "r", "--generations", str(GENERATIONS), processes=2, env=env)
    run_dir = root / "r"
    hold_points.wait_until_held(process, marks, ["r", "r-rank-1"])
    wait_for(lambda: checkpoint.latest_generation(run_dir) == 2)
    os.kill(_pid(pids, 1), signal.SIGKILL)
    hold_points.release(marks, ["r"])  # on into the generation's collectives, without its peer
    output, _ = process.communicate(timeout=120)
    assert process.returncode != 0, output
    wait_for(lambda: _gone(_pid(pids, 0)), timeout=60)
    folders = [generation for generation, _ in checkpoint.generation_folders(run_dir)]
    assert folders and checkpoint.complete_generations(run_dir) == sorted(folders)  # nothing partial to load
    assert checkpoint.latest_generation(run_dir) == 2
    for generation in folders:
        assert checkpoint.verify_generation(run_dir / checkpoint.generation_dirname(generation)) == []
    finish(launch(root, "r", "--resume", "--generations", str(GENERATIONS), processes=2))
    assert_same_run(run_dir, reference)


@pytest.mark.parametrize(
    ("target", "said"),
    [("rank 1", "a signal to another process"), ("torchrun", "SIGTERM")],  # torchrun passes it to every rank
)
def test_sigterm_stops_every_rank_at_a_safe_point(tmp_path, reference, target, said):
    root, pids, marks = tmp_path / "runs", tmp_path / "pids", tmp_path / "marks"
    pids.mkdir()
    # Every rank held at the start of generation 2 (tests/hold_points.py) until the stop reached the ranks signalled.
    env = {"SHARDED_PIDS": str(pids), **hold_points.environment(marks, "start@2")}
    process = launch(root, "r", "--generations", str(GENERATIONS), processes=2, env=env)
    run_dir = root / "r"
    ranks = ["r", "r-rank-1"]
    hold_points.wait_until_held(process, marks, ranks)
    os.kill(_pid(pids, 1) if target == "rank 1" else process.pid, signal.SIGTERM)
    hold_points.wait_until_stop_seen(process, marks, ranks[1:] if target == "rank 1" else ranks)
    hold_points.release(marks, ranks)
    output, _ = process.communicate(timeout=120)
    assert not OUR_FRAME.search(output), output  # no traceback through the project's code (torchrun reports the stop)
    stopped_at = checkpoint.latest_generation(run_dir)
    assert stopped_at == 1  # every rank at the first safe point after the stop: generation 2 abandoned
    assert f"stopped by {said} after generation {stopped_at}" in output
    assert checkpoint.verify_generation(run_dir / checkpoint.generation_dirname(stopped_at)) == []
    assert _gone(_pid(pids, 0)) and _gone(_pid(pids, 1))
    finish(launch(root, "r", "--resume", "--generations", str(GENERATIONS), processes=1))
    assert_same_run(run_dir, reference)


def test_a_population_that_does_not_split_evenly_is_refused_before_anything_is_written(tmp_path):
    root = tmp_path / "runs"
    process = launch(root, "r", "--population", "3", processes=2)
    output, _ = process.communicate(timeout=300)
    assert process.returncode != 0
    assert "error: evolution.popsize 3 must be a multiple of the number of processes (2)" in output
    assert not OUR_FRAME.search(output), output
    assert not (root / "r").exists()


def test_nothing_to_resume_is_one_line_from_every_rank(tmp_path):
    root = tmp_path / "runs"
    root.mkdir()
    process = launch(root, "missing", "--resume", processes=2)
    output, _ = process.communicate(timeout=300)
    assert process.returncode != 0
    assert output.count("error: no run named 'missing' under") == 2, output
    assert not OUR_FRAME.search(output), output
    assert list(root.iterdir()) == []


# ----------------------------------------------------------------------------- two nodes on one machine


@contextlib.contextmanager
def two_nodes(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[list[subprocess.Popen]]:
    """A job over two nodes of one process each: two torchrun launchers, separate process groups meeting at a c10d
    rendezvous, in one network namespace of their own. The first hosts the rendezvous store. Each writes its output
    to ``tmp_path/node-N.log`` and its rank's process id to ``tmp_path/pids-N``, with ``env`` added to its
    environment; everything is killed on the way out."""
    if not loopback_only.joinable():
        pytest.skip("no network namespace can be made and joined here (unshare --net, nsenter)")
    nodes: list[subprocess.Popen] = []
    with loopback_only.shared() as enter:
        try:
            for node in (0, 1):
                (tmp_path / f"pids-{node}").mkdir()
                torchrun = [
                    *(sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=1"),
                    *("--rdzv_backend=c10d", "--rdzv_endpoint=127.0.0.1:29400", "--rdzv_id=two-nodes"),
                    f"--rdzv_conf=is_host={int(node == 0)}",
                ]
                with open(tmp_path / f"node-{node}.log", "w") as log:
                    nodes.append(
                        subprocess.Popen(
                            enter([*torchrun, SCRIPT, *TRAIN, "--checkpoint-uri", str(tmp_path / "runs"), *extra]),
                            cwd=tmp_path,
                            env={**ENV, **(env or {}), "SHARDED_PIDS": str(tmp_path / f"pids-{node}")},
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            start_new_session=True,  # a node's launcher and its own, not the test's
                        )
                    )
            yield nodes
        finally:
            for node, launcher in enumerate(nodes):
                for group in (launcher.pid, *_node_ranks(tmp_path, node)):  # each rank has a session of its own
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(group, signal.SIGKILL)
                launcher.wait()


def _node_ranks(tmp_path: Path, node: int) -> list[int]:
    """The process ids of the ranks a node of ``two_nodes`` started so far."""
    return [int(path.read_text()) for path in (tmp_path / f"pids-{node}").glob("rank-*.pid")]


def test_two_nodes_train_the_run_one_process_trains(tmp_path, reference):
    with two_nodes(tmp_path, "--run-name", "r", "--generations", str(GENERATIONS)) as nodes:
        codes = [launcher.wait(timeout=300) for launcher in nodes]
    output = "".join((tmp_path / f"node-{node}.log").read_text() for node in (0, 1))
    assert codes == [0, 0], output
    assert "x 2 processes (torch.distributed)" in output
    assert_same_run(tmp_path / "runs" / "r", reference)


NODE_TIMEOUT_S = 10


@pytest.mark.parametrize(
    "strike",
    [signal.SIGKILL, signal.SIGSTOP],  # lost with a TCP reset for the survivor, or without (frozen, cut off)
    ids=["killed", "frozen"],
)
def test_a_lost_node_ends_the_other_within_the_collective_timeout(tmp_path, strike):
    timeout = ["--set", f"runtime.collective_timeout_s={NODE_TIMEOUT_S}"]
    # Both ranks held at the start of generation 2 (tests/hold_points.py): the survivor goes on once the other node
    # is struck, into the generation's collectives.
    marks = tmp_path / "marks"
    hold = hold_points.environment(marks, "start@2")
    with two_nodes(tmp_path, "--run-name", "r", "--generations", str(GENERATIONS), *timeout, env=hold) as nodes:
        survivor, lost = nodes
        run_dir = tmp_path / "runs" / "r"
        hold_points.wait_until_held(survivor, marks, ["r", "r-rank-1"])
        wait_for(lambda: checkpoint.latest_generation(run_dir) == 1)
        wait_for(lambda: len(_node_ranks(tmp_path, 0)) == len(_node_ranks(tmp_path, 1)) == 1)
        assert survivor.poll() is None and lost.poll() is None
        struck = time.monotonic()
        # The whole node that does not host the rendezvous store: its launcher and its rank.
        for group in (lost.pid, *_node_ranks(tmp_path, 1)):
            os.killpg(group, strike)
        hold_points.release(marks, ["r"])
        code = survivor.wait(timeout=NODE_TIMEOUT_S + 60)
        ended = time.monotonic() - struck
        output = (tmp_path / "node-0.log").read_text()
        assert code != 0, output
        assert ended < NODE_TIMEOUT_S + 30, output  # the collective's timeout at most, then torchrun's teardown
        assert all(_gone(pid) for pid in _node_ranks(tmp_path, 0))
    folders = [generation for generation, _ in checkpoint.generation_folders(run_dir)]
    assert folders and checkpoint.complete_generations(run_dir) == sorted(folders)  # nothing partial to load
    for generation in folders:
        assert checkpoint.verify_generation(run_dir / checkpoint.generation_dirname(generation)) == []


# ----------------------------------------------------------------------------- in one process


def test_sharding_splits_slots_into_equal_blocks_and_refuses_a_remainder():
    shards = [Sharding(8, Ranks(rank, 4)) for rank in range(4)]
    assert [s.share.slots for s in shards] == [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    assert [shards[0].owner(slot) for slot in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ConfigError, match="multiple of the number of processes"):
        Sharding(6, Ranks(0, 4))


def _population(slots: range | None = None) -> Population:
    return make_population(6, 12, seed=3, width=8, slots=slots)


def test_a_shard_of_the_population_starts_as_the_same_slots_of_the_whole():
    whole = _population().state_tensors()
    shard = _population(range(2, 4))
    for key, tensor in shard.state_tensors().items():
        expected = whole[key] if key.startswith("champion.") else whole[key][2:4]
        assert torch.equal(tensor, expected), key
    # and loads a whole population's checkpoint by taking its rows
    changed = {key: tensor + 1 for key, tensor in whole.items()}
    shard.load_state_tensors(changed)
    assert torch.equal(shard.actor.encoder.mlp.layers[0].weight, changed["actor.encoder.mlp.layers.0.weight"][2:4])


def test_an_agents_replay_batches_do_not_depend_on_the_split():
    market = make_market()

    def ring(rows: range | None) -> ReplayBuffer:
        buffer = ReplayBuffer(
            64,
            market,
            lookback=2,
            execution_delay=1,
            sample_shape=(6, 5),
            share=None if rows is None else Share(6, rows),
        )
        days = torch.arange(10, 50, dtype=torch.int32)
        weights = torch.full((40, market.num_assets + 1), 0.2)
        buffer.add(
            days=days,
            weights=weights,
            actions=weights,
            rewards=days.float(),
            next_weights=weights,
            terminated=False,
            truncated=False,
        )
        return buffer

    whole = ring(None).sample(torch.Generator().manual_seed(1))
    part = ring(range(4, 6)).sample(torch.Generator().manual_seed(1))
    assert torch.equal(part.rewards, whole.rewards[4:6])
    assert torch.equal(part.obs.windows, whole.obs.windows[4:6])


def test_each_block_fetches_exactly_the_donors_it_lacks():
    fitness = torch.tensor([0.5, -1.0, 2.0, 0.1, -0.3, 1.5, 0.7, -2.0])
    blocks = [range(0, 4), range(4, 8)]
    mate_only = 0
    for seed in range(10):
        plan = plan_generation(
            fitness,
            elites=2,
            tournament_size=3,
            crossover_prob=0.5,
            mutation_prob=0.5,
            generator=torch.Generator().manual_seed(seed),
        )
        needs = slots_to_fetch(plan.offspring, [plan.parents, plan.mates], blocks)
        parent_needs = slots_to_fetch(plan.offspring, [plan.parents], blocks)
        for block, need, parent_need in zip(blocks, needs, parent_needs):
            offspring = [s for s in plan.offspring.tolist() if s in block]
            parents = {int(plan.parents[s]) for s in offspring}
            assert need == sorted((parents | {int(plan.mates[s]) for s in offspring}) - set(block))
            assert parent_need == sorted(parents - set(block))
        mate_only += needs != parent_needs
    assert mate_only > 0  # some plans fetch a mate's actor alone


@pytest.mark.parametrize("command", ["inspect", "evaluate", "export"])
def test_the_one_process_commands_refuse_several_processes(monkeypatch, capsys, command):
    import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main.main([command, "runs/r"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: {command} runs in one process: start it with python, not torchrun"
    )


SEVERAL_NODES = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_WORLD_SIZE": "2"}
"""What torchrun sets in the process of a job over two nodes of one process each."""


def _hostname_resolves_to(monkeypatch, *addresses: str) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "node-7")

    def getaddrinfo(host, port, *args, **kwargs):
        assert host == "node-7"
        if not addresses:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0)) for a in addresses]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize(
    ("environ", "addresses"),
    [
        (SEVERAL_NODES, ("127.0.0.1",)),
        (SEVERAL_NODES, ("127.0.1.1", "10.0.0.5")),  # gloo binds the first
        (SEVERAL_NODES, ("::1",)),
        (SEVERAL_NODES, ()),  # gloo falls back to the loopback
        ({k: v for k, v in SEVERAL_NODES.items() if k != "GROUP_WORLD_SIZE"}, ("127.0.0.1",)),
        ({**SEVERAL_NODES, "GLOO_SOCKET_IFNAME": ""}, ("127.0.0.1",)),
    ],
)
def test_a_node_that_would_advertise_a_loopback_address_is_refused_before_joining(monkeypatch, environ, addresses):
    _hostname_resolves_to(monkeypatch, *addresses)
    with pytest.raises(ConfigError) as refused:
        check_node_address(environ)
    message = str(refused.value)
    assert "node-7" in message and "GLOO_SOCKET_IFNAME" in message and "NCCL_SOCKET_IFNAME" in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("environ", "addresses"),
    [
        ({**SEVERAL_NODES, "GLOO_SOCKET_IFNAME": "eth0"}, ("127.0.0.1",)),  # gloo binds the interface named
        (SEVERAL_NODES, ("10.0.0.5", "127.0.0.1")),
        ({**SEVERAL_NODES, "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "1"}, ("127.0.0.1",)),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, ("127.0.0.1",)),  # another launcher: nodes unknown
    ],
)
def test_one_node_or_a_reachable_address_joins(monkeypatch, environ, addresses):
    _hostname_resolves_to(monkeypatch, *addresses)
    check_node_address(environ)


def test_the_refusal_is_one_line_and_status_2_before_anything_is_written(monkeypatch, capsys, tmp_path):
    import main

    for key, value in {**SEVERAL_NODES, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    _hostname_resolves_to(monkeypatch, "127.0.0.1")
    # A short timeout, should the refusal fail and the process try to join.
    argv = [*TRAIN, "--checkpoint-uri", str(tmp_path / "runs"), "--set", "runtime.collective_timeout_s=2"]
    assert main.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: this job spans several nodes") and err.count("\n") == 1, err
    assert not dist.is_initialized()
    assert not (tmp_path / "runs").exists()


def test_a_resumed_runs_collective_timeout_replaces_the_one_the_group_was_joined_with(monkeypatch, tmp_path):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")  # listen on the loopback only
    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1, timeout=timedelta(seconds=300))
    try:
        ranks = Ranks(0, 1, timeout_s=300.0)
        ranks.set_timeout(15.0)
        assert ranks.timeout_s == 15.0
        host_group = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        assert host_group.options._timeout == timedelta(seconds=15)
    finally:
        dist.destroy_process_group()
    assert "runtime.collective_timeout_s" in RESUMABLE_CHANGES
    for wrong in ("0.5", "86401"):
        with pytest.raises(ConfigError, match=r"runtime.collective_timeout_s must be in \[1, 86400\]"):
            config_module.override(config_module.preset("smoke"), {"runtime.collective_timeout_s": wrong})
