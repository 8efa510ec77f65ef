"""The population: P agent slots and one champion slot, built once, changed only in place.

An agent is the slice ``[i]`` of every stacked tensor: actor, critic, their targets, both Adams'
moments, and its exploration stdev. Nothing here creates a module or optimiser after construction;
cloning is ``copy_`` into existing storage.
"""

from __future__ import annotations

import math

import torch

from config import ModelConfig
from models.networks import Actor, Critic, Rows
from models.optim import BatchedAdam


class Population:
    """P DDPG agents as stacked tensors, plus the champion's actor (equal weight until an agent is crowned).

    Args:
        popsize: P.
        window_size: L * K values per asset window.
        model: the networks' widths and encoder precision (``config.ModelConfig``).
        actor_lr, critic_lr: Adam learning rates.
        exploration: (min, max) stdev of the logit noise; slot i gets the i-th of P log-spaced values.
        device: where every tensor lives.
        generator: draws the initial parameters.
        slots: the slots this process holds when the population is sharded (``training.sharding``); all of them
            by default. Tensors then have ``len(slots)`` rows, drawn as the same slots of an unsharded population.
    """

    def __init__(
        self,
        popsize: int,
        window_size: int,
        model: ModelConfig,
        *,
        actor_lr: float,
        critic_lr: float,
        exploration: tuple[float, float],
        device: torch.device | str,
        generator: torch.Generator,
        slots: range | None = None,
    ) -> None:
        self.popsize = popsize
        self.slots = range(popsize) if slots is None else slots
        local = len(self.slots)  # the agents this process holds: all of them unless the population is sharded
        rows = None if local == popsize else Rows(popsize, self.slots)
        self.device = torch.device(device)
        self.actor = Actor(local, window_size, model).to(device)
        self.critic = Critic(local, window_size, model).to(device)
        self.actor_target = Actor(local, window_size, model).to(device)
        self.critic_target = Critic(local, window_size, model).to(device)
        self.champion = Actor(1, window_size, model).to(device)
        self.actor.reset_parameters(generator, rows=rows)
        self.critic.reset_parameters(generator, rows=rows)
        with torch.no_grad():
            _copy_all(self.actor_target.parameters(), self.actor.parameters())
            _copy_all(self.critic_target.parameters(), self.critic.parameters())
            self.champion.reset_parameters(generator)
            self.champion.set_equal_weight_()  # until an agent proves an edge over it (training.selection)
        for module in (self.actor_target, self.critic_target, self.champion):
            module.requires_grad_(False)
        self.actor_optim = BatchedAdam(list(self.actor.parameters()), lr=actor_lr)
        self.critic_optim = BatchedAdam(list(self.critic.parameters()), lr=critic_lr)
        low, high = exploration
        if popsize == 1 or low == high or low == 0:
            stdevs = torch.linspace(low, high, popsize)
        else:
            stdevs = torch.logspace(math.log10(low), math.log10(high), popsize)
        # (len(slots),) belongs to the slot, never cloned
        self.exploration_stdev = stdevs[self.slots.start : self.slots.stop].to(device, copy=True)

    # ------------------------------------------------------------------ per-agent state

    def agent_tensors(self) -> dict[str, torch.Tensor]:
        """Every stacked tensor that belongs to agents (dim 0 = slot), by checkpoint key."""
        out: dict[str, torch.Tensor] = {}
        for prefix, module in self._modules().items():
            for name, tensor in module.named_parameters():
                out[f"{prefix}.{name}"] = tensor
        for prefix, optim, module in (
            ("actor_optim", self.actor_optim, self.actor),
            ("critic_optim", self.critic_optim, self.critic),
        ):
            names = [name for name, _ in module.named_parameters()]
            for key, tensor in optim.state_tensors(names).items():
                out[f"{prefix}.{key}"] = tensor
        return out

    def slot_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor whose dim 0 is the slot: the agent tensors and the exploration stdevs."""
        return {**self.agent_tensors(), "exploration_stdev": self.exploration_stdev}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Everything to checkpoint: the slot tensors (of the slots held here) and the champion."""
        out = self.slot_tensors()
        out.update({f"champion.{name}": t for name, t in self.champion.named_parameters()})
        return out

    @torch.no_grad()
    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy a checkpoint's population (every slot, as ``state_tensors`` of an unsharded population) into this
        population's existing storage: the rows of the slots held here."""
        own = self.state_tensors()
        missing = sorted(set(own) - set(tensors))
        unexpected = sorted(set(tensors) - set(own))
        if missing or unexpected:
            raise KeyError(f"population tensors do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
        sharded = self.slot_tensors()
        for key, target in own.items():
            expected = (self.popsize, *target.shape[1:]) if key in sharded else target.shape
            if tensors[key].shape != expected:
                raise ValueError(f"{key}: shape {tuple(tensors[key].shape)} != {tuple(expected)}")
            source = tensors[key][self.slots.start : self.slots.stop] if key in sharded else tensors[key]
            target.copy_(source)

    @torch.no_grad()
    def crown(self, index: int) -> None:
        """Copy agent ``index``'s actor into the champion slot."""
        for champion, actor in zip(self.champion.parameters(), self.actor.parameters()):
            champion[0].copy_(actor[index])

    def _modules(self) -> dict[str, torch.nn.Module]:
        return {
            "actor": self.actor,
            "critic": self.critic,
            "actor_target": self.actor_target,
            "critic_target": self.critic_target,
        }


def _copy_all(targets, sources) -> None:
    for target, source in zip(targets, sources):
        target.copy_(source)
