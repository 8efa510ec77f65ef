"""The append-only metrics file: durable rows, crash tails, truncation for resume."""

from __future__ import annotations

import json

import pytest

from persistence.jsonl import append_row, read_rows
from utils.errors import CheckpointError


def test_append_and_read_round_trip(tmp_path):
    path = tmp_path / "metrics.jsonl"
    assert read_rows(path) == []
    rows = [{"generation": 0, "charts/sps": 1234.5, "tags": ["a", "b"]}, {"generation": 1, "nested": {"x": None}}]
    for row in rows:
        append_row(path, row)
    assert read_rows(path) == rows
    assert path.read_text().count("\n") == 2
    with pytest.raises(TypeError):
        append_row(path, [1, 2])


def test_non_finite_floats_become_null(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_row(path, {"losses/critic": float("nan"), "best": [float("inf"), -float("inf"), 1.0]})
    line = path.read_text()
    json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert read_rows(path) == [{"losses/critic": None, "best": [None, None, 1.0]}]


def test_trailing_partial_line_is_ignored_then_cut_off(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_row(path, {"generation": 0})
    with open(path, "ab") as f:
        f.write(b'{"generation": 1, "charts/')  # a crash mid-write
    assert read_rows(path) == [{"generation": 0}]

    append_row(path, {"generation": 1})
    assert read_rows(path) == [{"generation": 0}, {"generation": 1}]
    assert path.read_bytes().endswith(b'{"generation":0}\n{"generation":1}\n')


def test_partial_first_line_is_cut_off(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"generation": 0' + b" " * 100_000)  # no newline at all, longer than one scan chunk
    assert read_rows(path) == []
    append_row(path, {"generation": 0})
    assert path.read_bytes() == b'{"generation":0}\n'


def test_corrupt_complete_line_is_an_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(b'{"generation": 0}\nnot json\n{"generation": 1}\n')
    with pytest.raises(CheckpointError, match="line 2"):
        read_rows(path)
    path.write_bytes(b"[1, 2]\n")
    with pytest.raises(CheckpointError, match="line 1"):
        read_rows(path)
