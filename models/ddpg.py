"""One DDPG update of every agent at once.

Each agent's loss depends only on its own slice of the stacked parameters, so the sum of the
per-agent losses has, for each slice, exactly that agent's gradient: one backward trains all P.
Anything that is not elementwise (the gradient-norm clip) is computed per agent.

The critic learns Q on the usual TD target. The actor has two objectives:

* ``critic``: plain DDPG, maximise ``Q(s, actor(s))``. The critic must learn from noisy rewards how each
  asset's weight pays, and its errors are what the actor climbs.
* ``model``: the market is exogenous (a trade moves no price), so the day after a recorded decision is known
  for *any* action: maximise ``r(s, a) + gamma * Q(s', actor(s'))`` with ``a = actor(s)``, where ``r`` and the
  next weights in ``s'`` come from ``environment.kernel.portfolio_step`` on the recorded price relatives,
  differentiated exactly. Only the value of the days after that comes from the critic (a one-step value
  expansion). Costs are in ``r``, so every gradient weighs a trade against what it pays.

Either objective may subtract ``tilt_penalty * ||a - equal weight||^2`` a day: a prior at equal weight, so that a
tilt the data do not pay for consistently (on a market with no signal, none is) decays instead of drifting with the
noise the gradient fits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from config import ActorObjective
from environment.kernel import portfolio_step
from models.population import Population
from models.replay import ReplayBatch


class UpdateLosses(NamedTuple):
    critic: torch.Tensor
    """(P,) mean squared TD error of each critic, detached."""
    actor: torch.Tensor
    """(P,) mean -Q of each actor's actions, detached."""


def ddpg_update(
    population: Population,
    batch: ReplayBatch,
    *,
    gamma: float,
    tau: float,
    max_grad_norm: float,
    objective: ActorObjective = "critic",
    cost_rate: float = 0.0,
    tilt_penalty: float = 0.0,
    actor_step_scale: torch.Tensor | None = None,
) -> UpdateLosses:
    """Critic on the TD target, actor on ``objective`` minus ``tilt_penalty`` times the squared distance of its
    target weights from equal weight (see the module docstring), then Polyak-average both targets. ``cost_rate`` is
    the environment's, for the ``model`` objective. ``actor_step_scale`` (P,) multiplies each actor's step (0 keeps
    that actor as it is: ``evolution.frozen_elites``)."""
    actor, critic = population.actor, population.critic

    with torch.no_grad():
        next_actions = population.actor_target(batch.next_windows, batch.next_weights)
        next_q = population.critic_target(batch.next_windows, batch.next_weights, next_actions)
        # Truncation is not an end: only termination stops the bootstrap.
        target_q = batch.rewards + gamma * (1.0 - batch.terminated) * next_q  # (P, B)

    q = critic(batch.windows, batch.weights, batch.actions)  # (P, B)
    critic_loss = (q - target_q).pow(2).mean(dim=1)  # (P,)
    population.critic_optim.zero_grad()
    critic_loss.sum().backward()
    clip_grad_norm_per_agent_(population.critic_optim.params, max_grad_norm)
    population.critic_optim.step()

    critic.requires_grad_(False)  # the actor's loss must not spend work on critic gradients
    try:
        actions = actor(batch.windows, batch.weights)  # (P, B, N + 1)
        if objective == "model":
            step = portfolio_step(batch.weights, actions, batch.next_relatives, cost_rate=cost_rate)
            value = step.rewards  # (P, B)
            if gamma > 0:
                next_actions = actor(batch.next_windows, step.next_weights)
                next_q = critic(batch.next_windows, step.next_weights, next_actions)
                value = value + gamma * (1.0 - batch.terminated) * next_q
        else:
            value = critic(batch.windows, batch.weights, actions)
        if tilt_penalty > 0:
            assets = actions.shape[-1] - 1
            equal_weight = torch.full_like(actions[0, 0], 1.0 / assets)
            equal_weight[0] = 0.0  # cash first
            value = value - tilt_penalty * (actions - equal_weight).pow(2).sum(dim=-1)  # (P, B)
        actor_loss = -value.mean(dim=1)
        population.actor_optim.zero_grad()
        actor_loss.sum().backward()
    finally:
        critic.requires_grad_(True)
    clip_grad_norm_per_agent_(population.actor_optim.params, max_grad_norm)
    population.actor_optim.step(actor_step_scale)

    polyak_update_(population.actor_target.parameters(), actor.parameters(), tau=tau)
    polyak_update_(population.critic_target.parameters(), critic.parameters(), tau=tau)
    return UpdateLosses(critic_loss.detach(), actor_loss.detach())


@torch.no_grad()
def clip_grad_norm_per_agent_(params: list[torch.nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale each agent's gradients so their joint L2 norm is at most ``max_norm``; returns (P,) norms.

    0 disables clipping. No host synchronisation: the scale is computed and applied on the device.
    """
    grads = [p.grad for p in params]
    squares = torch.stack([g.pow(2).flatten(1).sum(dim=1) for g in grads])  # (num_params, P)
    norms = squares.sum(dim=0).sqrt()  # (P,)
    if max_norm > 0:
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(scale.view(-1, *([1] * (g.dim() - 1))))
    return norms


@torch.no_grad()
def polyak_update_(targets, sources, *, tau: float) -> None:
    """target <- target + tau * (source - target), for every pair."""
    torch._foreach_lerp_(list(targets), list(sources), tau)
