"""Errors that mean "the input is wrong", not "the program is wrong".

The command line turns any of these into a one-line message and exit status 2; everything else
is a bug and keeps its traceback.
"""


class InputError(Exception):
    """Bad input from the user: the message names the problem and how to fix it."""


class ConfigError(InputError):
    """A bad preset, ``--set`` key or value, flag, or config file."""


class DataError(InputError):
    """A price file that cannot be read or fails validation."""


class CheckpointError(InputError):
    """A checkpoint that is missing, incomplete, corrupt, unsafe or does not fit the config."""


class StorageError(InputError):
    """A checkpoint location that cannot be used: missing bucket, no or bad credentials, no permission, unreachable.

    ``transient`` is True when the cause may go away by itself (the service unreachable or overloaded until the
    retry deadline ran out), False when the user must change something (a bucket name, credentials, a role).
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


def one_line(text: object, limit: int = 240) -> str:
    """``text`` with its white space folded into single spaces, cut to ``limit`` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
