"""History and report plots: PNG files of a fixed size, drawn without pyplot."""

from __future__ import annotations

import ast
import datetime
import io
import math
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest

from offline.plots import (
    HISTORY_SIZE_PX,
    REPORT_SIZE_PX,
    SeriesPanel,
    WeightsPanel,
    plot_drawdowns,
    plot_equity,
    plot_history,
    plot_lines,
    plot_weights,
)

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
    tree = ast.parse((REPO / "offline" / "plots.py").read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
    assert not any(name.split(".")[0] in ("environment", "models", "training") for name in imported)
    code = (
        "import sys; from offline.plots import plot_history; "
        f"plot_history({str(tmp_path / 'p.png')!r}, generations=[1], best_fitness=[1.0], mean_fitness=[0.5], "
        "worst_fitness=[0.0], validation_best=[0.2], champion_score=[0.2], title='t'); "
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def iso_dates(n: int) -> list[str]:
    start = datetime.date(2021, 1, 4)
    return [(start + datetime.timedelta(days=i)).isoformat() for i in range(n)]


def equity_panel(title: str, n: int) -> SeriesPanel:
    return SeriesPanel(
        title=title,
        dates=iso_dates(n),
        series={
            "champion": [1.0 + 0.01 * t for t in range(n)],
            "buy and hold": [1.0 + 0.02 * math.sin(t) for t in range(n)],
            "cash": [1.0] * n,
        },
    )


def drawdown_panel(title: str, n: int) -> SeriesPanel:
    return SeriesPanel(
        title=title,
        dates=iso_dates(n),
        series={"champion": [0.1 * (t % 3) for t in range(n)], "cash": [0.0] * n, "gap": [None] * n},
    )


def weights_panel(title: str, n: int, columns: int) -> WeightsPanel:
    labels = ["cash", *(f"T{i:02d}" for i in range(columns - 1))]
    return WeightsPanel(title=title, dates=iso_dates(n), labels=labels, weights=[[1.0 / columns] * columns] * n)


def report_plots(n: int):
    """(function, panels) of each report plot, every figure with a long, a one-day and an n-day panel."""
    return [
        (plot_equity, [equity_panel("test", 300), equity_panel("one day", 1), equity_panel("n", n)]),
        (plot_drawdowns, [drawdown_panel("test", 300), drawdown_panel("one day", 1), drawdown_panel("n", n)]),
        (plot_weights, [weights_panel("21 labels", 300, 21), weights_panel("one day", 1, 3), weights_panel("n", n, 5)]),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("which", [0, 1, 2], ids=["equity", "drawdowns", "weights"])
@pytest.mark.parametrize("length", [0, 2, 60])
def test_report_plots_write_a_png_of_the_stated_size(tmp_path, which, length):
    function, panels = report_plots(length)[which]
    path = tmp_path / "report.png"
    function(path, panels, title="run r")
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width, channels = matplotlib.image.imread(path).shape
    assert (width, height) == REPORT_SIZE_PX and channels in (3, 4)


def test_a_single_panel_and_a_missing_highlight_are_drawn(tmp_path):
    plot_equity(tmp_path / "e.png", [equity_panel("only", 10)], title="t", highlight="nobody")
    plot_drawdowns(tmp_path / "d.png", [drawdown_panel("only", 10)], title="t", highlight="cash")
    height, width, _ = matplotlib.image.imread(tmp_path / "d.png").shape
    assert (width, height) == REPORT_SIZE_PX


def test_lines_go_into_a_file_object_at_the_size_asked(tmp_path):
    """The tear sheet draws into memory at its own size: rolling ratios with gaps before a full window."""
    buffer = io.BytesIO()
    rolling = SeriesPanel("63-day window", iso_dates(40), {"champion": [None] * 10 + [0.1 * t for t in range(30)]})
    plot_lines(buffer, [rolling, rolling], title="t", ylabel="Sharpe ratio", size_px=(800, 500))
    assert buffer.getvalue()[:8] == PNG_MAGIC
    height, width, _ = matplotlib.image.imread(io.BytesIO(buffer.getvalue())).shape
    assert (width, height) == (800, 500)
    plot_equity(tmp_path / "e.png", [equity_panel("only", 10)], title="t", size_px=(1000, 380))
    height, width, _ = matplotlib.image.imread(tmp_path / "e.png").shape
    assert (width, height) == (1000, 380)
    with pytest.raises(ValueError, match="finite"):
        bad = SeriesPanel("bad", iso_dates(2), {"a": [0.0, math.inf]})
        plot_lines(tmp_path / "x.png", [bad], title="t", ylabel="y")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    ("function", "panels", "message"),
    [
        (plot_equity, [], "no panels"),
        (plot_drawdowns, [], "no panels"),
        (plot_weights, [], "no panels"),
        (plot_equity, [equity_panel("ok", 3), SeriesPanel("bad", iso_dates(3), {"a": [1.0, 1.1]})], "2 values"),
        (plot_drawdowns, [SeriesPanel("bad", iso_dates(2), {"a": [0.0, 0.1, 0.2]})], "3 values for 2 dates"),
        (plot_equity, [SeriesPanel("bad", ["2021-01-04", "04/01/2021"], {"a": [1.0, 1.1]})], "ISO"),
        (plot_equity, [SeriesPanel("bad", iso_dates(2), {"a": [1.0, 0.0]})], "positive"),
        (plot_drawdowns, [SeriesPanel("bad", iso_dates(2), {"a": [0.0, -0.1]})], ">= 0"),
        (plot_weights, [WeightsPanel("bad", iso_dates(2), ["cash", "A"], [[0.5, 0.5]])], "1 rows of weights"),
        (plot_weights, [WeightsPanel("bad", iso_dates(2), ["cash", "A"], [[0.5, 0.5], [1.0]])], "one value per label"),
    ],
)
def test_bad_report_input_is_refused_and_writes_nothing(tmp_path, function, panels, message):
    with pytest.raises(ValueError, match=message):
        function(tmp_path / "x.png", panels, title="t")
    assert not (tmp_path / "x.png").exists()


def test_report_plots_use_no_pyplot(tmp_path):
    code = (
        "import sys; from offline.plots import SeriesPanel, WeightsPanel, plot_drawdowns, plot_equity, plot_weights; "
        "d = ['2021-01-04', '2021-01-05']; "
        f"plot_equity({str(tmp_path / 'e.png')!r}, [SeriesPanel('p', d, {{'champion': [1.0, 1.1]}})], title='t'); "
        f"plot_drawdowns({str(tmp_path / 'd.png')!r}, [SeriesPanel('p', d, {{'champion': [0.0, 0.1]}})], title='t'); "
        f"plot_weights({str(tmp_path / 'w.png')!r}, [WeightsPanel('p', d, ['cash', 'A'], [[1, 0], [0.5, 0.5]])], "
        "title='t'); "
        "assert 'matplotlib.pyplot' not in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert all((tmp_path / name).exists() for name in ("e.png", "d.png", "w.png"))
