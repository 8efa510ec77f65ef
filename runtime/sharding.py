"""The population sharded over processes with ``torch.distributed``: which slots a process holds, and the
collectives that make W processes train one run.

``torchrun --nproc_per_node=W main.py ...`` starts W processes (ranks). Each holds a contiguous block of
P / W slots, runs its agents' episodes and their batched learner updates; what joins them:

* every transition goes to every rank's replay buffer (one gather per environment step), so the buffer is the same
  everywhere and is checkpointed once;
* every random draw is made population-wide and each rank keeps its rows: a slot's exploration noise, replay
  batches, initial parameters and mutations depend on the seed, the generation and the slot, never on W;
* fitness, validation returns and losses are gathered, and every decision (champion, evolution plan) is computed
  from the same gathered tensors on every rank, with the host streams every rank holds identically; the
  champion's, which rests on float arithmetic that other hardware may round differently, is the leader's
  (``Ranks.leader_choice``), while the evolution plan compares and draws only, so it cannot differ;
* evolution moves only the rows of parents and mates that live on another rank (two all-to-alls: a mate
  sends its actor only, and no actor target moves);
* the leader (rank 0) alone touches storage: it decides the run to start or resume, gathers the population
  into one checkpoint, and uploads; resuming, it reads the checkpoint and broadcasts it, so a run checkpointed
  with one W resumes with any other.

``python main.py`` without torchrun is one rank holding every slot: each method here is then the identity and no
``torch.distributed`` call is made.

Two groups: the host group (gloo) carries host tensors (the stop vote, checkpoints, resume), so a stop vote never
waits on the accelerator; the device group carries tensors on the training device (NCCL on CUDA, the host group
itself on the CPU).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from models.share import Donors, Share
from utils.errors import ConfigError, InputError

if TYPE_CHECKING:
    from models.population import Population

LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
"""What torchrun sets for each process; all of them present means this process was launched by it."""
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # the older name before 2.10


class Ranks:
    """This process's place among the job's processes, and agreement among them on the host.

    ``Ranks()`` is a job of one process; ``Ranks.connect()`` joins the job torchrun launched.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, local_rank: int = 0, timeout_s: float | None = None) -> None:
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.timeout_s = timeout_s

    @staticmethod
    def launched() -> bool:
        """Whether torchrun (or another launcher setting its variables) started this process."""
        return all(name in os.environ for name in LAUNCH_VARIABLES)

    @classmethod
    def connect(cls, *, timeout_s: float) -> Ranks:
        """Join the job: the default process group, gloo, on the variables torchrun set.

        A collective that waits more than ``timeout_s`` seconds for another rank fails, and so ends the job: a node
        lost without a word (pre-empted, cut off) leaves no TCP reset for gloo to see, and torchrun only ends the
        processes of its own node. A node whose ranks would advertise an address the others cannot reach is
        refused first (``check_node_address``).
        """
        if not dist.is_initialized():
            check_node_address()
            dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return cls(dist.get_rank(), dist.get_world_size(), local_rank, timeout_s=timeout_s)

    def set_timeout(self, timeout_s: float) -> None:
        """Make every later collective of the host group wait at most ``timeout_s`` seconds: a resumed run's own
        setting, known only once the leader has read it, after the group was joined."""
        if timeout_s != self.timeout_s and dist.is_initialized():
            dist.distributed_c10d._set_pg_timeout(timedelta(seconds=timeout_s))
        self.timeout_s = timeout_s

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any (a stop asked of one rank stops all of them)."""
        if not self.distributed:
            return flag
        vote = torch.tensor([int(flag)], dtype=torch.int32)
        dist.all_reduce(vote, op=dist.ReduceOp.MAX)
        return bool(vote.item())

    def leader_choice(self, choice: int | None) -> int | None:
        """The leader's ``choice`` (a slot, or None) on every rank.

        A decision that steers a collective (which rank broadcasts, whether one does) must be the same everywhere.
        Every rank computes it from the same gathered numbers, but ranks on different hardware or libraries may
        round them differently, and a one-ulp difference could flip it: then the ranks would issue different
        collectives and hang. So the leader's decision is the one taken.
        """
        if not self.distributed:
            return choice
        value = torch.tensor([-1 if choice is None else choice], dtype=torch.int64)
        dist.broadcast(value, src=0)
        return None if int(value.item()) < 0 else int(value.item())

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """The leader's ``data`` on every rank (others pass None). Bytes, never pickles."""
        if not self.distributed:
            assert data is not None
            return data
        size = torch.tensor([len(data) if self.is_leader else 0], dtype=torch.int64)
        dist.broadcast(size, src=0)
        buffer = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if self.is_leader
            else torch.empty(int(size.item()), dtype=torch.uint8)
        )
        if buffer.numel():
            dist.broadcast(buffer, src=0)
        return data if self.is_leader else buffer.numpy().tobytes()

    def gather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data``, in rank order, on every rank. Bytes, never pickles: the lengths first, then the
        bytes padded to the longest."""
        if not self.distributed:
            return [data]
        length = torch.tensor([len(data)], dtype=torch.int64)
        lengths = [torch.empty_like(length) for _ in range(self.world_size)]
        dist.all_gather(lengths, length)
        sizes = [int(size.item()) for size in lengths]
        longest = max(sizes)
        if not longest:
            return [b""] * self.world_size
        padded = torch.zeros(longest, dtype=torch.uint8)
        if data:
            padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        parts = [torch.empty(longest, dtype=torch.uint8) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return [part[:size].numpy().tobytes() for part, size in zip(parts, sizes)]

    def from_leader(self, decide: Callable[[], dict]) -> dict:
        """``decide()`` on the leader, its JSON-able result on every rank.

        An input error on the leader is raised on every rank with the same message (each exits with status 2);
        any other failure there ends the others with an error that points to the leader's.
        """
        if not self.distributed:
            return decide()
        if not self.is_leader:
            answer = json.loads(self.broadcast_bytes(None))
            if "input_error" in answer:
                raise InputError(answer["input_error"])
            if "failed" in answer:
                raise RuntimeError("rank 0 failed; its error is above")
            return answer["result"]
        try:
            result = decide()
        except InputError as error:
            self.broadcast_bytes(json.dumps({"input_error": str(error)}).encode())
            raise
        except BaseException:
            self.broadcast_bytes(json.dumps({"failed": True}).encode())
            raise
        self.broadcast_bytes(json.dumps({"result": result}).encode())
        return result

    def broadcast_tensors(
        self, groups: dict[str, dict[str, torch.Tensor]] | None
    ) -> dict[str, dict[str, torch.Tensor]]:
        """The leader's host tensors (group -> key -> tensor) on every rank: a layout in JSON, then one broadcast
        per tensor."""
        if not self.distributed:
            assert groups is not None
            return groups
        layout = {
            name: {key: [str(t.dtype).removeprefix("torch."), list(t.shape)] for key, t in group.items()}
            for name, group in (groups or {}).items()
        }
        layout = json.loads(self.broadcast_bytes(json.dumps(layout).encode() if self.is_leader else None))
        shared: dict[str, dict[str, torch.Tensor]] = {}
        for name, entries in layout.items():
            shared[name] = {}
            for key, (dtype, shape) in entries.items():
                if self.is_leader:
                    tensor = groups[name][key].contiguous()
                else:
                    tensor = torch.empty(shape, dtype=getattr(torch, dtype))
                if tensor.numel():
                    dist.broadcast(tensor, src=0)
                shared[name][key] = tensor
        return shared

    def close(self) -> None:
        """Leave the job's process group (nothing to leave for one process, or once left)."""
        if dist.is_initialized():
            dist.destroy_process_group()


