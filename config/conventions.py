"""How a run trades and what it sees, in the words its reports state them: the settings its figures rest on."""

from __future__ import annotations

from typing import Any

from config.sections import Config, EnvConfig


def conventions(config: Config) -> dict[str, Any]:
    """How a run trades and what it sees, the settings its figures rest on, as its reports state them."""
    data, env = config.data, config.env
    return {
        "execution_delay": env.execution_delay,
        "universe": data.universe,
        "features": list(data.features) or ["builtin"],
        "cash": data.risk_free or env.cash_rate,
        "benchmark": data.benchmark or ("bundled" if not data.path else None),
        "delisting_return": data.delisting_return,
        "book": describe_book(env),
    }


def describe_book(env: EnvConfig) -> str:
    """The book a run trades, its limits, holding costs, cadence and size, in a few words (``environment.book``)."""
    cadence = "daily" if env.rebalance_every == 1 else f"every {env.rebalance_every} trading days"
    size = f"trades sized at {env.capital:,.0f} against a volume column where the file has one"
    if env.book == "long_only":
        cap = "" if env.weight_cap >= 1.0 else f", at most {env.weight_cap:g} an asset"
        return f"long-only{cap}, rebalanced {cadence}, {size}"
    low, high = env.net_exposure
    return (
        f"long-short: gross <= {env.gross_leverage:g}, net in [{low:g}, {high:g}], at most {env.weight_cap:g} "
        f"an asset, borrow {env.borrow_rate * 100:g}%/y, leverage pays cash + {env.financing_spread * 100:g}%/y, "
        f"rebalanced {cadence}, {size}"
    )


def describe_conventions(values: dict[str, Any]) -> str:
    """``conventions`` in one line."""
    delay = values["execution_delay"]
    fills = (
        "fills at the close it observed (execution_delay 0: optimistic)"
        if delay == 0
        else f"fills {delay} trading day{'s' if delay > 1 else ''} after the decision"
    )
    cash = values["cash"]
    earns = f"cash earns {cash * 100:g}%/y" if isinstance(cash, (int, float)) else f"cash earns {cash}"
    features = ",".join(values["features"])
    line = f"{fills} | universe {values['universe']} | features {features} | {earns}"
    if values["universe"] == "point_in_time" and "delisting_return" in values:  # recorded since it existed
        line += f" | a delisting pays {values['delisting_return'] * 100:g}% where the file gives no return"
    if "book" in values:  # recorded since it existed
        line += f" | {values['book']}"
    return line
