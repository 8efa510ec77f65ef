"""The update phase of a run: the learner's updates of every agent (``models.learner``) on batches from the replay
buffer, each update one step replayed as a CUDA graph with ``runtime.cuda_graphs`` (``runtime.graphs``), its losses
summed on the device.

What an update reads that is drawn (the batch, the observation noise on its windows) is drawn here, outside the
learner's update, which is device arithmetic alone."""

from __future__ import annotations

import functools
import weakref
from typing import NamedTuple

import torch

from config import Config
from models.learner import Learner
from models.replay import ReplayBatch, ReplayBuffer
from models.share import Share
from runtime.graphs import GraphedCall
from runtime.sharding import Sharding


class ObservationNoise(NamedTuple):
    """Gaussian noise of ``stdev`` on the features of a batch's observation windows (``learner.observation_noise``)."""

    stdev: float
    draws: torch.Tensor
    """(P, B, N, L * K), allocated once: drawn for the whole population, the rows held here kept (``models.share``)."""
    share: Share
    """The agents held here."""
    generator: torch.Generator

    @torch.no_grad()
    def add_(self, batch: ReplayBatch) -> None:
        """Add the noise to the batch's windows in place (they are the replay buffer's own gather buffers)."""
        for obs in (batch.obs, batch.next_obs):
            # drawn for the next observations too when they are not gathered: the stream is the same either way
            draws = torch.randn(self.draws.shape, generator=self.generator, out=self.draws)
            if obs is not None:
                obs.windows.add_(self.share.mine(draws), alpha=self.stdev)


class UpdatePhase:
    """What the update phase keeps from one update to the next, allocated once: the losses summed over a
    generation, the observation noise's draws; and its steps (one with the actor's step, and for TD3 one without).

    Args:
        config: the run's config.
        learner, buffer: the run's.
        generator: the replay stream (the batches' draws and the observation noise).
        sharding: the slots held here.
    """

    def __init__(
        self,
        config: Config,
        learner: Learner,
        buffer: ReplayBuffer,
        *,
        generator: torch.Generator,
        sharding: Sharding,
    ) -> None:
        settings, device = config.learner, buffer.storage["days"].device
        self.learner, self.buffer, self.generator = learner, buffer, generator
        self.noise = None
        if settings.observation_noise > 0:
            window = buffer.gatherer.window_size
            draws = torch.empty(
                sharding.popsize, settings.batch_size, buffer.gatherer.num_assets, window, device=device
            )
            self.noise = ObservationNoise(settings.observation_noise, draws, sharding.share, generator)
        self.loss_names = learner.loss_names
        self.loss_sums = torch.zeros(sharding.share.agents, len(self.loss_names), device=device)  # (P, losses)
        kinds = {learner.takes_actor_step(index) for index in range(settings.updates_per_generation)}
        this = weakref.proxy(self)  # the graphed calls are the phase's own: they hold it without a cycle
        self.graphed = {
            actor_step: GraphedCall(
                functools.partial(UpdatePhase._summed, this, actor_step), device=device, generators=[generator]
            )
            for actor_step in sorted(kinds)
        }
        self._sampled_size = -1  # the buffer size a captured update draws below

    def begin(self, frozen: torch.Tensor | None) -> None:
        """Before a generation's updates: the sums from 0, and ``frozen`` (P,) bool on the host, the agents whose
        actors take no step this generation (evolution's elites, ``evolution.frozen_elites``), applied at the learner's
        edge as a learning-rate scale of 0."""
        self.loss_sums.zero_()
        if frozen is not None:
            self.learner.hold_actors_(frozen)
        if self.buffer.size != self._sampled_size:  # a Python value of the graphs: capture the updates again
            for call in self.graphed.values():
                call.invalidate()
            self._sampled_size = self.buffer.size

    def __call__(self, index: int) -> None:
        """The generation's ``index``-th update of every agent, its losses added to the sums."""
        self.graphed[self.learner.takes_actor_step(index)]()

    def updates_counted(self, updates: int) -> dict[str, int]:
        """How many of ``updates`` updates computed each loss (``Learner.loss_counts``)."""
        return self.learner.loss_counts(updates)

    def update(self, actor_step: bool = True) -> dict[str, torch.Tensor]:
        """One batch per agent from the buffer, one update of all agents; the (P,) losses, not summed."""
        return self.update_on(self.buffer.sample(self.generator), actor_step)

    def update_on(self, batch: ReplayBatch, actor_step: bool = True) -> dict[str, torch.Tensor]:
        """One update of all agents on ``batch`` (the buffer's), its observation noise added first; the (P,) losses."""
        if self.noise is not None:
            self.noise.add_(batch)
        return self.learner.update(batch, actor_step=actor_step)

    def _summed(self, actor_step: bool) -> None:
        losses = self.update(actor_step)
        for column, name in enumerate(self.loss_names):
            if name in losses:
                self.loss_sums[:, column] += losses[name]
