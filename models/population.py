"""The population: P agent slots and one champion slot, built once, changed only in place.

An agent is the slice ``[i]`` of every stacked tensor: actor, critic, their targets, both Adams'
moments, and its exploration stdev. Nothing here creates a module or optimiser after construction;
cloning is ``copy_`` into existing storage.
"""

from __future__ import annotations

import math

import torch

from models.networks import Actor, Critic
from models.optim import BatchedAdam


class Population:
    """P DDPG agents as stacked tensors, plus the champion's actor (equal weight until an agent is crowned).

    Args:
        popsize: P.
        window_size: L * K values per asset window.
        encoder_hidden, embedding, head_hidden: network widths (see ``models.networks``).
        bf16_encoder: run the encoders under bfloat16 autocast.
        actor_lr, critic_lr: Adam learning rates.
        exploration: (min, max) stdev of the logit noise; slot i gets the i-th of P log-spaced values.
        device: where every tensor lives.
        generator: draws the initial parameters.
    """

    def __init__(
        self,
        popsize: int,
        window_size: int,
        *,
        encoder_hidden: int,
        embedding: int,
        head_hidden: int,
        bf16_encoder: bool = False,
        actor_lr: float,
        critic_lr: float,
        exploration: tuple[float, float],
        device: torch.device | str,
        generator: torch.Generator,
    ) -> None:
        widths = dict(
            encoder_hidden=encoder_hidden, embedding=embedding, head_hidden=head_hidden, bf16_encoder=bf16_encoder
        )
        self.popsize = popsize
        self.device = torch.device(device)
        self.actor = Actor(popsize, window_size, **widths).to(device)
        self.critic = Critic(popsize, window_size, **widths).to(device)
        self.actor_target = Actor(popsize, window_size, **widths).to(device)
        self.critic_target = Critic(popsize, window_size, **widths).to(device)
        self.champion = Actor(1, window_size, **widths).to(device)
        self.actor.reset_parameters(generator)
        self.critic.reset_parameters(generator)
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
        self.exploration_stdev = stdevs.to(device)  # (P,) belongs to the slot, never cloned

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

    def state_tensors(self) -> dict[str, torch.Tensor]:
        """Everything to checkpoint: agent tensors, the champion and the exploration stdevs."""
        out = dict(self.agent_tensors())
        out.update({f"champion.{name}": t for name, t in self.champion.named_parameters()})
        out["exploration_stdev"] = self.exploration_stdev
        return out

    @torch.no_grad()
    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Copy a ``state_tensors`` dict into this population's existing storage."""
        own = self.state_tensors()
        missing = sorted(set(own) - set(tensors))
        unexpected = sorted(set(tensors) - set(own))
        if missing or unexpected:
            raise KeyError(f"population tensors do not match: missing {missing[:3]}, unexpected {unexpected[:3]}")
        for key, target in own.items():
            if tensors[key].shape != target.shape:
                raise ValueError(f"{key}: shape {tuple(tensors[key].shape)} != {tuple(target.shape)}")
            target.copy_(tensors[key])

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
