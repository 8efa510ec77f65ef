"""The learner (``models.learner``): DDPG and TD3 updates of every agent at once: learning, Polyak targets, the TD
target's end flags, independence, the actor's objectives, TD3's twins, smoothing and delay, no work nothing reads."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from config import LearnerConfig, ModelConfig
from environment.kernel import portfolio_step
from models.learner import Learner
from models.replay import ReplayBatch
from tests.synthetic import replay_batch

P, B, N, WINDOW = 3, 16, 3, 8  # agents, batch, assets, L * K
GAMMA, TAU = 0.9, 0.05
WIDTHS = ModelConfig(encoder_hidden=8, embedding=4, head_hidden=8)


def _learner(seed: int = 0, *, lr: float = 1e-3, cost_rate: float = 0.0, **settings) -> Learner:
    """A learner of P agents; ``settings`` are ``LearnerConfig`` fields (by default textbook DDPG: the critic objective,
    gamma 0.9)."""
    defaults = {"gamma": GAMMA, "tau": TAU, "actor_objective": "critic", "actor_lr": lr, "critic_lr": lr}
    return Learner(
        P,
        WINDOW,
        WIDTHS,
        LearnerConfig(**{**defaults, **settings}),
        cost_rate=cost_rate,
        device="cpu",
        generator=torch.Generator().manual_seed(seed),
        noise_generator=torch.Generator().manual_seed(seed + 1000),
    )


def _batch(seed: int = 0, **flags: float) -> ReplayBatch:
    """A batch built by hand; ``terminated=`` / ``truncated=`` set the flags of every transition."""
    return replay_batch(P, B, N, WINDOW, seed=seed, **flags)


def _calls(module: torch.nn.Module) -> list[int]:
    """A list that grows by one at every forward of ``module``."""
    seen: list[int] = []
    module.register_forward_hook(lambda *_: seen.append(1))
    return seen


@pytest.mark.slow
def test_updates_on_a_fixed_batch_lower_every_critics_loss():
    learner = _learner(lr=1e-2)
    batch = _batch()
    first = learner.update(batch)
    for _ in range(30):
        last = learner.update(batch)
    assert first["critic"].shape == first["actor"].shape == (P,)
    assert torch.isfinite(last["critic"]).all() and torch.isfinite(last["actor"]).all()
    assert (last["critic"] < 0.5 * first["critic"]).all(), (first["critic"], last["critic"])


def test_targets_move_by_exactly_tau():
    learner = _learner()
    pairs = learner.trained_pairs()
    targets = [p for _, target in pairs for p in target.parameters()]
    online = [p for network, _ in pairs for p in network.parameters()]
    learner.update(_batch(seed=1))  # targets start equal to the online networks; one update first so that they differ
    before = [t.clone() for t in targets]
    learner.update(_batch(seed=2))
    for target, old, new in zip(targets, before, online):
        assert not torch.equal(target, old)
        assert torch.equal(target, torch.lerp(old, new.detach(), TAU))


@torch.no_grad()
def _q_and_next_q(learner: Learner, batch: ReplayBatch) -> tuple[torch.Tensor, torch.Tensor]:
    q = learner.critic(batch.obs, batch.actions)  # (P, B)
    next_actions = learner.actor_target(batch.next_obs)
    next_q = learner.critic_target(batch.next_obs, next_actions)
    return q, next_q


def _critic_loss(**flags: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The update's critic loss for a zero-reward batch with the given flags, with q and next_q by hand."""
    learner = _learner(seed=3, gamma=1.0)
    with torch.no_grad():  # different target networks, so that next_q is not q's twin
        for target in learner.critic_target.parameters():
            target.add_(0.3)
    batch = _batch(seed=4, **flags)._replace(rewards=torch.zeros(P, B))
    q, next_q = _q_and_next_q(learner, batch)
    return learner.update(batch)["critic"], q, next_q


