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

Two options change what an update sees and moves: ``observation_noise`` adds Gaussian noise to the replayed
observations' features (against memorising days), and ``frozen`` agents take no actor step (``evolution.
frozen_elites``: the elites kept this generation, so that an offspring must beat them on days no gradient saw).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from config import ActorObjective
from environment.kernel import portfolio_step
from models.population import Population
from models.replay import ReplayBatch


class ObservationNoise(NamedTuple):
    """Gaussian noise of ``stdev`` on the features of a batch's observation windows (``ddpg.observation_noise``)."""

    stdev: float
    draws: torch.Tensor
    """(P, B, N, L * K), allocated once: drawn for the whole population, each process keeping its agents' rows, so an
    agent's noise does not depend on how the population is split over processes."""
    rows: slice
    """This process's agents among the P."""
    generator: torch.Generator


class UpdateLosses(NamedTuple):
    critic: torch.Tensor | None
    """(P,) mean squared TD error of each critic, detached; None when nothing reads the critic (``trains_critic``)."""
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
    observation_noise: ObservationNoise | None = None,
    frozen: torch.Tensor | None = None,
) -> UpdateLosses:
    """Critic on the TD target, actor on ``objective`` minus ``tilt_penalty`` times the squared distance of its
    target weights from equal weight (see the module docstring), then Polyak-average both targets. ``cost_rate`` is
    the environment's, for the ``model`` objective. ``observation_noise`` is added to the batch's windows in place;
    ``frozen`` (P,) bool marks the agents whose actors keep their parameters (their moments still see the gradient).
    """
    actor, critic = population.actor, population.critic
    if observation_noise is not None:  # in place: the windows are the replay buffer's own gather buffers
        for windows in (batch.windows, batch.next_windows):
            draws = torch.randn(
                observation_noise.draws.shape, generator=observation_noise.generator, out=observation_noise.draws
            )
            windows.add_(draws[observation_noise.rows], alpha=observation_noise.stdev)

    critic_loss = None
    if trains_critic(objective, gamma):
        target_q = batch.rewards  # with gamma 0 the next day's value is multiplied by zero: not computed
        if gamma > 0:
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
    population.actor_optim.step(None if frozen is None else (~frozen).to(actor_loss.dtype))  # a step of 0 or 1

    if gamma > 0:  # the targets are read by the next day's value only
        polyak_update_(population.actor_target.parameters(), actor.parameters(), tau=tau)
        polyak_update_(population.critic_target.parameters(), critic.parameters(), tau=tau)
    return UpdateLosses(None if critic_loss is None else critic_loss.detach(), actor_loss.detach())


def trains_critic(objective: ActorObjective, gamma: float) -> bool:
    """Whether anything reads the critic: the ``critic`` objective, or a discount above 0 (the next day's value in
    either objective). With the ``model`` objective and ``gamma`` 0 the actor climbs the exact reward alone, and a
    critic trained beside it would be work whose result nothing uses."""
    return objective == "critic" or gamma > 0


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