def check_node_address(environ: Mapping[str, str] | None = None) -> None:
    """A ConfigError when this process is one of a job over several nodes whose ranks would advertise a loopback
    address to the others.

    Unless ``GLOO_SOCKET_IFNAME`` names an interface, gloo binds the first address this node's hostname resolves to
    (the loopback when it resolves to none). In many containers that is 127.0.0.1, which the other nodes cannot
    reach, and the job would hang while joining until the timeout, with nothing said (the other nodes cannot tell
    it from a slow start). So it is refused here, before joining.
    """
    environ = os.environ if environ is None else environ
    if environ.get("GLOO_SOCKET_IFNAME") or not _several_nodes(environ):
        return
    hostname = socket.gethostname()
    try:
        addresses = [info[4][0] for info in socket.getaddrinfo(hostname, None, type=socket.SOCK_STREAM)]
    except OSError:  # socket.gaierror: gloo falls back to the loopback
        addresses = []
    if addresses and not ipaddress.ip_address(addresses[0].split("%")[0]).is_loopback:
        return
    found = (
        f"resolves to {addresses[0]}, a loopback address"
        if addresses
        else "resolves to no address, so gloo would use the loopback"
    )
    raise ConfigError(
        f"this job spans several nodes but this node's hostname {hostname!r} {found}, which the other nodes "
        "cannot reach: set GLOO_SOCKET_IFNAME (and NCCL_SOCKET_IFNAME on CUDA) to the network interface the nodes "
        "reach each other on (e.g. GLOO_SOCKET_IFNAME=eth0; ip -brief address lists them)"
    )


