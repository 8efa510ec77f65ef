"""``python main.py trade TARGET --data FILE``: a proven champion's orders for the next fill, from a data file that
ends on the last close.

The market is rebuilt from ``FILE`` as the run built its own, with the run's normalisation: the statistics come from
the same rows (the run's training range: ``FILE`` must hold the run's history unchanged, so they are the same rows,
bit for bit), the features are the run's, and everything a decision sees is known at the last close. The weights the
last decision sees are, by default, its own: the champion is replayed from cash from ``--since`` (a decision date;
default the first day after the run's data) through the file, trading as the run did (its delay, costs and book); or
they come from ``--holdings`` (a CSV of ticker and weight rows, ``cash`` among them, summing to 1).

Written: ``orders.csv`` (ticker, the weight the decision saw, the target, the trade as a fraction of the book, and the
close it is meant to fill at, ``env.execution_delay`` trading days after the last, as a business-day estimate).
``evaluate``'s ``weights.csv`` holds the same orders for the days it scored: the file cut after a day gives that day's
order (``tests/offline/test_trade.py``).

Refused in one line, writing nothing: a file whose history differs from the run's on the days both hold (a price
restated, a ticker gone or added), one that ends before the holdout's first decision (the days before it chose the
champion), features the run was not trained with, holdings that do not sum to 1 within 1e-6 or name other tickers.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from config import conventions, describe_conventions, override
from environment.loading import load_market
from environment.market import Market, first_decision
from environment.vector_env import VectorPortfolioEnv
from offline.evaluate import ChampionActor, describe_champion, load_champion
from utils.cli import parse_command
from utils.errors import DataError, InputError

ORDERS_FILE = "orders.csv"
HOLDINGS_TOLERANCE = 1e-6


@dataclasses.dataclass(frozen=True)
class Orders:
    tickers: tuple[str, ...]
    decided: str
    """The close the decision observed: the file's last day."""
    fills: str
    """The close the order is meant to fill at (``env.execution_delay`` trading days later, a business-day estimate)."""
    seen: np.ndarray
    """(N + 1,) the weights the decision saw, cash first."""
    target: np.ndarray
    """(N + 1,) the order, cash first."""
    rebalances: bool = True
    """Whether the last close is a decision day of the book's cadence (``env.rebalance_every``), counted from the
    replay's first decision: on any other the run would not trade, and neither should its user."""

    def rows(self) -> list[dict[str, Any]]:
        names = ("cash", *self.tickers)
        return [
            {
                "ticker": name,
                "current_weight": float(seen),
                "target_weight": float(target),
                "trade": float(target - seen),
                "fill_date": self.fills,
            }
            for name, seen, target in zip(names, self.seen, self.target, strict=True)
        ]


def market_from(champion: ChampionActor, data: str) -> Market:
    """The market of ``data`` with the run's inputs, checked against the run's history."""
    config = override(champion.config, {"data.path": data, "data.end": ""})
    run = champion.market
    fitted = len(run.splits.train)
    market = load_market(config, torch.device("cpu"), statistics_rows=fitted)
    if market.tickers != run.tickers:
        raise DataError(f"{data}: its tickers {', '.join(market.tickers)} are not the run's {', '.join(run.tickers)}")
    if market.feature_names != run.feature_names:
        raise DataError(
            f"{data}: gives the features {', '.join(market.feature_names)}, the run was trained with "
            f"{', '.join(run.feature_names)}"
        )
    shared = min(market.num_days, run.num_days)
    if market.dates[:shared] != run.dates[:shared]:
        day = next(i for i in range(shared) if market.dates[i] != run.dates[i])
        raise DataError(f"{data}: its trading days differ from the run's from {run.dates[day]} ({market.dates[day]})")
    same = torch.isclose(market.relatives[:shared], run.relatives[:shared], rtol=1e-6, atol=0.0)
    if not bool(same.all()):
        day, asset = (int(i) for i in torch.nonzero(~same)[0])
        raise DataError(
            f"{data}: the price of {run.tickers[asset]} on {run.dates[day]} differs from the run's data (restated?)"
        )
    seen = torch.isclose(market.features[:shared], run.features[:shared], rtol=1e-5, atol=1e-6)
    if not bool(seen.all()):  # a price of the features' warm-up, before the first return the run kept
        day, asset, _ = (int(i) for i in torch.nonzero(~seen)[0])
        raise DataError(
            f"{data}: the features of {run.tickers[asset]} on {run.dates[day]} differ from the run's: a price before "
            "it differs from the run's data (restated?)"
        )
    first_out = first_decision(run.splits.holdout, champion.config.env.execution_delay)
    if market.num_days - 1 < first_out:
        raise DataError(
            f"{data}: ends on {market.dates[-1]}, before {run.dates[first_out]}, the first decision out of sample "
            "(the days before it chose the champion)"
        )
    return market


