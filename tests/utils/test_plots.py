"""History plots: PNG files of a fixed size, drawn without pyplot."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from utils.plots import HISTORY_SIZE_PX, plot_history

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def history(n: int) -> dict:
    return {
        "generations": list(range(1, n + 1)),
        "best_fitness": [0.01 * g for g in range(n)],
        "mean_fitness": [0.005 * g for g in range(n)],
        "worst_fitness": [None if g == 1 else -0.01 * g for g in range(n)],  # a null from a diverged run
        "validation_best": [0.02 * g for g in range(n)],
        "champion_score": [0.02 * g for g in range(n)],
    }


@pytest.mark.parametrize("length", [0, 1, 40])
def test_plot_history_writes_a_png_of_the_stated_size(tmp_path, length):
    path = tmp_path / "history.png"
    plot_history(path, **history(length), title="run r")
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width, channels = matplotlib.image.imread(path).shape
    assert (width, height) == HISTORY_SIZE_PX and channels in (3, 4)


def test_series_of_different_lengths_are_refused(tmp_path):
    values = history(3)
    values["champion_score"] = values["champion_score"][:2]
    with pytest.raises(ValueError, match="one value per generation"):
        plot_history(tmp_path / "x.png", **values, title="t")
    assert not (tmp_path / "x.png").exists()


def test_plots_use_no_pyplot_and_import_nothing_from_the_trainer(tmp_path):
    tree = ast.parse((REPO / "utils" / "plots.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not any(name.split(".")[0] in ("environment", "models", "training") for name in imported)
    code = (
        "import sys; from utils.plots import plot_history; "
        f"plot_history({str(tmp_path / 'p.png')!r}, generations=[1], best_fitness=[1.0], mean_fitness=[0.5], "
        "worst_fitness=[0.0], validation_best=[0.2], champion_score=[0.2], title='t'); "
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
