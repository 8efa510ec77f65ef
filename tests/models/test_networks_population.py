"""Batched networks equal P separate networks; the population changes only in place."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from config import LearnerConfig, ModelConfig
from environment.observation import Observation
from models.learner import Learner
from models.networks import Actor, BatchedLinear, Critic
from models.population import Population
from tests.synthetic import random_simplex

P, M, N, WINDOW = 3, 5, 4, 6  # agents, batch, assets, L * K
WIDTHS = ModelConfig(encoder_hidden=8, embedding=4, head_hidden=8)
EXPLORATION = (0.05, 0.8)


def _population(seed: int = 0, popsize: int = P) -> Population:
    generator = torch.Generator().manual_seed(seed)
    settings = LearnerConfig(
        actor_lr=1e-3, critic_lr=1e-3, exploration_min=EXPLORATION[0], exploration_max=EXPLORATION[1]
    )
    learner = Learner(popsize, WINDOW, WIDTHS, settings, cost_rate=0.0, device="cpu", generator=generator)
    return Population(popsize, learner, generator=generator)


@torch.no_grad()
def _scramble(population: Population, seed: int) -> None:
    """Give every agent tensor (targets and Adam moments included) distinct random values per slot."""
    g = torch.Generator().manual_seed(seed)
    for tensor in population.agent_tensors().values():
        tensor.copy_(torch.randn(tensor.shape, generator=g))


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shared = torch.randn(1, M, N, WINDOW, generator=g)  # (1, M, N, L * K)
    per_agent = torch.randn(P, M, N, WINDOW, generator=g)  # (P, M, N, L * K)
    weights = random_simplex(P, M, N + 1, generator=g)  # (P, M, N + 1)
    actions = random_simplex(P, M, N + 1, generator=g)
    return shared, per_agent, weights, actions


def _build(cls, popsize: int, seed: int):
    net = cls(popsize, WINDOW, WIDTHS)
    net.reset_parameters(torch.Generator().manual_seed(seed))
    return net


@torch.no_grad()
def _single(net, index: int):
    """A P = 1 network holding slot ``index`` of ``net``."""
    single = _build(type(net), 1, seed=99)
    for target, source in zip(single.parameters(), net.parameters()):
        target.copy_(source[index : index + 1])
    return single


@pytest.mark.parametrize("cls", [Actor, Critic])
@pytest.mark.parametrize("shared_windows", [True, False], ids=["shared", "per_agent"])
@torch.no_grad()
def test_batched_forward_equals_each_agents_own_forward(cls, shared_windows):
    net = _build(cls, P, seed=0)
    shared, per_agent, weights, actions = _inputs()
    windows = shared if shared_windows else per_agent
    args = () if cls is Actor else (actions,)
    batched = net(Observation(windows, weights), *args)  # (P, M, N + 1) or (P, M)
    assert batched.shape[:2] == (P, M)
    for i in range(P):
        agent_windows = windows if shared_windows else windows[i : i + 1]
        own = _single(net, i)(Observation(agent_windows, weights[i : i + 1]), *(a[i : i + 1] for a in args))
        torch.testing.assert_close(batched[i : i + 1], own, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("cls", [Actor, Critic])
@torch.no_grad()
def test_changing_one_agent_leaves_the_others_outputs_alone(cls):
    net = _build(cls, P, seed=0)
    _shared, windows, weights, actions = _inputs()
    args = () if cls is Actor else (actions,)
    before = net(Observation(windows, weights), *args)
    for param in net.parameters():
        param[1].add_(0.5)
    after = net(Observation(windows, weights), *args)
    assert torch.equal(after[0], before[0])
    assert torch.equal(after[2], before[2])
    assert not torch.equal(after[1], before[1])


@pytest.mark.parametrize("shared_windows", [True, False], ids=["shared", "per_agent"])
@torch.no_grad()
def test_actor_outputs_are_on_the_simplex(shared_windows):
    actor = _build(Actor, P, seed=1)
    shared, per_agent, weights, _ = _inputs(seed=1)
    out = actor(Observation(shared if shared_windows else per_agent, weights))
    assert out.shape == (P, M, N + 1)
    assert (out >= 0).all()
    torch.testing.assert_close(out.sum(-1), torch.ones(P, M))


# --------------------------------------------------------------------------- population


def test_agent_tensors_are_every_per_agent_state_and_nothing_else():
    population = _population()
    agent_keys = set(population.agent_tensors())
    # Actor, critic, both targets and both Adams' moments: what evolution copies from parent to offspring.
    assert {k.split(".")[0] for k in agent_keys} == {
        "actor",
        "critic",
        "actor_target",
        "critic_target",
        "actor_optim",
        "critic_optim",
    }
    # The exploration stdev belongs to the slot and the champion is not an agent.
    assert not any(k.startswith(("champion", "exploration")) for k in agent_keys)
    assert all(t.shape[0] == P for t in population.agent_tensors().values())


def test_state_tensors_round_trip_into_another_population():
    source = _population(seed=0)
    _scramble(source, seed=3)
    target = _population(seed=7)
    assert not torch.equal(source.actor.encoder.mlp.layers[0].weight, target.actor.encoder.mlp.layers[0].weight)
    pointers = {k: t.data_ptr() for k, t in target.state_tensors().items()}

    target.load_state_tensors(source.state_tensors())

    own = target.state_tensors()
    assert set(own) == set(source.state_tensors())
    for key, tensor in source.state_tensors().items():
        assert torch.equal(own[key], tensor), key
    assert {k: t.data_ptr() for k, t in own.items()} == pointers


def test_load_state_tensors_rejects_a_wrong_shape_or_key():
    population = _population()
    good = {k: t.clone() for k, t in population.state_tensors().items()}
    wrong_shape = dict(good, **{"critic.value_head.layers.0.weight": torch.zeros(P, 1, 1)})
    with pytest.raises(ValueError, match=r"critic\.value_head\.layers\.0\.weight"):
        population.load_state_tensors(wrong_shape)
    missing = {k: v for k, v in good.items() if k != "exploration_stdev"}
    with pytest.raises(KeyError):
        population.load_state_tensors(missing)
    with pytest.raises(KeyError):
        population.load_state_tensors(dict(good, extra=torch.zeros(1)))
    # A bigger population's tensors do not fit either.
    with pytest.raises(ValueError):
        population.load_state_tensors(_population(popsize=P + 1).state_tensors())


def test_crown_copies_the_actor_slot_into_the_champion():
    population = _population()
    _scramble(population, seed=4)
    population.crown(2)
    actor = dict(population.actor.named_parameters())
    champion = dict(population.champion.named_parameters())
    assert set(actor) == set(champion)
    for name, tensor in champion.items():
        assert tensor.shape[0] == 1
        assert torch.equal(tensor[0], actor[name][2]), name
    shared, _, weights, _ = _inputs()
    with torch.no_grad():
        champion = population.champion(Observation(shared, weights[2:3]))
        torch.testing.assert_close(champion, population.actor(Observation(shared, weights))[2:3])


@pytest.mark.parametrize("popsize", [2, 5])
def test_exploration_stdevs_are_log_spaced_per_slot(popsize):
    population = _population(popsize=popsize)
    stdevs = population.exploration_stdev
    assert stdevs.shape == (popsize,)
    low, high = EXPLORATION
    assert stdevs[0].item() == pytest.approx(low, rel=1e-5)
    assert stdevs[-1].item() == pytest.approx(high, rel=1e-5)
    logs = stdevs.double().log()
    steps = logs[1:] - logs[:-1]
    torch.testing.assert_close(steps, torch.full_like(steps, math.log(high / low) / (popsize - 1)), rtol=1e-4, atol=0)


@torch.no_grad()
def test_a_bf16_encoder_keeps_float32_outputs_close_to_the_float32_networks():
    shared, per_agent, weights, actions = _inputs(seed=3)
    exact = _build(Actor, P, seed=4)
    bf16 = Actor(P, WINDOW, dataclasses.replace(WIDTHS, bf16_encoder=True))
    bf16.load_state_dict(exact.state_dict())
    obs = Observation(per_agent, weights)
    out, reference = bf16.logits(obs), exact.logits(obs)
    assert out.dtype == torch.float32 and bf16.encoder(per_agent).dtype == torch.float32
    assert not torch.equal(out, reference)  # bfloat16 keeps 8 mantissa bits: the encoder really ran in it
    assert torch.allclose(out, reference, atol=0.05, rtol=0.05)
    assert bf16.agent(1).encoder.bf16  # an agent taken out keeps the setting

    critic, critic_bf16 = _build(Critic, P, seed=5), Critic(P, WINDOW, dataclasses.replace(WIDTHS, bf16_encoder=True))
    critic_bf16.load_state_dict(critic.state_dict())
    q, q_exact = critic_bf16(Observation(shared, weights), actions), critic(Observation(shared, weights), actions)
    assert q.dtype == torch.float32 and torch.allclose(q, q_exact, atol=0.05, rtol=0.05)


# --------------------------------------------------------------------------- the heads, without concatenations


def _concatenated_actor_logits(actor: Actor, windows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The actor's function as its docstring writes it: each head's input concatenated, then its MLP."""
    emb = actor.encoder(windows)  # (P, M, N, D)
    context = emb.mean(dim=2, keepdim=True)
    asset_in = torch.cat([emb, context.expand_as(emb), weights[..., 1:, None]], dim=-1)
    asset_logits = actor.asset_head(asset_in)[..., 0]
    cash_logit = actor.cash_head(torch.cat([context[:, :, 0], weights[..., :1]], dim=-1))
    return torch.cat([cash_logit, asset_logits], dim=-1)


