"""Hold a run at a named moment of one generation until the test lets it go, so that a test strikes (a stop signal, a
kill) while every run it names is provably still training, however fast or busy the machine.

Test-only: like ``tests/pause_points.py``, it wraps trainer phases from the outside, so product code carries no hook.
It is set through the environment, so that it reaches every process of a run: a backtest's worker processes (spawned:
multiprocessing runs this script again in each, as ``__mp_main__``, which installs the hold there too) and the
processes of a torchrun job (each runs its script as ``__main__``; ``tests/sharded_main.py`` installs it).

* ``HOLD_POINTS``: a folder for the markers below (unset: no hold);
* ``HOLD_AT``: where to hold, ``start@N``: generation N is about to begin (N-1 is trained and its checkpoint staged,
  N's rollouts have not run), or ``updating@N``: generation N's updates are about to run (its rollouts, validation
  and evolution are done).

A run there (``WHO``: its run folder's name, with ``-rank-R`` on process R > 0 of a torchrun job) writes
``HOLD_POINTS/WHO.held`` (its process id) and waits until ``HOLD_POINTS/WHO.release`` exists. While it waits it asks
the trainer's own stop request, as the trainer's safe points do, and creates ``HOLD_POINTS/WHO.stop-seen`` once that
says stop: then the stop has reached the run while it was held, and once released the trainer stops at its next safe
point by its own logic (the hold never stops a run itself). Run as a script, it installs the hold and runs
``main.py``:

    HOLD_POINTS=/tmp/marks HOLD_AT=start@2 python tests/hold_points.py backtest --jobs 2 ...
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(Path(__file__).resolve())
MOMENTS = ("start", "updating")
POLL_S = 0.01


def environment(marks: Path, at: str) -> dict[str, str]:
    """The variables that hold a run (and every process it starts) at ``at``, with its markers in ``marks``."""
    moment, _, generation = at.partition("@")
    if moment not in MOMENTS or not generation.isdigit():
        raise ValueError(f"hold at {at!r}: expected MOMENT@GENERATION, MOMENT one of {', '.join(MOMENTS)}")
    marks.mkdir(parents=True, exist_ok=True)
    return {"HOLD_POINTS": str(marks), "HOLD_AT": at}


def install() -> None:
    """Wrap the trainer's phases as ``HOLD_POINTS`` and ``HOLD_AT`` say; nothing when ``HOLD_POINTS`` is unset."""
    if not os.environ.get("HOLD_POINTS"):
        return
    from run.trainer import Trainer

    marks = Path(os.environ["HOLD_POINTS"])
    moment, _, at = os.environ["HOLD_AT"].partition("@")

    def hold(trainer: Trainer, here: str) -> None:
        if here != moment or trainer.generation + 1 != int(at):  # generation counts up once its update is done
            return
        rank = trainer.sharding.ranks.rank
        who = trainer.run_dir.name + (f"-rank-{rank}" if rank else "")
        draft = marks / f".{who}.held.tmp"
        draft.write_text(str(os.getpid()))
        draft.replace(marks / f"{who}.held")
        seen = False
        while not (marks / f"{who}.release").exists():
            if not seen and trainer.should_stop():
                (marks / f"{who}.stop-seen").touch()
                seen = True
            time.sleep(POLL_S)

    run_generation, update = Trainer.run_generation, Trainer._update

    def hold_then_run_generation(trainer: Trainer, *args, **kwargs):
        hold(trainer, "start")
        return run_generation(trainer, *args, **kwargs)

    def hold_then_update(trainer: Trainer, *args, **kwargs):
        hold(trainer, "updating")
        return update(trainer, *args, **kwargs)

    Trainer.run_generation = hold_then_run_generation
    Trainer._update = hold_then_update


# ---------------------------------------------------------------------------------------------- the test's side


def wait_until_held(process: subprocess.Popen, marks: Path, whos: Iterable[str], *, timeout: float = 300) -> None:
    """Until every run in ``whos`` is held; fails at once if ``process`` ended first (its output in the message)."""
    _wait(process, [marks / f"{who}.held" for who in whos], timeout)


def wait_until_stop_seen(process: subprocess.Popen, marks: Path, whos: Iterable[str], *, timeout: float = 120) -> None:
    """Until every held run in ``whos`` has seen its stop request."""
    _wait(process, [marks / f"{who}.stop-seen" for who in whos], timeout)


def held_pid(marks: Path, who: str) -> int:
    """The process id of the process that holds ``who``."""
    return int((marks / f"{who}.held").read_text())


def release(marks: Path, whos: Iterable[str]) -> None:
    """Let the runs in ``whos`` go on (ahead of time too: a run released before it gets there does not wait)."""
    for who in whos:
        (marks / f"{who}.release").touch()


def _wait(process: subprocess.Popen, markers: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(marker.exists() for marker in markers):
        if process.poll() is not None:
            output = process.communicate()
            raise AssertionError(f"the process ended ({process.returncode}) before {markers}: {output}")
        assert time.monotonic() < deadline, f"timed out waiting for {markers}"
        time.sleep(POLL_S)


if __name__ in ("__main__", "__mp_main__"):  # __mp_main__: this script run again in a spawned worker
    sys.path.insert(0, str(REPO))
    install()

if __name__ == "__main__":
    import main

    main.exit_process(main.main(sys.argv[1:]))
