"""What a checkpoint records of where it came from: the device that wrote it and the market data it was trained on.

A resume compares both with the present: other data is refused (``market_fingerprint``), another device is allowed
with a note, since bit-exact continuation holds only on the same kind (``device_change_note``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from environment.market import Market, Splits


def describe_device(device: torch.device) -> dict[str, str]:
    """What a checkpoint records of the machine that wrote it: bit-exact resume holds only on the same kind."""
    described = {"type": device.type, "torch": torch.__version__}
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        described |= {
            "name": torch.cuda.get_device_name(device),
            "capability": f"{major}.{minor}",
            "cuda": str(torch.version.cuda),
        }
    return described


def device_change_note(written: dict[str, Any] | None, current: dict[str, str]) -> str | None:
    """One line when the device that wrote a checkpoint differs from this one (the run continues), else None."""
    if written == current:
        return None
    if written is None:
        return (
            "note: the checkpoint does not record the device that wrote it: "
            "the run goes on, bit for bit only if it was this kind"
        )

    def name(described: dict[str, Any]) -> str:
        parts = [str(described.get("name") or described.get("type"))]
        if described.get("capability"):
            parts.append(f"compute {described['capability']}, CUDA {described.get('cuda')}")
        parts.append(f"torch {described.get('torch')}")
        return ", ".join(parts)

    return (
        f"note: the checkpoint was written on {name(written)}; continuing on {name(current)}: "
        "the run goes on, but not bit for bit as it would have on the first"
    )


def _splits_text(splits: Splits) -> str:
    """The splits as the fingerprint reads them: without an embargo, as written before one could exist."""
    if len(splits.embargo):
        return repr(splits)
    ranges = f"train={splits.train!r}, validation={splits.validation!r}, holdout={splits.holdout!r}, gap={splits.gap!r}"
    return f"Splits({ranges})"


def market_fingerprint(market: Market) -> str:
    """SHA-256 of everything the trainer reads from the market: a resumed run must see the same data. (The days each
    asset trades and what cash earns count where they say something: a market where all trade every day and cash
    earns nothing has the fingerprint it had before either existed. The benchmark is the reports' alone.)"""
    digest = hashlib.sha256()
    tensors = (market.features, market.relatives, market.tradable, market.cash_relatives)
    for tensor in (t for t in tensors if t is not None):
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    digest.update("\n".join(market.tickers + market.dates + market.feature_names).encode())
    digest.update(_splits_text(market.splits).encode())
    return digest.hexdigest()
