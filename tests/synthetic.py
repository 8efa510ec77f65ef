"""Synthetic markets for the tests (no downloads)."""

from __future__ import annotations

import torch

from environment.kernel import Fill
from environment.market import Market, Splits


def make_market(
    *,
    num_days: int = 400,
    num_assets: int = 4,
    num_features: int = 3,
    train_days: int = 250,
    validation_days: int = 75,
    seed: int = 0,
) -> Market:
    """A random Market built directly (no price file): features ~ N(0, 1), daily moves of about 1%."""
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(num_days, num_assets, num_features, generator=g)
    relatives = (1 + 0.01 * torch.randn(num_days, num_assets, generator=g)).clamp(min=0.5)
    relatives[0] = 1.0
    splits = Splits(
        train=range(0, train_days),
        validation=range(train_days, train_days + validation_days),
        holdout=range(train_days + validation_days, num_days),
    )
    return Market(
        dates=tuple(f"d{i}" for i in range(num_days)),
        tickers=tuple(f"A{i}" for i in range(num_assets)),
        feature_names=tuple(f"f{i}" for i in range(num_features)),
        features=features,
        relatives=relatives,
        splits=splits,
    )


def make_population(
    popsize: int,
    window_size: int,
    *,
    seed: int = 0,
    width: int = 4,
    slots: range | None = None,
    model=None,
    **learning,
):
    """A small Population on the CPU (``slots``: the ones held here of a split population; ``model``:
    its networks' ``ModelConfig``, by default all ``width`` wide; ``learning``: ``LearnerConfig`` fields)."""
    from config import LearnerConfig, ModelConfig
    from models.learner import Learner
    from models.population import Population
    from models.share import Share

    generator = torch.Generator().manual_seed(seed)
    share = Share(popsize, slots) if slots is not None else Share.whole(popsize)
    learner = Learner(
        share.agents,
        window_size,
        model or ModelConfig(encoder_hidden=width, embedding=width, head_hidden=width),
        LearnerConfig(**{"actor_lr": 1e-3, "critic_lr": 1e-3, **learning}),
        device="cpu",
        cost_rate=0.0,
        generator=generator,
        share=share,
    )
    return Population(popsize, learner, generator=generator)


def random_simplex(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """Random points on the simplex of the last dimension."""
    return torch.softmax(2 * torch.randn(*shape, generator=generator), dim=-1)


def replay_batch(
    agents: int,
    size: int,
    assets: int,
    window: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    terminated: float = 0.0,
    truncated: float = 0.0,
    execution_delay: int = 0,
):
    """A replay batch built by hand, (agents, size) transitions of ``assets`` assets and windows of ``window`` values:
    random windows, weights on the simplex, small rewards and price relatives near 1 (the fill day's too, with an
    ``execution_delay``); every transition's end flags as given."""
    from environment.observation import Observation
    from models.replay import ReplayBatch

    g = torch.Generator().manual_seed(seed)
    shape = (agents, size)
    windows = torch.randn(*shape, assets, window, generator=g)  # (P, B, N, L * K)
    weights = random_simplex(*shape, assets + 1, generator=g)  # (P, B, N + 1)
    actions = random_simplex(*shape, assets + 1, generator=g)
    rewards = torch.randn(*shape, generator=g) * 0.1  # (P, B)
    next_windows = torch.randn(*shape, assets, window, generator=g)
    next_weights = random_simplex(*shape, assets + 1, generator=g)
    next_relatives = torch.cat([torch.ones(*shape, 1), 1 + 0.02 * torch.randn(*shape, assets, generator=g)], dim=-1)
    fill_relatives = None
    if execution_delay:
        fill_relatives = torch.cat([torch.ones(*shape, 1), 1 + 0.02 * torch.randn(*shape, assets, generator=g)], -1)
    return ReplayBatch(
        obs=Observation(windows.to(dtype), weights.to(dtype)),
        actions=actions.to(dtype),
        rewards=rewards.to(dtype),
        next_obs=Observation(next_windows.to(dtype), next_weights.to(dtype)),
        terminated=torch.full(shape, terminated, dtype=dtype),
        truncated=torch.full(shape, truncated, dtype=dtype),
        fill=Fill(next_relatives.to(dtype), None if fill_relatives is None else fill_relatives.to(dtype)),
    )


def momentum_prices(*, num_days: int = 1100, num_assets: int = 4, persistence: float = 0.9, seed: int = 0):
    """Prices where one "hot" asset rises each day and usually stays hot the next day.

    The hot asset gains about 1% a day, the others lose about 0.2%, with 0.5% noise; each day the hot
    asset stays the same with probability ``persistence``. Today's one-day return reveals it, so a
    policy that reads its features can hold tomorrow's best asset most days.

    Returns:
        A wide pandas DataFrame with a ``Date`` column and one price column per asset.
    """
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    hot = np.zeros(num_days, dtype=int)
    for t in range(1, num_days):
        hot[t] = hot[t - 1] if rng.random() < persistence else rng.integers(num_assets)
    log_returns = rng.normal(-0.002, 0.005, size=(num_days, num_assets))
    log_returns[np.arange(num_days), hot] += 0.012
    prices = 100 * np.exp(np.cumsum(log_returns, axis=0))
    frame = pd.DataFrame(prices, columns=[f"S{i}" for i in range(num_assets)])
    frame.insert(0, "Date", pd.bdate_range("2000-01-03", periods=num_days).strftime("%Y-%m-%d"))
    return frame
