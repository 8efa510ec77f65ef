"""The append-only metrics file: one JSON object per line, durable line by line.

A row counts once its newline is on disk. A crash mid-write leaves a trailing partial line: ``read_rows`` ignores
it and the next ``append_row`` cuts it off before writing. Non-finite floats (a diverged loss) are written as
``null``, so every line is strict JSON that ``jq`` or pandas can read; ``NaN`` and ``Infinity`` do not come back.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from utils.errors import CheckpointError

_SCAN_CHUNK = 64 * 1024


def finite_or_null(value: Any) -> Any:
    """``value`` with every non-finite float (in nested dicts and lists too) replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def committed_length(f, end: int) -> int:
    """The length of the file up to and including its last newline (0 if it has none)."""
    pos = end
    while pos > 0:
        start = max(0, pos - _SCAN_CHUNK)
        f.seek(start)
        newline = f.read(pos - start).rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        pos = start
    return 0


def encode_row(row: dict) -> bytes:
    """One row as the JSON line ``append_row`` writes (non-finite floats as ``null``)."""
    if not isinstance(row, dict):
        raise TypeError(f"a metrics row must be a dict, got {type(row).__name__}")
    return (json.dumps(finite_or_null(row), allow_nan=False, separators=(",", ":")) + "\n").encode()


def append_row(path: Path, row: dict) -> None:
    """Append one row as a JSON line, flushed and fsynced; a trailing partial line from a crash is cut off first.

    Non-finite floats become ``null``. Raises ``TypeError`` for values ``json`` cannot encode.
    """
    append_rows(path, [row])


def append_rows(path: Path, rows: list[dict]) -> None:
    """Append rows as JSON lines in order, in one write and one fsync, as ``append_row`` appends one."""
    lines = b"".join(encode_row(row) for row in rows)
    with open(path, "a+b") as f:
        end = f.seek(0, os.SEEK_END)
        if end > 0:
            f.seek(end - 1)
            if f.read(1) != b"\n":
                f.truncate(committed_length(f, end))
        f.write(lines)  # "a" mode: always at the end, whatever the read position
        f.flush()
        os.fsync(f.fileno())


def read_rows(path: Path) -> list[dict]:
    """Every complete row, in order; a trailing partial line is ignored and a missing file gives [].

    Raises:
        CheckpointError: A complete line that is not a JSON object (the file is corrupt).
    """
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return []
    rows = []
    for number, raw in enumerate(data.split(b"\n")[:-1], start=1):  # the last piece is a partial line, or empty
        try:
            row = json.loads(raw)
        except ValueError as err:
            raise CheckpointError(f"{path} line {number} is not valid JSON: {err}") from None
        if not isinstance(row, dict):
            raise CheckpointError(f"{path} line {number} is not a JSON object")
        rows.append(row)
    return rows
