"""One DDPG update of every agent: learning, Polyak targets, the TD target's end flags, independence, clipping."""

from __future__ import annotations

import pytest
import torch

from config import ModelConfig
from environment.kernel import portfolio_step
from models.ddpg import clip_grad_norm_per_agent_, ddpg_update
from models.population import Population
from models.replay import ReplayBatch
from tests.synthetic import random_simplex

P, B, N, WINDOW = 3, 16, 3, 8  # agents, batch, assets, L * K
GAMMA, TAU = 0.9, 0.05


def _population(seed: int = 0, *, lr: float = 1e-3) -> Population:
    return Population(
        P,
        WINDOW,
        ModelConfig(encoder_hidden=8, embedding=4, head_hidden=8),
        actor_lr=lr,
        critic_lr=lr,
        exploration=(0.1, 1.0),
        device="cpu",
        generator=torch.Generator().manual_seed(seed),
    )


def _batch(seed: int = 0, **flags: float) -> ReplayBatch:
    """A batch built by hand; ``terminated=`` / ``truncated=`` set the flags of every transition."""
    g = torch.Generator().manual_seed(seed)
    return ReplayBatch(
        windows=torch.randn(P, B, N, WINDOW, generator=g),  # (P, B, N, L * K)
        weights=random_simplex(P, B, N + 1, generator=g),  # (P, B, N + 1)
        actions=random_simplex(P, B, N + 1, generator=g),
        rewards=torch.randn(P, B, generator=g) * 0.1,  # (P, B)
        next_windows=torch.randn(P, B, N, WINDOW, generator=g),
        next_weights=random_simplex(P, B, N + 1, generator=g),
        next_relatives=torch.cat([torch.ones(P, B, 1), 1 + 0.02 * torch.randn(P, B, N, generator=g)], dim=-1),
        terminated=torch.full((P, B), flags.get("terminated", 0.0)),
        truncated=torch.full((P, B), flags.get("truncated", 0.0)),
    )


def _update(population: Population, batch: ReplayBatch, *, gamma: float = GAMMA, max_grad_norm: float = 1.0):
    return ddpg_update(population, batch, gamma=gamma, tau=TAU, max_grad_norm=max_grad_norm)


def test_updates_on_a_fixed_batch_lower_every_critics_loss():
    population = _population(lr=1e-2)
    batch = _batch()
    first = _update(population, batch)
    for _ in range(30):
        last = _update(population, batch)
    assert first.critic.shape == first.actor.shape == (P,)
    assert torch.isfinite(last.critic).all() and torch.isfinite(last.actor).all()
    assert (last.critic < 0.5 * first.critic).all(), (first.critic, last.critic)


def test_targets_move_by_exactly_tau():
    population = _population()
    targets = list(population.actor_target.parameters()) + list(population.critic_target.parameters())
    online = list(population.actor.parameters()) + list(population.critic.parameters())
    # Targets start equal to the online networks; one update first so that they differ.
    _update(population, _batch(seed=1))
    before = [t.clone() for t in targets]
    _update(population, _batch(seed=2))
    for target, old, new in zip(targets, before, online):
        assert not torch.equal(target, old)
        assert torch.equal(target, torch.lerp(old, new.detach(), TAU))


@torch.no_grad()
def _q_and_next_q(population: Population, batch: ReplayBatch) -> tuple[torch.Tensor, torch.Tensor]:
    q = population.critic(batch.windows, batch.weights, batch.actions)  # (P, B)
    next_actions = population.actor_target(batch.next_windows, batch.next_weights)
    next_q = population.critic_target(batch.next_windows, batch.next_weights, next_actions)
    return q, next_q


