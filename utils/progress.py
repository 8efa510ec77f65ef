"""A progress bar over generations that keeps log lines above it."""

from __future__ import annotations

import sys

from tqdm import tqdm


class GenerationProgress:
    """``tqdm`` over generations; ``write`` prints a line without breaking the bar.

    Disabled, it prints plain lines (for logs and CI).
    """

    def __init__(self, *, enabled: bool = True, unit: str = "gen") -> None:
        self.enabled = enabled
        self.unit = unit
        self._bar: tqdm | None = None

    def __enter__(self) -> GenerationProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Remove the bar; later lines print plainly."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def reset(self, *, total: int, initial: int) -> None:
        if self.enabled:
            self._bar = tqdm(total=total, initial=initial, unit=self.unit, dynamic_ncols=True, file=sys.stderr)

    def update(self) -> None:
        if self._bar is not None:
            self._bar.update(1)

    def describe(self, text: str) -> None:
        """Show ``text`` beside the bar (what the current step is doing)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line)
        else:
            print(line, flush=True)
