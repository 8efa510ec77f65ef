"""Per-generation scalars and evaluation figures as TensorBoard event files, for ``tensorboard --logdir``.

TensorBoard is optional: this module imports without it, and only opening a ``TensorBoardLog`` needs it. The writer
is torch's ``SummaryWriter``, which needs only the ``tensorboard`` package's protobufs and event file writer for
scalars, images and text (tensorboard's own TensorFlow-free ``Writer`` takes scalars only).

A metrics row becomes tags grouped by what they measure (``fitness/``, ``validation/``, ``loss/``, ``memory/``,
``speed/``, ``time/`` for other fields ending in ``_s``, ``other/`` for the rest), one TensorBoard section each.
Missing, null and non-finite values are skipped, never written as gaps or zeros.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from utils.errors import InputError
from utils.telemetry import MEMORY_KEYS

MISSING_MESSAGE = "--tensorboard needs the tensorboard package: pip install tensorboard"

_TAGS: dict[str, str] = {
    "best_fitness": "fitness/best",
    "mean_fitness": "fitness/mean",
    "worst_fitness": "fitness/worst",
    "validation_best": "validation/best",
    "validation_mean": "validation/mean",
    "champion_score": "validation/champion",
    "champion_generation": "validation/champion_generation",
    "env_steps_per_s": "speed/env_steps_per_s",
    **{key: f"memory/{key}" for key in (*MEMORY_KEYS, "replay_bytes", "replay_transitions")},
}


def tensorboard_available() -> bool:
    """True when the ``tensorboard`` package can be imported (looked up without importing it)."""
    return importlib.util.find_spec("tensorboard") is not None


def _finite(value: Any) -> float | None:
    """``value`` as a float, or None for a missing, non-numeric (bools, lists, strings) or non-finite one."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _tag(key: str) -> str:
    if key in _TAGS:
        return _TAGS[key]
    if key.endswith("_loss"):  # each loss the learner reports, by its name
        return f"loss/{key.removesuffix('_loss')}"
    return f"time/{key}" if key.endswith("_s") else f"other/{key}"


def scalars(row: Mapping[str, Any]) -> dict[str, float]:
    """The TensorBoard scalars of one metrics row, by tag: the row's finite numbers and the fitness spread."""
    values = {key: _finite(value) for key, value in row.items() if key != "generation"}
    out = {_tag(key): value for key, value in values.items() if value is not None}
    best, worst = values.get("best_fitness"), values.get("worst_fitness")
    if best is not None and worst is not None:
        out["fitness/spread"] = best - worst
    return out


class TensorBoardLog:
    """Per-generation scalars and evaluation figures as TensorBoard event files in one folder.

    Each writer adds an event file to the folder; TensorBoard reads them all as one run. ``generation`` flushes after
    each row, so a crash loses no generation; figures and text reach the disk on the next flush or on ``close``.

    Args:
        log_dir: The folder of the event files; made if missing.
        purge_step: On resume, the first generation this run will write: TensorBoard hides what an earlier
            run wrote at that step or later, so the generations a crash cut off are not drawn twice.

    Raises:
        InputError: The ``tensorboard`` package is not installed (no folder is made then).
    """

    def __init__(self, log_dir: Path | str, *, purge_step: int | None = None) -> None:
        if not tensorboard_available():
            raise InputError(MISSING_MESSAGE)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:  # installed but unusable, e.g. too old for torch
            raise InputError(f"{MISSING_MESSAGE} ({error})") from error
        self.log_dir = Path(log_dir)
        self._writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=purge_step)
        self._closed = False

    def generation(self, row: Mapping[str, Any]) -> None:
        """Write one trainer metrics row as scalars at step ``row["generation"]``, then flush."""
        step = int(row["generation"])
        for tag, value in scalars(row).items():
            self._writer.add_scalar(tag, value, global_step=step)
        self._writer.flush()

    def figure(self, tag: str, png_path: Path | str, *, step: int = 0) -> None:
        """Add an already rendered PNG file as an image (its alpha channel dropped)."""
        import matplotlib.image  # only here: a log of scalars alone need not load matplotlib

        image = matplotlib.image.imread(Path(png_path))  # (H, W) grey or (H, W, 3 | 4), floats in [0, 1]
        if image.ndim == 2:
            image = np.repeat(image[:, :, None], 3, axis=2)
        self._writer.add_image(tag, image[:, :, :3], global_step=step, dataformats="HWC")

    def text(self, tag: str, markdown: str, *, step: int = 0) -> None:
        """Add Markdown text, e.g. a metrics table; TensorBoard's Text tab renders it."""
        self._writer.add_text(tag, markdown, global_step=step)

    def flush(self) -> None:
        """Write everything added so far to disk."""
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; closing again does nothing."""
        if not self._closed:
            self._closed = True
            self._writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
