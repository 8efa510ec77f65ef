"""Stop requests from SIGTERM (a pod being pre-empted) and SIGINT (Ctrl-C), honoured at safe points."""

from __future__ import annotations

import signal
from types import FrameType


class StopRequest:
    """Records the first SIGTERM or SIGINT instead of dying; a second SIGINT interrupts at once.

    Use as a context manager: the previous handlers come back on exit.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def __call__(self) -> bool:
        """True once a stop was requested."""
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def __enter__(self) -> StopRequest:
        for signum in self.SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # asked twice: the user means now
        self.signum = signum
