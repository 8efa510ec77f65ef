"""What a backtest shows while it runs: a bar over its folds (done / total) with each running fold's generation
beside it, one line per finished fold, and with ``--verbose`` every line of every fold's run, prefixed by the fold.

Under ``torchrun`` only the leader shows anything: the other processes hand their lines and running folds to the
status they exchange every second (``offline.backtest.spread``), and the leader shows them with its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from offline.backtest.plan import Fold
from offline.backtest.report import fmt
from utils.progress import GenerationProgress


def result_line(name: str, result: dict[str, Any]) -> str:
    """A finished fold's line: its champion's Sharpe beside equal weight's, and how it was chosen."""
    m = result["metrics"]
    generation = result["champion_generation"]
    crowned = f"crowned in generation {generation}" if generation else "equal weight (no agent proved an edge)"
    return (
        f"{name}: champion Sharpe {fmt(m['champion']['sharpe'], '+.2f')} "
        f"(equal weight {fmt(m['equal_weight']['sharpe'], '+.2f')}), "
        f"{crowned}; deflated Sharpe {fmt(result.get('deflated_sharpe'), '.2f')}, "
        f"PBO {fmt(result.get('pbo'), '.2f')}"
    )


class FoldBoard:
    """The bar and lines of one process's folds.

    Args:
        progress: the bar (over folds), already reset to the backtest's total.
        say: where lines go (the bar's ``write``, or stderr under ``--json``).
        verbose: show every line of every fold's run.
        speaks: False on a process of a torchrun job other than the leader: lines wait in ``outbox``.
    """

    def __init__(
        self, progress: GenerationProgress, *, say: Callable[[str], None], verbose: bool, speaks: bool = True
    ) -> None:
        self.progress, self._say, self.verbose, self.speaks = progress, say, verbose, speaks
        self.outbox: list[str] = []
        self.done = 0
        """Folds finished here, read back or trained."""
        self.running: dict[str, str] = {}
        """Each running fold's state beside the bar, by name, in the order they started."""
        self._elsewhere: dict[str, str] = {}
        self._done_elsewhere = 0

    def say(self, line: str) -> None:
        if self.speaks:
            self._say(line)
        else:
            self.outbox.append(line)

    def started(self, fold: Fold) -> None:
        self.running[fold.name] = "starting"
        self._show()

    def generation(self, fold: Fold, generation: int) -> None:
        self.running[fold.name] = f"gen {generation}/{fold.config.runtime.generations}"
        self._show()

    def log(self, fold: Fold, line: str) -> None:
        if self.verbose:
            self.say(f"{fold.name}: {line}")

    def finished(self, fold: Fold, result: dict[str, Any]) -> None:
        self.running.pop(fold.name, None)
        self.done += 1
        self.say(result_line(fold.name, result))
        self.progress.update()
        self._show()

    def left(self, fold: Fold) -> None:
        """``fold`` stopped or failed: no longer running."""
        self.running.pop(fold.name, None)
        self._show()

    def elsewhere(self, lines: list[str], running: dict[str, str], done: int) -> None:
        """The other processes' new lines, running folds and count of finished folds (the leader shows them)."""
        for line in lines:
            self._say(line)
        for _ in range(done - self._done_elsewhere):
            self.progress.update()
        self._elsewhere, self._done_elsewhere = running, done
        self._show()

    def _show(self) -> None:
        running = {**self.running, **self._elsewhere}
        self.progress.describe(", ".join(f"{name} {state}" for name, state in running.items()))
