"""The shared replay buffer: transitions as days and portfolio state, never observation windows.

A transition is its decision day ``t``, the weights before and after the step, the action, the
reward and the two end flags: ``8 + 12 * (N + 1)`` bytes or so, whatever the lookback length, the
number of features or the execution delay. Observations are rebuilt at sample time: the window ending
at ``t`` and, for the next observation, the one ending at ``t + 1``; what the market did from the
decision's fill on (its relatives, which assets traded) is read from the market by day too.

All storage is allocated in the constructor, including the sample buffers; a sampled batch's
windows live in those buffers until the next ``sample`` call overwrites them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from environment.kernel import Fill
from environment.market import Market
from environment.observation import Observation, WindowGatherer
from environment.vector_env import orders_seen_as_sent
from models.share import Share


class ReplayState(NamedTuple):
    """A replay buffer's contents as one value (``ReplayBuffer.state``; a checkpoint's segments of it:
    ``persistence.generation_contents.buffer_groups``)."""

    storage: dict[str, torch.Tensor]
    """Each stored tensor, at least its first ``size`` rows: the live tensors at full capacity, a staged copy of them,
    or the filled part read from a checkpoint."""
    pos: int
    """Where the next transition goes."""
    size: int
    """Transitions held."""


class ReplayBatch(NamedTuple):
    obs: Observation
    """The observations: windows (P, B, N, L * K), weights (P, B, N + 1)."""
    actions: torch.Tensor
    """(P, B, N + 1) target weights taken."""
    rewards: torch.Tensor
    """(P, B) rewards."""
    next_obs: Observation | None
    """The next observations: windows (P, B, N, L * K), weights (P, B, N + 1); None from a buffer built for a learner
    that never reads them (``next_obs=False``)."""
    terminated: torch.Tensor
    """(P, B) float, 1 where the episode ended for good (no bootstrap)."""
    truncated: torch.Tensor
    """(P, B) float, 1 where the window ended (bootstrap through it)."""
    fill: Fill
    """What each transition's decision met at its fill, each tensor (P, B, ...): the market is exogenous, so the reward
    of any other action follows from it (``environment.kernel.trade``)."""
    held: torch.Tensor | None = None
    """(P, B, N + 1) the previous order as it filled, which the trade started from, where the decision saw it as sent
    (``environment.vector_env.orders_seen_as_sent``); None where that is ``obs.weights`` itself."""


def storage_tensors(
    capacity: int, num_assets: int, *, held: bool, device: torch.device | str
) -> dict[str, torch.Tensor]:
    """A buffer's transition storage, zeroed: int32 days, the weight vectors before and after, the action (and with
    ``held`` the previous order as it filled), the reward and the two flags."""
    n1 = num_assets + 1
    return {
        "days": torch.zeros(capacity, dtype=torch.int32, device=device),
        "weights": torch.zeros(capacity, n1, device=device),
        "actions": torch.zeros(capacity, n1, device=device),
        "rewards": torch.zeros(capacity, device=device),
        "next_weights": torch.zeros(capacity, n1, device=device),
        **({"held": torch.zeros(capacity, n1, device=device)} if held else {}),
        "terminated": torch.zeros(capacity, dtype=torch.bool, device=device),
        "truncated": torch.zeros(capacity, dtype=torch.bool, device=device),
    }


class ReplayBuffer:
    """A ring of ``capacity`` transitions shared by the population, replayed under the conventions of the environment
    that traded them (``environment.vector_env``): the same market and windows, fill delay and holding days, and so
    the same rule for whether a decision saw its previous order as sent (``orders_seen_as_sent``), in which case each
    transition also keeps that order as it filled, the trade's true start.

    Args:
        capacity: transitions held; the oldest are overwritten.
        market: the market the transitions were traded in (read, never written): its features, relatives and
            tradable assets. The storage lives on its device.
        lookback: days of features in a window (``env.lookback``): windows are rebuilt from the market at sample time.
        execution_delay: days from a decision to its fill (``env.execution_delay``).
        held_days: the days a decision's target is held (``env.rebalance_every``): the model objective's fill of a
            sampled decision spans them.
        sample_shape: (P, B), agents and transitions per agent of every ``sample``.
        share: the agents of the P whose batches are trained here (``models.share``; all by default): every
            ``sample`` draws for all P and keeps their rows, so an agent's batches do not depend on the split.
        next_obs: rebuild the next observations at sample time; False for a learner that reads none (at ``gamma``
            0 the next day's value is multiplied by zero): its batches are gathered without them.
    """

    def __init__(
        self,
        capacity: int,
        market: Market,
        *,
        lookback: int,
        execution_delay: int,
        held_days: int = 1,
        sample_shape: tuple[int, int],
        share: Share | None = None,
        next_obs: bool = True,
    ) -> None:
        self.capacity, self.sample_shape = capacity, sample_shape
        self.share = share or Share.whole(sample_shape[0])
        self.gathers_next_obs = next_obs
        self.market, self.execution_delay, self.held_days = market, execution_delay, held_days
        self.gatherer = WindowGatherer(market.features, lookback, market.tradable)
        self.pos = 0  # the host's count of where the next transition goes (``commit``)
        self.size = 0
        device = market.device
        held = orders_seen_as_sent(market, execution_delay, held_days)
        self.storage = storage_tensors(capacity, market.num_assets, held=held, device=device)
        self._write_pos = torch.zeros((), dtype=torch.long, device=device)  # ``pos``, where ``write`` reads it
        self._windows = self.gatherer.empty(self.share.agents, sample_shape[1], device=device)
        self._next_windows = self.gatherer.empty(self.share.agents, sample_shape[1], device=device)

    def __len__(self) -> int:
        return self.size

    @property
    def nbytes(self) -> int:
        """Bytes of transition storage (sample buffers excluded)."""
        return sum(t.numel() * t.element_size() for t in self.storage.values())

    @property
    def bytes_per_transition(self) -> int:
        return self.nbytes // self.capacity

    def add(self, **transition: torch.Tensor | bool) -> None:
        """Append a batch of transitions (``write``'s arguments): ``write`` then ``commit``."""
        self.commit(self.write(**transition))

    @torch.no_grad()
    def write(
        self,
        *,
        days: torch.Tensor,
        weights: torch.Tensor,
        actions: torch.Tensor,
        rewards: torch.Tensor,
        next_weights: torch.Tensor,
        terminated: torch.Tensor | bool,
        truncated: torch.Tensor | bool,
        held: torch.Tensor | None = None,
    ) -> int:
        """Write a batch of transitions at the buffer's position, on the device alone (the position advances there),
        so a captured day replays it; returns their count, which ``commit`` must be given before the next ``sample``.
        ``days`` (E,) broadcast over the agents; a flag may be a Python bool or a 0-dim tensor."""
        values = {
            "days": days,
            "weights": weights,
            "actions": actions,
            "rewards": rewards,
            "next_weights": next_weights,
            **({"held": held} if "held" in self.storage else {}),
            "terminated": terminated,
            "truncated": truncated,
        }
        leading = rewards.shape
        count = rewards.numel()
        flat: dict[str, torch.Tensor] = {}
        flags: dict[str, bool] = {}
        for key, value in values.items():
            target = self.storage[key]
            if isinstance(value, bool):  # filled in place: a tensor made from it would be a host-to-device copy
                flags[key] = value
                continue
            value = torch.as_tensor(value, dtype=target.dtype, device=target.device)
            value = torch.broadcast_to(value, (*leading, *target.shape[1:]))
            flat[key] = value.reshape(count, *target.shape[1:])
        offset = 0
        if count > self.capacity:  # only the newest `capacity` survive a single oversized add
            flat = {k: v[-self.capacity :] for k, v in flat.items()}
            offset = count - self.capacity
        written = min(count, self.capacity)
        index = (
            torch.arange(offset, offset + written, device=self._write_pos.device) + self._write_pos
        ) % self.capacity
        for key, value in flat.items():
            self.storage[key].index_copy_(0, index, value)
        for key, flag in flags.items():
            self.storage[key].index_fill_(0, index, flag)
        self._write_pos.add_(count).remainder_(self.capacity)
        return count

    def commit(self, count: int) -> None:
        """The host's account of ``count`` transitions ``write`` put in the buffer: its position and size."""
        self.pos = (self.pos + count) % self.capacity
        self.size = min(self.size + count, self.capacity)

    @torch.no_grad()
    def sample(self, generator: torch.Generator) -> ReplayBatch:
        """Uniform draw of (P, B) transitions, each agent its own, with windows rebuilt for the agents held here."""
        if self.size == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        index = torch.randint(self.size, self.sample_shape, generator=generator, device=generator.device)
        return self.gather(self.share.mine(index).to(self.storage["days"].device))

    @torch.no_grad()
    def gather(self, index: torch.Tensor) -> ReplayBatch:
        """The transitions at buffer positions ``index`` (P, B), observations rebuilt from the features."""
        s = self.storage
        days = s["days"][index].long()  # (P, B)
        return ReplayBatch(
            obs=self.gatherer.observe(days, s["weights"][index], out=self._windows),
            actions=s["actions"][index],
            rewards=s["rewards"][index],
            next_obs=(
                self.gatherer.observe(days + 1, s["next_weights"][index], out=self._next_windows)
                if self.gathers_next_obs
                else None
            ),
            terminated=s["terminated"][index].float(),
            truncated=s["truncated"][index].float(),
            fill=self.market.fill(days, execution_delay=self.execution_delay, held_days=self.held_days),
            held=s["held"][index] if "held" in s else None,
        )

    def state(self) -> ReplayState:
        """The buffer's contents as one value, referring to the live storage (every row, at full capacity)."""
        return ReplayState(self.storage, self.pos, self.size)

    @torch.no_grad()
    def load_state_(self, state: ReplayState) -> None:
        """Copy ``state`` (its storage's first ``size`` rows) into this buffer's storage; the rows after are zeroed.

        Raises:
            ValueError: the state does not fit this buffer (its capacity, or the shapes of its tensors).
        """
        size, pos = int(state.size), int(state.pos)
        # A buffer that is not full has written 0 .. size - 1 and goes on at size.
        if not (0 <= size <= self.capacity and 0 <= pos < self.capacity and (size == self.capacity or pos == size)):
            raise ValueError(f"replay state (size {size}, pos {pos}) does not fit capacity {self.capacity}")
        for key, target in self.storage.items():
            value = state.storage[key][:size] if size else target[:0]
            if value.shape != (size, *target.shape[1:]):
                raise ValueError(f"replay {key}: shape {tuple(value.shape)} does not fit {tuple(target.shape)}")
            target[:size].copy_(value)
            target[size:].zero_()
        self.size, self.pos = size, pos
        self._write_pos.fill_(pos)
