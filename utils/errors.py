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
