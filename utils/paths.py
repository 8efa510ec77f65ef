"""Paths of the local file system."""

from __future__ import annotations

from pathlib import Path


def file_in_the_way(folder: Path) -> Path | None:
    """What keeps ``folder`` from being, or becoming, a folder: the nearest of it and the paths above it that exists
    (or is a link) and is not a folder; None when ``folder`` is, or can become, one."""
    for place in (folder, *folder.parents):
        if place.is_dir():
            return None
        if place.exists() or place.is_symlink():
            return place
    return None
