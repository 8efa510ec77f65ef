"""The agents held here: a share of the population.

A population may be split over processes (``runtime.sharding``); each then holds the agents of consecutive slots.
Everything random is drawn for the whole population and each share keeps its own rows, so an agent's draws (its
initial parameters, exploration and observation noise, mutations, batches) do not depend on how the population is
split, and a run gives the same numbers whatever its number of processes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import torch


class Share(NamedTuple):
    """Slots ``slots`` of a population of ``popsize`` (all of them unless the population is split)."""

    popsize: int
    slots: range

    @classmethod
    def whole(cls, popsize: int) -> Share:
        return cls(popsize, range(popsize))

    @property
    def agents(self) -> int:
        """How many agents are held here."""
        return len(self.slots)

    def mine(self, tensor: torch.Tensor) -> torch.Tensor:
        """The rows held here of ``tensor``, whose first dimension is the whole population (a view)."""
        return tensor[self.slots.start : self.slots.stop]

    def draw(self, sample: Callable[..., torch.Tensor], *trailing: int, **options: Any) -> torch.Tensor:
        """``sample((popsize, *trailing), **options)`` (``torch.randn``, ``torch.rand``...): drawn for the whole
        population, the rows held here kept."""
        return self.mine(sample((self.popsize, *trailing), **options))
