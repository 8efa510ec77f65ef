"""An exported champion's bundle, the one reader and the one writer of its format: ``actor.safetensors`` (the actor's
tensors, the population dimension of size 1 squeezed), ``actor.json`` (its spec: ``offline.export.actor_spec``) and
``README.md`` (a plain-PyTorch forward pass). ``export`` writes one, ``evaluate`` reads one, local or downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import safetensors
import safetensors.torch
import torch

from utils.errors import CheckpointError

TENSORS, SPEC, README = "actor.safetensors", "actor.json", "README.md"
FILES = (TENSORS, SPEC, README)
"""The bundle's files."""
FORMAT = "erl-trader-actor"
VERSION = 5
"""2 added ``precision`` and ``training_precision`` (a version 1 file lacks them and is float32 all the same); 3 names
the champion's validation score ``champion_score``, as the checkpoint does (``validation_score`` before), and adds
its ``champion_bound``; 4 adds ``execution_delay``, ``universe``, ``cash`` and ``tradable`` (how the actor traded and
what it may put weight on; a version 3 file traded at delay 0, every asset every day, cash at 0); 5 adds
``procedure`` (``selection.deploy``: which agents trade; an ensemble's tensors are named ``member{j}.NAME``)."""
VERSIONS = (1, 2, 3, 4, 5)
"""The versions this program reads."""
PRECISION = "float32"
"""The arithmetic an exported or evaluated champion runs in."""


class Bundle(NamedTuple):
    spec: dict[str, Any]
    """``actor.json``, checked: this project's format, a version read here, float32."""
    tensors: dict[str, torch.Tensor]
    """The actor's tensors by ``models.networks.Actor`` name, each without the population dimension."""


def holds_bundle(folder: Path) -> bool:
    """Whether ``folder`` holds an exported actor (its spec)."""
    return (folder / SPEC).is_file()


def write_bundle(folder: Path, tensors: dict[str, torch.Tensor], spec: dict[str, Any], readme: str) -> None:
    """The bundle's three files into ``folder`` (an empty folder, to be renamed into place by the caller)."""
    (folder / TENSORS).write_bytes(safetensors.torch.save(tensors))
    (folder / SPEC).write_text(json.dumps(spec, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    (folder / README).write_text(readme, encoding="utf-8")


def read_bundle(folder: Path, label: str) -> Bundle:
    """The bundle in ``folder`` (``label`` names it in messages), its spec checked.

    Raises:
        CheckpointError: a file cannot be read, or the spec is not an exported actor of a version read here, or asks
            for another precision.
    """
    try:
        spec = json.loads((folder / SPEC).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{label}/{SPEC} cannot be read: {error}") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT or not isinstance(spec.get("source"), dict):
        raise CheckpointError(f"{label}/{SPEC} is not an exported actor of this project")
    version = spec.get("format_version")
    if version not in VERSIONS:
        known = ", ".join(map(str, VERSIONS))
        raise CheckpointError(f"{label}/{SPEC} has format_version {version!r}; this version reads {known}")
    if spec.get("precision", PRECISION) != PRECISION:  # version 1 has no precision: its actors are float32
        raise CheckpointError(f"{label}/{SPEC} asks for precision {spec['precision']!r}; evaluate runs {PRECISION}")
    try:
        tensors = safetensors.torch.load_file(str(folder / TENSORS))
    except (OSError, safetensors.SafetensorError) as error:
        raise CheckpointError(f"{label}/{TENSORS} cannot be read: {error}") from None
    return Bundle(spec, tensors)
