"""Synthetic markets for the tests (no downloads)."""

from __future__ import annotations

import torch

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


def random_simplex(*shape: int, generator: torch.Generator) -> torch.Tensor:
    """Random points on the simplex of the last dimension."""
    return torch.softmax(2 * torch.randn(*shape, generator=generator), dim=-1)
