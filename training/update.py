"""The update phase of a run: DDPG updates of every agent on batches from the replay buffer (``models.ddpg``), each
update one step replayed as a CUDA graph with ``runtime.cuda_graphs`` (``training.graphs``), its losses summed on the
device."""

from __future__ import annotations

import torch

from config import Config
from models import ddpg as ddpg_module
from models.ddpg import ObservationNoise, UpdateLosses, ddpg_update
from models.population import Population
from models.replay import ReplayBuffer
from training.graphs import GraphedStep
from training.sharding import Sharding


class Updates:
    """What the update phase keeps from one update to the next, allocated once: the losses summed over a
    generation, the mask of agents whose actors stay as they are, the observation noise's draws; and its step.

    Args:
        config: the run's config.
        population, buffer: the run's.
        generator: the replay stream (the batches' draws and the observation noise).
        sharding: the slots held here.
        graphs: replay the update as a CUDA graph (on CUDA, one process).
    """

    def __init__(
        self,
        config: Config,
        population: Population,
        buffer: ReplayBuffer,
        *,
        generator: torch.Generator,
        sharding: Sharding,
        graphs: bool,
    ) -> None:
        ddpg, device = config.ddpg, population.device
        local = len(sharding.slots)
        self.population, self.buffer, self.generator = population, buffer, generator
        self.arguments = {
            "gamma": ddpg.gamma,
            "tau": ddpg.tau,
            "max_grad_norm": ddpg.max_grad_norm,
            "objective": ddpg.actor_objective,
            "cost_rate": config.env.cost_rate,
            "tilt_penalty": ddpg.tilt_penalty,
        }
        self.trains_critic = ddpg_module.trains_critic(ddpg.actor_objective, ddpg.gamma)
        """Whether the update trains the critic: only when something reads it (``models.ddpg.trains_critic``)."""
        self.noise = None
        if ddpg.observation_noise > 0:
            window = buffer.gatherer.window_size
            draws = torch.empty(sharding.popsize, ddpg.batch_size, buffer.gatherer.num_assets, window, device=device)
            rows = slice(sharding.slots.start, sharding.slots.stop)
            self.noise = ObservationNoise(ddpg.observation_noise, draws, rows, generator)
        self.frozen = torch.zeros(local, dtype=torch.bool, device=device) if config.evolution.frozen_elites else None
        self.loss_sums = torch.zeros(local, 2, device=device)  # (P, 2): critic, actor
        self.graphed = GraphedStep(self._summed, device=device, enabled=graphs, generators=[generator])
        self._sampled_size = -1  # the buffer size a captured update draws below

    def begin(self, frozen: torch.Tensor) -> None:
        """Before a generation's updates: the sums from 0, and ``frozen`` (P,) bool on the host, this generation's
        elites, as the agents that take no actor step (``evolution.frozen_elites``; else ignored)."""
        self.loss_sums.zero_()
        if self.frozen is not None:
            self.frozen.copy_(frozen)
        if self.buffer.size != self._sampled_size:  # a Python value of the graph: capture the update again
            self.graphed.invalidate()
            self._sampled_size = self.buffer.size

    def __call__(self) -> None:
        """One update of every agent, its losses added to the sums."""
        self.graphed()

    def step(self) -> UpdateLosses:
        """One batch per agent from the buffer, one batched DDPG update of all agents; the losses, not summed."""
        batch = self.buffer.sample(self.generator)
        return ddpg_update(self.population, batch, observation_noise=self.noise, frozen=self.frozen, **self.arguments)

    def _summed(self) -> None:
        losses = self.step()
        if losses.critic is not None:
            self.loss_sums[:, 0] += losses.critic
        self.loss_sums[:, 1] += losses.actor
