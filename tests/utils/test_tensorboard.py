"""TensorBoard output: event files read back with TensorBoard's own reader; a clear error without the package."""

from __future__ import annotations

import ast
import math
import sys
import time
from pathlib import Path

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import utils.tensorboard
from utils.errors import InputError
from utils.tensorboard import TensorBoardLog, scalars

REPO = Path(__file__).resolve().parents[2]


def row(generation: int, **fields) -> dict:
    """A metrics row as the trainer writes it, with values a float32 holds exactly."""
    return {
        "generation": generation,
        "best_fitness": 0.5 * generation,
        "mean_fitness": 0.25 * generation,
        "worst_fitness": -0.125 * generation,
        "validation_best": 0.75,
        "champion_score": 1.5,
        "critic_loss": 2.0,
        "actor_loss": -1.0,
        "rss_bytes": 1024 * generation,
        "rollout_s": 0.5,
        "env_steps_per_s": 4096.0,
        "elites": [0, 3],
        "updates": 8,
        **fields,
    }


def accumulator(log_dir: Path):
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = event_accumulator.EventAccumulator(
        str(log_dir), size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0, "tensors": 0}
    )
    return acc.Reload()


def scalar_series(acc, tag: str) -> list[tuple[int, float]]:
    return [(event.step, event.value) for event in acc.Scalars(tag)]


def png(path: Path, width: int, height: int) -> Path:
    fig = Figure(figsize=(width / 100, height / 100), dpi=100)
    FigureCanvasAgg(fig)
    fig.add_subplot().plot([0, 1, 2], [1, 0, 1])
    fig.savefig(path)
    return path


def test_rows_become_grouped_scalars_at_their_generation(tmp_path):
    pytest.importorskip("tensorboard")
    with TensorBoardLog(tmp_path / "tb") as log:
        log.generation(row(1))
        log.generation(row(2))
    acc = accumulator(tmp_path / "tb")
    assert scalar_series(acc, "fitness/best") == [(1, 0.5), (2, 1.0)]
    assert scalar_series(acc, "fitness/worst") == [(1, -0.125), (2, -0.25)]
    assert scalar_series(acc, "fitness/spread") == [(1, 0.625), (2, 1.25)]
    assert scalar_series(acc, "validation/champion") == [(1, 1.5), (2, 1.5)]
    assert scalar_series(acc, "loss/actor") == [(1, -1.0), (2, -1.0)]
    assert scalar_series(acc, "memory/rss_bytes") == [(1, 1024.0), (2, 2048.0)]
    assert scalar_series(acc, "time/rollout_s") == [(1, 0.5), (2, 0.5)]
    assert scalar_series(acc, "speed/env_steps_per_s") == [(1, 4096.0), (2, 4096.0)]
    assert scalar_series(acc, "other/updates") == [(1, 8.0), (2, 8.0)]
    assert not any("generation" in tag or "elites" in tag for tag in acc.Tags()["scalars"])


def test_null_nan_and_list_values_are_skipped(tmp_path):
    pytest.importorskip("tensorboard")
    with TensorBoardLog(tmp_path) as log:
        log.generation(row(1, worst_fitness=None, critic_loss=math.nan, actor_loss=math.inf, note="diverged"))
        log.generation(row(2))
    acc = accumulator(tmp_path)
    assert [step for step, _ in scalar_series(acc, "fitness/worst")] == [2]
    assert [step for step, _ in scalar_series(acc, "fitness/spread")] == [2]  # needs both best and worst
    assert [step for step, _ in scalar_series(acc, "loss/critic")] == [2]
    assert [step for step, _ in scalar_series(acc, "loss/actor")] == [2]
    assert [step for step, _ in scalar_series(acc, "fitness/best")] == [1, 2]
    assert "other/note" not in acc.Tags()["scalars"] and "other/elites" not in acc.Tags()["scalars"]


def test_scalars_of_a_row_need_no_tensorboard():
    assert scalars({"generation": 3, "best_fitness": 1.0, "worst_fitness": 0.25, "flag": True, "x": None}) == {
        "fitness/best": 1.0,
        "fitness/worst": 0.25,
        "fitness/spread": 0.75,
    }
    # Durations go to time/ by their unit, a new one (the background checkpoint write's) included; speeds do not.
    assert scalars({"checkpoint_write_s": 2.0, "env_steps_per_s": 8.0, "updates": 4}) == {
        "time/checkpoint_write_s": 2.0,
        "speed/env_steps_per_s": 8.0,
        "other/updates": 4.0,
    }


def test_a_png_becomes_an_image_of_its_size(tmp_path):
    pytest.importorskip("tensorboard")
    path = png(tmp_path / "equity.png", width=320, height=240)
    with TensorBoardLog(tmp_path / "tb") as log:
        log.figure("report/equity", path, step=5)
    images = accumulator(tmp_path / "tb").Images("report/equity")
    assert [(image.step, image.width, image.height) for image in images] == [(5, 320, 240)]
    assert images[0].encoded_image_string[:8] == b"\x89PNG\r\n\x1a\n"


def test_text_is_written(tmp_path):
    pytest.importorskip("tensorboard")
    table = "| metric | value |\n|---|---|\n| sharpe | 1.2 |"
    with TensorBoardLog(tmp_path) as log:
        log.text("report/metrics", table, step=2)
    acc = accumulator(tmp_path)
    (event,) = acc.Tensors("report/metrics/text_summary")
    assert event.step == 2
    assert event.tensor_proto.string_val[0].decode() == table


def test_close_twice_is_fine(tmp_path):
    pytest.importorskip("tensorboard")
    log = TensorBoardLog(tmp_path)
    log.generation(row(1))
    log.close()
    log.close()
    assert list(tmp_path.glob("events.out.tfevents.*"))


def test_purge_step_hides_what_a_crashed_run_wrote_past_its_checkpoint(tmp_path):
    pytest.importorskip("tensorboard")
    with TensorBoardLog(tmp_path) as log:
        for generation in (1, 2, 3):
            log.generation(row(generation))
    time.sleep(1.1)  # event files sort by their name, which starts with the time in seconds
    with TensorBoardLog(tmp_path, purge_step=3) as log:
        log.generation(row(3, best_fitness=9.0))
    assert scalar_series(accumulator(tmp_path), "fitness/best") == [(1, 0.5), (2, 1.0), (3, 9.0)]


def test_missing_tensorboard_is_a_one_line_input_error(tmp_path, monkeypatch):
    monkeypatch.setattr(utils.tensorboard, "tensorboard_available", lambda: False)
    with pytest.raises(InputError) as raised:
        TensorBoardLog(tmp_path / "tb")
    assert "\n" not in str(raised.value) and "pip install tensorboard" in str(raised.value)
    assert not (tmp_path / "tb").exists()


def test_a_blocked_import_counts_as_missing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now fails as if not installed
    assert not utils.tensorboard.tensorboard_available()
    with pytest.raises(InputError, match="pip install tensorboard"):
        TensorBoardLog(tmp_path / "tb")
    assert not (tmp_path / "tb").exists()


def test_import_needs_neither_tensorboard_nor_the_trainer():
    tree = ast.parse((REPO / "utils" / "tensorboard.py").read_text())
    top_level = {
        alias.name.split(".")[0]
        for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert not top_level & {"tensorboard", "torch", "environment", "models", "training"}