def _concatenated_q(critic: Critic, windows: torch.Tensor, weights: torch.Tensor, actions: torch.Tensor):
    emb = critic.encoder(windows)
    pooled = critic.asset_head(torch.cat([emb, weights[..., 1:, None], actions[..., 1:, None]], dim=-1)).mean(dim=2)
    return critic.value_head(torch.cat([pooled, weights[..., :1], actions[..., :1]], dim=-1))[..., 0]


@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float64, 1e-12), (torch.float32, 2e-6)], ids=["float64", "float32"]
)
@torch.no_grad()
def test_the_heads_compute_the_concatenated_function_within_rounding(dtype, tolerance):
    """The heads never write their concatenated inputs (each input multiplies its own rows of the first layer's weight):
    the same function, to float64's rounding in float64 and float32's in float32 (relative to the outputs' scale)."""
    g = torch.Generator().manual_seed(7)
    actor, critic = _build(Actor, P, seed=8).to(dtype), _build(Critic, P, seed=9).to(dtype)
    for net in (actor, critic):  # last layers of full size, so that the heads' outputs are not near zero
        for param in net.parameters():
            param.copy_(torch.randn(param.shape, generator=g, dtype=dtype) * 0.5)
    shared, per_agent, weights, actions = (t.to(dtype) for t in _inputs(seed=10))
    for windows in (shared, per_agent):
        obs = Observation(windows, weights)
        logits, expected = actor.logits(obs), _concatenated_actor_logits(actor, windows, weights)
        q, expected_q = critic(obs, actions), _concatenated_q(critic, windows, weights, actions)
        for got, want in ((logits, expected), (q, expected_q)):
            assert got.dtype == dtype and got.shape == want.shape
            assert (got - want).abs().max() <= tolerance * want.abs().max(), (got - want).abs().max()


