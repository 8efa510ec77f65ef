"""Fitness blocks: the training days evolution selects on are days no gradient fits, with an embargo around them."""

from __future__ import annotations

import pytest
import torch

from training.fitness import fitness, split_training_days

TRAIN, EPISODE = range(0, 2000), 21


def earned(starts: torch.Tensor, *, delay: int) -> set[int]:
    """Every day an episode from each start earns."""
    return {int(s) + delay + 1 + k for s in starts for k in range(EPISODE)}


@pytest.mark.parametrize("delay", [0, 1])
@pytest.mark.parametrize("embargo", [0, 26])
def test_no_learning_episode_comes_near_a_fitness_block(delay, embargo):
    starts = split_training_days(
        TRAIN, lookback=1, episode_days=EPISODE, every=4, execution_delay=delay, embargo=embargo
    )
    fitness_days = earned(starts.fitness, delay=delay)
    # Each fitness episode trades exactly a block: every fourth block of episode_days training days.
    blocks = {(int(s) + delay + 1) // EPISODE for s in starts.fitness}
    assert all((int(s) + delay + 1) % EPISODE == 0 for s in starts.fitness) and all(b % 4 == 3 for b in blocks)
    # No learning episode earns a fitness day, nor (with an embargo) one within `embargo` days of one.
    nearest = min(abs(a - b) for a in earned(starts.learning, delay=delay) for b in fitness_days)
    assert nearest > embargo
    if embargo:  # and the embargo is no wider than asked: some learning day lies just outside it
        assert nearest == embargo + 1
    assert len(starts.learning) > 0


def test_the_embargo_costs_learning_starts_and_nothing_else():
    plain = split_training_days(TRAIN, lookback=1, episode_days=EPISODE, every=4, execution_delay=1)
    apart = split_training_days(TRAIN, lookback=1, episode_days=EPISODE, every=4, execution_delay=1, embargo=26)
    assert torch.equal(plain.fitness, apart.fitness)
    assert set(apart.learning.tolist()) < set(plain.learning.tolist())


def test_fitness_of_episode_returns():
    returns = torch.tensor([[0.1, 0.3, -0.2], [0.0, 0.0, 0.0]])
    torch.testing.assert_close(fitness(returns, kind="mean_log_return", worst_k=2), torch.tensor([0.2 / 3, 0.0]))
    torch.testing.assert_close(fitness(returns, kind="worst_k", worst_k=2), torch.tensor([-0.05, 0.0]))