def _several_nodes(environ: Mapping[str, str]) -> bool:
    """Whether torchrun launched this process as one of a job over several nodes (agents)."""
    try:
        if int(environ.get("GROUP_WORLD_SIZE", "1")) > 1:
            return True
        return "LOCAL_WORLD_SIZE" in environ and int(environ["WORLD_SIZE"]) > int(environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return False


class Sharding:
    """The agents of a population of ``popsize`` that this rank holds (``share``), and the collectives over them.

    Args:
        popsize: P, the whole population.
        ranks: the job's processes; P must be a multiple of their number.
        device: this rank's training device (a CUDA device of its own on a GPU pod).
    """

    def __init__(self, popsize: int, ranks: Ranks | None = None, device: torch.device | str = "cpu") -> None:
        self.ranks = ranks or Ranks()
        world = self.ranks.world_size
        if popsize % world:
            raise ConfigError(
                f"evolution.popsize {popsize} must be a multiple of the number of processes ({world}): "
                "every rank holds the same number of slots"
            )
        self.popsize = popsize
        agents = popsize // world
        self.share = Share(popsize, range(self.ranks.rank * agents, (self.ranks.rank + 1) * agents))
        """The agents this rank holds: the same number on every rank, in rank order."""
        self.device = torch.device(device)
        self._device_group = None
        if self.ranks.distributed and self.device.type == "cuda":
            timeout = None if self.ranks.timeout_s is None else timedelta(seconds=self.ranks.timeout_s)
            self._device_group = dist.new_group(backend="nccl", timeout=timeout)

    @property
    def distributed(self) -> bool:
        return self.ranks.distributed

    @property
    def is_leader(self) -> bool:
        return self.ranks.is_leader

    def owner(self, slot: int) -> int:
        """The rank that holds ``slot``."""
        return slot // self.share.agents

    # ------------------------------------------------------------------ on the training device

    def gather(self, local: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """(P / W, ...) rows of this rank -> (P, ...) on every rank, in slot order."""
        if not self.distributed:
            return local if out is None else out.copy_(local)
        if out is None:
            out = local.new_empty((local.shape[0] * self.ranks.world_size, *local.shape[1:]))
        _ALL_GATHER(out, local.contiguous(), group=self._device_group)
        return out

    def crown(self, population: Population, choice: int | None) -> int | None:
        """The leader's ``choice`` of an agent slot to crown (None: none), agreed by every process and copied into
        every process's champion slot from the process that holds it; returns the slot crowned, or None.

        The leader's, since a choice rests on float arithmetic that other hardware may round differently, and the
        choice steers the broadcast: a one-ulp difference between processes would have them issue different
        collectives and hang (``Ranks.leader_choice``)."""
        choice = self.ranks.leader_choice(choice)
        if choice is not None:
            owner = self.owner(choice)
            if self.ranks.rank == owner:
                population.crown(choice - self.share.slots.start)
            self.broadcast_(list(population.champion.parameters()), src=owner)
        return choice

    def broadcast_(self, tensors: list[torch.Tensor], *, src: int) -> None:
        """Overwrite ``tensors`` on every rank with rank ``src``'s."""
        if not self.distributed:
            return
        for tensor in tensors:
            dist.broadcast(tensor, src=src, group=self._device_group)

    def donors(self, group: list[torch.Tensor], donors: list[torch.Tensor], offspring: torch.Tensor) -> Donors:
        """Where the ``offspring`` slots held here find their ``donors``' rows of ``group`` (one (P,) tensor of donor
        slots per kind of donor: parents, mates): the tensors themselves in one process; with several, the rows held
        here followed by those fetched from other ranks in one all-to-all (``fetch_rows``)."""
        if not self.distributed:
            return Donors.local(group)
        share, agents = self.share, self.share.agents
        blocks = [range(r * agents, (r + 1) * agents) for r in range(self.ranks.world_size)]
        needs = slots_to_fetch(offspring, donors, blocks)
        fetched = self.fetch_rows(group, needs)
        mine = needs[self.ranks.rank]
        row_of = torch.full((self.popsize,), -1, dtype=torch.long)
        share.mine(row_of)[:] = torch.arange(agents)
        row_of[mine] = agents + torch.arange(len(mine))
        tables = [torch.cat([tensor, rows]) for tensor, rows in zip(group, fetched)]
        return Donors(tables, row_of.to(self.device), share)

    def fetch_rows(self, tensors: list[torch.Tensor], needs: list[list[int]]) -> list[torch.Tensor]:
        """Rows held by other ranks, for evolution: ``needs[r]`` are the slots rank r wants from others (ascending,
        none of its own). Returns, for each of ``tensors``, (len(needs[rank]), ...) rows in that order.

        Every rank knows every rank's needs (they come from the one plan), so each sends exactly the rows asked of
        it, packed into one (rows, values per agent) tensor, in one all-to-all.
        """
        rank, world = self.ranks.rank, self.ranks.world_size
        width = sum(t[0].numel() for t in tensors)
        dtype = tensors[0].dtype
        if any(t.dtype != dtype for t in tensors):
            raise TypeError("rows exchanged in one call must share a dtype")
        sends = [[slot - self.share.slots.start for slot in needs[r] if self.owner(slot) == rank] for r in range(world)]
        index = torch.tensor([i for rows in sends for i in rows], dtype=torch.long, device=self.device)
        packed = torch.cat([t[index].flatten(1) for t in tensors], dim=1) if len(index) else None
        send = packed if packed is not None else torch.empty((0, width), dtype=dtype, device=self.device)
        receive_sizes = [sum(self.owner(slot) == q for slot in needs[rank]) for q in range(world)]
        received = torch.empty((len(needs[rank]), width), dtype=dtype, device=self.device)
        dist.all_to_all_single(
            received,
            send,
            output_split_sizes=receive_sizes,
            input_split_sizes=[len(rows) for rows in sends],
            group=self._device_group,
        )
        columns = received.split([t[0].numel() for t in tensors], dim=1)
        return [c.reshape(len(needs[rank]), *t.shape[1:]) for c, t in zip(columns, tensors)]

    # ------------------------------------------------------------------ on the host

    def gather_to_leader(self, local: dict[str, torch.Tensor], full: dict[str, torch.Tensor] | None) -> None:
        """Host rows (P / W, ...) of every rank into the leader's ``full`` (P, ...) tensors (None elsewhere)."""
        for key in sorted(local):
            parts = list(full[key].chunk(self.ranks.world_size)) if self.is_leader else None
            dist.gather(local[key], parts, dst=0)


def slots_to_fetch(offspring: torch.Tensor, donors: list[torch.Tensor], blocks: list[range]) -> list[list[int]]:
    """For each process's block of slots, the slots outside it that its ``offspring`` descend from (ascending): the
    slot each of ``donors`` (one (P,) tensor of donor slots per kind of donor) names for them."""
    children = offspring.tolist()
    donors_of = [donor.tolist() for donor in donors]
    needs = []
    for block in blocks:
        wanted = {donor[s] for donor in donors_of for s in children if s in block}
        needs.append(sorted(d for d in wanted if d not in block))
    return needs
