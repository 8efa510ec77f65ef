"""A run folder, in one place: its files' names, the start and resume decisions, and its copy in a bucket.

A run folder holds the run's config, its metrics rows, its TensorBoard log and its generations (``gen-NNNNNN/``,
whose format is ``persistence.checkpoint``'s). The trainer (``run.launch``) asks ``opening.start`` or
``opening.resume`` which folder, config and generation to use, and the offline commands find runs here
(``offline.stored``).

- ``names``: the folder's own files, each named once.
- ``opening``: whether a start or a resume may use a folder, with which config, from which generation.
- ``recovery``: which generation survives damage, and setting damaged ones aside.
- ``bucket``: reading the bucket's copy (``LATEST``, downloads, a generation for a reader).
- ``uploader``: writing it, in the background, as each generation is committed.

Dependencies run down that list's reverse: ``opening`` reads ``recovery`` and ``bucket``; ``recovery`` reads
``bucket``; all of them read ``names``.
"""

# Only the names are imported with the package: the command line reads them before it knows whether it will
# train (``main``), and the start and resume decisions import the storage clients.
from persistence.run_folder.names import (
    CONFIG_NAME,
    METRICS_NAME,
    TENSORBOARD_NAME,
    config_path,
    is_run_folder,
    metrics_path,
)

__all__ = ["CONFIG_NAME", "METRICS_NAME", "TENSORBOARD_NAME", "config_path", "is_run_folder", "metrics_path"]