def read_holdings(path: str, tickers: Sequence[str]) -> np.ndarray:
    """(N + 1,) weights, cash first, from a CSV of ``ticker,weight`` rows (``cash`` one of them)."""
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError, pd.errors.ParserError) as error:
        raise InputError(f"--holdings {path}: cannot be read ({error})") from None
    columns = {c.lower().strip(): c for c in frame.columns}
    if "ticker" not in columns or "weight" not in columns:
        raise InputError(f"--holdings {path}: needs the columns ticker and weight")
    names = [str(name).strip() for name in frame[columns["ticker"]]]
    weights = pd.to_numeric(frame[columns["weight"]], errors="coerce").to_numpy(dtype=np.float64)
    if np.isnan(weights).any() or not np.isfinite(weights).all():
        raise InputError(f"--holdings {path}: every weight must be a number")
    unknown = sorted(set(names) - {"cash", *tickers})
    if unknown or len(set(names)) != len(names):
        raise InputError(
            f"--holdings {path}: names {', '.join(unknown) or 'a ticker twice'}; the run trades cash and "
            f"{', '.join(tickers)}"
        )
    held = dict(zip(names, weights, strict=True))
    vector = np.array([held.get(name, 0.0) for name in ("cash", *tickers)])
    if abs(vector.sum() - 1.0) > HOLDINGS_TOLERANCE:
        raise InputError(f"--holdings {path}: the weights sum to {vector.sum():.9g}, not 1 (cash included)")
    return vector


def padded(market: Market, days: int) -> Market:
    """``market`` with ``days`` neutral days after its last (prices unchanged, every asset tradable): room for the
    environment to step the decisions whose fills come after the file; nothing a decision sees reads them."""

    def more(tensor: torch.Tensor | None, value: float | bool) -> torch.Tensor | None:
        if tensor is None:
            return None
        return torch.cat([tensor, torch.full((days, *tensor.shape[1:]), value, dtype=tensor.dtype)])

    return dataclasses.replace(
        market,
        dates=(*market.dates, *(f"after-{k}" for k in range(1, days + 1))),
        features=more(market.features, 0.0),
        relatives=more(market.relatives, 1.0),
        tradable=more(market.tradable, True),
        cash_relatives=more(market.cash_relatives, 1.0),
        benchmark=more(market.benchmark, 1.0),
        impact=more(market.impact, 0.0),
        capacity=more(market.capacity, 1.0),
    )


