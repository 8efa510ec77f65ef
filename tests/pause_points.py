"""Stop a run at a named moment, so a test can SIGKILL it exactly there.

Test-only: it wraps a trainer phase and three steps of ``persistence.committing.write_generation`` from the outside,
so product code carries no hook. The moment inside a generation's training:

* ``updating``: the generation's learner updates are about to run (its rollouts, validation and evolution are done); the
  training loop stops there, and the checkpoint writer's thread goes on writing the generation before it.

The moments in the order a generation is written:

* ``files-written``: every payload file is in the temporary folder, the manifest is not;
* ``manifest-written``: the manifest too, and the temporary folder is fsynced, but not yet renamed into place;
* ``renamed``: the generation folder is in place, ``LATEST`` still names the previous generation;
* ``latest-written``: ``LATEST`` names the new generation.

``install("renamed@3")`` pauses only while generation 3 is written (``"renamed"``: any generation): it creates
``RUN_DIR/.paused-<moment>`` and sleeps until killed. The write runs on the checkpoint writer's thread, so the
training loop goes on meanwhile; to tell how far, ``RUN_DIR/.recording-<N>`` is created when generation N's record
phase begins (after its training, before it waits for the write in flight). Run as a script, it installs the pause
and runs ``main.py``:

    python tests/pause_points.py renamed@3 --preset smoke ...
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MOMENTS = ("updating", "files-written", "manifest-written", "renamed", "latest-written")
_TMP_DIR = re.compile(r"\.gen-(\d+)\.tmp-\d+")


def install(spec: str) -> None:
    from persistence import checkpoint, committing
    from run.trainer import Trainer

    moment, _, only = spec.partition("@")
    if moment not in MOMENTS:
        raise ValueError(f"unknown moment {moment!r} (choose from {', '.join(MOMENTS)})")

    def pause(run_dir: Path, generation: int, at: str) -> None:
        if at == moment and (not only or int(only) == generation):
            (run_dir / f".paused-{at}").touch()
            while True:
                time.sleep(3600)

    def in_temporary_folder(path: Path) -> int | None:
        match = _TMP_DIR.fullmatch(path.name)
        return int(match.group(1)) if match else None

    write_durably, fsync_dir, write_latest = committing._write_durably, committing._fsync_dir, committing.write_latest

    def write_durably_then_pause(path: Path, data: bytes) -> None:
        generation = in_temporary_folder(path.parent)
        if generation is not None and path.name == checkpoint.MANIFEST_NAME:
            pause(path.parent.parent, generation, "files-written")
        write_durably(path, data)

    def fsync_dir_then_pause(path: Path) -> None:
        fsync_dir(path)
        generation = in_temporary_folder(path)
        if generation is not None:
            pause(path.parent, generation, "manifest-written")

    def write_latest_between_pauses(run_dir: Path, generation: int) -> None:
        pause(Path(run_dir), generation, "renamed")
        write_latest(run_dir, generation)
        pause(Path(run_dir), generation, "latest-written")

    update, record = Trainer._update, Trainer._record

    def pause_then_update(trainer: Trainer, *args, **kwargs):
        pause(trainer.run_dir, trainer.generation + 1, "updating")  # generation counts up once the update is done
        return update(trainer, *args, **kwargs)

    def say_then_record(trainer: Trainer, *args, **kwargs):
        (trainer.run_dir / f".recording-{trainer.generation}").touch()
        return record(trainer, *args, **kwargs)

    Trainer._update = pause_then_update
    Trainer._record = say_then_record
    committing._write_durably = write_durably_then_pause
    committing._fsync_dir = fsync_dir_then_pause
    committing.write_latest = write_latest_between_pauses


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    install(sys.argv[1])
    import main

    sys.exit(main.main(sys.argv[2:]))
