"""A run folder's own files, each named once: what a run keeps beside its generations (``gen-NNNNNN/``, whose
names ``persistence.checkpoint`` owns). The trainer, the bucket's copy and every offline command find them here."""

from __future__ import annotations

from pathlib import Path

CONFIG_NAME = "config.json"
"""The settings the run started with (``Config.to_json``): a resume checks its flags against them."""
METRICS_NAME = "metrics.jsonl"
"""One JSON row per generation (``run.records``), cut back to the checkpoint a resume continues from."""
TENSORBOARD_NAME = "tensorboard"
"""The folder of the run's TensorBoard log (``--tensorboard``)."""


def config_path(run_dir: Path) -> Path:
    return run_dir / CONFIG_NAME


def metrics_path(run_dir: Path) -> Path:
    return run_dir / METRICS_NAME


def is_run_folder(path: Path) -> bool:
    """Whether ``path`` holds a run: a run writes its config before anything else."""
    return config_path(path).is_file()
