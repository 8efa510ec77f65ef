"""Config documents of earlier versions: sections and keys renamed since, keys retired since, and keys added since
whose default is not what those versions did. A checkpoint's config.json of then still loads, as it ran; the command
line takes the current names only."""

from __future__ import annotations

from typing import Any

from utils.errors import ConfigError

RENAMED_SECTIONS = {"evaluation": "rollout", "ddpg": "learner"}
"""Sections renamed since earlier versions, old name to new: a checkpoint's config.json of then still loads; ``--set``
of a key by its old section's name is refused with the new one (``ddpg.gamma``: ``learner.gamma``)."""
RENAMED_KEYS = {
    "runtime.census_share": "runtime.census_fraction",
    "selection.early_share": "selection.early_fraction",
}
"""Keys renamed since earlier versions (by their current section), old to new: a checkpoint's config.json of then
still loads; ``--set`` of the old name is refused with the new one. "Share" names the agents a process holds, only."""
EARLIER_DEFAULTS = {"env.execution_delay": 0, "data.universe": "common", "data.gap_before_validation": False}
"""Keys added since earlier versions whose default is not what those versions did: a config document written before
one existed (a checkpoint's config.json) ran with this value, and loads with it, so that it resumes as it ran."""
RETIRED_KEYS = {
    "runtime.compile": "torch.compile's CUDA graphs of the per-day forwards crashed on a GPU and were never measured "
    "to pay (README, Speed)",
}
"""Keys of earlier versions that no longer exist, with why: a checkpoint's config.json holding one still loads (the
key is dropped); ``--set`` of one is refused with the reason."""


def with_current_names(values: dict[str, Any]) -> dict[str, Any]:
    """A config document (``Config.to_dict``) written before a section or a key was renamed, with their new names."""
    if not isinstance(values, dict):
        return values
    for old, new in RENAMED_SECTIONS.items():
        if old in values and new not in values:
            values = {(new if name == old else name): section for name, section in values.items()}
    for old, new in RENAMED_KEYS.items():
        section, _, old_name = old.partition(".")
        new_name = new.partition(".")[2]
        raw = values.get(section)
        if isinstance(raw, dict) and old_name in raw and new_name not in raw:
            values = {**values, section: {(new_name if k == old_name else k): v for k, v in raw.items()}}
    return values


def with_earlier_defaults(values: dict[str, Any]) -> dict[str, Any]:
    """A config document with the ``EARLIER_DEFAULTS`` of the keys it lacks (its sections' names current)."""
    values = dict(values)
    for key, value in EARLIER_DEFAULTS.items():
        section, _, name = key.partition(".")
        if isinstance(values.get(section), dict) and name not in values[section]:
            values[section] = {**values[section], name: value}
    return values


def refuse_renamed(key: str) -> None:
    section, _, name = key.partition(".")
    if section in RENAMED_SECTIONS and name:
        new = RENAMED_SECTIONS[section]
        raise ConfigError(f"config section {section} is now called {new}: {new}.{name}")
    if key in RENAMED_KEYS:
        raise ConfigError(f"config key {key} is now called {RENAMED_KEYS[key]}")


def refuse_retired(key: str) -> None:
    if key in RETIRED_KEYS:
        raise ConfigError(f"config key {key} was removed: {RETIRED_KEYS[key]}")
