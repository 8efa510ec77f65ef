"""Fixtures shared by the tests; the builders behind them live in tests/synthetic.py."""

from __future__ import annotations

import pytest

from environment.market import Market
from tests.synthetic import make_market


@pytest.fixture
def market() -> Market:
    return make_market()
