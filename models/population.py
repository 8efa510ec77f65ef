"""The population: P agent slots and one champion slot, built once, changed only in place.

An agent is the slice ``[i]`` of every stacked tensor: its learner's (actor, critics, their targets, the optimisers'
moments, ``models.learner``) and its exploration stdev. Nothing here creates a module or optimiser after construction;
cloning is ``copy_`` into existing storage.
"""

from __future__ import annotations

import math

import torch

from models.learner import Learner
from models.networks import Actor


class Population:
    """P agents as stacked tensors, plus the champion's actor (equal weight until an agent is crowned).

    Args:
        popsize: P.
        learner: the agents' learner (``models.learner.build_learner``), holding ``learner.share.agents`` of the P when
            the population is split (``models.share``, by ``runtime.sharding``), their tensors drawn as those of a
            whole population.
        generator: draws the champion's initial parameters, after the learner's (the stream that drew them).
    """

    def __init__(self, popsize: int, learner: Learner, *, generator: torch.Generator) -> None:
        self.popsize = popsize
        self.learner = learner
        self.share = learner.share
        if self.share.popsize != popsize:
            raise ValueError(f"the learner holds agents of a population of {self.share.popsize}, not {popsize}")
        device = learner.actor.encoder.mlp.layers[0].weight.device
        self.device = device
        learning, window_size, model = learner.settings, learner.window_size, learner.widths
        drawn = device.type != "meta"  # a build on the meta device (``run.sizing``) has shapes only: nothing to draw
        with torch.device(device):  # made where it lives, as the learner's networks are
            self.champion = Actor(1, window_size, model, book=learner.book)
        with torch.no_grad():
            if drawn:
                self.champion.reset_parameters(generator)
            self.champion.set_equal_weight_()  # until an agent proves an edge over it (training.selection)
        self.champion.requires_grad_(False)
        # (agents held here,) belongs to the slot, never cloned
        if drawn:
            stdevs = exploration_stdevs(popsize, learning.exploration_min, learning.exploration_max)
            self.exploration_stdev = self.share.mine(stdevs).to(device, copy=True)
        else:
            self.exploration_stdev = torch.empty(self.share.agents, device=device)

    @property
    def actor(self) -> Actor:
        """The agents' policies (the learner's actor)."""
        return self.learner.actor

    # ------------------------------------------------------------------ per-agent state

    def agent_tensors(self) -> dict[str, torch.Tensor]:
        """Every stacked tensor that belongs to agents (dim 0 = slot), by checkpoint key."""
        return self.learner.agent_tensors()

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
            source = self.share.mine(tensors[key]) if key in sharded else tensors[key]
            target.copy_(source)

    @torch.no_grad()
    def crown(self, index: int) -> None:
        """Copy agent ``index``'s actor into the champion slot."""
        for champion, actor in zip(self.champion.parameters(), self.actor.parameters()):
            champion[0].copy_(actor[index])


def exploration_stdevs(popsize: int, low: float, high: float) -> torch.Tensor:
    """(P,) each slot's exploration stdev: from ``low`` to ``high``, evenly on a log scale (linearly from 0)."""
    if popsize == 1 or low == high or low == 0:
        return torch.linspace(low, high, popsize)
    return torch.logspace(math.log10(low), math.log10(high), popsize)