@torch.no_grad()
def test_an_actors_features_of_many_observations_decide_each_one_as_alone():
    """What the windows alone give (``Actor.features``) computed for a block of M observations at once, then decided
    one observation at a time, is what each observation's own forward gives: the basis of a block of days."""
    actor = _build(Actor, P, seed=11)
    shared, _per_agent, weights, _ = _inputs(seed=12)
    block = actor.features(Observation(shared, None))
    for m in range(M):
        one = actor.logits(Observation(shared[:, m : m + 1], weights[:, m : m + 1]))
        sliced = type(block)(*(None if part is None else part[:, m : m + 1] for part in block))
        torch.testing.assert_close(actor.decide(sliced, weights[:, m : m + 1]), one, rtol=1e-6, atol=1e-7)


# --------------------------------------------------------------------------- the one-output layer's backward


class _Matmuls(TorchDispatchMode):
    """The batched matmuls dispatched, by the shapes of their two factors."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[tuple[int, ...], tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.bmm.default, torch.ops.aten.baddbmm.default):
            a, b = args[-2:] if func is torch.ops.aten.baddbmm.default else args
            self.shapes.append((tuple(a.shape), tuple(b.shape)))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("wanted", [(True, True, True), (False, True, False), (True, False, True)])
def test_a_one_output_layer_has_autograds_gradients_bit_for_bit_without_a_matmul_of_inner_size_one(wanted):
    """A layer of one output (the heads' last) gives the gradients a plain ``baddbmm`` gives, bit for bit, for the
    inputs that want them, and its input's gradient is a product, not a matmul whose inner size is 1 (several times
    slower on a CPU)."""
    layer = BatchedLinear(P, 64, 1)
    layer.reset_parameters(torch.Generator().manual_seed(13))
    g = torch.Generator().manual_seed(14)
    x = torch.randn(P, 300, 64, generator=g)
    upstream = torch.randn(P, 300, 1, generator=g)

    def gradients(forward):
        bias, x_, weight = (t.detach().clone().requires_grad_(w) for t, w in zip((layer.bias, x, layer.weight), wanted))
        out = forward(bias, x_, weight)
        out.backward(upstream)
        return out.detach(), [t.grad for t in (bias, x_, weight)]

    def layer_forward(bias, x_, weight):
        return BatchedLinear.forward(_AsLayer(bias, weight), x_)

    matmuls = _Matmuls()
    with matmuls:
        out, got = gradients(layer_forward)
    want_out, want = gradients(torch.baddbmm)
    assert torch.equal(out, want_out)
    for mine, theirs, asked in zip(got, want, wanted):
        assert (mine is None) == (not asked)
        assert mine is None or torch.equal(mine, theirs)
    assert all(a[-1] != 1 for a, _ in matmuls.shapes), matmuls.shapes  # no (.., 1) @ (1, ..)
    assert ((P, 300, 64), (P, 64, 1)) in matmuls.shapes  # the forward is the matmul it was: the same numbers
    with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast casts the factors: autograd's own backward there
        cast_out, cast = gradients(layer_forward)
        want_cast_out, want_cast = gradients(torch.baddbmm)
    assert cast_out.dtype == torch.bfloat16 and torch.equal(cast_out, want_cast_out)
    assert all(mine is None or torch.equal(mine, theirs) for mine, theirs in zip(cast, want_cast))


class _AsLayer:
    """A stand-in ``self`` for ``BatchedLinear.forward`` holding given tensors as its weight and bias."""

    def __init__(self, bias: torch.Tensor, weight: torch.Tensor) -> None:
        self.bias, self.weight = bias, weight