def _critic_loss(**flags: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The update's critic loss for a zero-reward batch with the given flags, with q and next_q by hand."""
    population = _population(seed=3)
    with torch.no_grad():  # different target networks, so that next_q is not q's twin
        for target in population.critic_target.parameters():
            target.add_(0.3)
    batch = _batch(seed=4, **flags)._replace(rewards=torch.zeros(P, B))
    q, next_q = _q_and_next_q(population, batch)
    losses = _update(population, batch, gamma=1.0)
    return losses.critic, q, next_q


def test_termination_stops_the_bootstrap_and_truncation_does_not():
    terminated, q, next_q = _critic_loss(terminated=1.0)
    truncated, q_again, next_q_again = _critic_loss(truncated=1.0)
    running, *_ = _critic_loss()
    assert torch.equal(q, q_again) and torch.equal(next_q, next_q_again)
    assert (next_q.abs() > 1e-3).any()  # the bootstrap term is not negligible
    torch.testing.assert_close(terminated, q.pow(2).mean(dim=1), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(truncated, (q - next_q).pow(2).mean(dim=1), rtol=1e-6, atol=1e-8)
    assert not torch.allclose(truncated, terminated)
    # A truncated transition is a running one as far as the target is concerned.
    assert torch.equal(truncated, running)


def test_agents_are_independent():
    batch = _batch(seed=5)
    changed = batch._replace(rewards=batch.rewards.clone())
    changed.rewards[1] += 1.0
    same, other = _population(seed=6), _population(seed=6)
    _update(same, batch)
    _update(other, changed)
    moved = set()
    for key, tensor in same.agent_tensors().items():
        theirs = other.agent_tensors()[key]
        assert torch.equal(tensor[0], theirs[0]), key
        assert torch.equal(tensor[2], theirs[2]), key
        if not torch.equal(tensor[1], theirs[1]):
            moved.add(key.split(".")[0])
    # Agent 1's rewards reach its critic directly and, through the updated critic, its actor.
    assert {"critic", "critic_optim", "critic_target", "actor", "actor_optim"} <= moved


def _grads(norms: list[float], seed: int = 0) -> list[torch.nn.Parameter]:
    """Two stacked parameters whose gradients have joint L2 norm ``norms[i]`` for agent i."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.zeros(len(norms), 3, 4)), torch.nn.Parameter(torch.zeros(len(norms), 5))]
    grads = [torch.randn(p.shape, generator=g) for p in params]
    current = torch.stack([gr.flatten(1).pow(2).sum(1) for gr in grads]).sum(0).sqrt()
    for p, gr in zip(params, grads):
        p.grad = gr * (torch.tensor(norms) / current).view(-1, *[1] * (gr.dim() - 1))
    return params


def _norms(params: list[torch.nn.Parameter]) -> torch.Tensor:
    return torch.stack([p.grad.flatten(1).pow(2).sum(1) for p in params]).sum(0).sqrt()


def test_gradient_norm_is_clipped_per_agent():
    params = _grads([0.4, 7.0, 2.5])
    before = [p.grad.clone() for p in params]
    returned = clip_grad_norm_per_agent_(params, 1.0)
    torch.testing.assert_close(returned, torch.tensor([0.4, 7.0, 2.5]))
    for p, old in zip(params, before):
        assert torch.equal(p.grad[0], old[0])  # under the limit: untouched, bit for bit
        # Above it: scaled, direction kept.
        torch.testing.assert_close(p.grad[1], old[1] / 7.0, rtol=1e-5, atol=1e-7)
    norms = _norms(params)
    assert norms[0].item() == pytest.approx(0.4, rel=1e-6)
    assert norms[1].item() == pytest.approx(1.0, abs=1e-5)
    assert norms[2].item() == pytest.approx(1.0, abs=1e-5)


def test_max_norm_zero_disables_clipping():
    params = _grads([0.4, 70.0])
    before = [p.grad.clone() for p in params]
    clip_grad_norm_per_agent_(params, 0.0)
    for p, old in zip(params, before):
        assert torch.equal(p.grad, old)


def test_model_objective_climbs_the_exact_reward_at_gamma_zero():
    """With gamma 0 the 'model' actor loss is minus the mean one-day reward of the actor's own action on the
    recorded price relatives, costs included: its gradient is that reward's, not a critic's estimate."""
    cost = 0.002
    batch = _batch(seed=7)
    population = _population(seed=8)
    actor = population.actor
    actions = actor(batch.windows, batch.weights)
    reward = portfolio_step(batch.weights, actions, batch.next_relatives, cost_rate=cost).rewards
    expected_loss = -reward.mean(dim=1)
    expected_grads = torch.autograd.grad(expected_loss.sum(), list(actor.parameters()))
    losses = ddpg_update(population, batch, gamma=0.0, tau=TAU, max_grad_norm=0.0, objective="model", cost_rate=cost)
    torch.testing.assert_close(losses.actor, expected_loss.detach(), rtol=1e-5, atol=1e-7)
    for param, expected in zip(actor.parameters(), expected_grads):  # .grad is kept after the step
        torch.testing.assert_close(param.grad, expected, rtol=1e-4, atol=1e-7)


def test_model_objective_prices_trading_costs():
    """The same batch with costs: the actor's loss is higher by what the actor's own trades cost."""
    batch = _batch(seed=9)
    free = ddpg_update(_population(seed=10), batch, gamma=0.0, tau=TAU, max_grad_norm=1.0, objective="model")
    costly = ddpg_update(
        _population(seed=10), batch, gamma=0.0, tau=TAU, max_grad_norm=1.0, objective="model", cost_rate=0.01
    )
    assert (costly.actor > free.actor).all()


def test_the_tilt_penalty_prices_the_squared_distance_from_equal_weight():
    """The actor's loss rises by exactly tilt_penalty times the mean squared distance of its actions from equal
    weight (cash 0); and updates with a large penalty pull every agent's actions towards equal weight."""
    batch = _batch(seed=11)
    equal_weight = torch.full((N + 1,), 1.0 / N)
    equal_weight[0] = 0.0
    actions = _population(seed=12).actor(batch.windows, batch.weights).detach()
    distance = (actions - equal_weight).pow(2).sum(dim=-1).mean(dim=1)  # (P,)
    plain = ddpg_update(_population(seed=12), batch, gamma=0.0, tau=TAU, max_grad_norm=0.0, objective="model")
    penalised = ddpg_update(
        _population(seed=12), batch, gamma=0.0, tau=TAU, max_grad_norm=0.0, objective="model", tilt_penalty=0.5
    )
    torch.testing.assert_close(penalised.actor - plain.actor, 0.5 * distance, rtol=1e-4, atol=1e-7)

    population = _population(seed=12, lr=1e-2)
    for _ in range(100):
        ddpg_update(population, batch, gamma=0.0, tau=TAU, max_grad_norm=0.0, objective="model", tilt_penalty=10.0)
    after = population.actor(batch.windows, batch.weights).detach()
    assert ((after - equal_weight).pow(2).sum(dim=-1).mean(dim=1) < 0.1 * distance).all()


def _calls(module: torch.nn.Module) -> list[int]:
    """A list that grows by one at every forward of ``module``."""
    seen: list[int] = []
    module.register_forward_hook(lambda *_: seen.append(1))
    return seen


def test_nothing_reads_the_critic_under_the_model_objective_at_gamma_zero_so_it_is_not_trained():
    """The default settings: the actor climbs the exact reward, so the critic, the target networks and the TD target
    are work whose result nothing uses; none of them runs, the critic keeps its parameters and moments, and the
    update says so with a critic loss of None."""
    population = _population(seed=13)
    critic_before = {k: t.clone() for k, t in population.agent_tensors().items() if not k.startswith("actor")}
    calls = [_calls(m) for m in (population.critic, population.actor_target, population.critic_target)]
    losses = ddpg_update(population, _batch(seed=14), gamma=0.0, tau=TAU, max_grad_norm=1.0, objective="model")
    assert losses.critic is None and losses.actor.shape == (P,)
    assert calls == [[], [], []]
    for key, before in critic_before.items():
        assert torch.equal(population.agent_tensors()[key], before), key


@pytest.mark.parametrize("objective", ["model", "critic"])
def test_something_reads_the_critic_with_a_discount_or_the_critic_objective_so_it_is_trained(objective):
    gamma = 0.9 if objective == "model" else 0.0
    population = _population(seed=15)
    critic_before = [p.clone() for p in population.critic.parameters()]
    losses = ddpg_update(population, _batch(seed=16), gamma=gamma, tau=TAU, max_grad_norm=1.0, objective=objective)
    assert losses.critic is not None and torch.isfinite(losses.critic).all()
    assert all(not torch.equal(p, old) for p, old in zip(population.critic.parameters(), critic_before))


def test_at_gamma_zero_the_td_target_is_the_reward_and_the_targets_are_not_run():
    """A zero discount multiplies the next day's value by zero: the target networks are not run and the critic's
    loss is its squared error against the reward, bit for bit what the discounted formula gives at gamma 0."""
    population, reference = _population(seed=17), _population(seed=17)
    batch = _batch(seed=18)
    targets = [_calls(population.actor_target), _calls(population.critic_target)]
    q, next_q = _q_and_next_q(reference, batch)
    losses = ddpg_update(population, batch, gamma=0.0, tau=TAU, max_grad_norm=1.0, objective="critic")
    assert targets == [[], []]
    assert torch.equal(losses.critic, (q - (batch.rewards + 0.0 * (1.0 - batch.terminated) * next_q)).pow(2).mean(1))
