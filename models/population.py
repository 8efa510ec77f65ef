"""The population: P agent slots and one champion slot, built once, changed only in place.

An agent is the slice ``[i]`` of every stacked tensor: its learner's (actor, critics, their targets, the optimisers'
moments, ``models.learner``) and its exploration stdev. Nothing here creates a module or optimiser after construction;
cloning is ``copy_`` into existing storage.
"""

from __future__ import annotations

import math

import torch

from config import LearnerConfig, ModelConfig
from models.learner import Learner
from models.networks import Actor
from models.share import Share


class Population:
    """P agents as stacked tensors, plus the champion's actor (equal weight until an agent is crowned).

    Args:
        popsize: P.
        window_size: L * K values per asset window.
        model: the networks' widths and encoder precision (``config.ModelConfig``).
        learning: the learner's settings (``config.LearnerConfig``).
        cost_rate: the environment's, for the learner's ``model`` objective.
        device: where every tensor lives.
        generator: draws the initial parameters.
        share: the agents held here when the population is split (``models.share``, by ``runtime.sharding``);
            all of them by default. Tensors then have ``share.agents`` rows, drawn as those of a whole population.
        frozen_elites: the actors' optimiser takes a per-agent learning-rate scale (``evolution.frozen_elites``).
        noise_generator: the learner's device stream for the randomness of its updates (``models.learner``).
    """

    def __init__(
        self,
        popsize: int,
        window_size: int,
        model: ModelConfig,
        learning: LearnerConfig,
        *,
        cost_rate: float = 0.0,
        device: torch.device | str,
        generator: torch.Generator,
        share: Share | None = None,
        frozen_elites: bool = False,
        noise_generator: torch.Generator | None = None,
    ) -> None:
        self.popsize = popsize
        self.share = share or Share.whole(popsize)
        self.device = torch.device(device)
        self.learner = Learner(
            self.share.agents,
            window_size,
            model,
            learning,
            cost_rate=cost_rate,
            device=device,
            generator=generator,
            share=self.share,
            per_agent_lr=frozen_elites,
            noise_generator=noise_generator,
        )
        self.champion = Actor(1, window_size, model).to(device)
        with torch.no_grad():
            self.champion.reset_parameters(generator)
            self.champion.set_equal_weight_()  # until an agent proves an edge over it (training.selection)
        self.champion.requires_grad_(False)
        low, high = learning.exploration_min, learning.exploration_max
        if popsize == 1 or low == high or low == 0:
            stdevs = torch.linspace(low, high, popsize)
        else:
            stdevs = torch.logspace(math.log10(low), math.log10(high), popsize)
        # (agents held here,) belongs to the slot, never cloned
        self.exploration_stdev = self.share.mine(stdevs).to(device, copy=True)

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