def test_termination_stops_the_bootstrap_and_truncation_does_not():
    terminated, q, next_q = _critic_loss(terminated=1.0)
    truncated, q_again, next_q_again = _critic_loss(truncated=1.0)
    running, *_ = _critic_loss()
    assert torch.equal(q, q_again) and torch.equal(next_q, next_q_again)
    assert (next_q.abs() > 1e-3).any()  # the bootstrap term is not negligible
    torch.testing.assert_close(terminated, q.pow(2).mean(dim=1), rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(truncated, (q - next_q).pow(2).mean(dim=1), rtol=1e-6, atol=1e-8)
    assert not torch.allclose(truncated, terminated)
    assert torch.equal(truncated, running)  # a truncated transition is a running one as far as the target goes


@pytest.mark.parametrize("algorithm", ["ddpg", "td3"])
def test_agents_are_independent(algorithm):
    batch = _batch(seed=5)
    changed = batch._replace(rewards=batch.rewards.clone())
    changed.rewards[1] += 1.0
    same, other = _learner(seed=6, algorithm=algorithm), _learner(seed=6, algorithm=algorithm)
    for _ in range(2):  # TD3 moves its actor on the second update
        same.update(batch, actor_step=same.takes_actor_step(_))
        other.update(changed, actor_step=other.takes_actor_step(_))
    moved = set()
    for key, tensor in same.agent_tensors().items():
        theirs = other.agent_tensors()[key]
        assert torch.equal(tensor[0], theirs[0]), key
        assert torch.equal(tensor[2], theirs[2]), key
        if not torch.equal(tensor[1], theirs[1]):
            moved.add(key.split(".")[0])
    # Agent 1's rewards reach its critics directly and, through the updated critic, its actor.
    expected = {"critic", "critic_optim", "critic_target", "actor", "actor_optim"}
    if algorithm == "td3":
        expected |= {"twin_critic", "twin_critic_target"}
    assert expected <= moved


def test_model_objective_climbs_the_exact_reward_at_gamma_zero():
    """With gamma 0 the 'model' actor loss is minus the mean one-day reward of the actor's own action on the
    recorded price relatives, costs included: its gradient is that reward's, not a critic's estimate."""
    cost = 0.002
    batch = _batch(seed=7)
    learner = _learner(seed=8, gamma=0.0, actor_objective="model", max_grad_norm=0.0, cost_rate=cost)
    actor = learner.actor
    actions = actor(batch.obs)
    reward = portfolio_step(batch.obs.weights, actions, batch.fill.held, cost_rate=cost).rewards
    expected_loss = -reward.mean(dim=1)
    expected_grads = torch.autograd.grad(expected_loss.sum(), list(actor.parameters()))
    losses = learner.update(batch)
    torch.testing.assert_close(losses["actor"], expected_loss.detach(), rtol=1e-5, atol=1e-7)
    for param, expected in zip(actor.parameters(), expected_grads):  # .grad is kept after the step
        torch.testing.assert_close(param.grad, expected, rtol=1e-4, atol=1e-7)


def test_model_objective_prices_trading_costs():
    """The same batch with costs: the actor's loss is higher by what the actor's own trades cost."""
    batch = _batch(seed=9)
    free = _learner(seed=10, gamma=0.0, actor_objective="model").update(batch)
    costly = _learner(seed=10, gamma=0.0, actor_objective="model", cost_rate=0.01).update(batch)
    assert (costly["actor"] > free["actor"]).all()


@pytest.mark.slow
def test_the_tilt_penalty_prices_the_squared_distance_from_equal_weight():
    """The actor's loss rises by exactly tilt_penalty times the mean squared distance of its actions from equal
    weight (cash 0); and updates with a large penalty pull every agent's actions towards equal weight."""
    batch = _batch(seed=11)
    equal_weight = torch.full((N + 1,), 1.0 / N)
    equal_weight[0] = 0.0
    model = {"gamma": 0.0, "actor_objective": "model", "max_grad_norm": 0.0}
    actions = _learner(seed=12, **model).actor(batch.obs).detach()
    distance = (actions - equal_weight).pow(2).sum(dim=-1).mean(dim=1)  # (P,)
    plain = _learner(seed=12, **model).update(batch)
    penalised = _learner(seed=12, tilt_penalty=0.5, **model).update(batch)
    torch.testing.assert_close(penalised["actor"] - plain["actor"], 0.5 * distance, rtol=1e-4, atol=1e-7)

    learner = _learner(seed=12, lr=1e-2, tilt_penalty=10.0, **model)
    for _ in range(100):
        learner.update(batch)
    after = learner.actor(batch.obs).detach()
    assert ((after - equal_weight).pow(2).sum(dim=-1).mean(dim=1) < 0.1 * distance).all()


# ---------------------------------------------------------------------------------------------- no dead work


@pytest.mark.parametrize("algorithm", ["ddpg", "td3"])
def test_nothing_reads_the_critic_under_the_model_objective_at_gamma_zero_so_it_is_not_trained(algorithm):
    """The default settings: the actor climbs the exact reward, so the critics, the target networks and the TD target
    are work whose result nothing uses; none of them runs, the critics keep their parameters and moments, and the
    update reports the actor's loss alone."""
    learner = _learner(seed=13, gamma=0.0, actor_objective="model", algorithm=algorithm)
    assert not learner.trains_critic and learner.loss_names == ("actor",)
    critic_before = {k: t.clone() for k, t in learner.agent_tensors().items() if not k.startswith("actor")}
    targets = [c for c in (learner.critic_target, learner.twin_critic_target) if c is not None]
    networks = [*learner.critics, *targets, learner.actor_target]
    calls = [_calls(m) for m in networks]
    losses = learner.update(_batch(seed=14))
    assert set(losses) == {"actor"} and losses["actor"].shape == (P,)
    assert calls == [[]] * len(networks)
    for key, before in critic_before.items():
        assert torch.equal(learner.agent_tensors()[key], before), key


@pytest.mark.parametrize("objective", ["model", "critic"])
def test_something_reads_the_critic_with_a_discount_or_the_critic_objective_so_it_is_trained(objective):
    gamma = 0.9 if objective == "model" else 0.0
    learner = _learner(seed=15, gamma=gamma, actor_objective=objective)
    critic_before = [p.clone() for p in learner.critic.parameters()]
    losses = learner.update(_batch(seed=16))
    assert learner.loss_names == ("actor", "critic") and torch.isfinite(losses["critic"]).all()
    assert all(not torch.equal(p, old) for p, old in zip(learner.critic.parameters(), critic_before))


def test_at_gamma_zero_the_td_target_is_the_reward_and_the_targets_are_neither_run_nor_averaged():
    """A zero discount multiplies the next day's value by zero: the target networks are not run, not averaged, and
    the critic's loss is its squared error against the reward, bit for bit what the discounted formula gives."""
    learner, reference = _learner(seed=17, gamma=0.0), _learner(seed=17, gamma=0.0)
    batch = _batch(seed=18)
    targets = [_calls(learner.actor_target), _calls(learner.critic_target)]
    target_before = [p.clone() for p in learner.critic_target.parameters()]
    q, next_q = _q_and_next_q(reference, batch)
    losses = learner.update(batch)
    assert targets == [[], []]
    assert all(torch.equal(p, old) for p, old in zip(learner.critic_target.parameters(), target_before))
    assert torch.equal(losses["critic"], (q - (batch.rewards + 0.0 * (1.0 - batch.terminated) * next_q)).pow(2).mean(1))


def test_an_offspring_inherits_only_what_is_read():
    """Evolution's copies are work too: with no critic trained, only the actor's moments are copied from the parent
    and no target restarts; textbook DDPG copies the critic, its moments and target, and restarts the actor target."""
    default = _learner(gamma=0.0, actor_objective="model").inheritance()
    assert all(k.startswith("actor.") for k in default.blended) and default.blended
    assert {k.split(".")[0] for k in default.copied} == {"actor_optim"}
    assert default.restarted == []
    textbook = _learner().inheritance()
    assert {k.split(".")[0] for k in textbook.copied} == {"actor_optim", "critic", "critic_optim", "critic_target"}
    assert len(textbook.restarted) == len(list(_learner().actor.parameters()))


# ---------------------------------------------------------------------------------------------- TD3


def test_td3_trains_twin_critics_on_the_smaller_of_their_targets_with_clipped_smoothing_noise():
    """The critics' target is r + gamma * min(Q1', Q2') of the target actor's action with noise on its logits, the
    noise drawn from the learner's stream (the same stream gives the same noise) and clipped."""
    learner = _learner(seed=19, algorithm="td3", target_noise=0.3, target_noise_clip=0.4)
    assert len(learner.critics) == 2 and learner.loss_names == ("actor", "critic")
    batch = _batch(seed=20)
    generator_state = learner.noise_generator.get_state()
    noise = torch.randn(P, B, N + 1, generator=learner.noise_generator).mul(0.3).clamp(-0.4, 0.4)
    learner.noise_generator.set_state(generator_state)
    with torch.no_grad():
        logits = learner.actor_target.logits(batch.next_obs) + noise
        next_actions = torch.softmax(logits, dim=-1)
        next_q = torch.minimum(
            learner.critic_target(batch.next_obs, next_actions),
            learner.twin_critic_target(batch.next_obs, next_actions),
        )
        target = batch.rewards + GAMMA * next_q
        q1 = learner.critic(batch.obs, batch.actions)
        q2 = learner.twin_critic(batch.obs, batch.actions)
    expected = (q1 - target).pow(2).mean(1) + (q2 - target).pow(2).mean(1)
    assert noise.abs().max() <= 0.4 and (noise.abs() == 0.4).any()  # the clip bites
    torch.testing.assert_close(learner.update(batch)["critic"], expected, rtol=1e-6, atol=1e-8)


def test_td3_moves_the_actor_and_the_targets_every_policy_delay_updates():
    learner = _learner(seed=21, algorithm="td3", policy_delay=3, updates_per_generation=6)
    assert [learner.takes_actor_step(i) for i in range(6)] == [False, False, True, False, False, True]
    actor = [p.clone() for p in learner.actor.parameters()]
    targets = [p.clone() for _, target in learner.trained_pairs() for p in target.parameters()]
    losses = learner.update(_batch(seed=22), actor_step=False)
    assert set(losses) == {"critic"}
    assert all(torch.equal(p, old) for p, old in zip(learner.actor.parameters(), actor))
    assert all(
        torch.equal(p, old) for p, old in zip([p for _, t in learner.trained_pairs() for p in t.parameters()], targets)
    )
    assert set(learner.update(_batch(seed=23), actor_step=True)) == {"critic", "actor"}
    assert all(not torch.equal(p, old) for p, old in zip(learner.actor.parameters(), actor))


def test_ddpg_is_td3_with_one_critic_no_smoothing_and_no_delay():
    plain = _learner(algorithm="ddpg", policy_delay=5, target_noise=0.5)
    assert plain.twin_critic is None and plain.policy_delay == 1 and plain.target_noise == 0.0
    assert all(plain.takes_actor_step(i) for i in range(4))
    assert not any(k.startswith("twin") for k in plain.agent_tensors())


def test_a_td3_policy_delay_must_divide_the_updates_of_a_generation():
    from utils.errors import ConfigError

    with pytest.raises(ConfigError, match=r"learner\.policy_delay"):
        LearnerConfig(algorithm="td3", policy_delay=3, updates_per_generation=32)
    assert dataclasses.replace(LearnerConfig(), policy_delay=3).policy_delay == 3  # DDPG ignores it