@torch.no_grad()
def next_orders(champion: ChampionActor, market: Market, *, since: str | None, holdings: np.ndarray | None) -> Orders:
    """The champion's order at the last close of ``market``, from the weights it saw (replayed from ``since`` or
    ``holdings``)."""
    config, actor = champion.config, champion.actor
    env_config = config.env
    delay = env_config.execution_delay
    last = market.num_days - 1
    run_end = champion.market.num_days  # the first day after the run's data
    if since is None:
        start = min(run_end, last)
    elif since not in market.dates:
        raise InputError(f"--since {since} is not a trading day of the file ({market.dates[0]} to {market.dates[-1]})")
    else:
        start = market.dates.index(since)
    if start < env_config.lookback - 1:  # its first window would reach before the data
        raise InputError(f"--since {market.dates[start]} is before the first day a decision can be made there")
    env = VectorPortfolioEnv.from_config(
        padded(market, delay + 1), env_config, num_agents=1, num_episodes=1, episode_days=last - start + 1
    )
    obs = env.reset(torch.tensor([start]))
    for _ in range(last - start):  # the decisions before the last, traded as the run trades
        obs = env.step(actor(obs))[1]
    if holdings is not None:
        obs = obs._replace(weights=torch.as_tensor(holdings, dtype=obs.weights.dtype).view(1, 1, -1))
    target = actor(obs)[0, 0]
    fills = market.dates[last]  # delay 0: that very close; later, a business-day estimate of the fill's close
    if delay:
        fills = (pd.Timestamp(fills) + pd.offsets.BDay(delay)).strftime("%Y-%m-%d")
    return Orders(
        tickers=market.tickers,
        decided=market.dates[last],
        fills=fills,
        seen=obs.weights[0, 0].double().numpy(),
        target=target.double().numpy(),
        rebalances=(last - start) % env_config.rebalance_every == 0,
    )


def write_orders(path: Path, orders: Orders) -> None:
    rows = orders.rows()
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})


def run(
    target: str,
    *,
    data: str,
    out: str | None,
    since: str | None,
    holdings: str | None,
    as_json: bool,
    log: Callable[[str], None] = print,
) -> Path:
    """Make, print and write the orders; returns ``orders.csv``'s path."""
    with tempfile.TemporaryDirectory(prefix="erl-trade-") as scratch:
        champion = load_champion(target, Path(scratch))
    market = market_from(champion, data)
    held = None if holdings is None else read_holdings(holdings, market.tickers)
    orders = next_orders(champion, market, since=since, holdings=held)
    folder = Path(out).expanduser() if out else Path(".")
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--out {folder} exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / ORDERS_FILE
    write_orders(path, orders)
    trading = describe_conventions(conventions(champion.config))
    if as_json:
        document = {
            "decided": orders.decided,
            "fills": orders.fills,
            "rebalances": orders.rebalances,
            "trading": trading,
            "orders": orders.rows(),
        }
        log(json.dumps(document, allow_nan=False))
        return path
    lines = [
        describe_champion(champion.source),
        f"trading: {trading}",
        f"orders decided at the close of {orders.decided}, to fill at the close of {orders.fills}"
        + (" (a business-day estimate)" if champion.config.env.execution_delay else "")
        + (
            ""
            if orders.rebalances
            else f"; not a decision day of the book's cadence (every {champion.config.env.rebalance_every} trading "
            "days from --since): the run would hold, not trade, today"
        ),
        f"{'ticker':<12}{'current':>10}{'target':>10}{'trade':>10}",
    ]
    for row in orders.rows():
        lines.append(
            f"{row['ticker']:<12}{row['current_weight']:>10.4f}{row['target_weight']:>10.4f}{row['trade']:>+10.4f}"
        )
    lines.append(f"written: {path}")
    log("\n".join(lines))
    return path


def main(argv: Sequence[str]) -> int:
    """``trade``'s command line; returns the exit status (InputError propagates to ``main.py``)."""
    args = parse_command(
        argv,
        "trade",
        "The champion's orders for the next fill from a data file that ends on the last close.",
        ("target", {"help": "a run folder, a generation folder or an exported actor (local or gs://)"}),
        ("--data", {"required": True, "help": "the price file, the run's history and the days since"}),
        ("--out", {"help": "folder for orders.csv (default: the current folder)"}),
        ("--since", {"help": "replay the champion from cash from this decision date (default: after the run's data)"}),
        ("--holdings", {"help": "a CSV of ticker,weight rows (cash among them) instead of the replay"}),
        ("--json", {"action": "store_true", "help": "print the orders as one JSON object"}),
    )
    if args.since is not None and args.holdings is not None:
        raise InputError("give --since or --holdings, not both")
    run(args.target, data=args.data, out=args.out, since=args.since, holdings=args.holdings, as_json=args.json)
    return 0
