"""Command-line plumbing shared by the subcommands (``inspect``, ``evaluate``, ``export``, ``backtest``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn

from utils.errors import InputError


class ArgumentParser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one-line ``InputError``s: the command line prints them and exits 2."""

    def error(self, message: str) -> NoReturn:
        raise InputError(f"{message} (see {self.prog} --help)")


def parse_command(
    argv: Sequence[str], command: str, description: str, *arguments: tuple[str, dict[str, Any]]
) -> argparse.Namespace:
    """Parse the arguments of ``python main.py COMMAND``; ``arguments`` are (name, ``add_argument`` keywords)."""
    parser = ArgumentParser(prog=f"python main.py {command}", description=description)
    for name, options in arguments:
        parser.add_argument(name, **options)
    return parser.parse_args(list(argv))
