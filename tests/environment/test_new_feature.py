"""A new input touches ``environment/`` alone: the features are named there and nowhere else in the product, and a
feature added to ``environment.features.BUILT_IN_FEATURES`` is trained on, evaluated and exported with nothing else
changed."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import main
from environment.features import BUILT_IN_FEATURES, FEATURE_NAMES, BuiltInFeature

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("main.py", "config", "models", "runtime", "persistence", "training", "offline", "utils")


def test_no_module_outside_the_environment_names_a_feature():
    named = []
    for root in PRODUCT:
        for path in sorted((REPO / root).rglob("*.py")) if (REPO / root).is_dir() else [REPO / root]:
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    named += [f"{path.relative_to(REPO)}: {name}" for name in FEATURE_NAMES if name in node.value]
    assert not named, "\n".join(named)


def _range(prices: pd.DataFrame) -> pd.DataFrame:
    """The log of the highest over the lowest price of the last 10 days."""
    return np.log(prices.rolling(10).max() / prices.rolling(10).min())


@pytest.mark.slow
def test_a_feature_added_to_the_environment_is_trained_evaluated_and_exported(monkeypatch, tmp_path, capsys):
    definition = "log(max / min) of the last 10 prices"
    monkeypatch.setitem(BUILT_IN_FEATURES, "range_10d", BuiltInFeature(definition, _range, 10))
    run = ["--preset", "smoke", "--generations", "1", "--checkpoint-uri", str(tmp_path), "--run-name", "r"]
    run += ["--no-progress", "--device", "cpu", "--set", "data.features=builtin,range_10d"]
    assert main.main(run) == 0
    assert "features builtin,range_10d" in capsys.readouterr().out
    assert main.main(["export", str(tmp_path / "r"), str(tmp_path / "export")]) == 0
    spec = json.loads((tmp_path / "export" / "actor.json").read_text())
    assert spec["feature_names"] == [*FEATURE_NAMES, "range_10d"]
    assert spec["feature_definitions"]["range_10d"] == definition
    assert spec["observation"]["windows"]["shape"][1] == spec["lookback"] * (len(FEATURE_NAMES) + 1)
    assert main.main(["evaluate", str(tmp_path / "export"), "--json", "--out", str(tmp_path / "evaluation")]) == 0
    evaluation = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert evaluation["conventions"]["features"] == ["builtin", "range_10d"]
