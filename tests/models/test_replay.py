"""The replay buffer: wrap-around, observations rebuilt exactly, size independent of L and K, state round trip."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_leaves as all_leaves

from environment.vector_env import VectorPortfolioEnv
from models.replay import ReplayBuffer
from persistence.generation_contents import buffer_from_groups, buffer_groups
from tests.synthetic import make_market, random_simplex


def tree_leaves(tree: object) -> list[torch.Tensor]:
    """The tensors of a batch (a part the market does not need, such as no fill day's relatives, is None)."""
    return [leaf for leaf in all_leaves(tree) if isinstance(leaf, torch.Tensor)]


LOOKBACK = 4


def _buffer(market, capacity: int, *, lookback: int = LOOKBACK, sample_shape=(2, 3)) -> ReplayBuffer:
    return ReplayBuffer(capacity, market, lookback=lookback, execution_delay=0, sample_shape=sample_shape)


def _transitions(count: int, num_assets: int, *, first: int = 0) -> dict[str, torch.Tensor]:
    """``count`` transitions numbered ``first, first + 1, ...``: the number is the reward, so ring order shows."""
    g = torch.Generator().manual_seed(first)
    number = torch.arange(first, first + count)
    return dict(
        days=LOOKBACK - 1 + number,
        weights=random_simplex(count, num_assets + 1, generator=g),
        actions=random_simplex(count, num_assets + 1, generator=g),
        rewards=number.float(),
        next_weights=random_simplex(count, num_assets + 1, generator=g),
        terminated=number % 3 == 0,
        truncated=number % 2 == 0,
    )


def _one_at_a_time(market, capacity: int, counts: list[int]) -> ReplayBuffer:
    """The reference ring: every transition added on its own."""
    buffer = _buffer(market, capacity)
    first = 0
    for count in counts:
        batch = _transitions(count, market.num_assets, first=first)
        for i in range(count):
            buffer.add(**{k: v[i : i + 1] for k, v in batch.items()})
        first += count
    return buffer


def test_wrap_around_keeps_the_newest_in_ring_order(market):
    buffer = _buffer(market, capacity=10)
    buffer.add(**_transitions(7, market.num_assets))
    assert (len(buffer), buffer.pos) == (7, 7)
    buffer.add(**_transitions(7, market.num_assets, first=7))
    assert (len(buffer), buffer.pos) == (10, 4)
    # Transitions 4..13 survive; transition t sits at position t % 10.
    assert buffer.storage["rewards"].tolist() == [10, 11, 12, 13, 4, 5, 6, 7, 8, 9]
    reference = _one_at_a_time(market, 10, [7, 7])
    for key, tensor in buffer.storage.items():
        assert torch.equal(tensor, reference.storage[key]), key


@pytest.mark.parametrize("counts", [[23], [4, 23], [10, 10]])
def test_an_add_larger_than_capacity_keeps_the_newest(market, counts):
    buffer = _buffer(market, capacity=10)
    first = 0
    for count in counts:
        buffer.add(**_transitions(count, market.num_assets, first=first))
        first += count
    reference = _one_at_a_time(market, 10, counts)
    assert (buffer.size, buffer.pos) == (reference.size, reference.pos) == (10, first % 10)
    assert sorted(buffer.storage["rewards"].tolist()) == list(range(first - 10, first))
    for key, tensor in buffer.storage.items():
        assert torch.equal(tensor, reference.storage[key]), key


def test_sampled_observations_are_the_ones_the_agents_saw(market):
    agents, episodes, days = 2, 3, 5
    env = VectorPortfolioEnv(
        market,
        num_agents=agents,
        num_episodes=episodes,
        episode_days=days,
        lookback=LOOKBACK,
        cost_rate=0.001,
        execution_delay=0,
    )
    per_step = agents * episodes
    buffer = ReplayBuffer(
        per_step * days + 7, market, lookback=LOOKBACK, execution_delay=0, sample_shape=(agents, episodes)
    )
    g = torch.Generator().manual_seed(0)
    obs = env.reset(torch.tensor([LOOKBACK - 1, 40, 150]))
    seen, steps = [], []
    while obs is not None:
        seen.append((obs.windows.clone(), obs.weights.clone()))  # the env reuses its arrays
        actions = random_simplex(agents, episodes, market.num_assets + 1, generator=g)
        step, obs = env.step(actions)
        steps.append(step)
        buffer.add(**step._asdict(), terminated=False)
    assert len(steps) == days and len(buffer) == per_step * days

    for t, step in enumerate(steps):
        # Insertion order is step-major, then agent, then episode.
        index = t * per_step + torch.arange(agents).view(-1, 1) * episodes + torch.arange(episodes).view(1, -1)
        batch = buffer.gather(index)  # (P, E, ...)
        windows, weights = seen[t]
        if t + 1 < days:
            next_windows = seen[t + 1][0]
        else:  # the window ended: the next observation is the one the market would have shown
            next_windows = torch.stack(
                [
                    market.features[d - LOOKBACK + 1 : d + 1].permute(1, 0, 2).reshape(market.num_assets, -1)
                    for d in (step.days + 1).tolist()
                ]
            )
        assert torch.equal(batch.obs.windows, windows.expand(agents, -1, -1, -1))
        assert torch.equal(batch.obs.weights, weights)
        assert torch.equal(batch.actions, step.actions)
        assert torch.equal(batch.rewards, step.rewards)
        assert torch.equal(batch.next_obs.windows, next_windows.expand(agents, -1, -1, -1))
        assert torch.equal(batch.next_obs.weights, step.next_weights)
        if t + 1 < days:
            assert torch.equal(batch.next_obs.weights, seen[t + 1][1])
        # The price relatives of the day each action earned: what the 'model' objective replays.
        assert torch.equal(batch.fill.held[..., 1:], market.relatives[step.days + 1].expand(agents, -1, -1))
        assert (batch.fill.held[..., 0] == 1).all()
        assert torch.equal(batch.truncated, torch.full((agents, episodes), float(t == days - 1)))
        assert not batch.terminated.any()


def test_bytes_per_transition_depend_on_assets_only():
    sizes = set()
    for num_features in (2, 7):
        market = make_market(num_days=80, num_assets=3, num_features=num_features, train_days=50, validation_days=15)
        for lookback in (2, 16):
            buffer = _buffer(market, 64, lookback=lookback)
            assert buffer.gatherer.window_size == lookback * num_features
            sizes.add((buffer.bytes_per_transition, buffer.nbytes))
    assert len(sizes) == 1
    (per_transition, nbytes), *_ = sizes
    assert nbytes == 64 * per_transition
    more_assets = make_market(num_days=80, num_assets=9, num_features=2, train_days=50, validation_days=15)
    bigger = _buffer(more_assets, 64)
    assert bigger.bytes_per_transition > per_transition
    # Three (N + 1) float32 vectors per transition: 12 bytes more per extra asset.
    assert bigger.bytes_per_transition - per_transition == 12 * (9 - 3)


@pytest.mark.parametrize("count", [6, 27], ids=["partial", "wrapped"])
def test_state_round_trip(market, count):
    source = _buffer(market, 10)
    source.add(**_transitions(count, market.num_assets))
    target = _buffer(market, 10)
    target.add(**_transitions(9, market.num_assets, first=100))  # stale content must not survive the load
    state = source.state()
    target.load_state_(state._replace(storage={k: v.clone() for k, v in state.storage.items()}))
    assert (target.size, target.pos) == (source.size, source.pos)
    for key, tensor in source.storage.items():
        assert torch.equal(target.storage[key], tensor), key
    # Both rings go on identically: the same samples, the same next writes.
    for buffer in (source, target):
        buffer.add(**_transitions(3, market.num_assets, first=200))
    for key, tensor in source.storage.items():
        assert torch.equal(target.storage[key], tensor), key
    a = source.sample(torch.Generator().manual_seed(5))
    b = target.sample(torch.Generator().manual_seed(5))
    for x, y in zip(tree_leaves(a), tree_leaves(b)):
        assert torch.equal(x, y)


def test_a_state_that_does_not_fit_raises(market):
    full = _buffer(market, 10)
    full.add(**_transitions(13, market.num_assets))
    small = _buffer(market, 8)
    with pytest.raises(ValueError):  # 10 transitions in a ring of 8
        small.load_state_(full.state())
    other = make_market(num_assets=5)
    with pytest.raises(ValueError):  # N + 1 = 6 weights where the buffer holds 5
        _buffer(other, 10).load_state_(full.state())
    with pytest.raises(ValueError):
        _buffer(market, 10).load_state_(full.state()._replace(pos=10))


def test_a_wrapped_ring_does_not_fit_a_bigger_one(market):
    """A full ring of 10 whose oldest transition sits at pos 3 is no partial ring of 20 (there pos == size)."""
    full = _buffer(market, 10)
    full.add(**_transitions(13, market.num_assets))
    bigger = _buffer(market, 20)
    with pytest.raises(ValueError):
        bigger.load_state_(full.state())


def test_sample_is_seeded_and_reuses_its_buffers(market):
    buffer = _buffer(market, 50, sample_shape=(3, 4))
    buffer.add(**_transitions(40, market.num_assets))
    first = buffer.sample(torch.Generator().manual_seed(11))
    first_values = [t.clone() for t in tree_leaves(first)]
    pointers = (first.obs.windows.data_ptr(), first.next_obs.windows.data_ptr())
    assert first.obs.windows.shape == (3, 4, market.num_assets, LOOKBACK * market.num_features)
    again = buffer.sample(torch.Generator().manual_seed(11))
    for x, y in zip(first_values, tree_leaves(again)):
        assert torch.equal(x, y)
    other = buffer.sample(torch.Generator().manual_seed(12))
    assert (other.obs.windows.data_ptr(), other.next_obs.windows.data_ptr()) == pointers
    assert not torch.equal(other.rewards, first_values[3])  # the leaves: windows, weights, actions, rewards, ...
    with pytest.raises(RuntimeError):
        _buffer(market, 5).sample(torch.Generator().manual_seed(0))


@pytest.mark.parametrize("count", [0, 6, 33, 77], ids=["empty", "one-segment", "partial", "wrapped"])
def test_buffer_groups_round_trip_in_segments(market, count):
    source = _buffer(market, 40)  # SEGMENTS rows of ceil(40 / 16) = 3
    source.add(**_transitions(count, market.num_assets))
    groups = buffer_groups(source.state(), capacity=source.capacity)
    segments = sorted(name for name in groups if name.startswith("replay-"))
    assert segments == [f"replay-{i:03d}" for i in range(-(-source.size // 3))]
    assert all(len(groups[name]["days"]) == 3 for name in segments[:-1])
    target = _buffer(market, 40)
    target.add(**_transitions(9, market.num_assets, first=100))  # stale content must not survive the load
    copies = {name: {k: v.clone() for k, v in group.items()} for name, group in groups.items()}
    target.load_state_(buffer_from_groups(copies))
    assert (target.size, target.pos) == (source.size, source.pos)
    for key, tensor in source.storage.items():
        assert torch.equal(target.storage[key], tensor), key


def test_a_new_transition_changes_only_the_segment_it_lands_in(market):
    ring = _buffer(market, 40)
    ring.add(**_transitions(40, market.num_assets))  # full, next write at row 0
    before = buffer_groups(ring.state(), capacity=ring.capacity)
    before = {name: {k: v.clone() for k, v in group.items()} for name, group in before.items()}
    ring.add(**_transitions(4, market.num_assets, first=500))  # rows 0..3: segments 0 and 1
    after = buffer_groups(ring.state(), capacity=ring.capacity)
    changed = {name for name in after if not all(torch.equal(after[name][k], before[name][k]) for k in after[name])}
    assert changed == {"replay", "replay-000", "replay-001"}


def test_checkpoints_that_hold_the_ring_in_one_group_still_load(market):
    source = _buffer(market, 10)
    source.add(**_transitions(13, market.num_assets))
    target = _buffer(market, 10)
    whole = {key: tensor[: source.size] for key, tensor in source.storage.items()}  # the group of earlier versions
    whole |= {"pos": torch.tensor(source.pos), "size": torch.tensor(source.size)}
    target.load_state_(buffer_from_groups({"replay": whole}))
    for key, tensor in source.storage.items():
        assert torch.equal(target.storage[key], tensor), key


def test_a_missing_segment_does_not_fit(market):
    source = _buffer(market, 40)
    source.add(**_transitions(20, market.num_assets))
    groups = buffer_groups(source.state(), capacity=source.capacity)
    del groups["replay-002"]
    with pytest.raises(ValueError):
        _buffer(market, 40).load_state_(buffer_from_groups(groups))


@pytest.mark.parametrize("delay", [0, 1, 3])
@pytest.mark.parametrize("masked", [False, True], ids=["every-asset-trades", "some-do-not"])
@pytest.mark.parametrize("book", ["long_only", "long_short_sized"])
def test_a_replayed_transition_gives_back_the_reward_the_environment_paid(delay, masked, book):
    """The learner's model objective recomputes a transition's reward from what the buffer gives back (the weights
    the agent saw, the fill day's and the next day's relatives, which assets could trade at the fill, and, with a
    volume column, each asset's impact and capacity at the fill): for the action taken, that is the reward the
    environment paid, whatever the execution delay, the universe and the book (its limits and borrow)."""
    import dataclasses

    from config import EnvConfig
    from environment.book import LONG_ONLY, Book
    from environment.kernel import trade

    market = make_market(seed=7)
    if masked:
        tradable = torch.rand(market.num_days, market.num_assets, generator=torch.Generator().manual_seed(1)) > 0.2
        market = dataclasses.replace(market, tradable=tradable)
    terms = LONG_ONLY
    if book == "long_short_sized":
        terms = Book.from_env(EnvConfig(book="long_short", borrow_rate=0.3, gross_leverage=1.6))
        sizes = torch.Generator().manual_seed(2)
        market = dataclasses.replace(
            market,
            impact=0.05 * torch.rand(market.num_days, market.num_assets, generator=sizes),
            capacity=0.3 * torch.rand(market.num_days, market.num_assets, generator=sizes),
        )
    agents, episodes, days = 2, 3, 8
    env = VectorPortfolioEnv(
        market,
        num_agents=agents,
        num_episodes=episodes,
        episode_days=days,
        lookback=LOOKBACK,
        cost_rate=0.002,
        execution_delay=delay,
        book=terms,
    )
    buffer = ReplayBuffer(
        agents * episodes * days,
        market,
        lookback=LOOKBACK,
        execution_delay=delay,
        held_days=terms.rebalance_every,
        sample_shape=(agents, episodes * days),
    )
    g = torch.Generator().manual_seed(0)
    obs = env.reset(torch.tensor([LOOKBACK - 1, 40, 150]))
    while obs is not None:
        actions = random_simplex(agents, episodes, market.num_assets + 1, generator=g)
        if terms.long_short:  # signed targets, some beyond the limits
            actions = terms.weights(3 * torch.randn(agents, episodes, market.num_assets + 1, generator=g))
        step, obs = env.step(actions)
        buffer.add(**step._asdict(), terminated=False)
    batch = buffer.gather(torch.arange(agents * episodes * days).view(agents, -1))
    assert (batch.fill.drift is None) == (delay == 0) and (batch.fill.tradable is None) == (not masked)
    assert (batch.held is not None) == (masked and delay >= 2)
    assert (batch.fill.impact is None) == (book == "long_only")
    held = batch.obs.weights if batch.held is None else batch.held
    again = trade(held, batch.actions, batch.fill, cost_rate=0.002, book=terms)
    torch.testing.assert_close(again.rewards, batch.rewards, rtol=0, atol=1e-6)
    seen = again.next_weights if batch.held is None else batch.actions  # the order as it filled, or as it was sent
    torch.testing.assert_close(seen, batch.next_obs.weights)  # the state the next decision saw
    if terms.long_short:
        assert float(again.fees.max()) > 0 and float(again.impact.max()) > 0
